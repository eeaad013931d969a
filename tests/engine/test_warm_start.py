"""The warm start of k="auto" (`engine.warm_start`, its store `engine.step_store`): the timing leaves
both caches as they were, so greedy output is the same with and without it (torch and llama.cpp);
it keeps to its budget (on a fake clock); the store (the default) seeds a later call of the same
models on the same machine and no other, each keyed by its own identity, and a miss decodes cold; a
corrupt store warns once and is replaced; a fixed k, given step times or a used AutoK get none."""

import functools
import json
import warnings

import pytest
import torch

import moespec.engine.decode as decode
from moespec.backends.torch_model import CachedModel
from moespec.engine import step_store, warm_start
from moespec.engine.decode import generate
from moespec.engine.policy import AutoK, Learned
from moespec.engine.proposers import DraftModel, OracleDraft, PromptLookup
from moespec.models import synthetic

from ..conftest import require_llama
from tests.engine.fake_clock import FakeClock

REAL, NEW = 259, 32


@pytest.fixture(scope="module")
def pair():
    target, tok = synthetic.build("olmoe-tiny", seed=0)
    return target, synthetic.build("dense-tiny", seed=1)[0], tok.encode("The quick brown fox", add_bos=True)


@pytest.fixture
def store(tmp_path, monkeypatch):
    """The store where a user's would be: $MOESPEC_CACHE/step-times.json, in tmp_path."""
    monkeypatch.delenv("MOESPEC_STEP_TIMES", raising=False)
    monkeypatch.setenv("MOESPEC_CACHE", str(tmp_path))
    return tmp_path / "step-times.json"


@pytest.fixture
def whole_timing(monkeypatch):
    """Every pass size timed (tiny models: the share of a short call allows few, a loaded machine may
    spend 1 s); counts the timings."""
    calls = []
    monkeypatch.setattr(decode, "prepare", functools.partial(warm_start.prepare, share=1e3, budget_s=60.0))
    real = warm_start.time_passes
    monkeypatch.setattr(warm_start, "time_passes", lambda *a, **kw: calls.append(a) or real(*a, **kw))
    return calls


def _warm(out) -> dict | None:
    return out.stats.policy.get("warm_start")


def test_pass_sizes_are_timed_ends_first_and_seeds_interpolate():
    assert warm_start.size_order(9) == [1, 2, 9, 5, 3, 7, 4, 6, 8]
    assert warm_start.size_order(2) == [1, 2] and warm_start.size_order(3) == [1, 2, 3]
    tau = {1: 1.0, 2: 2.0, 6: 4.0}
    assert [warm_start.predict_pass(tau, n) for n in (2, 4, 8)] == [2.0, 3.0, 5.0]
    assert warm_start.predict_pass({1: 1.0, 2: 0.5}, 5) == 0.5  # a line falling with n stops at the largest
    assert warm_start.predict_pass({1: 1.5}, 3) == 4.5  # one point: proportional, an upper bound
    # a pass slower than the one-token passes it could be split into counts as those
    assert warm_start.seed_from_passes({1: 1.0, 2: 5.0, 3: 2.5}, 0.5, 3) == [1.0, 2.5, 3.5, 4.5]
    assert warm_start.seed_from_passes({1: 1.0}, 0.5, 3) is None
    # a store entry: its medians, linear between them and beyond; plain decoding's and a k >= 1 are needed
    assert step_store.seed_from_entry({"measured": {"0": 1.0, "3": 4.0}}, 4) == [1.0, 2.0, 3.0, 4.0, 5.0]
    # a k timed in fewer than MIN_ROUNDS rounds over the calls is left to the points around it
    entry = {"measured": {"0": 1.0, "1": 1.5, "2": 9.0, "3": 2.0}, "rounds": {"0": 1, "1": 5, "2": 1, "3": 4}}
    assert step_store.seed_from_entry(entry, 4) == [1.0, 1.5, 1.75, 2.0, 2.25]
    # below the smallest drafting point, the line through the two smallest, not the one from plain's
    assert step_store.seed_from_entry({"measured": {"0": 1.0, "3": 4.0, "5": 5.0}}, 6) == [1.0, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5]
    assert step_store.seed_from_entry({"measured": {"0": 1.0, "4": 2.0, "5": 4.0}}, 5)[1:4] == [1.0, 1.0, 1.0]  # >= V(0)
    assert step_store.seed_from_entry({"measured": {"0": 1.0, "1": 1.5, "3": 2.0}}, 4) == [1.0, 1.5, 1.75, 2.0, 2.25]
    assert step_store.seed_from_entry({"measured": {"0": 1.0}}, 4) is None
    assert step_store.seed_from_entry({"measured": {"1": 1.0, "3": 4.0}}, 4) is None


