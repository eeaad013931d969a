"""Tests of bench.verify: prompts at depth, the bootstrap of S(n), verify times and their resumption."""

import numpy as np
import pytest

from moespec.pointlog import PointLog
from moespec.texts import prompt_ids, prompt_texts
from moespec.bench.verify import run_scaling, run_verify
from moespec.costmodel.verify_times import ScalingCurve, VerifyTimes, bootstrap_saving
from moespec.kernel_names import DEDUP, SLOT
from moespec.models.synthetic import build
from moespec.models.tokenizer import ByteTokenizer
from tests.bench.conftest import FakeClock


class FourBytes:
    """A stand-in subword tokenizer: one token per 4 bytes, so 4096 tokens need several prompts."""

    def encode(self, text):
        data = text.encode()
        return [int.from_bytes(data[i:i + 4].ljust(4, b"\0"), "little") % 1000 for i in range(0, len(data), 4)]


def test_prompt_ids_have_exact_length_and_start_with_their_prompt():
    tok = ByteTokenizer()
    texts = prompt_texts()
    ids = prompt_ids(tok, 4096 + 9, 6)
    assert [len(x) for x in ids] == [4105] * 6
    for text, x in zip(texts, ids):
        assert len(text.encode()) >= 5000  # one prompt covers depth 4096 + 9 under the byte tokenizer
        assert x == tok.encode(text)[:4105]


def test_short_tokenizations_are_filled_with_the_next_prompts():
    ids = prompt_ids(FourBytes(), 4096, 3)
    texts = prompt_texts()
    first = FourBytes().encode(texts[0] + "\n\n")
    assert len(first) < 4096 and all(len(x) == 4096 for x in ids)
    assert ids[0][: len(first)] == first
    assert ids[0][len(first): len(first) + 8] == FourBytes().encode(texts[1] + "\n\n")[:8]


@pytest.mark.parametrize("bad", [dict(length=0), dict(length=8, count=7), dict(length=8, count=0)])
def test_prompt_ids_reject_bad_arguments(bad):
    with pytest.raises(ValueError):
        prompt_ids(ByteTokenizer(), **{"count": 2, **bad})


def test_bootstrap_interval_holds_the_point_and_narrows_with_more_data():
    rng = np.random.default_rng(1)
    widths = []
    for P, R in [(3, 3), (6, 40)]:
        slot = 1.0 + 0.05 * rng.standard_normal((P, R))
        dedup = 0.9 + 0.05 * rng.standard_normal((P, R))
        point, lo, hi = bootstrap_saving(slot, dedup, seed=0)
        assert lo <= point <= hi
        # each prompt's median over its repetitions, averaged over the prompts
        assert point == pytest.approx(np.median(slot, axis=1).mean() - np.median(dedup, axis=1).mean())
        widths.append(hi - lo)
    # 9 against 240 samples: the interval must shrink (by about sqrt(240/9) ~ 5 for a median)
    assert widths[1] < widths[0] / 2
    assert bootstrap_saving(slot, dedup, seed=3) == bootstrap_saving(slot, dedup, seed=3)  # seeded


def test_pass_time_averages_the_prompts_medians_where_the_pooled_median_falls_between_clusters():
    """Two prompts whose passes form two clusters (40 and 54 ms): the pooled median of an even
    count lies between the clusters' inner tails, set by two outliers; the pass time is the mean
    of the two prompts' medians, whatever those tails do."""
    from moespec.costmodel.verify_times import pass_time

    low = [0.039, 0.040, 0.040, 0.041, 0.049]  # one slow outlier
    high = [0.042, 0.054, 0.054, 0.055, 0.056]  # one fast outlier
    samples = np.array([low, high])
    assert pass_time(samples) == pytest.approx((0.040 + 0.054) / 2)
    assert np.median(samples) == pytest.approx((0.042 + 0.049) / 2)  # the pooled median: 45.5 ms
    with pytest.raises(ValueError, match="prompts, repetitions"):
        pass_time(np.ones(3))


def test_bootstrap_rejects_mismatched_samples():
    with pytest.raises(ValueError, match="shape"):
        bootstrap_saving(np.ones((2, 3)), np.ones((3, 2)))
    with pytest.raises(ValueError, match="level"):
        bootstrap_saving(np.ones((2, 3)), np.ones((2, 3)), level=1.5)


