"""What a run leaves, for both backends: records, the node series, trace events, token spans,
metrics and summaries, provenance, the output reference, sweep directories, and the journal's
replay through the core."""
