"""The `dualpace-sim` command line: run, sweep, plot, validate, profile and traces."""
