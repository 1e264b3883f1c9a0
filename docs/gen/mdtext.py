"""Text from docstrings and help strings, made safe to put into generated Markdown."""

from __future__ import annotations


def prose(text: str) -> str:
    """Angle brackets outside code spans escaped, so `<box>` in a help text is not taken for an
    HTML tag and dropped from the page."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def cell(text: str) -> str:
    """One table cell: prose on one line, with its pipes escaped."""
    return prose(" ".join(text.split())).replace("|", "\\|")
