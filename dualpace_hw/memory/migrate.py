"""KV migrations between the HBM pool and the pinned host pool, on a copy stream of their own.

`Migrator(gpu_pool, host_pool)` moves whole blocks (swap-out, swap-in: every layer, K and V)
and single layers of a Prefill-to-CPU chunk. On CUDA each call is issued on a dedicated
high-priority stream after a GPU-side wait for the compute work issued so far (so it copies the
KV that work wrote), and returns a `CopyHandle` with an event: `.done()` queries it, `.wait()`
blocks the host, `.block(stream)` makes another stream wait on the GPU (the compute stream waits
only where it reads or overwrites the copied blocks). On the CPU device the copies are
synchronous.

Copy methods on CUDA:

* "dma" (copy engines). Pairs of (GPU block, host block) are sorted by host id and cut into
  runs. Where the GPU ids run along with the host ids, each run is copied directly; otherwise
  the GPU side goes through one contiguous staging buffer (one index_select / index_copy_ over
  every layer at HBM speed). Each run is ONE strided DMA over all layers and K/V
  (cudaMemcpy2DAsync, one row per (layer, K/V)), so a swap of a request whose host blocks are a
  few runs is a few large DMAs and little host work. Without the runtime symbol the same copy
  is a loop of per-(layer, K/V) copies.
* "kernel": one Triton kernel that reads and writes the pinned host pool directly over PCIe
  (zero-copy through unified addressing), any fragmentation in one launch, no staging; for
  fragmented host ids, where DMA would be many small copies. It occupies SMs while it runs.

"auto" picks "dma" when the host ids form runs of 4 blocks or more on average, else "kernel".
Host block ids come from a LIFO free list and are mostly long runs (ascending or descending).

Under GPU tensor parallelism a rank's host pool is a view of the shared pool holding only its
KV heads (`PagedKVPool.heads`): a page's head slice is still contiguous, but consecutive blocks
are a full page apart, so a run becomes one strided DMA per (layer, K/V) row instead of one for
all rows, and the kernel's offsets follow the view's strides.
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dualpace_hw.kernels.triton_decode import HAVE_TRITON
from dualpace_hw.memory.kv import PagedKVPool

if HAVE_TRITON:  # pragma: no cover - depends on the machine
    import triton
    import triton.language as tl

    @triton.jit
    def _copy_chunks_kernel(src_ptr, dst_ptr, src_off_ptr, dst_off_ptr, n_items,
                            CHUNK: tl.constexpr, BLOCK: tl.constexpr):
        """Copy n_items chunks of CHUNK elements: dst[dst_off[i]:] = src[src_off[i]:]."""
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        offs = tl.arange(0, BLOCK)
        for i in range(pid, n_items, nprog):
            so = tl.load(src_off_ptr + i)
            do = tl.load(dst_off_ptr + i)
            for c in tl.static_range(0, CHUNK, BLOCK):
                m = (c + offs) < CHUNK
                x = tl.load(src_ptr + so + c + offs, mask=m)
                tl.store(dst_ptr + do + c + offs, x, mask=m)


class CopyHandle:
    """Readiness of one group of copies (an event on the copy stream; None = already done)."""

    def __init__(self, event: torch.cuda.Event | None = None, keep: Sequence = ()) -> None:
        self.event = event
        self._keep = list(keep)  # tensors that must outlive the copy

    def done(self) -> bool:
        if self.event is None or self.event.query():
            self._keep = []
            return True
        return False

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()
        self._keep = []

    def block(self, stream: torch.cuda.Stream | None = None) -> None:
        """Make `stream` (default: the current one) wait on the GPU until the copies landed."""
        if self.event is not None:
            (stream or torch.cuda.current_stream()).wait_event(self.event)


class CopyGroup:
    """Several handles as one: done when all are (e.g. every layer of a Prefill-to-CPU chunk)."""

    def __init__(self, handles: Sequence[CopyHandle] = ()) -> None:
        self.handles = list(handles)

    def add(self, h: CopyHandle) -> None:
        self.handles.append(h)

    def done(self) -> bool:
        return all(h.done() for h in self.handles)

    def wait(self) -> None:
        for h in self.handles:
            h.wait()

    def block(self, stream: torch.cuda.Stream | None = None) -> None:
        for h in self.handles:
            h.block(stream)


def host_runs(ids: Sequence[int]) -> list[tuple[int, int, int]]:
    """(first position in sorted order, first id, length) of runs of consecutive sorted ids."""
    runs: list[tuple[int, int, int]] = []
    for pos, b in enumerate(sorted(ids)):
        if runs and b == runs[-1][1] + runs[-1][2]:
            p, s, n = runs[-1]
            runs[-1] = (p, s, n + 1)
        else:
            runs.append((pos, b, 1))
    return runs


def joint_runs(host_ids: Sequence[int], gpu_ids: Sequence[int]) -> list[tuple[int, int, int]]:
    """(host id, GPU id, length) runs of pairs sorted by host id, consecutive on both sides."""
    runs: list[tuple[int, int, int]] = []
    for h, g in sorted(zip(host_ids, gpu_ids, strict=True)):
        if runs and h == runs[-1][0] + runs[-1][2] and g == runs[-1][1] + runs[-1][2]:
            a, b, n = runs[-1]
            runs[-1] = (a, b, n + 1)
        else:
            runs.append((h, g, 1))
    return runs


@dataclass
class PagePlan:
    """How a Prefill-to-CPU chunk's pages go to its host blocks, the same for every layer:
    `order` puts the pages in host-id order (None: they already are; a flip: "flip"), and
    `runs` are (position, first host id, length) of the sorted host ids."""

    host_blocks: tuple[int, ...]
    order: torch.Tensor | str | None
    runs: list[tuple[int, int, int]]
    inverse: torch.Tensor | None = None  # host-id order back to the given order

    def unsort(self, pages: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """Pages in host-id order along `dim` back into the order of `host_blocks`."""
        if self.order is None:
            return pages
        if isinstance(self.order, str):
            return pages.flip(dim)
        return pages.index_select(dim, self.inverse)


class _Cudart:
    """cudaMemcpy2DAsync from the CUDA runtime torch loaded (None where it can't be found)."""

    fn = None
    lib = None
    tried = False

    @classmethod
    def memcpy2d(cls):
        if not cls.tried:
            cls.tried = True
            paths = []
            try:
                with open("/proc/self/maps") as f:
                    for line in f:
                        if "libcudart" in line and line.rstrip().endswith(tuple("0123456789o")):
                            paths.append(line.split()[-1])
            except OSError:
                pass
            for p in list(dict.fromkeys(paths)) + ["libcudart.so"]:
                try:
                    lib = ctypes.CDLL(p)
                    fn = lib.cudaMemcpy2DAsync
                except (OSError, AttributeError):
                    continue
                fn.restype = ctypes.c_int
                fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                               ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
                cls.fn, cls.lib = fn, lib
                break
        return cls.fn


_MAX_PITCH = 2**31 - 1  # cudaDevAttrMaxPitch on current GPUs


def _pages(data: torch.Tensor) -> torch.Tensor:
    """A pool tensor [layers, 2, blocks, heads, bs, hd] as [(layer, K|V), blocks, page]: a
    view, also of a head-sliced pool (its page slices are contiguous)."""
    return data.flatten(3).flatten(0, 1)


def _dense(t: torch.Tensor) -> bool:
    """Whether a [pages, page] view is one contiguous span."""
    return t.shape[0] <= 1 or t.stride(0) == t.shape[1]


class Migrator:
    def __init__(self, gpu_pool: PagedKVPool, host_pool: PagedKVPool, method: str = "auto",
                 max_stage_blocks: int = 128, kernel_ctas: int = 128,
                 use_2d: bool = True) -> None:
        if gpu_pool.data.shape[3:] != host_pool.data.shape[3:] or (
                gpu_pool.n_layers != host_pool.n_layers):
            raise ValueError("the GPU and host pools must have the same page shape and layers")
        if gpu_pool.data.dtype != host_pool.data.dtype:
            raise ValueError("the GPU and host pools must have the same dtype")
        if method not in ("auto", "dma", "kernel"):
            raise ValueError(f"unknown copy method {method!r}")
        self.gpu = gpu_pool
        self.host = host_pool
        self.cuda = gpu_pool.device.type == "cuda"
        self.max_stage_blocks = max_stage_blocks
        self.kernel_ctas = kernel_ctas
        self.stream: torch.cuda.Stream | None = None
        self._memcpy2d = None
        if self.cuda:
            if not host_pool.data.is_pinned():
                raise ValueError("the host KV pool must be pinned for asynchronous copies")
            self.stream = torch.cuda.Stream(device=gpu_pool.device, priority=-1)
            if use_2d:
                self._memcpy2d = _Cudart.memcpy2d()
        if method == "kernel" and not HAVE_TRITON:
            raise ValueError("the 'kernel' copy method needs triton")
        self.method = method
        self.chunk = int(gpu_pool.data[0, 0, 0].numel())  # elements of one page (layer, K|V)
        self.page_bytes = self.chunk * gpu_pool.data.element_size()
        self._plans: OrderedDict[tuple[int, ...], PagePlan] = OrderedDict()

    # ------------------------------------------------------------------ helpers

    def _pick(self, host_ids: Sequence[int]) -> str:
        if self.method != "auto":
            return self.method
        if not HAVE_TRITON or not self.cuda:
            return "dma"
        runs = len(host_runs(host_ids))
        return "dma" if len(host_ids) >= 4 * runs else "kernel"

    def _begin(self) -> torch.cuda.Stream:
        """Enter the copy stream after the compute work issued so far."""
        s = self.stream
        s.wait_stream(torch.cuda.current_stream(self.gpu.device))
        return s

    def _end(self, keep: Sequence = ()) -> CopyHandle:
        ev = torch.cuda.Event()
        ev.record(self.stream)
        return CopyHandle(ev, keep)

    def _upload(self, ids: Sequence[int]) -> torch.Tensor:
        """Small int64 index list to the GPU on the current stream, without blocking."""
        return torch.tensor(list(ids), dtype=torch.int64).pin_memory().to(
            self.gpu.device, non_blocking=True)

    def _copy_rows(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """dst[i] = src[i] for the leading axis of two [rows, pages, page] views whose pages
        are contiguous, as one strided DMA where each row is contiguous too, else one per row
        (a head-sliced host pool: pages a full page apart)."""
        if dst.dim() == 3 and not (_dense(dst[0]) and _dense(src[0])):
            for i in range(dst.shape[0]):
                self._copy_rows(dst[i], src[i])
            return
        rows = dst.shape[0]
        width = dst[0].numel() * dst.element_size()
        dp, sp = dst.stride(0) * dst.element_size(), src.stride(0) * src.element_size()
        fn = self._memcpy2d
        if fn is not None and rows > 1 and dp < _MAX_PITCH and sp < _MAX_PITCH:
            err = fn(dst.data_ptr(), dp, src.data_ptr(), sp, width, rows, 4,
                     self.stream.cuda_stream)
            if err == 0:
                return
            _Cudart.lib.cudaGetLastError()  # clear it; fall back to a loop
            self._memcpy2d = None
        for i in range(rows):
            dst[i].copy_(src[i], non_blocking=True)

    def _kernel_copy(self, src: torch.Tensor, dst: torch.Tensor, src_off: torch.Tensor,
                     dst_off: torch.Tensor, chunk: int) -> None:
        n = int(src_off.numel())
        if n == 0:
            return
        block = min(4096, triton.next_power_of_2(chunk))
        grid = (min(n, self.kernel_ctas),)
        _copy_chunks_kernel[grid](src, dst, src_off, dst_off, n, CHUNK=chunk, BLOCK=block,
                                  num_warps=4)

    def _block_offsets(self, pool: PagedKVPool, ids: torch.Tensor,
                       layers: Sequence[int]) -> torch.Tensor:
        """Element offsets of block `ids` of each (layer, K/V) in pool.data, [layers*2*n]
        (from the data's strides: a head-sliced view's pages are a full page apart)."""
        s0, s1, s2 = pool.data.stride()[:3]
        lk = torch.tensor([layer * s0 + kv * s1 for layer in layers for kv in (0, 1)],
                          dtype=torch.int64).to(ids.device, non_blocking=True)
        return (lk[:, None] + ids[None, :] * s2).reshape(-1)

    # -------------------------------------------------------------- block copies

    def _copy_blocks(self, to_host: bool, gpu_ids: Sequence[int], host_ids: Sequence[int]
                     ) -> CopyHandle:
        if len(gpu_ids) != len(host_ids):
            raise ValueError(f"{len(gpu_ids)} GPU blocks for {len(host_ids)} host blocks")
        if not gpu_ids:
            return CopyHandle()
        g, h = self.gpu.data, self.host.data
        n_layers = self.gpu.n_layers
        if not self.cuda:  # synchronous copies between CPU tensors
            gi = torch.tensor(list(gpu_ids), device=g.device)
            hi = torch.tensor(list(host_ids))
            if to_host:
                h.index_copy_(2, hi, g.index_select(2, gi).to(h.device))
            else:
                g.index_copy_(2, gi, h.index_select(2, hi).to(g.device))
            return CopyHandle()
        method = self._pick(host_ids)
        rows = 2 * n_layers
        gv, hv = _pages(g), _pages(h)  # [(layer, K|V), blocks, page elements]
        with torch.cuda.stream(self._begin()):
            if method == "kernel":
                gi, hi = self._upload(gpu_ids), self._upload(host_ids)
                layers = range(n_layers)
                go, ho = self._block_offsets(self.gpu, gi, layers), \
                    self._block_offsets(self.host, hi, layers)
                if to_host:
                    self._kernel_copy(g, h, go, ho, self.chunk)
                else:
                    self._kernel_copy(h, g, ho, go, self.chunk)
                return self._end()
            joint = joint_runs(host_ids, gpu_ids)
            if len(joint) <= max(1, len(host_runs(host_ids))):  # GPU ids run along: direct
                for hb, gb, n in joint:
                    if to_host:
                        self._copy_rows(hv[:, hb:hb + n], gv[:, gb:gb + n])
                    else:
                        self._copy_rows(gv[:, gb:gb + n], hv[:, hb:hb + n])
                return self._end()
            # GPU side through one contiguous staging buffer per group of blocks
            order = sorted(range(len(host_ids)), key=host_ids.__getitem__)
            for c0 in range(0, len(order), self.max_stage_blocks):
                part = order[c0:c0 + self.max_stage_blocks]
                hs = [host_ids[i] for i in part]
                gs = self._upload([gpu_ids[i] for i in part])
                if to_host:
                    stage = gv.index_select(1, gs)  # [(layer, K|V), n, page]
                    for p, hb, n in host_runs(hs):
                        self._copy_rows(hv[:, hb:hb + n], stage[:, p:p + n])
                else:
                    stage = torch.empty((rows, len(part), gv.shape[2]), dtype=g.dtype,
                                        device=g.device)
                    for p, hb, n in host_runs(hs):
                        self._copy_rows(stage[:, p:p + n], hv[:, hb:hb + n])
                    gv.index_copy_(1, gs, stage)
            return self._end()

    def swap_out(self, gpu_blocks: Sequence[int], host_blocks: Sequence[int]) -> CopyHandle:
        """Every layer's K and V of `gpu_blocks` into `host_blocks` (pairwise)."""
        return self._copy_blocks(True, gpu_blocks, host_blocks)

    def swap_in(self, host_blocks: Sequence[int], gpu_blocks: Sequence[int]) -> CopyHandle:
        """Every layer's K and V of `host_blocks` into `gpu_blocks` (pairwise)."""
        return self._copy_blocks(False, gpu_blocks, host_blocks)

    # ------------------------------------------------------- Prefill-to-CPU layers

    def page_plan(self, host_blocks: Sequence[int]) -> PagePlan:
        """The (cached) plan for copying pages to these host blocks, layer after layer."""
        key = tuple(host_blocks)
        plan = self._plans.get(key)
        if plan is not None:
            self._plans.move_to_end(key)
            return plan
        n = len(key)
        if all(key[i + 1] == key[i] + 1 for i in range(n - 1)):
            order: torch.Tensor | str | None = None
        elif all(key[i + 1] == key[i] - 1 for i in range(n - 1)):
            order = "flip"
        else:
            idx = sorted(range(n), key=key.__getitem__)
            inv = [0] * n
            for pos, i in enumerate(idx):
                inv[i] = pos
            order = self._upload(idx) if self.cuda else torch.tensor(idx)
            inverse = self._upload(inv) if self.cuda else torch.tensor(inv)
        plan = PagePlan(key, order, host_runs(key))
        if isinstance(order, torch.Tensor):
            plan.inverse = inverse
        self._plans[key] = plan
        while len(self._plans) > 64:
            self._plans.popitem(last=False)
        return plan

    @staticmethod
    def sort_pages(plan: PagePlan, pages: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """Pages along `dim` in the plan's host-id order (contiguous)."""
        if plan.order is None:
            return pages.contiguous()
        if isinstance(plan.order, str):
            return pages.flip(dim).contiguous()
        return pages.index_select(dim, plan.order)

    def copy_layer_pages_to_host(self, layer: int, kv: torch.Tensor, plan: PagePlan
                                 ) -> CopyHandle:
        """One layer's pages kv [2 (K, V), n, kv_heads, block_size, hd], already in the plan's
        host-id order (`sort_pages`), into the plan's host blocks: one DMA per host run."""
        h = self.host.data
        if not self.cuda:
            hi = torch.tensor(sorted(plan.host_blocks))
            h[layer].index_copy_(1, hi, kv.to(h.device, h.dtype))
            return CopyHandle()
        with torch.cuda.stream(self._begin()):
            kv.record_stream(self.stream)
            src = kv.view(2, kv.shape[1], -1)
            dst = _pages(h)[2 * layer:2 * layer + 2]
            for p, hb, n in plan.runs:
                self._copy_rows(dst[:, hb:hb + n], src[:, p:p + n])
            return self._end()

    def copy_layer_blocks_to_host(self, layer: int, k_blocks: torch.Tensor,
                                  v_blocks: torch.Tensor, host_blocks: Sequence[int]
                                  ) -> CopyHandle:
        """Whole pages of one layer ([n, kv_heads, block_size, hd] each, on the GPU, in the
        order of `host_blocks`) into those host blocks."""
        plan = self.page_plan(host_blocks)
        kv = self.sort_pages(plan, torch.stack([k_blocks, v_blocks]).to(self.host.data.dtype))
        return self.copy_layer_pages_to_host(layer, kv, plan)

    def copy_layer_to_host(self, layer: int, k: torch.Tensor, v: torch.Tensor,
                           host_slots: Sequence[int] | torch.Tensor) -> CopyHandle:
        """K and V [T, kv_heads, hd] of T tokens into host slots (block * block_size + offset).

        Slot-granular: on CUDA the zero-copy kernel writes each (token, head) row in place; the
        executor's Prefill-to-CPU path uses the page-granular copies above."""
        h = self.host.data
        slots = torch.as_tensor(host_slots, dtype=torch.int64)
        if not self.cuda:
            self.host.write(layer, slots.to(h.device), k.to(h.device), v.to(h.device))
            return CopyHandle()
        if not HAVE_TRITON:  # synchronous fallback
            self.host.write(layer, slots.cpu(), k.cpu(), v.cpu())
            return CopyHandle()
        t, kvh, hd = k.shape
        bs = self.host.block_size
        with torch.cuda.stream(self._begin()):
            dev = k.device
            k.record_stream(self.stream)
            v.record_stream(self.stream)
            src = torch.stack([k, v]).to(h.dtype).contiguous()  # [2, T, kvh, hd]
            sl = slots.cpu().pin_memory().to(dev, non_blocking=True)
            heads = torch.arange(kvh, device=dev, dtype=torch.int64)
            blk, off = sl // bs, sl % bs
            s0, s1, s2 = h.stride()[:3]  # a head-sliced pool's pages are a full page apart
            base = (layer * s0 + torch.arange(2, device=dev)[:, None] * s1
                    + blk[None, :] * s2)  # [2, T]
            do = (base[:, :, None] + heads[None, None, :] * (bs * hd)
                  + (off * hd)[None, :, None]).reshape(-1)
            so = torch.arange(2 * t * kvh, device=dev, dtype=torch.int64) * hd
            self._kernel_copy(src, h, so, do, hd)
            return self._end([src])
