"""The work of the demo's steps (`chain.demo`): recording routing, the verified text's routing, the
characterization, and the measurement settings they share; each writes the artifact at `path`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from moespec.chain.demo import DemoConfig

TRAINED_ROUTER = "trained:olmoe"
TRAINED_ROUTING_TOKENS = 8192  # covers every position the demo decodes at (the full protocol's wrap around)


def _trace(net, tok, config: DemoConfig, path: Path) -> None:
    from moespec.texts import default_corpus
    from moespec.moe.routing import record_to_file, tokenize

    docs = tokenize(tok, default_corpus(), config.trace_tokens)
    record_to_file(net, docs, path, model_spec=config.model, corpus=["moespec:data/corpus"])


def _trace_trained(path: Path) -> None:
    """The routing trained:olmoe chose on the shipped corpus, for the target to replay."""
    from moespec.models import load
    from moespec.texts import default_corpus
    from moespec.moe.routing import record_to_file, tokenize

    net, tok = load(TRAINED_ROUTER)
    docs = tokenize(tok, default_corpus(), TRAINED_ROUTING_TOKENS)
    record_to_file(net, docs, path, model_spec=TRAINED_ROUTER, corpus=["moespec:data/corpus"])


def _measure_config(config: DemoConfig):
    from moespec.bench.measure import MeasureConfig

    return MeasureConfig.preset(config.full, **config.measure_knobs())


def _verified_length(config: DemoConfig) -> int:
    """Tokens of each prompt's continuation that the verify passes read (`prompts.continuation_length`)."""
    from moespec.texts import continuation_length

    m = _measure_config(config)
    return continuation_length(m.reps, max(m.ns), m.stride)


def _verified_too_short(config: DemoConfig, path: Path) -> str:
    """"" unless the verified routing at `path` holds fewer tokens than this config's passes read."""
    if not path.exists():
        return ""
    from moespec.moe.traces import RoutingTrace

    have, need = min(len(d) for d in RoutingTrace.load(path).documents), _verified_length(config)
    return f"holds {have} tokens per continuation, the verify passes read {need}" if have < need else ""


def _trace_verified(net, tok, config: DemoConfig, path: Path) -> None:
    from moespec.bench.verify import verified_routing

    m = _measure_config(config)
    verified_routing(net, tok, depths=m.depths, prompts=m.prompts, n_max=max(m.ns), length=_verified_length(config),
                     model_spec=config.model).save(path)


def _characterize(net, config: DemoConfig, traces: Path, verified: Path | None, path: Path, progress: bool) -> None:
    from moespec.bench.characterize import characterize

    knobs = dict(config.characterize)
    knobs.setdefault("n", _measure_config(config).ns)
    if config.times_ops_between_passes and "verified_reps" not in knobs:  # the base measurement times them
        verified = None
    if config.backend == "llama.cpp":
        knobs["threads"] = config.threads
    characterize(net, traces, verified=verified, out=path, progress=progress, seed=config.seed,
                 model_spec=None if config.backend == "llama.cpp" else config.model, **knobs)
