"""Tests of bench.sweep: the shared prefill, the oracle sweep, the real-draft sweep, resumption."""

import math

import numpy as np
import pytest
import torch

from moespec.pointlog import PointLog
from moespec.bench.prefilled import PrefilledTarget
from moespec.texts import prompt_ids
from moespec.bench.sweep import oracle_points, run_draft, run_oracle
from moespec.costmodel.sweep_cells import SweepCell, resample_throughput, step_time
from moespec.kernel_names import DEDUP, ENGINE_KERNELS as KERNELS
from moespec.backends.torch_model import CachedModel
from moespec.engine.decode import generate
from moespec.engine.proposers import OracleDraft, PromptLookup
from moespec.models.synthetic import build
from tests.bench.conftest import FakeClock


@pytest.fixture(scope="module")
def tiny():
    return build("olmoe-tiny", seed=0)


def test_prefilled_target_matches_a_fresh_cache(tiny):
    model, _ = tiny
    prompt = torch.arange(40, 60)
    shared = PrefilledTarget(model, prompt)
    fresh = CachedModel(model)
    for _ in range(2):  # the second generate reuses the prefill
        a = generate(shared, prompt, k=0, max_new_tokens=6)
        b = generate(fresh, prompt, k=0, max_new_tokens=6)
        assert a.tokens == b.tokens
    shared.reset()
    rows = shared.extend(prompt)
    fresh.reset()
    assert torch.allclose(rows, fresh.extend(prompt), atol=1e-4)
    with pytest.raises(ValueError, match="one prompt"):
        shared.truncate(0)
        shared.extend(prompt + 1)


def test_a_target_that_holds_more_text_decodes_as_one_prefilled_with_it(tiny):
    model, _ = tiny
    text = torch.arange(40, 70)
    grown = PrefilledTarget(model, text[:20])
    generate(grown, text[:21], k=0, max_new_tokens=4, prefill_last=False)  # a run before the start moves
    grown.hold(text[20:29])
    fresh = PrefilledTarget(model, text[:29])
    assert grown.prompt.tolist() == text[:29].tolist() and grown.logits.shape == fresh.logits.shape
    assert torch.allclose(grown.logits, fresh.logits, atol=1e-4)
    a = generate(grown, text[:30], k=2, max_new_tokens=6, prefill_last=False)
    b = generate(fresh, text[:30], k=2, max_new_tokens=6, prefill_last=False)
    assert a.tokens == b.tokens


def test_a_target_that_keeps_its_last_rows_serves_them_alone_and_refuses_the_rest(tiny, monkeypatch):
    # 600 tokens: two prefill chunks; keep=3 holds the last three rows of the 600, the rows a full
    # target holds there, and a run's prefill reads its one row without copying the other 599
    model, _ = tiny
    prompt = torch.arange(3, 603) % 97 + 3
    full, kept = PrefilledTarget(model, prompt), PrefilledTarget(model, prompt, keep=3)
    assert kept.logits.shape[0] == 3 and kept.first_row == 597
    assert torch.allclose(kept.logits, full.logits[-3:], atol=1e-4)
    grown = PrefilledTarget(model, prompt[:10], keep=3)
    grown.hold(prompt[10:])  # 590 tokens in one pass: its last three rows kept
    assert torch.allclose(grown.logits, full.logits[-3:], atol=1e-4)
    copied = []
    real_cat = torch.cat
    monkeypatch.setattr(torch, "cat", lambda parts, *a, **kw: copied.append(sum(p.shape[0] for p in parts))
                        or real_cat(parts, *a, **kw))
    row = kept.extend(prompt[:-1], outputs=1)
    monkeypatch.undo()
    assert copied == [1] and torch.allclose(row, full.logits[-2:-1], atol=1e-4)
    kept.reset()
    with pytest.raises(ValueError, match="position 595 were not kept"):
        kept.extend(prompt[:596], outputs=1)
    kept.reset()
    full.reset()
    a = generate(kept, list(prompt) + [7], k=0, max_new_tokens=5, prefill_last=False)
    b = generate(full, list(prompt) + [7], k=0, max_new_tokens=5, prefill_last=False)
    assert a.tokens == b.tokens
    kept.hold(torch.tensor([7, 8]))
    full.hold(torch.tensor([7, 8]))
    assert kept.prompt.shape[0] == 602 and kept.logits.shape[0] == 3
    assert torch.allclose(kept.logits, full.logits[-3:], atol=1e-4)  # the held rows, at their positions
    with pytest.raises(ValueError, match="keep=0"):
        PrefilledTarget(model, prompt, keep=0)


