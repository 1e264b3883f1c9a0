"""Small hand-built fixtures for the unit tests of the scheduling core.

Each helper puts one request into one queue of an `EngineState`, holding the blocks a real run
would have given it, so that `state.check_invariants()` holds after construction. Block counts
default to what the request's KV occupies (prompt + generated - 1 tokens once it decodes); pass
`blocks=` to override.
"""

from __future__ import annotations

from dualpace_sim.core import (
    CpuScheduler,
    EngineState,
    GpuScheduler,
    Owner,
    Request,
    RoundLog,
    SchedulerConfig,
    blocks_for,
)
from dualpace_sim.core.rounds import CpuDriver, GpuDriver, RoundKind
from dualpace_sim.core.state import host_growth

BS = 4  # block size used throughout the unit tests: small numbers are easy to check by hand

_next_id = [0]


def make_state(gpu: int = 64, host: int = 256, **limits) -> EngineState:
    """An empty state with `gpu` HBM blocks and `host` host blocks; other limits by keyword."""
    limits.setdefault("block_size", BS)
    limits.setdefault("route_p", 0)
    limits.setdefault("route_f", 0)
    return EngineState(SchedulerConfig(gpu_kv_blocks=gpu, host_kv_blocks=host, **limits))


def make_req(
    prompt: int, max_tokens: int = 8, generated: int = 0, *, bs: int = BS, req_id: int | None = None
) -> Request:
    """A request that has already emitted `generated` tokens (times 0.0, 1.0, ...)."""
    if req_id is None:
        req_id = _next_id[0]
        _next_id[0] += 1
    r = Request.create(req_id, 0.0, prompt, max_tokens, bs)
    r.prefilled = prompt if generated else 0
    rounds = RoundLog()
    for i in range(generated):
        r.emit(float(i), Owner.GPU, rounds)
    return r


def kv_blocks(r: Request, bs: int = BS) -> int:
    """Blocks a decoding request holds: its KV covers prompt + generated - 1 tokens."""
    return blocks_for(r.prompt_tokens + max(r.generated - 1, 0), bs)


def _held(r: Request, blocks: int | None) -> int:
    return kv_blocks(r) if blocks is None else blocks


def gpu_running(st: EngineState, r: Request, blocks: int | None = None) -> Request:
    """A GPU-owned decoding request at the eviction tail of the GPU ownership queue."""
    r.blocks = st.hbm.allocate(_held(r, blocks))
    r.owner, r.ready, r.transit_to = Owner.GPU, True, None
    st.gpu_running.append(r)
    st.gpu_queue_peak += r.peak_blocks
    st.gpu_context += r.kv_tokens_after_step
    if r.next_blocks(st.config.block_size):
        st.gpu_growing.append(r)
    st.n_submitted += 1
    return r


def gpu_waiting(st: EngineState, r: Request) -> Request:
    """A prompt waiting for admission."""
    st.submit(r)
    return r


def gpu_prefilling(
    st: EngineState, r: Request, prefilled: int, to_cpu: bool = False
) -> Request:
    """A prompt whose chunked prefill is under way (persistent blocks already allocated)."""
    pool = st.host if to_cpu else st.hbm
    r.blocks = pool.allocate(blocks_for(r.prompt_tokens, st.config.block_size))
    r.prefilled, r.to_cpu = prefilled, to_cpu
    st.gpu_prefilling.append(r)
    if to_cpu:
        st.waiting_growth += host_growth(r)
    else:
        st.gpu_queue_peak += r.peak_blocks
    st.n_submitted += 1
    return r


def cpu_running(st: EngineState, r: Request, blocks: int | None = None) -> Request:
    """A request in the active CPU batch; keeps B_growth (Σ b̂ - b) and the Σ context up to
    date."""
    r.blocks = st.host.allocate(_held(r, blocks))
    r.owner, r.ready, r.transit_to = Owner.CPU, True, None
    st.cpu_running.append(r)
    st.cpu_growth += max(r.peak_blocks - len(r.blocks), 0)
    st.cpu_context += r.prompt_tokens + r.generated
    st.n_submitted += 1
    return r


def cpu_waiting(
    st: EngineState, r: Request, blocks: int | None = None, ready: bool = True
) -> Request:
    """A host-resident request in the CPU waiting queue; `ready=False` models a swap-out whose
    transfer has not landed yet (still GPU-owned, in transit to the CPU)."""
    r.blocks = st.host.allocate(_held(r, blocks))
    if ready:
        r.owner, r.ready, r.transit_to = Owner.CPU, True, None
    else:
        r.owner, r.ready, r.transit_to = Owner.GPU, False, Owner.CPU
    st.cpu_waiting.append(r)
    st.waiting_growth += host_growth(r)
    st.n_submitted += 1
    return r


def mark(st: EngineState, r: Request) -> Request:
    """A deferred swap-in mark, as a GPU round's commit places it."""
    st.marked[r.req_id] = r
    return r


def gpu_round(st: EngineState, t: float | None = 1.0):
    """A GPU round's begin (schedule + commit), and unless `t` is None its migrations landing
    and its end (apply) at time `t`; a round waiting for copies only begins."""
    driver = GpuDriver(GpuScheduler(st))
    rnd = driver.begin(0.0)
    st.check_invariants()
    if t is not None and rnd.kind is not RoundKind.WAIT_FOR_COPIES:
        if rnd.lands:
            driver.landed(rnd, t)
        if rnd.forward:
            driver.end(rnd, t)
        st.check_invariants()
    return rnd.plan


def cpu_round(st: EngineState, t: float | None = 1.0):
    """A CPU round's begin (schedule + commit), and its end (apply) at time `t` unless `t` is
    None."""
    driver = CpuDriver(CpuScheduler(st))
    rnd = driver.begin(0.0)
    st.check_invariants()
    if t is not None and not rnd.idle:
        driver.end(rnd, t)
        st.check_invariants()
    return rnd.plan
