"""`python -m dualpace_sim.validation.analysis.neo_rounds` on committed runs prints the
figures docs/validation/ cites."""

from __future__ import annotations

import re

from tests.validation.analysis.running import run


def test_neo_rounds_are_the_documented_ones_and_price_the_floors(azure_dir, tmp_path):
    """The real NEO run at 3 req/s by class: its GPU-only decode iterations are the 2.5x; priced
    with a profile that has NEO's decode floor, each class's layer is held to its floors."""
    from dualpace_sim.costs import load_profile

    env = {"DUALPACE_AZURE_DIR": str(azure_dir)}
    args = ("--scenario", "scenarios/h200/cpu-busy/llama-3.1-8b-r3.yaml",
            "--real", "docs/validation/cpu-busy/r3/real")
    out = run("neo_rounds", *args, env=env)
    assert re.search(r"GPU-only, decode +13900 +246\.91 +84\.21 +84\.21 +2\.50 +0\.431 +0\.147",
                     out)
    assert re.search(r"GPU-only, prefill +79 +2\.56 +1\.29 +2\.34 +1\.04 +0\.892 +0\.857", out)
    assert re.search(r"pipelined, prefill +105 +10\.99 +3\.90 +3\.98 +2\.89 +3\.171 +1\.019", out)
    assert re.search(r"all +14241 +264\.31", out)
    profile = load_profile("docs/validation/cpu-busy/r3/real/profile.yaml")
    profile.neo.eager_decode_layer_s = 2e-3  # above every class's kernels
    profile.save(tmp_path / "floor.yaml")
    priced = run("neo_rounds", *args, "--costs", str(tmp_path / "floor.yaml"), env=env)
    layer = {line[:25].strip(): float(line.split()[-1]) for line in priced.splitlines()[1:]}
    eager = profile.gpu.eager_layer_s * 1e3
    assert layer["GPU-only, decode"] == 2.0
    assert layer["GPU-only, prefill"] == round(eager, 3)
    assert layer["pipelined, prefill"] == round(eager + 2.0, 3)  # both sub-batches issued
