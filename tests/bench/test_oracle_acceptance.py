"""The oracle sweep runs at the acceptance it is labeled with on a backend whose (k+1)-token verify passes
break near ties otherwise than the one-token passes that decoded its reference (issue 55)."""

import pytest
import torch

from moespec.bench import sweep as sweep_module
from moespec.bench.sweep import run_oracle
from moespec.costmodel.sweep_cells import ACCEPTANCE_LEVEL, SweepCell, acceptance_interval, acceptance_rows
from moespec.engine.proposers import OracleDraft
from moespec.kernel_names import DEDUP
from moespec.models.synthetic import build
from tests.near_tie import NearTieLM

# 2 prompts x 160 tokens per cell: every k >= 1 cell tests >= 150 drafts (asserted), where the 99%
# interval a ± 2.58 sqrt(a(1-a)/tested) is at most ± 0.105 wide at a = 0.5 and ± 0.063 at a = 0.9
GRID = dict(depths=(16,), ks=(0, 1, 4), acceptances=(0.5, 0.9), kernels=(DEDUP,), prompts=2, reps=1, new_tokens=160)
MIN_TESTED = 150


@pytest.fixture(scope="module")
def tok():
    return build("olmoe-tiny", seed=0)[1]


def oracle_cells(tok) -> list[dict]:
    model = NearTieLM(len(tok), seed=1, margin=0.1)
    text = torch.tensor(list(range(40, 200)))
    assert model.flips(text) >= 0.1  # the fake breaks >= 10% of its ties apart between the two kinds of pass
    return [c for c in run_oracle(model, tok, **GRID)[0]["cells"] if c["k"]]


def test_every_cell_realizes_its_set_acceptance_where_the_verify_pass_breaks_ties_apart(tok):
    cells = oracle_cells(tok)
    assert len(cells) == 4
    for c in cells:
        assert c["tested"] >= MIN_TESTED, c["tested"]
        lo, hi = acceptance_interval(c["a"], c["tested"])
        assert c["acceptance_interval"] == pytest.approx([lo, hi]) and hi - lo <= 0.21
        assert c["acceptance_within"] and lo <= c["realized_acceptance"] <= hi, (c["a"], c["realized_acceptance"])
        assert c["reanchors"] == 0  # the committed text never left the reference
    # the passes did disagree with the reference: the verdict, not luck, kept the acceptance
    assert sum(c["overruled"] for c in cells) >= 10
    rows = acceptance_rows(cells, GRID["acceptances"])
    assert [r["refused"] for r in rows] == [False, False] and all(r["checked"] for r in rows)


def test_without_the_oracles_verdict_the_same_sweep_misses_its_acceptance(tok, monkeypatch):
    # the path before the fix: the verify pass's own verdict, cut at the oracle's marks
    monkeypatch.setattr(sweep_module, "OracleDraft", lambda *a, **kw: OracleDraft(*a, **{**kw, "honour": False}))
    cells = oracle_cells(tok)
    high = [c for c in cells if c["a"] == 0.9]
    assert all(c["tested"] >= MIN_TESTED for c in cells)
    assert not any(c["acceptance_within"] for c in high), [c["realized_acceptance"] for c in high]
    assert all(c["realized_acceptance"] < 0.9 - 0.063 for c in high)
    assert acceptance_rows(cells, GRID["acceptances"])[1]["refused"]


def test_the_interval_is_the_binomial_one_at_the_stated_level():
    assert ACCEPTANCE_LEVEL == 0.99
    lo, hi = acceptance_interval(0.9, 100)
    assert (lo, hi) == pytest.approx((0.9 - 2.5758 * 0.03, 0.9 + 2.5758 * 0.03), abs=1e-4)
    assert acceptance_interval(0.98, 10)[1] == 1.0  # clipped to [0, 1]
    assert acceptance_interval(0.5, 0) is None
    with pytest.raises(ValueError, match="level"):
        acceptance_interval(0.5, 10, level=1.0)


def test_a_cell_records_set_and_realized_acceptance_and_reads_back_without_the_new_fields():
    stats = {"new_tokens": 6, "total_s": 1.0, "tokens_per_round": [3, 3], "round_s": [0.5, 0.5], "verify_s": 0.0,
             "draft_s": 0.0, "sampling_s": 0.0, "ttft_s": 0.5, "peak_rss_bytes": 1, "drafted_by_position": [100, 100],
             "reached_by_position": [100, 100], "accepted_by_position": [95, 95]}
    d = SweepCell.pool(2, 0.5, [{"stats": stats, "prefill_s": 0.0, "overruled": 1}]).to_dict()
    assert (d["a"], d["realized_acceptance"], d["tested"], d["overruled"]) == (0.5, 0.95, 200, 1)
    assert d["acceptance_within"] is False  # 0.95 of 200 tested drafts: outside 0.5 ± 0.091
    old = {k: v for k, v in d.items() if k not in ("tested", "overruled", "acceptance_interval", "acceptance_within")}
    back = SweepCell.from_dict(old)  # a measurement written before these fields: read back, unchecked
    assert back.tested == 0 and back.to_dict()["acceptance_within"] is None
    assert acceptance_rows([old], [0.5])[0]["checked"] is False
