"""The public LLM request traces that `dualpace-sim traces` and ``workload.source: trace`` know.

Each entry says where the file lives upstream, what it must hash to, how to parse it and whom to
cite. The project does not redistribute any of them; ``fetch.py`` downloads them into a cache.

``sha256`` is pinned only for files whose bytes were hashed here; the others are None (the source
could not be reached when the entry was written), so fetching them reports the computed hash for
the user to compare and pin instead of checking it against an invented value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dualpace_sim.workload.spec import WorkloadError

TraceFormat = Literal["azure", "vidur", "mooncake"]

AZURE_RAW = "https://raw.githubusercontent.com/Azure/AzurePublicDataset/master/data"
AZURE_2024_RELEASE = (
    "https://github.com/Azure/AzurePublicDataset/releases/download/dataset-llm-2024"
)
VIDUR_RAW = "https://raw.githubusercontent.com/microsoft/vidur/main/data/processed_traces"
MOONCAKE_RAW = "https://raw.githubusercontent.com/kvcache-ai/Mooncake/main/FAST25-release"

AZURE_LICENSE = "CC-BY 4.0"
SPLITWISE = ('Patel et al., "Splitwise: Efficient generative LLM inference using phase '
             'splitting", ISCA 2024')
DYNAMOLLM = ('Stojkovic et al., "DynamoLLM: Designing LLM Inference Clusters for Performance and '
             'Energy Efficiency", HPCA 2025')
VIDUR = ('Agrawal et al., "Vidur: A Large-Scale Simulation Framework For LLM Inference", '
         'MLSys 2024')
VIDUR_LICENSE = "MIT (microsoft/vidur repository license)"
MOONCAKE = ('Qin et al., "Mooncake: Trading More Storage for Less Computation - A KVCache-centric '
            'Architecture for Serving LLM Chatbot", FAST 2025')
MOONCAKE_LICENSE = "Apache-2.0 (kvcache-ai/Mooncake repository license)"


@dataclass(frozen=True)
class TraceEntry:
    """One downloadable trace; ``size`` is for display only (the checksum guards the bytes)."""

    name: str
    description: str
    url: str
    file_name: str
    sha256: str | None
    size: str
    format: TraceFormat
    license: str
    attribution: str


def _entry(name: str, description: str, base_url: str, file_name: str, sha256: str | None,
           size: str, fmt: TraceFormat, license_: str, attribution: str) -> TraceEntry:
    return TraceEntry(name, description, f"{base_url}/{file_name}", file_name, sha256, size, fmt,
                      license_, attribution)


TRACES: dict[str, TraceEntry] = {e.name: e for e in [
    _entry("azure-2023-conv", "Azure LLM inference 2023, conversation: 19,366 requests in 1 h",
           AZURE_RAW, "AzureLLMInferenceTrace_conv.csv",
           "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8", "0.7 MB",
           "azure", AZURE_LICENSE, SPLITWISE),
    _entry("azure-2023-code", "Azure LLM inference 2023, code: 8,819 requests in 1 h",
           AZURE_RAW, "AzureLLMInferenceTrace_code.csv",
           "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6", "0.3 MB",
           "azure", AZURE_LICENSE, SPLITWISE),
    _entry("azure-2024-conv", "Azure LLM inference 2024, conversation: one week (May 2024)",
           AZURE_2024_RELEASE, "AzureLLMInferenceTrace_conv_1week.csv", None, "about 1.1 GB",
           "azure", AZURE_LICENSE, DYNAMOLLM),
    _entry("azure-2024-code", "Azure LLM inference 2024, code: one week (May 2024)",
           AZURE_2024_RELEASE, "AzureLLMInferenceTrace_code_1week.csv", None, "about 0.7 GB",
           "azure", AZURE_LICENSE, DYNAMOLLM),
    _entry("vidur-splitwise-conv", "Vidur's processed Azure 2023 conversation trace",
           VIDUR_RAW, "splitwise_conv.csv", None, "about 0.4 MB", "vidur",
           f"{VIDUR_LICENSE}; data derived from the {AZURE_LICENSE} Azure 2023 trace",
           f"{VIDUR}; {SPLITWISE}"),
    _entry("vidur-splitwise-code", "Vidur's processed Azure 2023 code trace",
           VIDUR_RAW, "splitwise_code.csv", None, "about 0.2 MB", "vidur",
           f"{VIDUR_LICENSE}; data derived from the {AZURE_LICENSE} Azure 2023 trace",
           f"{VIDUR}; {SPLITWISE}"),
    _entry("vidur-arxiv-summarization",
           "Vidur's arXiv-summarization request lengths (Llama-2 tokenizer), no arrival times",
           VIDUR_RAW, "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv", None,
           "about 0.9 MB", "vidur", VIDUR_LICENSE, VIDUR),
    _entry("vidur-sharegpt",
           "Vidur's ShareGPT request lengths (Llama-2 tokenizer), no arrival times",
           VIDUR_RAW, "sharegpt_8k_filtered_stats_llama2_tokenizer.csv", None, "size unknown",
           "vidur", VIDUR_LICENSE, VIDUR),
    _entry("mooncake-conversation", "Mooncake (Kimi) conversation trace, FAST'25 release",
           f"{MOONCAKE_RAW}/traces", "conversation_trace.jsonl", None, "about 3 MB",
           "mooncake", MOONCAKE_LICENSE, MOONCAKE),
    _entry("mooncake-toolagent", "Mooncake (Kimi) tool & agent trace, FAST'25 release",
           f"{MOONCAKE_RAW}/traces", "toolagent_trace.jsonl", None, "size unknown",
           "mooncake", MOONCAKE_LICENSE, MOONCAKE),
    _entry("mooncake-synthetic", "Mooncake synthetic trace, FAST'25 release",
           f"{MOONCAKE_RAW}/traces", "synthetic_trace.jsonl", None, "about 1.1 MB",
           "mooncake", MOONCAKE_LICENSE, MOONCAKE),
    _entry("mooncake-arxiv", "Mooncake trace of the 2024 arXiv technical report",
           f"{MOONCAKE_RAW}/arxiv-trace", "mooncake_trace.jsonl", None, "size unknown",
           "mooncake", MOONCAKE_LICENSE, MOONCAKE),
]}


def trace_entry(name: str) -> TraceEntry:
    """The registry entry ``name``, or a one-line error listing the known names."""
    if name not in TRACES:
        raise WorkloadError(f"unknown trace {name!r}; known traces: {', '.join(TRACES)} "
                            "(`dualpace-sim traces list` describes them)")
    return TRACES[name]
