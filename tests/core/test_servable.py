"""The up-front refusals name the real cause: NEO's pools, before any one request."""

from dualpace_sim.core.neo import NeoConfig
from dualpace_sim.core.servable import neo_pool_refusal, neo_refusal


def neo(gpu: int, host: int, **kw) -> NeoConfig:
    return NeoConfig(gpu_kv_blocks=gpu, host_kv_blocks=host, block_size=16, **kw)


def test_a_host_pool_no_larger_than_hbm_is_refused_for_what_it_is():
    reason = neo_pool_refusal(neo(32008, 12000))
    assert reason.startswith("NEO needs a host KV pool larger than the HBM pool")
    assert "scheduler.host_kv_blocks - scheduler.gpu_kv_blocks = 12000 - 32008 = -20008" in reason
    assert "set scheduler.gpu_kv_blocks below 12000 or scheduler.host_kv_blocks above 32008" \
        in reason
    assert neo_pool_refusal(neo(4096, 4096)) is not None
    assert neo_pool_refusal(neo(4096, 4097)) is None


def test_a_prompt_beyond_the_room_past_the_swap_reserve_names_that_room():
    reason = neo_refusal(neo(1000, 1100, max_tokens_in_batch=8192), 16 * 200, 16)
    assert "more than NEO admits into the host pool beyond the HBM pool's worth" in reason
    assert "(scheduler.host_kv_blocks - scheduler.gpu_kv_blocks = 100)" in reason


def test_a_prompt_beyond_the_staging_pool_names_neo_itm_blocks():
    reason = neo_refusal(neo(1000, 4000, max_tokens_in_batch=8192, itm_blocks=50), 16 * 60, 16)
    assert "more than NEO can stage (neo.itm_blocks, default the HBM pool: 50)" in reason
