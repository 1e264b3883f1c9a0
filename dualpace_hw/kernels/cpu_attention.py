"""CPU paged decode attention over the host KV pool: a C++/OpenMP kernel, built at first use.

`cpu_paged_decode_attention` has the signature and semantics of
`attention.paged_decode_attention` (q [B, n_heads, hd]; caches [blocks, kv_heads, block_size, hd],
HND pages; block_tables [B, max_blocks]; context_lens [B], tokens including the current one).
It runs `csrc/paged_attention.cpp` (bf16/fp32/fp16, fp32 sums, online softmax, parallel over
(request, kv head) and split-K for small batches, AVX-512 / AVX512-BF16 where the CPU has them).

The extension is compiled with torch.utils.cpp_extension.load on first use (about 30-60 s with
one compiler job) into a cache folder named after the CPU's feature flags, so a cache shared by
machines with different CPUs never loads code built for another one: ``$DUALPACE_EXT_DIR``, or
``$TORCH_EXTENSIONS_DIR/dualpace``, or ``~/.cache/dualpace/torch_extensions``.
If it cannot be built (no C++ compiler, no ninja, a compiler error) a batched pure-PyTorch path
is used instead, and the reason is logged once. ``DUALPACE_CPU_ATTN=torch`` forces that path.

Thread count: the kernel uses the OpenMP team of the calling thread, i.e.
``torch.get_num_threads()`` as set *in that thread* (the extension links the same libgomp as
torch, so there is one OpenMP runtime in the process).
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from dualpace_hw.hostinfo import cpu_flags
from dualpace_hw.kernels.attention import paged_decode_attention

log = logging.getLogger("dualpace_hw.kernels.cpu_attention")

# One extension, one op namespace (dualpace_cpu): the paged attention and the dense kernels.
_SOURCES = [Path(__file__).parent / "csrc" / name for name in ("paged_attention.cpp", "dense.cpp")]
_lock = threading.Lock()
_state: dict[str, object] = {"tried": False, "ok": False, "error": None, "build_s": None}


def _build_name() -> tuple[str, Path]:
    """Module name and build folder, both specific to this CPU's features and this torch."""
    flags = cpu_flags()
    if "avx512_bf16" in flags:
        isa = "avx512bf16"
    elif "avx512f" in flags:
        isa = "avx512"
    elif "avx2" in flags:
        isa = "avx2"
    else:
        isa = platform.machine() or "cpu"
    digest = hashlib.sha1(
        (" ".join(sorted(flags)) + torch.__version__ + platform.python_version()).encode()
    ).hexdigest()[:10]
    name = f"dualpace_cpu_attn_{isa}_{digest}"
    root = os.environ.get("DUALPACE_EXT_DIR")
    if root:
        base = Path(root)
    elif os.environ.get("TORCH_EXTENSIONS_DIR"):
        base = Path(os.environ["TORCH_EXTENSIONS_DIR"]) / "dualpace"
    else:
        base = Path.home() / ".cache" / "dualpace" / "torch_extensions"
    return name, base / name


def _compile_flags() -> list[str]:
    flags = ["-O3", "-fopenmp", "-fno-math-errno"]
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        flags.append("-march=native")
    elif machine in ("aarch64", "arm64"):
        flags.append("-mcpu=native")
    return flags


def load_extension(verbose: bool = False) -> bool:
    """Build (first time) and load the extension; True when its ops are available."""
    with _lock:
        if _state["tried"]:
            return bool(_state["ok"])
        _state["tried"] = True
        if os.environ.get("DUALPACE_CPU_ATTN", "").lower() == "torch":
            _state["error"] = "DUALPACE_CPU_ATTN=torch"
            log.warning("CPU paged attention: the C++ extension is disabled "
                        "(DUALPACE_CPU_ATTN=torch); using the PyTorch path")
            return False
        cxx = os.environ.get("CXX", "c++")
        if shutil.which(cxx) is None:
            _state["error"] = f"no C++ compiler ({cxx!r} not on PATH)"
        else:
            try:
                import ninja  # noqa: F401
            except ImportError:
                if shutil.which("ninja") is None:
                    _state["error"] = "ninja is not installed (pip install ninja)"
        if _state["error"] is None:
            try:
                from torch.utils.cpp_extension import load

                name, folder = _build_name()
                folder.mkdir(parents=True, exist_ok=True)
                t0 = time.perf_counter()
                load(name=name, sources=[str(p) for p in _SOURCES], extra_cflags=_compile_flags(),
                     extra_ldflags=["-fopenmp"], build_directory=str(folder),
                     is_python_module=False, verbose=verbose)
                _state["build_s"] = time.perf_counter() - t0
                _state["ok"] = hasattr(torch.ops.dualpace_cpu, "paged_decode_attention")
                if not _state["ok"]:
                    _state["error"] = "the built library registered no dualpace_cpu ops"
            except Exception as e:  # a compiler error, a missing header, a load failure
                _state["error"] = f"{type(e).__name__}: {str(e).strip()[-2000:]}"
        if not _state["ok"]:
            log.warning("CPU paged attention: the C++ extension could not be built or loaded "
                        "(%s); using the batched PyTorch path, which is much slower",
                        _state["error"])
        return bool(_state["ok"])