def test_oracle_sweep_invariants_and_resumption(tiny, tmp_path):
    model, tok = tiny
    path = tmp_path / "o.points.jsonl"
    grid = dict(depths=(16,), ks=(0, 3), acceptances=(0.5, 0.9), kernels=KERNELS, prompts=1, reps=1, new_tokens=32)
    total = oracle_points(**{k: v for k, v in grid.items() if k != "new_tokens"})
    assert total == 8  # k = 0 and 3 at each of two acceptances, two kernels
    calls = []

    def interrupt_after_three(key, resumed):
        calls.append(resumed)
        if len(calls) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_oracle(model, tok, log=PointLog(path), on_point=interrupt_after_three, **grid)
    calls.clear()
    out = run_oracle(model, tok, log=PointLog(path), on_point=lambda key, resumed: calls.append(resumed), **grid)
    assert calls == [True] * 3 + [False] * (total - 3)  # finished points are read back, the rest measured
    assert len(PointLog(path)) == total
    assert [(e["kernel"], e["depth"]) for e in out] == [(p, 16) for p in KERNELS]
    for entry in out:
        assert sorted(entry["h"]) == ["0", "3"] and all(h >= 0 for h in entry["h"].values())
        for cell in entry["cells"]:
            assert cell["tokens"] == 32
            assert 1 <= cell["tokens_per_step"] <= cell["k"] + 1
            if cell["k"] == 0:  # each acceptance's block has its own plain run
                assert cell["a"] in (0.5, 0.9) and cell["tokens_per_step"] == 1
                continue
            assert cell["G"] == pytest.approx(sum(cell["a"] ** j for j in range(cell["k"] + 1)))
            # 32 tokens at k = 3 give >= 20 tested drafts; 0.25 is > 2 standard errors of the geometric
            # estimate at a = 0.5 (sd 0.11 at 20 tests); the flags are seeded, so this is deterministic
            assert abs(cell["realized_acceptance"] - cell["a"]) < 0.25
            assert len(cell["acceptance_by_position"]) == cell["k"]
        plain = entry["plain"]  # every k = 0 run of both blocks, pooled
        zero = [c for c in entry["cells"] if c["k"] == 0]
        assert plain["a"] is None and plain["runs"] == sum(c["runs"] for c in zero) == 2
        assert plain["steps"] == sum(c["steps"] for c in zero)
        # one acceptance's runs after another, each in pass order (`resample_throughput` draws passes)
        assert plain["run_steps"] == [steps for c in zero for steps in c["run_steps"]]
    back = SweepCell.from_dict({k: v for k, v in out[0]["cells"][1].items() if k in SweepCell.__dataclass_fields__})
    assert back.throughput == pytest.approx(out[0]["cells"][1]["throughput"])


def _run(rounds: list[int], times: list[float]) -> dict:
    stats = {"new_tokens": sum(rounds), "total_s": sum(times), "tokens_per_round": rounds, "round_s": times,
             "verify_s": 0.0, "draft_s": 0.0, "sampling_s": 0.0, "ttft_s": times[0], "peak_rss_bytes": 1,
             "drafted_by_position": [0], "reached_by_position": [0], "accepted_by_position": [0]}
    return {"stats": stats, "prefill_s": 0.0}