@pytest.fixture(scope="module")
def tiny():
    return build("olmoe-tiny", seed=0)


def test_verify_times_structure_and_invariants(tiny, tmp_path):
    model, tok = tiny
    log = PointLog(tmp_path / "v.points.jsonl")
    (vt,) = run_verify(model, tok, depths=(24,), ns=(1, 2), prompts=2, reps=2, log=log)
    assert vt.depth == 24 and vt.ns == (1, 2) and set(vt.kernels) == {SLOT, DEDUP}
    for p in vt.kernels:
        assert all(s.shape == (2, 2) for s in vt.samples[p].values())
        assert all(t > 0 for t in vt.tau(p).values())
    assert vt.tau_meas_1 == vt.tau(SLOT)[1] > 0
    savings = vt.savings()
    assert [s.n for s in savings] == [1, 2]
    assert all(s.lo <= s.point <= s.hi for s in savings)
    back = VerifyTimes.from_dict(vt.to_dict())
    assert back.tau(DEDUP) == vt.tau(DEDUP) and len(log) == 2
    # every pass split into its time inside the experts modules, kept through the artifact
    for p in vt.kernels:
        for n, inside in vt.inside[p].items():
            assert inside.shape == (2, 2) and np.all(inside < vt.samples[p][n])
            assert np.array_equal(back.inside[p][n], inside)


def test_verify_resumes_without_remeasuring(tiny, tmp_path):
    model, tok = tiny
    path = tmp_path / "v.points.jsonl"
    seen = []

    def stop_after_one(key, resumed):
        seen.append((key["prompt"], resumed))
        if len(seen) == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_verify(model, tok, depths=(16,), ns=(1, 2), prompts=3, reps=1, log=PointLog(path), on_point=stop_after_one)
    first = PointLog(path).get(next(iter(dict(PointLog(path).items()))))
    seen.clear()
    (vt,) = run_verify(model, tok, depths=(16,), ns=(1, 2), prompts=3, reps=1, log=PointLog(path),
                       on_point=lambda key, resumed: seen.append((key["prompt"], resumed)))
    assert seen == [(0, True), (1, False), (2, False)]
    assert vt.samples[SLOT][1][0].tolist() == first[SLOT]["1"]  # the finished point is read back, not redone
    assert len(PointLog(path)) == 3


def test_scaling_curve_is_relative_to_one_token(tiny, monkeypatch):
    """On a clock where a pass of n tokens takes exactly PASS + TOKEN n seconds, the curve is
    (PASS + TOKEN n) / (PASS + TOKEN): the n-token pass over the one-token pass."""
    from moespec.bench import timing

    PASS, TOKEN = 2.0**-8, 2.0**-10
    model, tok = tiny
    FakeClock().install(monkeypatch, timing).drive(monkeypatch, model, per_pass=PASS, per_token=TOKEN)
    curve = run_scaling(model, tok, depth=16, ns=range(1, 4), prompts=1, reps=1)
    assert sorted(curve.samples) == [1, 2, 3]
    for n in (1, 2, 3):
        assert curve.samples[n].tolist() == [[PASS + TOKEN * n]]  # [prompts, reps]: the timed pass alone
    assert curve.ratio == {n: pytest.approx((PASS + TOKEN * n) / (PASS + TOKEN), rel=1e-12) for n in (1, 2, 3)}
    assert curve.ratio[1] == 1.0
    assert ScalingCurve.from_dict(curve.to_dict()).ratio == curve.ratio


