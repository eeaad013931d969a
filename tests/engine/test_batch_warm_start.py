"""The warm start of a batch's k="auto" (`engine.batch_warm_start`), on a counting batch model and a
fake clock (no llama.cpp): a warm store that says drafting does not pay runs no drafting round, not
at the first rounds and not as the batch shrinks; one that says it pays drafts its best k from the
first round; an unseen live count is seeded from the other sizes by the documented rule; a call
writes an entry per live count; concurrent writers of several sizes lose no entry. The tokens are
plain decoding's throughout."""

import json
import multiprocessing as mp

import pytest
import torch

import moespec.engine.batch as batch_module
from moespec.engine import step_store
from moespec.engine.batch import generate_batch
from moespec.engine.batch_warm_start import Known, batch_key, plain_time, size_seed
from moespec.engine.policy import AutoK, Learned

V, EOS, MAX_K = 64, 63, 4
ENDS = [10, 20, 30, 40]  # prompt i ends at token ENDS[i]: it reaches the EOS after 63 - ENDS[i] tokens


class Clock:
    """Stands in for batch's `time`: the models advance it."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class TimedCounting:
    """A BatchModel whose greedy token after x is x + 1 (mod V); a pass of n tokens costs cost(n) on the
    clock. A draft of this kind drafts the target's own tokens: every draft is accepted."""

    batch, n_vocab, vocab_limit, forward_s, compiled_steps = 512, V, None, 0.0, False

    def __init__(self, sequences: int, clock: Clock, cost, name: str):
        self.sequences, self.clock, self.cost, self.name = sequences, clock, cost, name
        self.held = [[] for _ in range(sequences)]

    def identity(self) -> dict:
        return {"backend": "counting", "name": self.name}

    def reset(self):
        self.held = [[] for _ in range(self.sequences)]

    def seq_length(self, seq):
        return len(self.held[seq])

    def truncate_seq(self, seq, n):
        del self.held[seq][n:]

    def move(self, src, dst):
        self.held[dst], self.held[src] = self.held[src], []

    def extend_parts(self, parts):
        self.clock.now += self.cost(sum(len(ids) for _, ids in parts))
        out = []
        for seq, ids in parts:
            self.held[seq].extend(ids)
            logits = torch.full((len(ids), V), -1.0)
            logits[torch.arange(len(ids)), (torch.tensor(ids) + 1) % V] = 1.0
            out.append(logits)
        return out

    def argmax_parts(self, parts, limit):
        return [[int(r) for r in rows[:, :limit].argmax(-1)] for rows in self.extend_parts(parts)]

    def batch_greedy_steps(self, parts, steps, limit, eos=()):
        raise AssertionError("not compiled")


def step_time(B: int, k: int, draft_step: float) -> float:
    """A round's seconds on the fake clock: k draft passes, then a verify pass of B(k + 1) tokens."""
    return k * draft_step + 1 + B * (k + 1) / 4


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("MOESPEC_STEP_TIMES", str(tmp_path / "step-times.json"))
    return tmp_path / "step-times.json"


@pytest.fixture
def pair(monkeypatch):
    """make(B, draft_step) -> (target, draft) on one fake clock, batch's `time` patched to it."""
    clock = Clock()
    monkeypatch.setattr(batch_module, "time", clock)

    def make(B: int, draft_step: float):
        return (TimedCounting(B, clock, lambda n: 1 + n / 4, "target"),
                TimedCounting(B, clock, lambda n: draft_step, f"draft {draft_step}"))
    return make


def key_of(target, draft) -> dict:
    """The pair's key as generate_batch builds it."""
    from moespec.engine.batch_proposers import BatchDraft

    return step_store.store_key(target, BatchDraft(draft))


def store_sizes(target, draft, sizes, draft_step: float, acceptance) -> None:
    """Entries at live counts `sizes` as a well-timed earlier call leaves them: V_B(0..MAX_K) in 9 rounds each."""
    step_store.remember_all([(batch_key(key_of(target, draft), B), Learned(
        {k: step_time(B, k, draft_step) for k in range(MAX_K + 1)}, {k: 9 for k in range(MAX_K + 1)}, acceptance))
        for B in sizes])