def extension_available() -> bool:
    return load_extension()


def extension_info() -> dict[str, object]:
    """Whether the extension loaded, why not, its vector ISA and the load/build time."""
    ok = load_extension()
    info = {"ok": ok, "error": _state["error"], "load_s": _state["build_s"]}
    if ok:
        info["isa"] = torch.ops.dualpace_cpu.vector_isa()
        info["name"] = _build_name()[0]
    return info


def torch_paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
) -> torch.Tensor:
    """Batched pure-PyTorch fallback: one gather of every request's pages, one masked SDPA."""
    b, n_heads, hd = q.shape
    kv_heads, bs = k_cache.shape[1], k_cache.shape[2]
    lens = context_lens.to(torch.int64)
    n_blocks = int((lens.max().item() + bs - 1) // bs) if b else 0
    if n_blocks == 0:
        return torch.zeros_like(q)
    tables = block_tables[:, :n_blocks].to(torch.int64)
    used = torch.arange(n_blocks)[None, :] * bs < lens[:, None]
    tables = torch.where(used, tables, torch.zeros_like(tables))  # padding may be anything
    # [B, nb, kvh, bs, hd] -> [B, kvh, nb * bs, hd]
    k = k_cache[tables].permute(0, 2, 1, 3, 4).reshape(b, kv_heads, n_blocks * bs, hd)
    v = v_cache[tables].permute(0, 2, 1, 3, 4).reshape(b, kv_heads, n_blocks * bs, hd)
    group = n_heads // kv_heads
    mask = torch.arange(n_blocks * bs)[None, :] < lens[:, None]  # [B, T]
    qh = q.view(b, kv_heads, group, hd)
    o = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask[:, None, None, :])
    return o.reshape(b, n_heads, hd)


def cpu_paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    impl: str = "auto",
    prefetch_blocks: int = 1,
    heads_per_unit: int = 0,
    pv_bf16: bool = False,
    prefetch_mode: int = 1,
    validate: bool = True,
    _profile_skip: int = 0,
) -> torch.Tensor:
    """One query per request over its paged history, GQA -> [B, n_heads, hd].

    impl: "auto" (the extension, else the PyTorch fallback), "ext" (the extension's vector
    path; raises if it is missing), "scalar" (the extension's scalar path), "torch" (batched
    PyTorch), "reference" (attention.paged_decode_attention, one request at a time).
    Tuning knobs (defaults: the best measured on the accelerator machine's Xeon, see
    benchmarks/results/kernels/h200-spr16-cpu_kernels.md): prefetch_blocks: pages prefetched
    ahead, in processing order (0: none); prefetch_mode: 0: the next page's rows into L1 as the
    current page's rows are read; 1: the same into L2; 2: the whole next page into L2 up front;
    3: the same into L1; heads_per_unit: kv heads one work unit covers (0: all, so a unit walks
    whole blocks; 1: one unit per (request, kv head)); pv_bf16: with bf16 caches, round the
    probabilities to bf16 for P.V (vdpbf16ps, as GPU flash attention rounds P before its second
    matmul; no faster on Sapphire Rapids), False keeps them fp32 (FMA).
    validate: check shapes and block ids here (ValueError) rather than in C++; a caller that
    reuses one checked set of tables for every layer passes False after the first.
    _profile_skip: profiling only, wrong results (1: no q.k, 2: no P.V, 4: no page work).
    """
    if impl == "reference":
        return paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens)
    if impl == "torch" or (impl == "auto" and not load_extension()):
        return torch_paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens)
    if impl not in ("auto", "ext", "scalar"):
        raise ValueError(f"unknown impl {impl!r}")
    if not load_extension():
        raise RuntimeError(f"the CPU attention extension is unavailable: {_state['error']}")
    if q.dtype != k_cache.dtype:
        q = q.to(k_cache.dtype)
    if q.stride(-1) != 1:
        q = q.contiguous()
    tables = block_tables.to(torch.int32)
    if tables.stride(-1) != 1:
        tables = tables.contiguous()
    lens = context_lens.to(torch.int32).contiguous()
    if validate:
        check_inputs(q, k_cache, v_cache, tables, lens)
    return torch.ops.dualpace_cpu.paged_decode_attention(
        q, k_cache, v_cache, tables, lens, impl == "scalar", prefetch_blocks, heads_per_unit,
        pv_bf16, _profile_skip, prefetch_mode)


