"""Helpers both command lines and every layer share: input files read with one-line errors,
progress bars, the command lines' exit and signal conventions."""
