"""Profile-guided controls (paper §4.3, Algorithm 1, Appendix B).

Three independent fits turn a calibration profile into the four scheduler controls, one module
each: the routing thresholds (P, F) (:mod:`.thresholds`: the route scores of Eq. 6-8 and
Algorithm 1), the GPU batched-token limit (:mod:`.token_limit`: an isotonic fit of prefill
throughput and its plateau) and the CPU decode batch limit (:mod:`.cpu_limit`). :mod:`.controls`
runs the three on one profile and writes the result back into it; :mod:`.grid` holds what they
share. Everything here is plain Python + numpy/scipy.

The whole fit is imported from here; a fit's own pieces from its module.
"""

from dualpace_sim.costs.fit.controls import FitResult, fit_controls, with_controls
from dualpace_sim.costs.fit.grid import FitError, profile_batch_sizes

__all__ = ["FitError", "FitResult", "fit_controls", "profile_batch_sizes", "with_controls"]