def run(target, draft, B: int, **kw):
    prompts = [[0, e] for e in ENDS[:B]]
    return generate_batch(target, prompts, draft=draft, k="auto", max_k=MAX_K, max_new_tokens=V, eos_token_id=EOS, **kw)


def plain_tokens(B: int) -> list[list[int]]:
    return [list(range(e + 1, EOS + 1)) for e in ENDS[:B]]


def test_a_store_that_says_drafting_does_not_pay_runs_no_drafting_round(store, pair):
    target, draft = pair(4, 5.0)  # a draft step costs 5 plain one-token passes
    cold = run(target, draft, 4, warm_start=False)[0].batch
    assert cold.k_per_round[:2] == (2, 2)  # without a store: the opening probes k_open twice
    store_sizes(target, draft, [4], 5.0, (0.9,) * MAX_K)
    out = run(target, draft, 4)
    batch = out[0].batch
    assert [r.tokens for r in out] == plain_tokens(4)
    assert set(batch.live_per_round) == {4, 3, 2, 1} and set(batch.k_per_round) == {0}
    warm = batch.policy["warm_start"]
    assert warm["4"]["source"] == "store" and warm["4"]["acceptance"] == [0.9] * MAX_K
    assert [warm[b]["source"] for b in "321"] == ["sizes"] * 3 and warm["3"]["from_size"] == 4
    # no live count would pay were every draft accepted: (k + 1) V_B(0) <= V_B(k)
    assert all((k + 1) * w["V"][0] <= w["V"][k] for w in warm.values() for k in range(1, MAX_K + 1))


def test_a_store_that_says_drafting_pays_drafts_its_best_k_from_the_first_round(store, pair):
    target, draft = pair(4, 0.01)
    store_sizes(target, draft, [4], 0.01, (0.9,) * MAX_K)
    expect = AutoK(MAX_K, V=[step_time(4, k, 0.01) for k in range(MAX_K + 1)])
    expect.set_acceptance([0.9] * MAX_K)
    assert expect.choose() == 3 and AutoK(MAX_K).choose() == 2  # the store's best k is not the cold opening's
    out = run(target, draft, 4)
    assert [r.tokens for r in out] == plain_tokens(4)
    assert out[0].batch.k_per_round[0] == 3 and out[0].batch.policy["warm_start"]["4"]["source"] == "store"


def test_an_unseen_live_count_takes_the_nearest_sizes_ratio_and_the_plain_times_between():
    V2, V4 = (1.0, 3.0, 4.0), (2.0, 8.0, 14.0)
    known = {2: Known(V2, 1.0, (0, 1, 2), (0.7, 0.6), 1.0), 4: Known(V4, 2.0, (0, 1, 2), None, 2.0)}
    three = size_seed(3, known, None)  # nearest by |log B/B'|: 4; V_3(0) halfway between 1.0 and 2.0
    assert (three.source, three.from_size, three.acceptance) == ("sizes", 4, (0.7, 0.6))
    assert three.V == pytest.approx((1.5, 6.0, 10.5)) and three.anchors is None
    one = size_seed(1, known, (0.2, 0.1))  # nearest 2; below every known plain time: the nearest one's
    assert (one.from_size, one.V, one.acceptance) == (2, V2, (0.2, 0.1))  # this call's acceptance first
    assert size_seed(4, known, None) == type(three)("store", V4, (0, 1, 2), (0.7, 0.6))
    assert size_seed(3, {2: Known(None, 1.0, None, None, 1.0)}, None).source is None
    assert plain_time(6, {2: 1.0, 4: 2.0}) == 2.0 and plain_time(3, {2: 1.0, 6: 3.0}) == 1.5
    assert size_seed(2, {1: known[2], 4: known[4]}, None).from_size == 4  # a tie in |log B/B'|: the larger size