def test_a_cells_step_time_is_the_mean_log_of_its_runs_median_steps_each_runs_first_round_left_out():
    # the first round's pass is short (the prefill gave its first row): at 1 ms it would pull a mean
    # of these rounds down; one slow step (90 ms) would pull it up; a run's median step sees neither
    runs = [_run([2, 3, 1, 2], [0.001, 0.010, 0.012, 0.090]), _run([4, 1, 2], [0.001, 0.011, 0.013])]
    cell = SweepCell.pool(1, 0.5, runs)
    assert cell.rounds == 7 and cell.steps == 5 and cell.tokens == 15
    assert cell.step_s == pytest.approx(0.012)  # runs' medians 12 (10, 12, 90) and 12 (11, 13) ms
    assert cell.step_tokens == pytest.approx((3 + 1 + 2 + 1 + 2) / 5)
    assert cell.step_throughput == pytest.approx(1.8 / 0.012)
    assert cell.throughput == pytest.approx(15 / 0.138)  # the engine paper's: every round, wall clock
    for r in runs:  # runs whose prompt's last token was fed by their first round: every round is a step
        r["prefill_last"] = False
    steady = SweepCell.pool(1, 0.5, runs)
    assert steady.steps == 7 and steady.step_s == pytest.approx(0.011)  # medians of 1, 10, 12, 90 and 1, 11, 13 ms


class _TimedLookup(PromptLookup):
    """Prompt lookup whose every proposed token takes `per_draft` seconds of the fake clock."""

    def __init__(self, n, clock, per_draft):
        super().__init__(n)
        self.clock, self.per_draft, self.sizes = clock, per_draft, []

    def propose(self, context, k):
        p = super().propose(context, k)
        self.sizes.append(int(p.tokens.shape[0]))
        self.clock.advance(self.per_draft * self.sizes[-1])
        return p


def test_draft_sweep_reports_the_engine_paper_figures(tiny, monkeypatch):
    """On a fake clock where the target takes TOKEN seconds per token it is fed and the draft DRAFT
    seconds per token it proposes, and nothing else takes time, every figure is known exactly from
    the counts: plain decoding feeds one token a round (the first round's came with the prefill),
    a round at k = 2 feeds its drafts and, after the first, the token before them."""
    import moespec.bench.prefilled as prefilled
    import moespec.backends.protocol as protocol  # times greedy plain runs, step by step
    import moespec.backends.torch_model as cached
    import moespec.engine.decode as decode

    TOKEN, DRAFT, DEPTH = 2.0**-10, 2.0**-12, 32
    model, tok = tiny
    clock = FakeClock().install(monkeypatch, decode, prefilled, cached, protocol).drive(monkeypatch, model,
                                                                                 per_token=TOKEN)
    lookup = _TimedLookup(2, clock, DRAFT)
    (entry,) = run_draft(model, tok, lookup, draft_name="prompt-lookup:2", depths=(DEPTH,), ks=(2,),
                         prompts=1, new_tokens=16, temperature=0.0, kernel=DEDUP)
    cells = {c["k"]: c for c in entry["cells"]}
    assert sorted(cells) == [0, 2]
    plain, spec = cells[0], cells[2]
    drafted = sum(lookup.sizes)
    assert drafted > 0 and lookup.sizes[0] > 0  # the prompt's last 2-gram recurs: the first round drafts
    assert plain["rounds"] == plain["tokens"] > 1  # one token a round
    plain_s = TOKEN * (plain["rounds"] - 1)
    spec_s = TOKEN * (drafted + spec["rounds"] - 1) + DRAFT * drafted
    assert plain["total_s"] == pytest.approx(plain_s) and spec["total_s"] == pytest.approx(spec_s)
    assert plain["throughput"] == pytest.approx(plain["tokens"] / plain_s) == entry["baseline_throughput"]
    assert spec["throughput"] == pytest.approx(spec["tokens"] / spec_s)
    speedup = (spec["tokens"] / spec_s) / (plain["tokens"] / plain_s)
    assert entry["speedup"] == {"0": 1.0, "2": pytest.approx(speedup)}
    per_token_ms = {"draft": 1e3 * DRAFT * drafted, "verify": 1e3 * TOKEN * (drafted + spec["rounds"] - 1),
                    "sampling": 0.0, "other": 0.0}
    assert spec["latency_split_ms"] == {part: pytest.approx(ms / spec["tokens"], abs=1e-12)
                                       for part, ms in per_token_ms.items()}
    # the first token: the prompt's prefill, then the first round's drafts and their pass
    assert spec["ttft_s"] == pytest.approx(TOKEN * DEPTH + (DRAFT + TOKEN) * lookup.sizes[0])
    assert entry["target_step_s"] == pytest.approx(TOKEN)  # a plain step is a one-token pass
    assert entry["draft_step_s"] == pytest.approx(DRAFT)  # per drafted token
    assert entry["draft_target_ratio"] == pytest.approx(DRAFT / TOKEN)
    assert spec["peak_rss_bytes"] > 0 and len(spec["acceptance_by_position"]) == 2


