"""A fake clock the models advance, for tests of timed decoding: a target pass of n tokens costs
1 + n/4, a draft step 1/5, so V(k) = 5/4 + 9k/20 and k="auto" makes the same choices on every run.
Stands in for decode's `time` (perf_counter) or as a clock callable."""


class FakeClock:
    def __init__(self, target, draft):
        self.now = 0.0
        for lm, cost in ((target, lambda n: 1 + n / 4), (draft, lambda n: 0.2)):
            lm.extend = self._timed(lm.extend, cost)

    def _timed(self, extend, cost):
        def timed(tokens, outputs=None):
            self.now += cost(tokens.numel())
            return extend(tokens, outputs)
        return timed

    def perf_counter(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def __call__(self) -> float:
        return self.now