def test_the_timing_keeps_to_its_budget_and_extrapolates_exactly(table_lm):
    context = torch.tensor([1, 2, 3])
    for budget, timed, after in [(8.0, [1, 2], 9), (10.0, [1, 2, 9], 5), (100.0, warm_start.size_order(9), None)]:
        target, draft = table_lm(48, seed=1), table_lm(48, seed=2)
        target.extend(context)
        clock = FakeClock(target, draft)
        tau, delta, target_s, draft_s = warm_start.time_passes(target, draft, context, 8, 1000, clock=clock,
                                                               budget_s=budget)
        assert clock.now <= budget and target_s + draft_s == pytest.approx(clock.now)
        assert list(tau) == timed and delta == pytest.approx(0.2) and draft_s == pytest.approx(0.8)
        if after is not None:  # it stopped at the first pass that would not have fit
            assert clock.now + 1 + after / 4 > budget
        V = warm_start.seed_from_passes(tau, delta, 8)  # affine costs: the line through two sizes is exact
        assert V == pytest.approx([1 + (k + 1) / 4 + 0.2 * k for k in range(9)])
        assert target.length == 3 and draft.length == 0
    # one stray slow pass (of 9 tokens, +10) is timed again, and the faster kept
    target, draft = table_lm(48, seed=1), table_lm(48, seed=2)
    clock, stray = FakeClock(target, draft), [10.0]
    extend = target.extend
    target.extend = lambda tokens, outputs=None: (tokens.numel() == 9 and stray and clock.advance(stray.pop()),
                                                  extend(tokens, outputs))[1]
    tau, *_ = warm_start.time_passes(target, draft, context, 8, 1000, clock=clock, budget_s=100.0)
    assert tau[9] == pytest.approx(3.25) and not stray and clock.now == pytest.approx(22.3 + 10 + 3.25)
    # the share of a plain call binds too: 0.1 x 40 tokens x 1.25 (the warm-up) = 5
    target, draft = table_lm(48, seed=1), table_lm(48, seed=2)
    clock = FakeClock(target, draft)
    tau, delta, *_ = warm_start.time_passes(target, draft, context, 8, 40, clock=clock, budget_s=100.0, share=0.1)
    assert clock.now <= 5 and list(tau) == [1] and warm_start.seed_from_passes(tau, delta, 8) is None


def _restored(make, prompt: torch.Tensor, draft_make=None) -> None:
    """After a timing on a prefilled target (and a fresh draft) the next logits are a fresh run's, bit for bit."""
    for base in (prompt.shape[0], 0):
        timed, fresh = make(), make()
        drafts = (draft_make(), draft_make()) if draft_make else (None, None)
        if base:
            timed.extend(prompt, outputs=1)
            fresh.extend(prompt, outputs=1)
        tau, delta, *_ = warm_start.time_passes(timed, drafts[0], prompt, 4, 10**4, budget_s=60.0)
        assert list(tau) == warm_start.size_order(5) and delta is not None
        assert timed.length == base
        nxt = torch.tensor([5, 6, 7])
        assert torch.equal(timed.extend(nxt), fresh.extend(nxt))
        if draft_make:
            assert drafts[0].length == 0
            assert torch.equal(drafts[0].extend(prompt), drafts[1].extend(prompt))


def test_the_timing_restores_torch_caches(pair):
    target, draft, prompt = pair
    _restored(lambda: CachedModel(target), torch.tensor(prompt), lambda: CachedModel(draft))


def test_greedy_output_is_the_same_with_and_without_warm_start(pair, whole_timing):
    target, draft, prompt = pair
    expected = generate(target, prompt, k=0, max_new_tokens=NEW, vocab_limit=REAL).tokens
    for proposer in (draft, OracleDraft(0.8, seed=3)):
        for prefill_last in (True, False):
            for mode in (False, "timed"):
                out = generate(target, prompt, draft=proposer, k="auto", max_k=4, max_new_tokens=NEW,
                               vocab_limit=REAL, prefill_last=prefill_last, warm_start=mode)
                assert out.tokens == expected, (type(proposer).__name__, prefill_last, mode)
                if mode:
                    w = _warm(out)
                    assert w["source"] == "timed" and len(w["V"]) == 5 and out.stats.policy["seeded"]
                    assert 0 < w["seconds"] < out.stats.total_s and list(w["pass_s"]) == ["1", "2", "5", "3", "4"]
                else:
                    assert _warm(out) is None and not out.stats.policy["seeded"]


