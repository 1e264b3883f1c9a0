import math
import time
import warnings
from contextlib import contextmanager

import pytest

from dualpace_sim.costs import (
    CostExtrapolationWarning,
    CostModel,
    ModelShape,
    load_spec,
    synthesize,
)
from dualpace_sim.costs.model import AXIS_MEMO_SIZE, Interp1D, Interp2D
from dualpace_sim.costs.profile import Table1D, Table2D

LOG_X = [1.0, 10.0, 100.0]
LIN_X = [1.0, 2.0, 4.0]  # spans less than a decade: linear


@pytest.fixture(scope="module")
def cm() -> CostModel:
    return CostModel(synthesize(load_spec("h200-spr16"), ModelShape.from_name("tiny-llama")))


@contextmanager
def _no_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error", CostExtrapolationWarning)
        yield


def test_exact_at_grid_points():
    table = Table1D(x=LOG_X, y=[3.0, 7.0, 50.0])
    f = Interp1D("t", table)
    with _no_warnings():
        for x, y in zip(table.x, table.y, strict=True):
            assert f(x) == pytest.approx(y, rel=1e-12)


def test_linear_between_points_on_a_short_axis():
    f = Interp1D("t", Table1D(x=LIN_X, y=[1.0, 3.0, 4.0]))
    assert f(1.5) == pytest.approx(2.0)
    assert f(3.0) == pytest.approx(3.5)


def test_log_log_between_points_on_a_wide_axis():
    f = Interp1D("t", Table1D(x=LOG_X, y=[1.0, 100.0, 10000.0]))  # y = x^2
    assert f(math.sqrt(10.0)) == pytest.approx(10.0)
    assert f(50.0) == pytest.approx(2500.0)


def test_zero_values_fall_back_to_linear_y():
    f = Interp1D("t", Table1D(x=LOG_X, y=[0.0, 1.0, 2.0]))
    # log x, linear y: halfway in log x between 10 and 100 is sqrt(1000)
    assert f(math.sqrt(1000.0)) == pytest.approx(1.5)


def test_extrapolation_follows_last_segment_and_warns_once():
    f = Interp1D("gpu.post_attn", Table1D(x=LOG_X, y=[1.0, 100.0, 10000.0]))
    with pytest.warns(CostExtrapolationWarning, match=r"gpu.post_attn: x=1000") as record:
        assert f(1000.0) == pytest.approx(1e6)  # power law continues
        assert f(0.1) == pytest.approx(0.01)
        f(5000.0)
    assert len(record) == 1


def test_linear_extrapolation_never_goes_negative():
    f = Interp1D("t", Table1D(x=LIN_X, y=[1.0, 0.5, 0.0]))
    with pytest.warns(CostExtrapolationWarning):
        assert f(8.0) == 0.0


def test_each_table_warns_separately():
    a = Interp1D("a", Table1D(x=LIN_X, y=[1.0, 2.0, 3.0]))
    b = Interp1D("b", Table1D(x=LIN_X, y=[1.0, 2.0, 3.0]))
    with pytest.warns(CostExtrapolationWarning) as record:
        a(10.0)
        b(10.0)
        a(11.0)
    assert [str(w.message).split(":")[0] for w in record] == ["cost table a", "cost table b"]


def test_integer_lookups_are_memoized():
    f = Interp1D("t", Table1D(x=LOG_X, y=[1.0, 2.0, 3.0]))
    value = f(42)
    assert f._memo == {42: value}
    f(42.5)
    assert 42.5 not in f._memo


def test_bilinear_lookups_remember_integer_axis_positions_up_to_a_bound():
    """A 2-D table remembers where integer queries fall on each axis (batch sizes repeat), gives
    the same values with and without the memo, and stops remembering past AXIS_MEMO_SIZE."""
    xs, ys = [1.0, 10.0, 100.0], [10.0, 100.0, 1000.0]
    table = Table2D(x=xs, y=ys, z=[[x * y + 1 for y in ys] for x in xs])
    g = Interp2D("t", table)
    queries = [(b, c) for b in (1, 7, 33, 99) for c in (10, 64, 777, 999)]
    first = [g(b, c) for b, c in queries]
    assert set(g.ax._memo) == {1, 7, 33, 99} and set(g.ay._memo) == {10, 64, 777, 999}
    assert [g(b, c) for b, c in queries] == first == [Interp2D("u", table)(float(b), float(c))
                                                       for b, c in queries]
    for c in range(10, 10 + AXIS_MEMO_SIZE + 50):
        g(1, c)
    assert len(g.ay._memo) == AXIS_MEMO_SIZE


