"""The command-line reference, made from the typer apps at docs build time.

It walks the click command tree that typer builds for `--help` (`typer.main.get_command`), so a
command or option added to an app appears here without anyone editing the docs, with the same
help text (`param.get_help_record`: the option's names, metavar, default and required marks).
Duck-typed over click's API, so it works with typer's vendored click and with plain click.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import typer
import typer.main
from mdtext import prose


@dataclass
class Command:
    """One command of the tree with the context `--help` would format it in."""

    path: str  # e.g. "dualpace-sim profile fit"
    command: Any  # a click Command (or Group)
    context: Any  # its click Context

    @property
    def is_group(self) -> bool:
        return hasattr(self.command, "list_commands")

    @property
    def anchor(self) -> str:
        return self.path.replace(" ", "-")

    def params(self) -> list[Any]:
        """Arguments and options as `--help` lists them, less hidden ones and `--help` itself
        (every command has it; the page says so once)."""
        helps = set(self.context.help_option_names)
        return [p for p in self.command.get_params(self.context)
                if not getattr(p, "hidden", False) and not set(p.opts) <= helps]

    def subcommands(self) -> list[str]:
        if not self.is_group:
            return []
        names = self.command.list_commands(self.context)
        return [n for n in names if not self.command.get_command(self.context, n).hidden]


def walk(app: typer.Typer, prog: str) -> Iterator[Command]:
    """`app`'s root command and every visible subcommand below it, depth first."""
    root = typer.main.get_command(app)
    stack = [Command(prog, root, typer.Context(root, info_name=prog))]
    while stack:
        cmd = stack.pop()
        yield cmd
        for name in reversed(cmd.subcommands()):
            sub = cmd.command.get_command(cmd.context, name)
            stack.append(Command(f"{cmd.path} {name}", sub,
                                 typer.Context(sub, parent=cmd.context, info_name=name)))


def help_text(cmd: Command) -> str:
    """What `--help` prints above the options: the help up to click's \\f cut, without \\b."""
    text = (cmd.command.help or cmd.command.short_help or "").split("\f")[0]
    return "\n".join(line for line in text.strip().splitlines() if line.strip() != "\b")


def usage(cmd: Command) -> str:
    """The usage line, with arguments in capitals as the help texts name them."""
    words = [cmd.path, "[OPTIONS]"]
    for p in cmd.params():
        if p.param_type_name == "argument":
            word = p.name.upper() + ("..." if p.nargs == -1 else "")
            words.append(word if p.required else f"[{word}]")
    if cmd.is_group:
        words.append("COMMAND [ARGS]...")
    return " ".join(words)


def param_help(param: Any, cmd: Command) -> tuple[str, str]:
    """(names and metavar, help with its default/required marks), as `--help` shows them."""
    record = param.get_help_record(cmd.context)
    if record is None:  # plain click arguments have no help record
        return param.human_readable_name, getattr(param, "help", None) or ""
    return record


def undocumented(app: typer.Typer, prog: str) -> list[str]:
    """Commands and parameters whose `--help` would show no text."""
    missing = []
    for cmd in walk(app, prog):
        if not help_text(cmd):
            missing.append(cmd.path)
        for p in cmd.params():
            if not (getattr(p, "help", None) or "").strip():
                missing.append(f"{cmd.path} {p.opts[0] if p.opts else p.name}")
    return missing


def command_markdown(cmd: Command) -> list[str]:
    depth = cmd.path.count(" ") + 2
    out = [f"{'#' * depth} `{cmd.path}` {{#{cmd.anchor}}}", "", prose(help_text(cmd)), "",
           "```text", usage(cmd), "```", ""]
    subs = cmd.subcommands()
    if subs:
        out += ["Commands:", ""]
        out += [f"* [`{name}`](#{cmd.anchor}-{name})" for name in subs]
        out.append("")
    for p in cmd.params():
        names, text = param_help(p, cmd)
        out.append(f"* `{names}` — {prose(' '.join(text.split()))}")
    return out + [""]


def cli_reference(apps: list[tuple[typer.Typer, str]], title: str, intro: str) -> str:
    """One page for several programs: each command under its program, in tree order."""
    out = [f"# {title}", "", intro, ""]
    for app, prog in apps:
        for cmd in walk(app, prog):
            out += command_markdown(cmd)
    return "\n".join(out)