def check_inputs(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
) -> None:
    """Raise ValueError for inputs the kernel would refuse. (Done in Python: a C++ exception
    thrown by the extension's op crashed the process under torch 2.11 on the accelerator
    machine instead of becoming a RuntimeError.)"""
    tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "block_tables": block_tables,
               "context_lens": context_lens}
    for name, t in tensors.items():
        if t.device.type != "cpu":
            raise ValueError(f"{name} is on {t.device}; the CPU kernel needs CPU tensors")
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"want q [B, heads, hd] and caches [blocks, kv_heads, block_size, hd], "
                         f"got {tuple(q.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise ValueError(f"q, K and V differ in dtype: {q.dtype}, {k_cache.dtype}, "
                         f"{v_cache.dtype}")
    if q.dtype not in (torch.bfloat16, torch.float32, torch.float16):
        raise ValueError(f"unsupported dtype {q.dtype}")
    b, n_heads, hd = q.shape
    n_blocks, kv_heads, bs, hd_c = k_cache.shape
    if hd != hd_c or n_heads % kv_heads:
        raise ValueError(f"q {tuple(q.shape)} does not fit caches {tuple(k_cache.shape)}")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("head_dim must be contiguous in q and the caches")
    if block_tables.dtype != torch.int32 or context_lens.dtype != torch.int32:
        raise ValueError("block_tables and context_lens must be int32")
    if block_tables.dim() != 2 or block_tables.shape[0] != b or context_lens.shape != (b,):
        raise ValueError(f"want block_tables [{b}, max_blocks] and context_lens [{b}], got "
                         f"{tuple(block_tables.shape)} and {tuple(context_lens.shape)}")
    if b == 0:
        return
    need = (context_lens.to(torch.int64).clamp(min=0) + bs - 1) // bs
    width = block_tables.shape[1]
    if int(need.max()) > width:
        i = int(need.argmax())
        raise ValueError(f"request {i}: context {int(context_lens[i])} needs {int(need[i])} "
                         f"blocks, its table has {width}")
    used = torch.arange(width)[None, :] < need[:, None]
    ids = block_tables[used]
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n_blocks):
        bad = used & ((block_tables < 0) | (block_tables >= n_blocks))
        i, j = (int(x) for x in bad.nonzero()[0])
        raise ValueError(f"request {i}: block id {int(block_tables[i, j])} outside the pool's "
                         f"{n_blocks} blocks")


def pin_threads(cores: list[int]) -> int:
    """Pin each OpenMP thread of the calling thread's team to one of `cores` (0 if the
    extension is missing: the caller's affinity mask, inherited by new threads, still holds)."""
    if not load_extension():
        return 0
    return int(torch.ops.dualpace_cpu.pin_threads(list(cores)))


def omp_threads() -> int:
    """Threads a parallel region started by the calling thread uses (torch.get_num_threads()
    when the extension is missing)."""
    if not load_extension():
        return torch.get_num_threads()
    return int(torch.ops.dualpace_cpu.omp_threads())


def stream_read(t: torch.Tensor) -> float:
    """A streaming read of every byte of a contiguous CPU tensor with all threads."""
    if not load_extension():
        return float(t.view(torch.uint8).sum(dtype=torch.int64))
    return float(torch.ops.dualpace_cpu.stream_read(t))


def hugepage_empty(shape: tuple[int, ...], dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """A zeroed tensor in memory advised for transparent huge pages (MADV_HUGEPAGE), for host
    KV pools: with 4 KiB pages every (block, head) page the attention reads is a TLB miss too.
    Falls back to torch.zeros without the extension."""
    numel = 1
    for n in shape:
        numel *= n
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if not load_extension() or nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    raw = torch.ops.dualpace_cpu.empty_hugepage(nbytes)
    return raw.view(dtype).view(shape)
