"""Figures: sweeps and timelines, served runs, the Algorithm 1 fit, and the plots of a run or
sweep directory."""