def test_oracle_order_runs_each_acceptance_as_one_block():
    from moespec.bench.sweep import _oracle_order

    grid = [0.2, 0.5, 0.9]
    order = _oracle_order(range(0, 5), grid)
    assert sorted(order) == sorted((k, a) for a in grid for k in range(0, 5))
    for j, a in enumerate(grid):  # every k of one a, the baseline k = 0 included, runs back to back
        at = [i for i, (_, aa) in enumerate(order) if aa == a]
        assert at == list(range(at[0], at[0] + 5))
    assert [k for k, a in order if a == 0.5] == [4, 3, 2, 1, 0]  # direction alternates, so drift averages over a


def test_round_budget_gives_every_cell_the_same_rounds_and_one_sequence_of_draws(tiny, tmp_path):
    from moespec.bench.sweep import oracle_budget

    assert oracle_budget(3, new_tokens=5, steps=None) == (5, None)
    assert oracle_budget(3, new_tokens=5, steps=6) == (24, 6)  # room for 6 full steps of k + 1 tokens
    with pytest.raises(ValueError, match="steps"):
        oracle_budget(1, new_tokens=5, steps=0)

    model, tok = tiny
    log, keys = PointLog(tmp_path / "r.points.jsonl"), []
    (entry,) = run_oracle(model, tok, depths=(16,), ks=(0, 3), acceptances=(0.5, 0.9), kernels=(DEDUP,), prompts=2,
                          reps=2, new_tokens=5, steps=6, log=log, on_point=lambda key, _: keys.append(key))
    for cell in entry["cells"]:  # 2 prompts x 2 repetitions x 6 steps, none cut short, each a step
        assert cell["rounds"] == cell["steps"] == 24 and cell["runs"] == 4
        assert cell["tokens"] == 24 if cell["k"] == 0 else 24 <= cell["tokens"] <= 96
    # the four runs of one cell, in run order, realize the rounds of one 24-round run: their draws
    # are consecutive stretches of one sequence (the rounds depend on the draws and k alone)
    runs = [log.get(key)["stats"]["tokens_per_round"] for key in keys if key["k"] == 3 and key["a"] == 0.9]
    assert len(runs) == 4
    target = PrefilledTarget(model, torch.tensor(range(3, 18)))
    one = generate(target, list(range(3, 19)), draft=OracleDraft(0.9, seed=0, block=24), k=3, max_new_tokens=96,
                   max_steps=24, prefill_last=False)  # blocks of one cell's steps, as the sweep draws them
    assert sum(runs, []) == list(one.stats.tokens_per_round)


