"""Rank 0's command ring: every reader takes every command once, in order, across processes;
a full ring holds the writer back; a vanished writer or reader ends the wait with EOFError."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time

import pytest

from dualpace_hw.memory.command_ring import CommandRing, RingReader


def _read(refs, index: int, n: int, out) -> None:
    reader = RingReader(refs, index, spin_s=0.0)
    out.put([reader.take(lambda: False) for _ in range(n)])


def test_every_reader_process_takes_every_command_in_order():
    ring = CommandRing(readers=2, slots=8)  # a small ring: the writer laps it many times
    commands = [("round", 1, 0, 0)] + [("s", 0, 0, 0)] * 40 + [("a", 2, 31, 7), ("end", 0, 0, 0)]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_read, args=(ring.refs, i, len(commands), out))
             for i in range(2)]
    for p in procs:
        p.start()
    try:
        for op, *args in commands:
            ring.write(op, *args, readers_alive=lambda: all(p.exitcode in (None, 0)
                                                            for p in procs))
        got = [out.get(timeout=60) for _ in procs]
    finally:
        for p in procs:
            p.join(10)
        ring.close()
    assert got == [commands, commands]


def test_a_full_ring_holds_the_writer_until_the_reader_takes():
    ring = CommandRing(readers=1, slots=2)
    reader = RingReader(ring.refs, 0, spin_s=0.0)
    ring.write("s", readers_alive=lambda: True)
    ring.write("s", readers_alive=lambda: True)
    done = threading.Event()
    writer = threading.Thread(target=lambda: (ring.write("end", readers_alive=lambda: True),
                                              done.set()))
    writer.start()
    time.sleep(0.05)
    assert not done.is_set()  # the reader is a whole ring behind
    assert reader.take(lambda: False)[0] == "s"
    writer.join(5)
    assert done.is_set()
    assert [reader.take(lambda: False)[0] for _ in range(2)] == ["s", "end"]
    ring.write("s", readers_alive=lambda: True)
    ring.write("s", readers_alive=lambda: True)
    with pytest.raises(EOFError, match="reader of the command ring is gone"):
        ring.write("s", readers_alive=lambda: False)  # full, and its reader died


def test_a_reader_waiting_on_a_gone_writer_gets_eof():
    ring = CommandRing(readers=1)
    reader = RingReader(ring.refs, 0, spin_s=0.0)
    with pytest.raises(EOFError, match="rank 0 is gone"):
        reader.take(lambda: True)
