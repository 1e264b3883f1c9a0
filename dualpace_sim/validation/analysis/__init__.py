"""The round analyses behind the figures of docs/validation/: each real round or CPU step of a
validation run, from its journal and records, beside the cost model's price for it. Each module
is a command, `python -m dualpace_sim.validation.analysis.<name> --help`; `rounds` holds what
they share."""

from __future__ import annotations

import sys
from collections.abc import Callable


def run_analysis(main: Callable[..., None], *args: object) -> None:
    """Run an analysis command with bad input (a scenario that does not load, a run folder
    without its journal or records) as one `error:` line and exit 2, as the command lines do,
    instead of a traceback."""
    try:
        main(*args)
    except (ValueError, OSError) as e:  # ScenarioError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
