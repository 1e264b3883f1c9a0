"""Rank 0's teardown order: the CUDA graphs go before the process group.

NCCL's teardown waits until every graph that captured one of its collectives is destroyed
(pytorch#115388); on the 2-GPU box, with the graphs still held, every rank hung leaving the group
at the end of a finished run. The order is what matters, so it is checked with stand-ins for the
graphs and the other ranks (the serving tests cover the rest on Gloo)."""

from __future__ import annotations

from collections import OrderedDict

from dualpace_hw.runtime.gpu_ranks import LeadExecutor


class _Graph:
    def __init__(self, events: list[str], name: str) -> None:
        self.events, self.name = events, name

    def release(self) -> None:
        self.events.append(f"release {self.name}")


class _Peers:
    def __init__(self, events: list[str]) -> None:
        self.events = events

    def close(self) -> None:
        self.events.append("leave group")


def test_rank_0_releases_its_graphs_before_the_ranks_leave_the_group():
    events: list[str] = []
    lead = object.__new__(LeadExecutor)  # the order only: no model, pool or processes
    lead.cuda = False
    lead._graphs = OrderedDict({(1, 16): _Graph(events, "a"), (8, 32): _Graph(events, "b")})
    lead.peers = _Peers(events)
    lead.close()
    assert events == ["release a", "release b", "leave group"]
    assert not lead._graphs


class _Sent:
    def __init__(self, events: list[str]) -> None:
        self.events = events

    def send(self, *msg) -> None:
        self.events.append(f"send {msg}")


def test_every_rank_captures_the_graphs_rank_0_does_in_its_order(monkeypatch):
    """A capture's warm-up runs the round's all-reduces: the other ranks must capture the same
    bucket at the same time, so rank 0 sends each before capturing it."""
    from dualpace_hw.executors.gpu import GpuExecutor

    events: list[str] = []
    lead = object.__new__(LeadExecutor)
    lead.peers = _Sent(events)
    monkeypatch.setattr(GpuExecutor, "capture_graph",
                        lambda self, key: events.append(f"capture {key}"))
    lead.capture_graph((8, 32))
    assert events == ["send ('graph', 8, 32)", "capture (8, 32)"]