def _watch_passes(model, seen) -> None:
    """Make every forward pass of `model` call seen(its token count) first."""
    forward = model.forward

    def spy(*args, **kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        seen(int(ids.shape[-1]))
        return forward(*args, **kwargs)

    model.forward = spy


def test_time_passes_runs_repetitions_in_rounds_over_every_n():
    """After one warm-up per (n, kernel), the timed passes go round by round: every n once per round."""
    from moespec.bench.verify import time_passes

    model, tok = build("olmoe-tiny")
    sizes = []
    _watch_passes(model, sizes.append)
    ids = tok.encode("x" * 40, add_bos=True)
    out = time_passes(model, ids, 16, [1, 2, 3], [SLOT, DEDUP], reps=3, warmup=1)
    timed = [n for n in sizes if n <= 3][12:]  # after the prefill and 2 untimed + timed warm-ups per (n, kernel)
    assert len(timed) == 3 * 3 * 2 and all(len(out[k][str(n)]) == 3 for k in (SLOT, DEDUP) for n in (1, 2, 3))
    rounds = [timed[i:i + 6] for i in range(0, 18, 6)]
    assert all(sorted(r) == [1, 1, 2, 2, 3, 3] for r in rounds)  # each round holds every n, both kernels


def test_time_passes_splits_each_pass_into_its_experts_time_and_the_rest():
    """"inside" holds, per timed pass, the seconds inside the model's experts modules: positive and
    below the pass's own time, one value per pass."""
    from moespec.bench.verify import time_passes

    model, tok = build("olmoe-tiny")
    out = time_passes(model, tok.encode("x" * 40, add_bos=True), 16, [1, 2, 3], [SLOT, DEDUP], reps=3, warmup=1)
    assert set(out) == {SLOT, DEDUP, "inside"}
    for k in (SLOT, DEDUP):
        for n in ("1", "2", "3"):
            assert len(out["inside"][k][n]) == 3
            assert all(0 < i < t for i, t in zip(out["inside"][k][n], out[k][n]))


def test_time_passes_calls_between_right_after_each_timed_pass():
    from moespec.bench.verify import time_passes

    model, tok = build("olmoe-tiny")
    events = []
    _watch_passes(model, lambda n: events.append(("pass", n)) if n <= 3 else None)

    def between(n, kernel, start):
        events.append(("between", n, kernel, start))
        return [float(n), 2.0]

    out = time_passes(model, tok.encode("x" * 40, add_bos=True), 16, [1, 2, 3], [SLOT, DEDUP], reps=2, warmup=1,
                      between=between, stride=4)  # the 4 tokens fed between rounds are no pass of n <= 3
    assert out["ops"][DEDUP]["2"] == [[2.0, 2.0]] * 2 and set(out["ops"]) == {SLOT, DEDUP}
    warm = [i for i, e in enumerate(events) if e[0] == "between"][:6]
    assert all(events[i][3] == 0 for i in warm)  # warm-up passes read the first window
    timed = [e for e in events[warm[-1] + 1:] if not (e[0] == "pass" and e[1] > 3)]
    # every timed pass is followed by one call with its own n, kernel and window, before the next pass
    assert [e[0] for e in timed] == ["pass", "between"] * (2 * 3 * 2)
    assert all(p[1] == b[1] for p, b in zip(timed[::2], timed[1::2]))
    assert [b[2] for b in timed[1::2]] == [SLOT, DEDUP] * 6
    assert [b[3] for b in timed[1::2]] == [0] * 6 + [4] * 6  # round r reads the window 4r tokens in


def test_time_passes_with_a_stride_verifies_later_windows_over_the_text_before_them():
    """Repetition r passes ids[d + s r : d + s r + n] on a cache holding exactly ids[:d + s r]."""
    from moespec.bench.verify import time_passes
    from moespec.backends import torch_model as cached

    model, tok = build("olmoe-tiny")
    ids = list(range(40, 80))
    seen = []
    extend = cached.CachedModel.extend

    def spy(self, tokens, outputs=None):
        seen.append((self.length, [int(t) for t in tokens.reshape(-1)]))
        return extend(self, tokens, outputs)

    cached.CachedModel.extend = spy
    try:
        time_passes(model, ids, 16, [1, 2], [DEDUP], reps=3, warmup=0, stride=3)
    finally:
        cached.CachedModel.extend = extend
    passes = [(at, t) for at, t in seen if at >= 16]  # the timed passes and the extensions between rounds
    for at, t in passes:  # every call reads the tokens right after what the cache holds
        assert t == ids[at:at + len(t)]
    assert sorted({at for at, _ in passes}) == [16, 19, 22]
    with pytest.raises(ValueError, match="cannot hold depth 16 plus 3 passes"):
        time_passes(model, ids[:23], 16, [1, 2], [DEDUP], reps=3, warmup=0, stride=3)


def test_verified_text_is_the_targets_greedy_continuation(tiny):
    """Teacher-forced once, the model's argmax after each prefix is the next continuation token."""
    import torch

    from moespec.bench.verified_text import verified_texts

    model, tok = tiny
    (text,) = verified_texts(model, tok, 16, 1, 6)
    assert len(text) == 22 and text[:16] == prompt_ids(tok, 16, 1)[0]
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([text])).logits[0, 15:21, :len(tok)]
    assert logits.argmax(-1).tolist() == text[16:]