def test_the_store_seeds_the_next_call_of_the_same_models(pair, store, whole_timing):
    target, draft, prompt = pair
    expected = generate(target, prompt, k=0, max_new_tokens=NEW, vocab_limit=REAL).tokens
    first = generate(target, prompt, draft=draft, k="auto", max_k=4, max_new_tokens=NEW, vocab_limit=REAL)
    assert _warm(first)["source"] is None and not first.stats.policy["seeded"] and store.exists()  # a miss: cold
    (entry,) = json.loads(store.read_text())["entries"].values()
    measured = {int(k): s for k, s in entry["measured"].items()}
    assert 0 in measured and len(measured) >= 2 and set(measured) <= set(first.stats.k_per_round)
    second = generate(target, prompt, draft=draft, k=AutoK(4), max_new_tokens=NEW, vocab_limit=REAL)
    assert second.tokens == first.tokens == expected
    assert _warm(second)["source"] == "store" and _warm(second)["pass_s"] == {} and second.stats.policy["seeded"]
    assert _warm(second)["V"] == step_store.seed_from_entry(entry, 4)
    steady = [k for k in measured if k == 0 or entry["rounds"][str(k)] >= step_store.MIN_ROUNDS]
    assert [_warm(second)["V"][k] for k in steady] == [measured[k] for k in steady]
    # the oracle (another proposer) misses; "timed" times and writes nothing
    third = generate(target, prompt, draft=OracleDraft(0.8), k="auto", max_k=4, max_new_tokens=NEW, vocab_limit=REAL)
    fourth = generate(target, prompt, draft=draft, k="auto", max_k=4, max_new_tokens=NEW, vocab_limit=REAL,
                      warm_start="timed")
    assert _warm(third)["source"] is None and _warm(fourth)["source"] == "timed" and len(whole_timing) == 1
    assert len(json.loads(store.read_text())["entries"]) == 2


def test_another_model_or_machine_finds_no_entry(pair, store, whole_timing, monkeypatch):
    target, draft, prompt = pair
    other = synthetic.build("olmoe-tiny", seed=5)[0]  # the same config, other weights
    run = lambda t: _warm(generate(t, prompt, draft=draft, k="auto", max_k=4, max_new_tokens=NEW, vocab_limit=REAL))
    assert run(target)["source"] is None and run(target)["source"] == "store"
    assert run(other)["source"] is None
    machine = step_store.machine_key()
    monkeypatch.setattr(step_store, "machine_key", lambda: {**machine, "cpu": "another CPU"})
    assert run(target)["source"] is None
    monkeypatch.setattr(step_store, "machine_key", lambda: machine)
    before = torch.get_num_threads()
    torch.set_num_threads(before + 1)
    try:
        assert run(target)["source"] is None
    finally:
        torch.set_num_threads(before)
    assert run(target)["source"] == "store" and len(json.loads(store.read_text())["entries"]) == 4
    assert whole_timing == []  # the store never times


def test_each_model_and_proposer_states_its_own_key(pair, store, table_lm):
    from moespec.backends.exact import ExactPasses
    from moespec.provenance import model_fingerprint

    target, draft, prompt = pair
    key = step_store.store_key(CachedModel(target), DraftModel(draft))
    assert key["target"]["backend"] == "torch" and key["target"]["fingerprint"] == model_fingerprint(target)
    assert key["draft"]["fingerprint"] == model_fingerprint(draft) and key["target"]["threads"] == 1
    assert (key["proposer"], key["options"], key["machine"]) == ("DraftModel", {}, step_store.machine_key())
    assert step_store.store_key(CachedModel(target), PromptLookup(3))["options"] == {"n": 3}
    exact = step_store.store_key(ExactPasses(CachedModel(target)), OracleDraft(0.5))
    assert exact["target"] == {**key["target"], "wrapper": "ExactPasses"} and exact["draft"] is None
    # a table model states none: no key, and its calls decode cold and write nothing
    assert step_store.store_key(table_lm(48), PromptLookup(2)) is None
    assert step_store.store_key(CachedModel(target), DraftModel(table_lm(48))) is None
    out = generate(table_lm(48), [1, 2, 3], draft=table_lm(48, seed=1), k="auto", max_k=3, max_new_tokens=16)
    assert _warm(out)["source"] is None and not store.exists()


