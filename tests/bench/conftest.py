"""A fake clock for the timing tests: figures become exact. Import it:
`from tests.bench.conftest import FakeClock`."""


class FakeClock:
    """Stands in for the `time` module of the modules that time (only `perf_counter` is read): its
    seconds move only when `advance` moves them, or when a model whose forward it drives runs.

    `drive(monkeypatch, model, per_pass, per_token)`: every forward pass of `model` advances the
    clock by per_pass + per_token * (its tokens), so a pass of n tokens takes exactly that long.
    Powers of two keep the sums exact in floating point.
    """

    def __init__(self):
        self.now = 0.0
        self.passes: list[int] = []  # the token count of every forward pass, in order

    def perf_counter(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def install(self, monkeypatch, *modules) -> "FakeClock":
        for module in modules:
            monkeypatch.setattr(module, "time", self)
        return self

    def drive(self, monkeypatch, model, *, per_pass: float = 0.0, per_token: float) -> "FakeClock":
        forward = model.forward

        def timed(*args, **kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            n = int(ids.shape[-1])
            self.passes.append(n)
            self.advance(per_pass + per_token * n)
            return forward(*args, **kwargs)

        monkeypatch.setattr(model, "forward", timed)
        return self
