"""The round analyses behind the figures of docs/validation/: each real round or CPU step of a
validation run, from its journal and records, beside the cost model's price for it. Each module
is a command, `python -m dualpace_sim.validation.analysis.<name> --help`; `rounds` holds what
they share."""
