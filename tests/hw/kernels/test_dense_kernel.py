"""The CPU dense kernel (csrc/dense.cpp): its blocked weight layout, and each of its paths this
machine can run against a float32 reference at every row count the CPU tier is judged at
(CI runs the portable path; the AMX and AVX512-BF16 paths run where the CPU has them)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dualpace_hw.executors.packed import (
    SMALL_ROWS,
    PackedDense,
    dense_isas,
    pack_weight,
    packed_linear,
    unpack_weight,
)
from dualpace_hw.kernels.cpu_attention import extension_available

pytestmark = pytest.mark.skipif(not extension_available(), reason="no C++ extension here")

ROWS = (1, 2, 4, 8, 16, 32, 48, 63, 64, 65, 96, 128, 256, 512, 1024)


def _weight(n_out: int, n_in: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return ((torch.rand(n_out, n_in, generator=g) - 0.5) / n_in ** 0.5).to(torch.bfloat16)


def _rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.float() - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("n_out,n_in", [(96, 64), (130, 66), (256, 128)])
def test_the_layout_round_trips_and_pads_the_last_block_with_zeros(n_out, n_in):
    w = _weight(n_out, n_in)
    packed = pack_weight(w)
    assert packed.shape == (-(-n_out // 32), n_in // 2, 32, 2)
    assert torch.equal(unpack_weight(packed, n_out), w)
    tail = packed.permute(0, 2, 1, 3).reshape(-1, n_in)[n_out:]
    assert not tail.any()


@pytest.mark.parametrize("isa", dense_isas())
def test_every_path_matches_a_float32_reference_at_every_row_count(isa):
    # in_features 192 spans several k-steps of every path; 130 outputs leave a partial block
    w = _weight(130, 192, seed=1)
    packed = pack_weight(w)
    g = torch.Generator().manual_seed(2)
    for rows in ROWS:
        x = torch.randn(rows, 192, generator=g).to(torch.bfloat16)
        got = packed_linear(x, packed, 130, isa)
        assert got.shape == (rows, 130) and got.dtype == torch.bfloat16
        ref = F.linear(x.float(), w.float())
        # one bf16 rounding of the output over fp32 sums
        assert _rel_err(got, ref) < 8e-3, (isa, rows)


@pytest.mark.parametrize("isa", dense_isas())
@pytest.mark.parametrize("n_in", [2080, 2082])
def test_the_k_chunks_groups_and_panels_add_up_at_a_long_k(isa, n_in):
    """in_features past one k-chunk (1,024): up to 128 rows block-major, each panel over the
    whole k of every column block in turn; at 161 rows panel-major, partial sums carried across
    chunks (65 steps of 32: chunks of 32, 32 and 1; 2,082 ends in a step of 2) in groups of 4
    of the 10 column blocks; rows that fill, cross and leave part of the 32-row panels."""
    if isa == "amx" and n_in % 32:
        pytest.skip("the AMX path takes in_features in multiples of 32")
    w = _weight(300, n_in, seed=4)
    packed = pack_weight(w)
    g = torch.Generator().manual_seed(5)
    for rows in (1, 31, 33, 65, 100, 161):
        x = torch.randn(rows, n_in, generator=g).to(torch.bfloat16)
        ref = F.linear(x.float(), w.float())
        assert _rel_err(packed_linear(x, packed, 300, isa), ref) < 8e-3, (isa, rows)


@pytest.mark.parametrize("isa", dense_isas())
@pytest.mark.parametrize("n_in", [4160, 4162])
def test_both_blockings_add_up_on_either_side_of_their_boundary(isa, n_in):
    """At in_features 4,160 (130 steps) up to 96 rows (3 panels) pass block-major over the whole
    k; from 97 rows (4 panels) x's panels and two blocks outgrow the block-major L2 budget, and
    the panels pass panel-major over k-chunks of 32, 32, 32, 32 and 2 steps (4,162: the last
    step holds 2 k), carrying the sums across them, in groups of 4 of the 10 column blocks."""
    if isa == "amx" and n_in % 32:
        pytest.skip("the AMX path takes in_features in multiples of 32")
    w = _weight(300, n_in, seed=6)
    packed = pack_weight(w)
    g = torch.Generator().manual_seed(7)
    for rows in (65, 96, 97, 128):
        x = torch.randn(rows, n_in, generator=g).to(torch.bfloat16)
        ref = F.linear(x.float(), w.float())
        assert _rel_err(packed_linear(x, packed, 300, isa), ref) < 8e-3, (isa, rows)


@pytest.mark.parametrize("isa", dense_isas())
@pytest.mark.parametrize("n_in", [4096, 4098])
def test_two_panels_add_up_block_major_at_the_models_k(isa, n_in):
    """At the model's in_features (4,096: 128 steps) 33-64 rows are two 32-row panels passing
    block-major over the whole k, the second panel from L2 while it streams the next block
    (4,098 ends in a step of 2 on the paths that take it); 300 outputs end in a partial block,
    and 65 rows start a third panel."""
    if isa == "amx" and n_in % 32:
        pytest.skip("the AMX path takes in_features in multiples of 32")
    w = _weight(300, n_in, seed=8)
    packed = pack_weight(w)
    g = torch.Generator().manual_seed(9)
    for rows in (33, 48, 63, 64, 65):
        x = torch.randn(rows, n_in, generator=g).to(torch.bfloat16)
        ref = F.linear(x.float(), w.float())
        assert _rel_err(packed_linear(x, packed, 300, isa), ref) < 8e-3, (isa, rows)


@pytest.mark.parametrize("isa", dense_isas())
def test_rows_do_not_interfere_across_row_blocks(isa):
    """Each output row depends on its own input row only, across the 32-row tiles and the
    4-row micro-kernel groups (a row of zeros gives zeros, wherever it sits)."""
    w = _weight(64, 64, seed=3)
    packed = pack_weight(w)
    x = torch.randn(70, 64).to(torch.bfloat16)
    x[[0, 31, 32, 33, 69]] = 0
    y = packed_linear(x, packed, 64, isa)
    assert not y[[0, 31, 32, 33, 69]].any()
    alone = packed_linear(x[40:41].contiguous(), packed, 64, isa)
    torch.testing.assert_close(y[40:41], alone, atol=0, rtol=0)


def test_packed_linear_refuses_mismatched_inputs_with_a_value_error():
    packed = pack_weight(_weight(32, 64))
    with pytest.raises(ValueError, match="wants x"):
        packed_linear(torch.randn(3, 62).to(torch.bfloat16), packed, 32, "portable")
    with pytest.raises(ValueError, match="out_features"):
        packed_linear(torch.randn(3, 64).to(torch.bfloat16), packed, 33, "portable")
    with pytest.raises(ValueError, match="unknown dense kernel path"):
        packed_linear(torch.randn(3, 64).to(torch.bfloat16), packed, 32, "sse2")


def test_packed_dense_uses_the_fast_paths_or_says_why_not():
    w = _weight(96, 64)
    d = PackedDense(w)
    fast = [i for i in dense_isas() if i != "portable"]
    if fast:
        assert d.is_packed and d.isa == fast[0] and d.fallback_reason is None
        assert d.small_isa in fast
    else:
        assert not d.is_packed and "AMX-BF16 or AVX512-BF16" in d.fallback_reason
    for rows in (1, SMALL_ROWS, SMALL_ROWS + 1, 40):
        x = torch.randn(rows, 64).to(torch.bfloat16)
        assert _rel_err(d(x), F.linear(x.float(), w.float())) < 8e-3
    x3 = torch.randn(2, 5, 64).to(torch.bfloat16)  # leading dims and a strided input
    assert d(x3).shape == (2, 5, 96)
    assert _rel_err(d(x3), F.linear(x3.float(), w.float())) < 8e-3
    xt = torch.randn(64, 7).to(torch.bfloat16).t()
    assert _rel_err(d(xt), F.linear(xt.float(), w.float())) < 8e-3