@pytest.mark.parametrize("text, said", [
    ("{not json", "ignoring the step-time store {store} ("),
    ("\xff\xfe", "ignoring the step-time store {store} ("),  # not UTF-8
    (json.dumps([1, 2]), "ignoring the step-time store {store} ("),
    # a malformed entry is dropped alone (issue: one bad entry must not discard the whole store)
    (json.dumps({"version": 1, "entries": {"x": {"key": {}, "measured": {"1": -0.5}, "written": 1.0}}}),
     "dropping 1 malformed entry of the step-time store {store} (x)"),
])
def test_a_corrupt_store_warns_once_and_is_replaced(pair, store, whole_timing, text, said):
    target, draft, prompt = pair
    store.write_text(text, encoding="latin-1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = generate(target, prompt, draft=draft, k="auto", max_k=4, max_new_tokens=NEW, vocab_limit=REAL)
    (warning,) = caught
    assert str(warning.message).startswith(said.format(store=store)) and warning.filename == __file__
    assert out.tokens == generate(target, prompt, k=0, max_new_tokens=NEW, vocab_limit=REAL).tokens
    assert _warm(out)["source"] is None and len(step_store.read_store(store)) == 1


def test_no_warm_start_for_a_fixed_k_given_step_times_or_a_used_autok(pair, whole_timing):
    target, draft, prompt = pair
    kw = dict(draft=draft, max_new_tokens=NEW, vocab_limit=REAL)
    used = AutoK(4)
    generate(target, prompt, k=used, warm_start=False, **kw)
    assert any(used.timed)
    runs = [dict(k=3), dict(k="auto", max_k=4, step_times=[1.0] * 5), dict(k=used), dict(k=AutoK(4, V=[1.0] * 5)),
            dict(k="auto", max_k=4, warm_start=False), dict(k="auto", max_k=4, draft=None)]
    for run in runs:
        out = generate(target, prompt, **{**kw, **run})
        assert _warm(out) is None
    assert whole_timing == []
    fresh = AutoK(4)
    assert _warm(generate(target, prompt, k=fresh, **kw))["source"] is None and fresh.seed is None  # the store is off
    assert whole_timing == []
    fresh = AutoK(4)
    assert _warm(generate(target, prompt, k=fresh, warm_start="timed", **kw))["source"] == "timed"
    assert fresh.seed is not None and len(whole_timing) == 1
    with pytest.raises(ValueError, match="warm_start must be True .* got 'fast'"):
        generate(target, prompt, k="auto", warm_start="fast", **kw)
    with pytest.raises(ValueError, match="before its rounds"):
        used.set_seed([1.0] * 5)


def test_llama_cpp_caches_are_restored_and_output_is_the_same(gguf_files, store, whole_timing):
    require_llama()
    from moespec.models import load

    def open_(name, **kw):
        return load(str(gguf_files[name]), backend="llama.cpp", threads=1, **kw)[0]

    prompt = [256, *range(40, 72)]
    _restored(lambda: open_("olmoe-q8_0"), torch.tensor(prompt), lambda: open_("draft-q8_0"))
    whole_timing.clear()
    target, draft = open_("olmoe-q8_0", exact=True), open_("draft-q8_0")
    expected = generate(target, prompt, k=0, max_new_tokens=NEW, vocab_limit=REAL).tokens
    sources = []
    for mode in (False, "timed", True, True):
        out = generate(target, prompt, draft=draft, k="auto", max_k=4, max_new_tokens=NEW, vocab_limit=REAL,
                       warm_start=mode)
        assert out.tokens == expected, mode
        sources.append(None if _warm(out) is None else _warm(out)["source"])
    assert sources == [None, "timed", None, "store"] and len(whole_timing) == 1
    (entry,) = json.loads(store.read_text())["entries"].values()
    assert entry["key"]["target"]["gguf"].endswith("olmoe-q8_0.gguf") and entry["key"]["target"]["threads"] == 1
    assert entry["key"]["target"]["wrapper"] == "ExactPasses" and entry["key"]["draft"]["backend"] == "llama.cpp"
    from moespec.provenance import file_fingerprint

    assert entry["key"]["target"]["fingerprint"] == file_fingerprint(gguf_files["olmoe-q8_0"])  # the one file identity


def test_the_store_remembers_the_pairs_acceptance_and_the_next_call_starts_there(pair, store, whole_timing):
    target, _, prompt = pair
    kw = dict(k="auto", max_k=4, max_new_tokens=NEW, vocab_limit=REAL)
    first = generate(target, prompt, draft=OracleDraft(0.9, seed=1), **kw)
    (entry,) = json.loads(store.read_text())["entries"].values()
    assert entry["acceptance"] == first.stats.policy["acceptance"] and entry["key"]["options"] == {"acceptance": 0.9}
    # step times where the remembered acceptance decides: at α = 1/2 (a cold policy) one draft is best,
    # E(1)/V(1) = 1.2; at α = 0.95, four, E(4)/V(4) = 2.26 (test_policy: remembered acceptance)
    V, remembered = [1.0, 1.25, 1.5, 1.75, 2.0], [0.95] * 4
    doc = json.loads(store.read_text())
    doc["entries"][next(iter(doc["entries"]))].update(
        measured={str(k): v for k, v in enumerate(V)}, rounds={str(k): 9 for k in range(5)}, acceptance=remembered)
    store.write_text(json.dumps(doc))
    fresh = AutoK(4)
    second = generate(target, prompt, draft=OracleDraft(0.9, seed=2), k=fresh, max_new_tokens=NEW, vocab_limit=REAL)
    assert _warm(second)["acceptance"] == remembered and _warm(second)["V"] == V
    expect = AutoK(4, V=_warm(second)["V"])
    expect.set_acceptance(remembered)
    assert AutoK(4, V=V).choose() == 1 and expect.choose() == 4  # the remembered α changes the choice
    assert second.stats.k_per_round[0] == expect.choose()  # the first round drafts by the remembered α
    # another oracle acceptance (or another lookup size) is another drafter: its own entry, a miss
    assert _warm(generate(target, prompt, draft=OracleDraft(0.2, seed=3), **kw))["source"] is None
    assert len(json.loads(store.read_text())["entries"]) == 2
    # an entry with acceptances outside [0, 1] is malformed: dropped alone (the 0.2 entry stays)
    doc = json.loads(store.read_text())
    (bad,) = [e for e in doc["entries"].values() if e["key"]["options"] == {"acceptance": 0.9}]
    bad["acceptance"] = [1.5]
    store.write_text(json.dumps(doc))
    with pytest.warns(UserWarning, match="malformed"):
        assert _warm(generate(target, prompt, draft=OracleDraft(0.9, seed=4), **kw))["source"] is None
    assert _warm(generate(target, prompt, draft=OracleDraft(0.2, seed=5), **kw))["source"] == "store"


def test_a_call_averages_its_times_into_the_entry_by_rounds(store):
    key = {"model": "m"}
    step_store.remember(key, Learned({0: 1.0, 2: 4.0}, {0: 3, 2: 1}, (0.5, 0.4)))
    step_store.remember(key, Learned({0: 2.0, 4: 6.0}, {0: 1, 4: 5}, None))
    (entry,) = step_store.read_store(store).values()
    assert entry["measured"] == {"0": 1.25, "2": 4.0, "4": 6.0} and entry["rounds"] == {"0": 4, "2": 1, "4": 5}
    assert entry["acceptance"] == [0.5, 0.4]  # a call that drafted nothing keeps the last acceptance
    W, calls = step_store.MAX_WEIGHT, 100
    assert 4 < W < calls
    for _ in range(calls):  # the stored time stands for at most MAX_WEIGHT rounds: a new machine state shows
        step_store.remember(key, Learned({0: 3.0}, {0: 1}, None))
    (entry,) = step_store.read_store(store).values()
    # the first W - 4 calls bring the stored rounds from 4 to W: the mean of them all; then each call
    # moves the stored time 1/(W + 1) of the way to 3.0 (without the cap, 3.0 - 1.75 * 4/104 = 2.93)
    capped = (1.25 * 4 + 3.0 * (W - 4)) / W
    assert entry["measured"]["0"] == pytest.approx(3.0 - (3.0 - capped) * (W / (W + 1)) ** (calls - (W - 4)), rel=1e-12)
    assert entry["rounds"]["0"] == W + 1
