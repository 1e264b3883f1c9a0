"""Serving a scenario or an HTTP endpoint: `dualpace-hw run` (records, journals, plots), the
engine service behind the OpenAI-style server, and the server."""