def test_bilinear_exact_and_between():
    # z = x + 10 y on linear axes is reproduced exactly by bilinear interpolation
    xs, ys = [1.0, 2.0, 3.0], [0.0, 1.0]
    g = Interp2D("t", Table2D(x=xs, y=ys, z=[[x + 10 * y for y in ys] for x in xs]))
    with _no_warnings():
        assert g(2.0, 1.0) == pytest.approx(12.0)
        assert g(2.5, 0.25) == pytest.approx(5.0)


def test_bilinear_log_axes_and_one_warning():
    xs, ys = [1.0, 10.0, 100.0], [10.0, 100.0, 1000.0]
    g = Interp2D("gpu.decode_attn", Table2D(x=xs, y=ys, z=[[x * y for y in ys] for x in xs]))
    assert g(10.0, 100.0) == pytest.approx(1000.0)
    assert g(math.sqrt(10.0), math.sqrt(1000.0)) == pytest.approx(100.0)
    with pytest.warns(CostExtrapolationWarning, match=r"gpu.decode_attn: \(x=1000, y=10\)") as rec:
        assert g(1000.0, 10.0) == pytest.approx(1e4)
        g(1.0, 1e5)
    assert len(rec) == 1


def test_decode_attention_is_read_linearly_in_the_context_it_streams():
    """Attention affine in the context (a fixed cost plus the KV it reads), on the profiler's
    log-spaced grid: read linearly in the context it is exact between the points, where a
    log-log reading bows above the line (by a fifth here, at the segment's geometric middle)."""
    xs, ys = [1.0, 16.0, 256.0], [1024.0, 16384.0, 262144.0]
    z = [[2e-4 * (1 + 0.01 * x) + 6.7e-8 * y for y in ys] for x in xs]
    table = Table2D(x=xs, y=ys, z=z)
    affine, loglog = Interp2D("t", table, affine_in_y=True), Interp2D("t", table)
    for x in (1.0, 16.0, 256.0):
        for y in (2048.0, 4096.0, 65536.0, 100_000.0):
            exact = 2e-4 * (1 + 0.01 * x) + 6.7e-8 * y
            assert affine(x, y) == pytest.approx(exact)
    assert loglog(16.0, 4096.0) / affine(16.0, 4096.0) > 1.2


def test_the_model_reads_both_decode_attention_tables_as_affine_in_context(cm):
    """Between two context points the model's decode attention is the line through them."""
    for table, price in ((cm.profile.gpu.decode_attn, cm.gpu_decode_attn),
                         (cm.profile.cpu.decode_attn, cm.cpu_decode_attn)):
        x, (y0, y1) = table.x[1], table.y[2:4]
        i = table.x.index(x)
        z0, z1 = table.z[i][2], table.z[i][3]
        assert price(int(x), int((y0 + y1) / 2)) == pytest.approx((z0 + z1) / 2)


def test_gpu_layer_is_the_sum_of_its_parts(cm):
    layer = cm.gpu_layer(300, [(200, 1200), (36, 36)], 64, 64 * 900)
    parts = (
        cm._g_pre_attn(300)
        + cm._g_post_attn(300)
        + cm._g_prefill_attn(200, 1200)
        + cm._g_prefill_attn(36, 36)
        + cm._g_decode_attn(64, 64 * 900)
    )
    assert layer == pytest.approx(parts)
    assert cm.gpu_layer(64, [], 64, 6400) > cm.gpu_layer(64, [], 0, 0)
    assert cm.gpu_layer(0, [], 0, 0) == 0.0


def test_eager_floor_binds_only_batches_with_prefill_chunks(cm):
    """Batches with prefill chunks run without CUDA graphs: a layer costs at least the host's
    launch time. Decode-only batches replay graphs and keep their GPU time."""
    profile = cm.profile.model_copy(deep=True)
    floor = 10 * cm.gpu_layer(40, [(8, 8)], 32, 32 * 100)
    profile.gpu.eager_layer_s = floor
    eager = CostModel(profile)
    assert cm.gpu_eager_layer == 0.0
    assert eager.gpu_layer(40, [(8, 8)], 32, 32 * 100) == floor
    assert eager.gpu_layer(32, [], 32, 32 * 100) == cm.gpu_layer(32, [], 32, 32 * 100) < floor
    big = cm.gpu_layer(60_000, [(60_000, 60_000)], 0, 0)
    assert big > floor and eager.gpu_layer(60_000, [(60_000, 60_000)], 0, 0) == big


