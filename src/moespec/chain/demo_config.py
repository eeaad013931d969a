"""The demo's settings (`DemoConfig`: each step's knobs) and the run folder `moespec demo`'s options
name (`demo_setup`); the knobs each measure phase and llama.cpp's context derive from them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from moespec.bench.measure_base import base_knobs
from moespec.kernel_names import DEDUP
from moespec.run_files import LLAMA_FOLDER

# a smoke run's cache flush between timings: it checks the plumbing, not the figures, and the full
# flush (twice the LLC, >= 256 MiB: `bench.timing.CacheFlusher`) took most of a smoke characterization
SMOKE_FLUSH_BYTES = 16 << 20
# the batch chain's characterization at smoke settings (`moespec batch --smoke`, the demo's smoke run):
# one layer, n = 1..3 besides the pass sizes B(k + 1), a small flush
SMOKE_BATCH_CHARACTERIZE = dict(n=(1, 2, 3), layers=(0,), reps=3, u_points=2, windows=2, flush_bytes=SMOKE_FLUSH_BYTES)
# new tokens per prompt, the shipped prompts' length (None: the chain's depth, so that the candidates
# decode where the verify passes were timed), sampling (greedy by default), draw seed, timings of h(k)
# per k, held-out repetitions per k, and the seconds plain decoding of the held-out prompts lasts at
# least over them (more repetitions on a fast model: `chain.candidate_check.check_reps`)
CANDIDATE_KNOBS = dict(new_tokens=48, prompt_tokens=None, temperature=0.0, top_p=None, seed=0, cost_reps=20,
                       check_reps=3, check_seconds=2.0)


@dataclass(frozen=True)
class DemoConfig:
    """The knobs of each step; `demo()` fits a 2-core CPU in minutes, `full_protocol()` is the paper's.
    Why each demo value was chosen: docs/methodology.md and BENCHMARKS.md."""

    model: str = "synthetic:olmoe-shaped"
    layers: int | None = None  # a synthetic preset's depth (None: the preset's)
    trace_tokens: int = 4096
    # both layers (rho differs between them); the verified windows are timed between the base
    # measurement's passes (`ops_between_passes`), so the characterization leaves them out
    characterize: dict = field(default_factory=lambda: dict(layers=(0, "mid"), reps=3, u_points=3, windows=4))
    # 32 verify repetitions: the prediction reads the 16 even ones, the score the 16 odd ones; 18
    # one-step oracle runs per cell, 2 tokens apart, verify the stretch the verify passes read
    measure: dict = field(default_factory=lambda: dict(new_tokens=64, oracle_steps=1, oracle_reps=18, prompts=2,
                                                       oracle_start_stride=2, reps=32,
                                                       scaling_ns=tuple(range(1, 10))))
    full: bool = False
    seed: int = 0
    # None: the model's own routers; a trace file the MoE layers replay; "trained": trained:olmoe's
    # routing, recorded into the run folder first (`moe.replay`)
    routing: str | None = None
    # time the characterized layers' operation on each verify pass's window right after the pass
    ops_between_passes: bool = True
    # "llama.cpp": the chain on llama.cpp, on `model` exported to GGUF of `gguf_type` (or a .gguf
    # `model` itself), its expert operation timed through ggml (`chain.llama_inputs`)
    backend: str = "torch"
    gguf_type: str = "q8_0"
    threads: int | None = None
    # on llama.cpp, the chain at batch size B after B = 1's (`chain.batch_chain.BatchKnobs`; torch stays at
    # B = 1); sizes=() runs none of it
    batch: dict = field(default_factory=lambda: dict(sizes=(1, 2, 4), max_k=3, acceptances=(0.5, 0.7, 0.9, 0.95),
                                                     prompt_tokens=64, new_tokens=32, reps=2, trace_tokens=4096))
    # the user's candidate drafts (`Candidate.to_dict()` each; `chain.candidate_steps`), the prompts
    # file they are measured on (None: the shipped prompts) and the knobs of their steps
    candidates: tuple = ()
    prompts: str | None = None
    candidate: dict = field(default_factory=lambda: dict(CANDIDATE_KNOBS))
    llama_check: bool = False  # then llama.cpp's own speculative decoding of the held-out half
    dense_reps: int = 15  # a dense file's D(n) and R_d(n): timed rounds (`chain.dense_chain`), as an MoE file's

    def __post_init__(self):
        if self.trace_tokens < 16:
            raise ValueError(f"trace_tokens={self.trace_tokens}; trace at least 16 tokens")
        if self.backend not in ("torch", "llama.cpp"):
            raise ValueError(f"backend={self.backend!r}; choose 'torch' or 'llama.cpp'")
        if self.backend == "llama.cpp" and self.routing is not None:
            raise ValueError("routing replay runs on the torch backend; the llama.cpp chain runs the file's own routers")

    @property
    def llama(self) -> bool:
        return self.backend == "llama.cpp"

    @property
    def batched(self) -> bool:
        """Whether the chain at batch size B runs (on llama.cpp, unless `batch` names no sizes)."""
        return self.llama and bool(self.batch.get("sizes", True))

    def measure_knobs(self) -> dict[str, Any]:
        """`measure` as the measure step takes it: on llama.cpp one kernel, llama.cpp's grouped mul_mat_id,
        and the pass's o(n) timed beside each verify pass (`bench.ggml_outside`)."""
        if not self.llama:
            return dict(self.measure)
        return {"outside": True, **self.measure, "kernels": (DEDUP,), "oracle_kernels": (DEDUP,)}

    @property
    def times_ops_between_passes(self) -> bool:
        """Whether the verify phase times the characterized layers' operation between its passes (on
        llama.cpp its grouped kernel, `ggml_expert_op.WindowTimer`; the characterization still times the
        verified windows there, for the per-slot kernel llama.cpp's passes do not run)."""
        return self.ops_between_passes

    @classmethod
    def demo(cls, **overrides) -> "DemoConfig":
        return cls(**overrides)

    @classmethod
    def full_protocol(cls, **overrides) -> "DemoConfig":
        paper = dict(trace_tokens=65536, characterize=dict(layers=(0, "mid")), measure={}, full=True)
        return cls(**{**paper, **overrides})

    @classmethod
    def smoke(cls, **overrides) -> "DemoConfig":
        """Seconds on a *-tiny preset: n <= 3, k <= 2, depth 16; checks the plumbing, not the figures.
        Medians of 5 after a warm-up keep a slow call out of every time."""
        tiny = dict(model="synthetic:olmoe-tiny", trace_tokens=200,
                    characterize=dict(layers=(0,), reps=5, warmup=1, u_points=2, windows=2, n=range(1, 4),
                                      flush_bytes=SMOKE_FLUSH_BYTES),
                    measure=dict(depths=(16,), ns=range(1, 4), reps=6, ks=(0, 1, 2), new_tokens=6, scaling_ns=(),
                                 flush=False),
                    batch=dict(sizes=(1, 2), max_k=2, acceptances=(0.5, 0.9), prompt_tokens=16, new_tokens=8, reps=1,
                               trace_tokens=512, characterize=SMOKE_BATCH_CHARACTERIZE),
                    candidate=dict(CANDIDATE_KNOBS, new_tokens=8, prompt_tokens=24, cost_reps=3, check_reps=1,
                                   check_seconds=0.0),
                    dense_reps=3)
        return cls(**{**tiny, **overrides})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def candidate_knobs(self) -> dict[str, Any]:
        """The candidates' steps' knobs, with kmax: the longest draft the prediction prices."""
        from moespec.chain.candidate_steps import MAX_PROMPT_TOKENS, candidate_kmax

        m = measure_config(self)
        knobs = {**CANDIDATE_KNOBS, **self.candidate, "kmax": candidate_kmax(m.ns, m.ks)}
        if knobs["prompt_tokens"] is None:  # a small model's pass at depth 128 takes half its time at 512
            knobs["prompt_tokens"] = min(min(m.depths), MAX_PROMPT_TOKENS)
        return knobs


