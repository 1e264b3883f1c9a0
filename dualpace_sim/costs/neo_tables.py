"""NEO's predictor tables, read from the same calibration profile as every other policy, so
that differences between policies come from scheduling alone."""

from __future__ import annotations

from .model import CostModel, Interp2D


class NeoTables:
    """linr_T, pref_T, gdec_T, cdec_T and lnch_T (per layer, seconds) over a cost model.

    NEO decides with these, in the simulator and in the runtime, so a real run's journal
    replays only through the lookups it decided with: the decode-attention tables keep the
    log-log reading every NEO run so far was made with (`Interp2D`'s default), where the cost
    model now reads them linearly in the context (docs/costs.md). NEO's own predictor reads its
    tables piecewise-linearly (BASELINES.md, A1); moving to that is the predictor work of the
    NEO issue, with the journals it makes."""

    def __init__(self, cost: CostModel, launch_s: float | None = None) -> None:
        self.cost = cost
        self.lnch_T = cost.neo_launch_s if launch_s is None else launch_s
        self._linr: dict[int, float] = {}
        self._pref: dict[int, float] = {}
        self._gdec = Interp2D("gpu.decode_attn", cost.profile.gpu.decode_attn)
        self._cdec = Interp2D("cpu.decode_attn", cost.profile.cpu.decode_attn)
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
            t = self._gdec(n, context) if n > 0 else 0.0
            self._gdec_last = (n, context, t)
        return t

    def cdec_T(self, n: int, context: int) -> float:
        return self._cdec(n, context) if n > 0 else 0.0