def test_a_speed_common_to_one_pass_cancels_from_the_ratio_of_two_cells():
    # 10 passes of 4 steps for two cells at one acceptance, b 1.3 times a's work plus its own noise;
    # then the machine runs each pass at its own speed (x0.7..x1.5), the same for both cells of a pass
    rng = np.random.default_rng(7)
    a = rng.uniform(0.010, 0.014, size=(10, 4))
    b = 1.3 * rng.uniform(0.010, 0.014, size=(10, 4))
    speed = rng.uniform(0.7, 1.5, size=(10, 1))
    ratio = step_time(b.tolist()) / step_time(a.tolist())
    assert step_time((speed * b).tolist()) / step_time((speed * a).tolist()) == pytest.approx(ratio, rel=1e-12)
    pooled = lambda t: float(np.median(t))  # noqa: E731  the pooled median does not cancel it
    assert pooled(speed * b) / pooled(speed * a) != pytest.approx(pooled(b) / pooled(a), rel=1e-3)
    assert step_time([[0.02, 0.02, 0.5], [], [0.02]]) == pytest.approx(0.02)  # a run without steps is left out
    assert math.isnan(step_time([[], []]))
    with pytest.raises(ValueError, match="positive"):
        step_time([[0.0, 0.0]])


def test_resampling_draws_passes_shared_by_every_cell():
    # 6 passes; cell b ran every pass at twice cell a's times, so drawn together their ratio stays 1/2
    rng = np.random.default_rng(1)
    times = rng.uniform(0.01, 0.03, size=(6, 4))
    a = {"k": 1, "a": 0.5, "step_tokens": 1.5, "run_steps": times.tolist()}
    b = {"k": 2, "a": 0.5, "step_tokens": 1.5, "run_steps": (2 * times).tolist()}
    pooled = {"k": 0, "a": None, "step_tokens": 1.5, "run_steps": times.tolist() + times.tolist()}
    T = resample_throughput([a, b, pooled, a], resamples=200, seed=3)
    assert T.shape == (200, 4)
    assert np.allclose(T[:, 1] / T[:, 0], 0.5)  # the same passes for both cells on every draw
    assert np.array_equal(T[:, 3], T[:, 0])  # one cell at two positions: one value per draw
    assert T[:, 0].std() > 0  # the draws differ
    # a cell pooled over two acceptances takes the same passes from both: here both groups hold
    # cell a's runs, so its drawn runs are a's twice over and their step time is a's
    assert np.allclose(T[:, 2], T[:, 0])
    steady = {"k": 1, "a": 0.5, "step_tokens": 1.5, "run_steps": [[0.01] * 4] * 6}
    assert np.allclose(resample_throughput([steady], resamples=20), 150.0)  # tokens per step / step time
    with pytest.raises(ValueError, match="multiples"):
        resample_throughput([a, {"k": 1, "a": 0.6, "step_tokens": 1.0, "run_steps": times[:4].tolist()}])


def test_each_repetition_starts_its_runs_further_into_the_greedy_text(tiny, monkeypatch):
    """start_stride s: repetition r's runs decode after the prompt and the first r·s greedy tokens,
    and what they decode is the greedy text from there on (k = 0 and k = 3 alike)."""
    import moespec.bench.sweep as sweep

    model, tok = tiny
    calls = []

    def recording(target, prompt, **kw):
        out = generate(target, prompt, **kw)
        calls.append((list(prompt), list(out.tokens)))
        return out

    monkeypatch.setattr(sweep, "generate", recording)
    run_oracle(model, tok, depths=(16,), ks=(0, 3), acceptances=(0.7,), kernels=(DEDUP,), prompts=1, reps=3,
               new_tokens=5, steps=2, start_stride=4)
    prompt = prompt_ids(tok, 16, 1)[0]
    greedy = generate(CachedModel(model), prompt, k=0, max_new_tokens=40, prefill_last=False).tokens
    text = prompt + list(greedy)
    starts = sorted({len(p) - 16 for p, _ in calls})  # the sweep's runs and its untimed greedy decoding
    assert starts == [0, 4, 8]
    for p, out in calls:
        assert p == text[: len(p)] and out == text[len(p): len(p) + len(out)] and len(out) >= 2


def test_a_negative_start_stride_is_refused(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="start_stride"):
        run_oracle(model, tok, depths=(16,), ks=(0,), acceptances=(0.5,), kernels=(DEDUP,), prompts=1, start_stride=-1)