def test_a_store_entry_for_two_sequences_seeds_three_and_one(store, pair):
    target, draft = pair(3, 5.0)
    store_sizes(target, draft, [2], 5.0, (0.8,) * MAX_K)
    out = run(target, draft, 3)
    warm = out[0].batch.policy["warm_start"]
    V2 = [step_time(2, k, 5.0) for k in range(MAX_K + 1)]
    assert warm["3"] == {"source": "sizes", "V": pytest.approx(V2), "anchors": None,
                         "acceptance": [0.8] * MAX_K, "from_size": 2}  # one plain time known: V_3(0) = V_2(0)
    assert warm["2"]["source"] == "store" and warm["2"]["V"] == pytest.approx(V2)
    by_size = out[0].batch.policy["by_size"]
    V2_now = by_size["2"]["step_s"]  # at 1, this call's B = 2 estimate (nearest, with its own plain time)
    assert warm["1"]["from_size"] == 2 and warm["1"]["V"] == pytest.approx(V2_now)
    assert set(out[0].batch.k_per_round) == {0} and [r.tokens for r in out] == plain_tokens(3)


def test_a_call_writes_an_entry_per_live_count_and_the_next_call_reads_them(store, pair):
    target, draft = pair(4, 5.0)
    first = run(target, draft, 4)
    assert {w["source"] for w in first[0].batch.policy["warm_start"].values()} <= {None, "sizes"}
    entries = step_store.read_store(store)
    by_batch = {e["key"]["batch"]: e for e in entries.values()}
    assert 4 in by_batch and set(by_batch) <= {4, 3, 2, 1}
    for B, e in by_batch.items():
        assert e["key"] == batch_key(key_of(target, draft), B)
        if "0" in e["measured"]:
            assert e["measured"]["0"] == pytest.approx(step_time(B, 0, 5.0))
    second = run(target, draft, 4)
    warm = second[0].batch.policy["warm_start"]
    assert warm["4"]["source"] == "store" and set(second[0].batch.k_per_round) == {0}
    # a live count with only plain rounds stored: its own plain time, the ratio of the nearest size with
    # drafting times, and the acceptance of the latest entry (a sequence's, whatever B)
    assert warm["3"]["source"] == "sizes" and warm["3"]["V"][0] == pytest.approx(by_batch[3]["measured"]["0"])
    assert warm["3"]["acceptance"] == by_batch[4]["acceptance"] is not None
    assert [r.tokens for r in second] == [r.tokens for r in first] == plain_tokens(4)


def test_no_store_no_warm_start_and_a_bad_mode_is_refused(pair, monkeypatch, store):
    target, draft = pair(2, 5.0)
    assert "warm_start" not in run(target, draft, 2, warm_start=False)[0].batch.policy and not store.exists()
    with pytest.raises(ValueError, match="warm_start must be True .* got 'timed'"):
        run(target, draft, 2, warm_start="timed")
    monkeypatch.setenv("MOESPEC_STEP_TIMES", "")
    assert "warm_start" not in run(target, draft, 2)[0].batch.policy


PROCESSES, SIZES = 4, 4


def _writer(path: str, worker: int, start) -> None:
    import os

    os.environ["MOESPEC_STEP_TIMES"] = path
    start.wait()
    step_store.remember_all([(batch_key({"worker": worker}, B), Learned({0: 1e-3 * B, 1: 3e-3 * B}, {0: 4, 1: 4},
                                                                        (0.5,))) for B in range(1, SIZES + 1)])


