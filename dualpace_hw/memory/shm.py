"""Host memory shared between the runtime's processes: an anonymous memfd arena.

The CPU engine runs in its own process (so the GIL never serializes it behind the GPU engine);
the host KV pool, the CPU engine's copy of the weights and the Dense Assist buffers must be the
same bytes in both processes. Why a memfd rather than /dev/shm or torch's sharing strategies:

* nothing is named, so nothing can leak: the memory goes away when the last process holding a
  mapping exits, however it exits (Ctrl-C, a crash, SIGKILL);
* it is not bounded by the size of the /dev/shm mount (64 MiB in a default container), and a
  host KV pool is tens of GB;
* the GPU engine registers the same pages with CUDA (`pin`), so swaps and Prefill-to-CPU copies
  are DMA into the very memory the CPU engine reads.

A child process attaches through `/proc/<owner pid>/fd/<fd>`, valid while the owner lives.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TensorRef:
    """Where one tensor lives in an arena (picklable; stands in for the tensor in a message)."""

    offset: int
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class ArenaHandle:
    """What a child process needs to map an arena."""

    path: str
    size: int


_ALIGN = 4096
_PUNCH_HOLE, _KEEP_SIZE = 0x02, 0x01  # fallocate(2) modes, from linux/falloc.h
_libc = ctypes.CDLL(None, use_errno=True)


class SharedArena:
    """A bump allocator over one memfd mapping; tensors are views of the mapping."""

    def __init__(self, size: int, name: str = "dualpace", huge_pages: bool = False) -> None:
        if size < 1:
            raise ValueError(f"an arena needs a positive size, got {size}")
        self.size = -(-size // _ALIGN) * _ALIGN
        self._fd = os.memfd_create(name, os.MFD_CLOEXEC)
        os.ftruncate(self._fd, self.size)
        self._map = mmap.mmap(self._fd, self.size)
        if huge_pages:  # shared memory gets 4 KB pages unless asked (and shmem THP allows it)
            with contextlib.suppress(OSError, AttributeError):
                self._map.madvise(mmap.MADV_HUGEPAGE)
        self._base = torch.frombuffer(self._map, dtype=torch.uint8)
        self._used = 0
        self._pinned = False

    @classmethod
    def attach(cls, handle: ArenaHandle) -> SharedArena:
        """Map another process's arena (read-write); the owner must be alive."""
        arena = cls.__new__(cls)
        arena.size = handle.size
        try:
            arena._fd = os.open(handle.path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError as e:
            raise RuntimeError(f"shared arena {handle.path} is gone: its owner exited") from e
        arena._map = mmap.mmap(arena._fd, handle.size)
        arena._base = torch.frombuffer(arena._map, dtype=torch.uint8)
        arena._used = handle.size
        arena._pinned = False
        return arena

    @staticmethod
    def bytes_for(shapes: list[tuple[tuple[int, ...], torch.dtype]]) -> int:
        """The arena size that holds tensors of these shapes and dtypes."""
        total = 0
        for shape, dtype in shapes:
            n = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
            total += -(-n // _ALIGN) * _ALIGN
        return max(total, _ALIGN)

    def handle(self) -> ArenaHandle:
        return ArenaHandle(f"/proc/{os.getpid()}/fd/{self._fd}", self.size)

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, TensorRef]:
        """A new zero-filled tensor in the arena, and its reference for other processes."""
        ref = TensorRef(self._used, tuple(shape), dtype)
        t = self.view(ref)
        self._used += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
        if self._used > self.size:
            raise ValueError(f"shared arena of {self.size} bytes is full")
        return t, ref

    def put(self, t: torch.Tensor) -> TensorRef:
        """Copy a tensor (any device) into the arena."""
        dst, ref = self.empty(tuple(t.shape), t.dtype)
        dst.copy_(t)
        return ref

    def view(self, ref: TensorRef) -> torch.Tensor:
        nbytes = torch.Size(ref.shape).numel() * torch.empty((), dtype=ref.dtype).element_size()
        if ref.offset + nbytes > self.size:
            raise ValueError(f"{ref} lies outside the {self.size}-byte arena")
        raw = self._base[ref.offset: ref.offset + nbytes]
        return raw.view(ref.dtype).view(ref.shape)

    def release(self, ref: TensorRef) -> None:
        """Give a tensor's pages back to the OS (every process's view of them reads zeros
        after): the CPU engine releases the plain projection weights it has repacked, so the
        host holds one copy of the weights, not two (Qwen3-32B is 64 GB)."""
        nbytes = torch.Size(ref.shape).numel() * torch.empty((), dtype=ref.dtype).element_size()
        length = nbytes // _ALIGN * _ALIGN  # whole pages only; allocations start on a page
        if length == 0:
            return
        if _libc.fallocate(self._fd, _PUNCH_HOLE | _KEEP_SIZE, ctypes.c_long(ref.offset),
                           ctypes.c_long(length)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"releasing {length} bytes of the shared arena: "
                               f"{os.strerror(err)}")

    def allocated_bytes(self) -> int:
        """Bytes of the arena backed by memory now (what `release` gave back is not)."""
        return os.fstat(self._fd).st_blocks * 512

    def pin(self) -> None:
        """Page-lock the arena for CUDA DMA (the owner process, once CUDA is up)."""
        if self._pinned or not torch.cuda.is_available():
            return
        err = torch.cuda.cudart().cudaHostRegister(self._base.data_ptr(), self.size, 0)
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister of {self.size} bytes failed: error {int(err)}")
        self._pinned = True

    def close(self) -> None:
        """Unpin and drop this process's mapping; the memory is freed with the last one."""
        if self._pinned:
            torch.cuda.cudart().cudaHostUnregister(self._base.data_ptr())
            self._pinned = False
        self._base = None
        with contextlib.suppress(BufferError):  # views still alive: the mapping goes with them
            self._map.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