def demo_setup(out_dir: str | Path, *, model: str | None = None, backend: str | None = None, smoke: bool = False,
               full: bool = False, layers: int | None = None, routing: str | None = None, gguf_type: str | None = None,
               threads: int | None = None, measure: dict | None = None, drafts: tuple = (),
               prompt_lookup: int | None = None, ngrams: tuple = (), prompts: str | Path | None = None,
               candidate: dict | None = None, llama_check: bool = False) -> tuple[DemoConfig, Path]:
    """The config and run folder `moespec demo`'s options name. A .gguf model is the model: the chain
    runs it on llama.cpp in `out_dir` (at smoke settings with `smoke`); another model runs on torch in
    `out_dir`, or with backend "llama.cpp" exported to GGUF (`gguf_type`, default q8_0) in
    `out_dir`/llama.cpp, beside the torch run it is reported with. `measure` overrides knobs of the
    measurement (oracle_reps, reps); drafts, prompt_lookup and ngrams name the user's candidate
    drafts, measured on `prompts` with the knobs in `candidate` (temperature, top_p, ...), all
    checked here, before anything runs (`chain.candidate_steps`)."""
    from moespec.models.gguf import is_gguf

    if smoke and full:
        raise ValueError("--smoke and --full exclude each other")
    gguf = model is not None and is_gguf(model)
    backend = backend or ("llama.cpp" if gguf else "torch")
    if backend not in ("torch", "llama.cpp"):
        raise ValueError(f"backend {backend!r}: choose torch or llama.cpp")
    if gguf and backend == "torch":
        raise ValueError(f"{model} is a GGUF file: its chain runs on llama.cpp, the engine that decodes it (drop "
                         "--backend torch); for the torch chain give the transformers checkpoint it was made from")
    if gguf and (layers is not None or gguf_type is not None):
        raise ValueError(f"--layers and --gguf-type shape a model moespec builds or exports; {model} is used as it is")
    if backend == "llama.cpp":
        from moespec.backends import llama_lib
        from moespec.models.gguf_export import FTYPES

        if routing is not None:
            raise ValueError("--routing replays routing on the torch backend; the llama.cpp chain runs the file's own "
                             "routers")
        if gguf_type is not None and gguf_type not in FTYPES:
            raise ValueError(f"--gguf-type {gguf_type!r} is not one of {', '.join(FTYPES)}")
        if not llama_lib.available():
            raise ValueError(f"the chain on llama.cpp needs llama-cpp-python: {llama_lib.INSTALL_HINT}")
    if smoke:  # olmoe-tiny has grouped-query attention, which llama.cpp's olmoe lacks: trained:olmoe there
        config = DemoConfig.smoke(model=model or ("trained:olmoe" if backend == "llama.cpp" else "synthetic:olmoe-tiny"))
    else:
        make = DemoConfig.full_protocol if full else DemoConfig.demo
        config = make(model=model or DemoConfig.model, layers=layers, routing=routing)
    config = replace(config, backend=backend, gguf_type=gguf_type or DemoConfig.gguf_type,
                     threads=threads if backend == "llama.cpp" else None,
                     measure={**config.measure, **{k: v for k, v in (measure or {}).items() if v is not None}},
                     candidate={**config.candidate, **{k: v for k, v in (candidate or {}).items() if v is not None}})
    config = with_candidates(config, drafts=drafts, prompt_lookup=prompt_lookup, ngrams=ngrams, prompts=prompts,
                             target_gguf=model if gguf else None)
    if llama_check and not (config.llama and config.candidates):
        raise ValueError("--llama-check runs llama.cpp's own speculative decoding of your drafts: give a .gguf "
                         "--model (or --backend llama.cpp) and a draft (--draft, --prompt-lookup or --ngram)")
    config = replace(config, llama_check=llama_check)
    folder = Path(out_dir) / LLAMA_FOLDER if backend == "llama.cpp" and not gguf else Path(out_dir)
    return config, folder


