from types import SimpleNamespace

import numpy as np
import pytest

from dualpace_sim.plots import plot_latency_cdf, plot_timeline
from dualpace_sim.records import records_frame


def frame(policy: str, slowdown: float):
    rng = np.random.default_rng(1)
    reqs = []
    for i in range(50):
        times = 0.2 * i + np.cumsum(rng.exponential(0.05 * slowdown, 20))
        owners = bytearray(rng.integers(0, 2, 20).astype(np.uint8))
        reqs.append(SimpleNamespace(req_id=i, arrival_s=0.2 * i, prompt_tokens=10, max_tokens=20,
                                    token_times=times.tolist(), token_owners=owners, migrations=[]))
    return records_frame(reqs, policy)


@pytest.mark.parametrize("plot", [plot_timeline, plot_latency_cdf])
def test_plots_write_png_and_pdf(tmp_path, plot):
    frames = {"dualpace": frame("dualpace", 1.0), "vllm": frame("vllm", 2.0),
              "idle": records_frame([], "idle")}
    stem = tmp_path / "figs" / plot.__name__
    plot(frames, stem)
    png = stem.with_name(stem.name + ".png").read_bytes()
    pdf = stem.with_name(stem.name + ".pdf").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 1000
    assert pdf.startswith(b"%PDF") and len(pdf) > 1000