def test_the_floor_beside_a_cpu_engine_applies_only_where_one_runs(cm):
    """DualPace's GPU engine shares the box with the CPU engine: its eager floor is the one the
    profiler measured beside it; without that measurement, the plain floor."""
    profile = cm.profile.model_copy(deep=True)
    floor = 10 * cm.gpu_layer(40, [(8, 8)], 32, 32 * 100)
    profile.gpu.eager_layer_s = floor
    assert CostModel(profile).gpu_layer(40, [(8, 8)], 32, 3200, beside_cpu=True) == floor
    profile.gpu.eager_layer_beside_cpu_s = 2 * floor
    both = CostModel(profile)
    assert both.gpu_layer(40, [(8, 8)], 32, 3200, beside_cpu=True) == 2 * floor
    assert both.gpu_layer(40, [(8, 8)], 32, 3200) == floor
    assert both.gpu_layer(32, [], 32, 3200, beside_cpu=True) == cm.gpu_layer(32, [], 32, 3200)


def test_gpu_forward(cm):
    prefills = [(100, 100)]
    forward = cm.gpu_forward(132, prefills, 32, 32 * 500)
    expected = (
        cm.gpu_pre_layer(132)
        + cm.n_layers * cm.gpu_layer(132, prefills, 32, 32 * 500)
        + cm.gpu_post_layer(33)
        + cm.gpu_iteration_overhead
    )
    assert forward == pytest.approx(expected)
    assert cm.gpu_post_layer(0) == 0.0


def test_cpu_and_assist_primitives(cm):
    assert cm.cpu_layer_local(8, 8000) == pytest.approx(
        cm._c_pre_attn(8) + cm._c_decode_attn(8, 8000)
    )
    for fn in (cm.cpu_pre_layer, cm.cpu_post_attn, cm.cpu_post_layer, cm.cpu_assist_write):
        assert fn(0) == 0.0 and fn(4) > 0
    assert cm.cpu_assist_read(4) > 0 and cm.cpu_hidden_write(4) > 0
    for kind in ("p", "lA", "lS"):
        assert cm.assist_gpu(kind, 16) > 0
        assert cm.assist_q(kind) == pytest.approx(3e-5)
        assert cm.assist_o(kind) == pytest.approx(2e-5)
    assert cm.assist_gpu("lA", 16) > cm.assist_gpu("p", 16)
    assert cm.poll_s > 0 and cm.cpu_iteration_overhead > 0


def test_link_and_sizes(cm):
    link = cm.profile.link
    assert cm.h2d_time(0) == 0.0
    assert cm.h2d_time(1e6) == pytest.approx(link.latency_s + 1e6 / link.h2d_bytes_per_s)
    assert cm.d2h_time(1e6) == pytest.approx(link.latency_s + 1e6 / link.d2h_bytes_per_s)
    s = cm.shape
    assert cm.kv_block_bytes_per_layer == 16 * 2 * s.n_kv_heads * s.head_dim * 2
    assert cm.kv_block_bytes == cm.kv_block_bytes_per_layer * s.n_layers
    assert cm.activation_bytes(8) == 8 * s.hidden_size * 2
    assert (cm.block_size, cm.gpu_kv_blocks) == (16, cm.profile.gpu.kv_capacity_blocks)
    assert cm.cpu_kv_blocks == cm.profile.cpu.kv_capacity_blocks


def test_lookups_are_fast(cm):
    start = time.perf_counter()
    for i in range(20_000):
        cm.gpu_layer(64 + i % 512, [(64, 64 + i)], 1 + i % 256, 1000 + 37 * i)
        cm.cpu_post_attn(1 + i % 1024)
    assert time.perf_counter() - start < 1.0  # ~5 us per iteration here


def test_the_rank_groups_round_work_is_charged_by_rows_under_tensor_parallelism(cm):
    """`gpu.rank_round` (measured under GPU tensor parallelism) adds to every round's fixed
    part by the round's rows; a one-GPU profile has none."""
    assert cm.profile.gpu.rank_round is None
    assert cm.gpu_round_overhead(64) == cm.gpu_iteration_overhead
    profile = cm.profile.model_copy(deep=True)
    profile.gpu.rank_round = Table1D(x=[1, 64], y=[1e-3, 2.5e-3])
    tp = CostModel(profile)
    assert tp.gpu_round_overhead(1) == pytest.approx(cm.gpu_iteration_overhead + 1e-3)
    assert tp.gpu_round_overhead(64) == pytest.approx(cm.gpu_iteration_overhead + 2.5e-3)
    assert cm.gpu_iteration_overhead + 1e-3 < tp.gpu_round_overhead(4) < \
        cm.gpu_iteration_overhead + 2.5e-3
    assert tp.gpu_round_overhead(0) == cm.gpu_iteration_overhead
    prefills = [(100, 100)]
    assert tp.gpu_forward(132, prefills, 32, 32 * 500) == pytest.approx(
        cm.gpu_forward(132, prefills, 32, 32 * 500) + tp.gpu_round_overhead(33)
        - cm.gpu_iteration_overhead)