def with_candidates(config: DemoConfig, *, drafts, prompt_lookup, ngrams, prompts, target_gguf) -> DemoConfig:
    """The config with the user's candidates and prompts file, refused in one line before anything
    runs: a draft llama.cpp would not pair with the target, an unreadable or empty prompts file, a
    candidate that drafts nothing at the draft lengths the chain prices, sampling knobs out of range."""
    from moespec.bench.candidate import read_prompts
    from moespec.chain.candidates import Candidate, user_candidates

    candidates = user_candidates(drafts=drafts, prompt_lookup=prompt_lookup, ngrams=ngrams, target_gguf=target_gguf)
    if not candidates:
        if prompts is not None:
            raise ValueError("--prompts is read for your drafts; name one with --draft, --prompt-lookup or --ngram")
        return config
    if prompts is not None:
        read_prompts(prompts)  # a missing, empty or malformed file: refused now, not after the chain
    config = replace(config, candidates=candidates, prompts=None if prompts is None else str(prompts))
    kmax = config.candidate_knobs()["kmax"]
    for c in map(Candidate.from_dict, candidates):
        if c.min_k > kmax:
            raise ValueError(f"{c.name} drafts only at k >= {c.min_k}, and this chain prices k <= {kmax}; "
                             f"give --ngram {c.kind}:{kmax} or smaller")
    return config


CONTEXT_SLACK = 64  # positions beyond what the measurement's passes reach


def phase_knobs(cfg: DemoConfig, base: bool, op_layers: tuple[int, ...] = ()) -> dict[str, Any]:
    """The knobs of one measure phase (base or sweep) as `bench.measure` takes them."""
    knobs = dict(cfg.measure_knobs(), op_layers=tuple(op_layers))
    return base_knobs(knobs) if base else knobs


def measure_config(cfg: DemoConfig):
    """The sweep phase's `MeasureConfig` (the verified windows and the characterization's n read it)."""
    from moespec.bench.measure import MeasureConfig

    return MeasureConfig.preset(cfg.full, **cfg.measure_knobs())


def llama_context(cfg: DemoConfig) -> int:
    """llama.cpp's context for the demo's measurements: the positions both phases reach, so that the
    KV cache is sized to the run, not to the file's trained context (a 16-layer OLMoE at 8192
    positions holds 1 GB of cache)."""
    from moespec.bench.measure import MeasureConfig
    from moespec.chain.candidate_steps import MAX_PROMPT_TOKENS

    measured = max(MeasureConfig.preset(cfg.full, **phase_knobs(cfg, base)).positions for base in (True, False))
    if cfg.candidates:  # the candidates' prompts, their new tokens and a draft beyond them
        knobs = cfg.candidate_knobs()
        measured = max(measured, MAX_PROMPT_TOKENS + knobs["new_tokens"] + knobs["kmax"] + 1)
    return CONTEXT_SLACK + measured


def verified_length(cfg: DemoConfig) -> int:
    """Tokens of each prompt's continuation that the verify passes read (`prompts.continuation_length`)."""
    from moespec.texts import continuation_length

    m = measure_config(cfg)
    return continuation_length(m.reps, max(m.ns), m.stride)
