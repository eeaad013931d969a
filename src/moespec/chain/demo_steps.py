"""The work of each step of the demo (`chain.demo`), as functions of plain values: the routing, the
routing of the verified text, the characterization, the two measure phases, the prediction and the
score. Each writes the artifact at `path`; `chain.run_folder.Runner` decides whether it runs and hands
the steps that run on the chain's model that model (model=, tokenizer=).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from moespec import artifacts
from moespec.run_files import KINDS, PREDICTION, SCORE

TRAINED_ROUTER = "trained:olmoe"
TRAINED_ROUTING_TOKENS = 8192  # covers every position the demo decodes at (the full protocol's wrap around)
CORPUS = ["moespec:data/corpus"]


def trace_routing(model, tokenizer, *, spec: str, tokens: int, path: Path) -> None:
    """The routing `model` chooses on the shipped corpus, `tokens` tokens of it."""
    from moespec.texts import default_corpus
    from moespec.moe.routing import record_to_file, tokenize

    docs = tokenize(tokenizer, default_corpus(), tokens)
    record_to_file(model, docs, path, model_spec=spec, corpus=CORPUS)


def trace_trained(path: Path) -> None:
    """The routing trained:olmoe chose on the shipped corpus, for the target to replay."""
    from moespec.models import load

    net, tok = load(TRAINED_ROUTER)
    trace_routing(net, tok, spec=TRAINED_ROUTER, tokens=TRAINED_ROUTING_TOKENS, path=path)


def trace_verified(model, tokenizer, *, spec: str, depths: tuple[int, ...], prompts: int, n_max: int, length: int,
                   path: Path) -> None:
    """The routing of the text the verify passes read (`bench.verify.verified_routing`)."""
    from moespec.bench.verify import verified_routing

    verified_routing(model, tokenizer, depths=depths, prompts=prompts, n_max=n_max, length=length,
                     model_spec=spec).save(path)


def verified_too_short(path: Path, need: int) -> str:
    """"" unless the verified routing at `path` holds fewer than `need` tokens per continuation."""
    if not path.exists():
        return ""
    from moespec.moe.traces import RoutingTrace

    have = min(len(d) for d in RoutingTrace.load(path).documents)
    return f"holds {have} tokens per continuation, the verify passes read {need}" if have < need else ""


def characterize_model(model: Any, tokenizer: Any = None, *, traces: Path, verified: Path | None, path: Path,
                       knobs: Mapping[str, Any], seed: int, spec: str | None, progress: bool) -> None:
    """The characterization of `model` (a loaded module, or a GGUF file's path) on its routing."""
    from moespec.bench.characterize import characterize

    characterize(model, traces, verified=verified, out=path, progress=progress, seed=seed, model_spec=spec, **knobs)


def measure_phase(model, tokenizer, *, spec: str, path: Path, points: Path, base: bool, full: bool,
                  layers: int | None, verified: Path | None, backend: str, progress: bool,
                  knobs: Mapping[str, Any]) -> dict[str, Any]:
    """One phase of `bench.measure.measure` on the chain's model. Both phases ask for the same verify
    points, so the sweep phase reads the base phase's back from the point log they share."""
    from moespec.bench.measure import measure

    return measure(spec, full=full, out=path, points=points, base=base, layers=layers, progress=progress,
                   loaded=(model, tokenizer), verified=verified, backend=backend, **knobs)


def predict(*, path: Path, characterization: Path, traces: Path, measurement_base: Path) -> None:
    """The prediction (`chain.prediction.predict_all`), written before any scored sweep (Sec. 4)."""
    from moespec.chain.prediction import predict_all

    sources = {"characterization": str(characterization), "traces": str(traces),
               "measurement_base": str(measurement_base)}
    artifacts.write(path, KINDS[PREDICTION], predict_all(characterization, traces, measurement_base, sources=sources))


def score(*, path: Path, prediction: Path, measurement: Path, characterization: Path, measurement_base: Path) -> None:
    """The score of the prediction against the sweep (`chain.scoring.score_all`)."""
    from moespec.chain.scoring import score_all

    artifacts.write(path, KINDS[SCORE], score_all(artifacts.load(prediction, KINDS[PREDICTION]), measurement,
                                                 characterization=characterization, measurement_base=measurement_base))