def test_verify_times_the_operation_on_each_passs_own_window(tiny, tmp_path):
    from moespec.texts import continuation_length
    from moespec.bench.verify import verified_routing

    model, tok = tiny
    with pytest.raises(ValueError, match=r"shorter than the 8 tokens.*verified_routing\(length=8\)"):
        run_verify(model, tok, depths=(16,), ns=(1, 2), prompts=2, reps=3, windows=verified_routing(
            model, tok, depths=(16,), prompts=2, n_max=2), op_layers=(0,))
    windows = verified_routing(model, tok, depths=(16,), prompts=2, n_max=2, length=continuation_length(3, 2))
    assert [len(d) for d in windows.documents] == [8, 8]
    log = PointLog(tmp_path / "v.points.jsonl")
    (vt,) = run_verify(model, tok, depths=(16,), ns=(1, 2), prompts=2, reps=3, log=log, windows=windows,
                       op_layers=(1, 0))
    assert vt.op_layers == (1, 0)
    for kernel in (SLOT, DEDUP):
        assert all(s.shape == (2, 3, 2) and np.all(s > 0) for s in vt.ops[kernel].values())  # [P, R, L]
        assert np.allclose(vt.op_times(kernel)[2], np.median(vt.ops[kernel][2], axis=1).mean(axis=0))
    back = VerifyTimes.from_dict(vt.to_dict())
    assert back.op_layers == (1, 0) and all(np.array_equal(back.ops[DEDUP][n], vt.ops[DEDUP][n]) for n in (1, 2))
    # read back from the log, not timed again; asked without the operation, the points are other points
    again = run_verify(model, tok, depths=(16,), ns=(1, 2), prompts=2, reps=3, log=log, windows=windows,
                       op_layers=(1, 0))[0]
    assert np.array_equal(again.ops[SLOT][2], vt.ops[SLOT][2]) and len(log) == 2
    plain = run_verify(model, tok, depths=(16,), ns=(1, 2), prompts=2, reps=3, log=log)[0]
    assert plain.ops is None and len(log) == 4
    with pytest.raises(ValueError, match="no operation times"):
        plain.op_times(SLOT)
    with pytest.raises(ValueError, match="no document 'd24/p0'"):
        run_verify(model, tok, depths=(24,), ns=(1, 2), prompts=1, reps=1, windows=windows, op_layers=(0,))


def test_the_flush_is_skipped_for_weights_that_fit_in_the_cache(tmp_path, monkeypatch):
    """A model whose weights fit in half the LLC decodes from cache: its passes are timed warm. A
    larger one, or one whose size or the cache's is unknown, is flushed before each pass."""
    import torch

    from moespec.bench import verify as v
    from moespec.bench.timing import CacheFlusher

    monkeypatch.setattr("moespec.device.last_level_cache_bytes", lambda: 8 << 20)  # 8 MiB
    small = torch.nn.Linear(512, 512)  # 1 MiB of float32 weights
    large = torch.nn.Linear(2048, 2048)  # 16 MiB
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"\0" * (5 << 20))  # 5 MiB: over half of 8 MiB

    class FileModel:
        path = gguf

    assert v.weight_bytes(small) == (512 * 512 + 512) * 4 and v.weight_bytes(FileModel()) == 5 << 20
    assert v.default_flusher(True, small) is None
    assert isinstance(v.default_flusher(True, large), CacheFlusher)
    assert isinstance(v.default_flusher(True, FileModel()), CacheFlusher)
    assert isinstance(v.default_flusher(True, object()), CacheFlusher)  # size unknown: flushed
    assert v.default_flusher(False, large) is None
    monkeypatch.setattr("moespec.device.last_level_cache_bytes", lambda: None)
    assert isinstance(v.default_flusher(True, small), CacheFlusher)  # the cache's size unknown: flushed
