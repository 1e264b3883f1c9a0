"""Children that Ctrl-C reaches, however the tests were started."""

from __future__ import annotations

import signal


def default_sigint() -> None:
    """`preexec_fn` of a child the test interrupts with SIGINT: give it SIGINT's default action.
    A shell starts a background job with SIGINT ignored, and an ignored signal stays ignored
    across exec, so under `make test &` the child would never see the Ctrl-C under test."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
