"""What both command lines (`dualpace-sim`, `dualpace-hw`) share: usage errors as one line and
exit 2, SIGTERM and SIGHUP as Ctrl-C, and the cost model's warnings as notes."""

from __future__ import annotations

import signal
import sys
import warnings

import typer


class NoteWarning(UserWarning):
    """A warning meant for the user, shown as one line (`cost_warnings_as_notes`). It lives here,
    below the cost model, so that the cost model's warnings can be notes without the command
    lines' helpers importing the cost model."""


def cost_warnings_as_notes() -> None:
    """Print the cost model's warnings about lookups outside a profile's tables (every
    `NoteWarning`) as one-line notes: Python's default shows the simulator's source file and
    line with each, which says nothing to a user. Other warnings keep the default."""
    default = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if issubclass(category, NoteWarning):
            print(f"note: {message}", file=file or sys.stderr)
        else:
            default(message, category, filename, lineno, file, line)

    warnings.showwarning = show


def interrupt_on_termination() -> None:
    """SIGTERM and SIGHUP (a closed terminal, `kill`, a batch system's time limit) end a run or a
    sweep as Ctrl-C does: workers stopped, finished results kept, the message printed."""

    def interrupt(signum, frame) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)


def run_app(command: typer.Typer, prog: str) -> None:
    """Run a command line app with its usage errors (a missing argument, an unknown option, a
    bad choice) as one `error:` line and exit 2, like every other bad input: click draws them
    as a usage line plus a boxed message. KeyboardInterrupt reaches the caller."""
    from typer.exceptions import TyperException

    try:
        code = command(standalone_mode=False, prog_name=prog)
    except typer.Abort as e:  # the parser's form of Ctrl-C outside standalone mode
        raise KeyboardInterrupt(*(e.__context__.args if e.__context__ else ())) from None
    except TyperException as e:  # usage errors and other parser errors (typer's click)
        ctx, message = getattr(e, "ctx", None), e.format_message()
        if message:  # none where the error is the help page itself (no arguments given)
            where = f"{ctx.command_path}: " if ctx is not None else ""
            see = f" (see {ctx.command_path} --help)" if ctx is not None else ""
            typer.echo(f"error: {where}{message}{see}", err=True)
        sys.exit(getattr(e, "exit_code", 2))
    sys.exit(code if isinstance(code, int) else 0)