def test_concurrent_writers_of_several_sizes_lose_no_entry(store):
    ctx = mp.get_context("fork")
    start = ctx.Barrier(PROCESSES)
    procs = [ctx.Process(target=_writer, args=(str(store), w, start)) for w in range(PROCESSES)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * PROCESSES
    keys = {json.dumps(e["key"], sort_keys=True) for e in json.loads(store.read_text())["entries"].values()}
    assert len(keys) == PROCESSES * SIZES


def test_on_llama_cpp_the_store_keys_each_live_count_and_the_tokens_stay_plain(gguf_files, store):
    """The exported trained pair under exact passes: a cold call and a warm one give each sequence its
    plain tokens; the store holds the pair's entries per live count, keyed by the files."""
    from moespec.backends.exact import exact_llama_environment
    from moespec.backends.llama_batch import LlamaBatch
    from moespec.models.tokenizer import ByteTokenizer
    from tests.conftest import require_llama

    require_llama()
    exact_llama_environment()
    tok = ByteTokenizer()
    ps = [tok.encode(t, add_bos=True) for t in ("def area(r):\n    return ", "The river ran past the old mill")]
    load = lambda name: LlamaBatch(gguf_files[name], sequences=2, threads=1, n_ctx=256, flash_attn=False,  # noqa: E731
                                   exact=True)
    target, draft = load("olmoe-q8_0"), load("draft-q8_0")
    plain = [r.tokens for r in generate_batch(target, ps, k=0, max_new_tokens=24, vocab_limit=259)]
    outs = [generate_batch(target, ps, draft=draft, k="auto", max_k=4, max_new_tokens=24, vocab_limit=259)
            for _ in range(2)]
    assert [[r.tokens for r in out] for out in outs] == [plain, plain]
    entries = step_store.read_store(store).values()
    assert {e["key"]["batch"] for e in entries} >= {2}
    assert all(e["key"]["target"]["gguf"].endswith("olmoe-q8_0.gguf") and e["key"]["proposer"] == "BatchDraft"
               and e["key"]["draft"]["gguf"].endswith("draft-q8_0.gguf") for e in entries)
    assert outs[1][0].batch.policy["warm_start"]["2"]["source"] == "store"


def test_a_probe_is_priced_with_the_drafts_catch_up_once_its_fill_rate_is_known(store, pair, monkeypatch):
    """B = 1, a store whose acceptance (0.05) says drafting does not pay, a 300-token prompt, a draft
    whose pass costs 0.01 s per token (its fill of the prompt: about 3 s, 2.4 plain rounds of 1.25 s
    each). Not yet knowing the draft's fill rate, the call probes within its 40 tokens (the doubling
    wait, the probe's loss V(1) - E(1) V(0) about 0.2 s); once a fill was timed, the probe's cost
    holds the catch-up and is due after about 86 plain rounds: the call drafts no round."""
    import moespec.engine.batch_proposers as proposers

    monkeypatch.setattr(proposers, "time", batch_module.time)  # the fills on the same fake clock
    clock = batch_module.time
    target = TimedCounting(1, clock, lambda n: 1 + n / 4, "target")
    draft = TimedCounting(1, clock, lambda n: 0.01 * n, "draft per token")
    prompt = [i % 60 for i in range(300)]
    store_sizes(target, draft, [1], 0.01, (0.05,) * MAX_K)

    def call():
        return generate_batch(target, [prompt], draft=draft, k="auto", max_k=MAX_K, max_new_tokens=40)[0]

    first = call()
    assert any(first.batch.k_per_round), first.batch.k_per_round  # probed: its fill is timed now
    store_sizes(target, draft, [1], 0.01, (0.05,) * MAX_K)  # the same store again (the probe wrote into it)
    second = call()
    assert set(second.batch.k_per_round) == {0}, second.batch.k_per_round
    assert second.tokens == first.tokens == [(59 + 1 + i) % V for i in range(40)]  # plain decoding's
    proposers._fill_rates.clear()  # the same store, the fill rate forgotten: the probe is back
    assert any(call().batch.k_per_round)


def test_a_plain_call_that_learned_nothing_new_leaves_the_store_unwritten(store, pair):
    # the store says drafting does not pay at B = 1; a call that decodes plainly at the stored plain time
    # (the fake clock's, exactly) writes nothing; one whose plain rounds took 10% longer writes them
    target, draft = pair(1, 5.0)
    store_sizes(target, draft, [1], 5.0, (0.9,) * MAX_K)
    before = store.read_bytes()
    out = run(target, draft, 1)
    assert set(out[0].batch.k_per_round) == {0} and store.read_bytes() == before
    store_sizes(target, draft, [1], 5.0, (0.9,) * MAX_K)  # written again: stored plain now 1.1x the clock's
    entries = step_store.read_store(store)
    entry = next(iter(entries.values()))
    entry["measured"]["0"] *= 1.1
    store.write_text(json.dumps({"version": step_store.STORE_VERSION, "entries": entries}))
    before = store.read_bytes()
    run(target, draft, 1)
    after = next(iter(step_store.read_store(store).values()))["measured"]["0"]
    assert store.read_bytes() != before and after < entry["measured"]["0"]
