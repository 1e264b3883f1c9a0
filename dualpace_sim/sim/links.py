"""The PCIe link: two independent directions (full duplex), each serving transfers FIFO.

Transfers are booked analytically (start = max(issue, channel free), end = start + latency +
bytes / bandwidth) instead of as SimPy resources: the order of issue is already the simulated
order, and booking needs no extra events on the hot path.
"""

from __future__ import annotations

from dualpace_sim.results.node_series import Intervals


class Channel:
    """One direction of the link."""

    def __init__(self, name: str, bytes_per_s: float, latency_s: float) -> None:
        self.name = name
        self.bytes_per_s = bytes_per_s
        self.latency_s = latency_s
        self.free_at = 0.0
        self.busy_s = 0.0
        self.bytes_moved = 0
        self.worked = Intervals()  # when it moved data, for utilisation over time

    def transfer(self, issue_s: float, nbytes: int) -> tuple[float, float]:
        """Book a transfer issued at `issue_s`; returns when it starts moving (after the ones
        queued before it) and when its last byte lands."""
        start = max(issue_s, self.free_at)
        duration = self.duration(nbytes)
        self.free_at = start + duration
        self.busy_s += duration
        self.bytes_moved += nbytes
        self.worked.add(start, self.free_at)
        return start, self.free_at

    def transfer_each(self, issues_s: list[float], nbytes: int) -> float:
        """Book one transfer of `nbytes` at each issue time, in order (what `transfer` does
        for each, in one loop); returns when the last one lands."""
        duration = self.duration(nbytes)
        free, busy, add = self.free_at, self.busy_s, self.worked.add
        for issue in issues_s:
            start = issue if issue > free else free
            free = start + duration
            add(start, free)
            busy += duration
        self.free_at, self.busy_s = free, busy
        self.bytes_moved += nbytes * len(issues_s)
        return free

    def duration(self, nbytes: int) -> float:
        """Time on the wire of one transfer: latency plus bytes over bandwidth."""
        return self.latency_s + nbytes / self.bytes_per_s

    def carry(self, nbytes: int, at_s: float) -> None:
        """Account bytes whose transfer time a measured latency already includes (Dense Assist
        activations, g_x in the profile). They travel on the assist's own stream and do not
        queue behind KV copies: a copy engine interleaves streams, and megabytes of
        activations next to gigabytes of KV change little. For utilisation over time they
        count as moving from `at_s` at the full bandwidth."""
        self.busy_s += nbytes / self.bytes_per_s
        self.bytes_moved += nbytes
        self.worked.add(at_s, at_s + nbytes / self.bytes_per_s)


class Link:
    """H2D and D2H channels of one GPU's PCIe link."""

    def __init__(self, h2d_bytes_per_s: float, d2h_bytes_per_s: float, latency_s: float) -> None:
        self.h2d = Channel("H2D", h2d_bytes_per_s, latency_s)
        self.d2h = Channel("D2H", d2h_bytes_per_s, latency_s)
