"""`dualpace-hw`: the real runtime and profiler; not built yet in this release."""

from __future__ import annotations

import sys


def main() -> None:
    sys.stderr.write(
        "dualpace-hw: the real runtime and the profiler arrive with the hw extra "
        "(pip install -e \".[hw]\") in a later release; this build has the simulator only "
        "(dualpace-sim).\n"
    )
    sys.exit(2)
