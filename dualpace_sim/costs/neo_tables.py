"""NEO's predictor tables, read from the same calibration profile as every other policy, so
that differences between policies come from scheduling alone."""

from __future__ import annotations

from .model import CostModel


class NeoTables:
    """linr_T, pref_T, gdec_T, cdec_T and lnch_T (per layer, seconds) over a cost model."""

    def __init__(self, cost: CostModel, launch_s: float | None = None) -> None:
        self.cost = cost
        self.lnch_T = cost.neo_launch_s if launch_s is None else launch_s
        self._linr: dict[int, float] = {}
        self._pref: dict[int, float] = {}
        # gdec_T's last (n, context) and its value (0 for no decode): a round asks for its GPU
        # decodes' pair twice or more (NEO's overlap terms, then the iteration's time).
        # cdec_T is not memoised: its pairs are new sums of KV lengths (in the saturated 2k
        # scaling point 8 % repeat the previous pair, 16 % any earlier one, and a dict memo
        # made the scan slower).
        self._gdec_last: tuple[int, int, float] = (0, 0, 0.0)

    def linr_T(self, width: int) -> float:
        t = self._linr.get(width)
        if t is None:
            t = self._linr[width] = self.cost.gpu_linear(width)
        return t

    def pref_T(self, prompt: int) -> float:
        t = self._pref.get(prompt)
        if t is None:
            t = self._pref[prompt] = self.cost.gpu_prefill_attn(prompt, prompt)
        return t

    def gdec_T(self, n: int, context: int) -> float:
        last_n, last_context, t = self._gdec_last
        if n != last_n or context != last_context:
            t = self.cost.gpu_decode_attn(n, context)
            self._gdec_last = (n, context, t)
        return t

    def cdec_T(self, n: int, context: int) -> float:
        return self.cost.cpu_decode_attn(n, context)
