"""`run_gate` and `moespec gate`: the three-level losslessness gate on synthetic:olmoe-tiny with
synthetic:dense-tiny as draft, at sizes far below the defaults so the file runs in well under a minute.

Sizes and thresholds: level 1, 20,000 rounds per (p, q) family, goodness of fit p > 0.001; level 2,
300 generations x 8 tokens per method (2,400 tokens over 16 ids x 8 positions), two-sample p > 0.01;
level 3, 1,500 sampled tokens per method over the byte tokenizer's 259 ids (rare ids pooled), p > 0.01,
and the draft's own sampling must give p < 0.01. At these sizes the draft's sampling is rejected at
p < 1e-10 at levels 2 and 3, so a bug that makes the output follow the draft (always accepting, checked
at 200 x 8 mock tokens and 1,200 sampled tokens) is caught with a wide margin. The CLI runs smaller still.
"""

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import moespec.cli.main  # noqa: F401  (registers the commands)
from moespec.cli.app import app
from moespec.checks import by_runs, gate
from moespec.engine import sampling
from moespec.models import load

SMALL = dict(prompts=2, ks=(1, 4, "auto"), max_k=4, samples=1500, greedy_tokens=12, trials=20_000, mock_runs=300)


@pytest.fixture(scope="module")
def pair():
    target, tok = load("synthetic:olmoe-tiny")
    draft, _ = load("synthetic:dense-tiny")
    return target, draft, tok


def test_gate_passes_on_a_correct_engine(pair):
    result = gate.run_gate(*pair, **SMALL)
    l1, l2, l3 = result.level1, result.level2, result.level3
    assert l1.passed and max(l1.max_error.values()) <= gate.EXACT_TOL and all(l1.threshold_ok.values())
    assert l2.passed and set(l2.spec) == {"1", "4", "auto"} and l2.padded_ids == 0
    assert l3.passed and l3.verdict == "pass" and l3.reason == ""
    assert all(g.equal == g.prompts == 2 for g in l3.greedy)
    assert l3.spec.n == (1500, 1500) and l3.spec.pvalue > 0.01 and l3.power.pvalue_independent < 1e-10
    assert l2.power.pvalue_independent < 1e-10
    # by permuting runs the least p-value is 1/(1 + permutations): the power checks reach it
    assert l3.power.pvalue == l2.power.pvalue == 1 / (1 + by_runs.PERMUTATIONS)
    assert result.passed
    d = result.to_dict()
    assert d["passed"] and d["level3"]["verdict"] == "pass" and d["settings"]["samples"] == 1500
    json.dumps(d, default=float)


def test_always_accepting_fails_levels_1_2_and_3(pair, monkeypatch):
    # The rule broken on purpose: every draft accepted, so the output follows the draft, not the target.
    monkeypatch.setattr(sampling, "accept_mask", lambda px, qx, r: torch.ones_like(px, dtype=torch.bool))
    assert not gate.run_level1(trials=20_000).passed
    l2 = gate.run_level2(ks=(4,), runs=200)  # 1,600 tokens per method
    assert not l2.passed and l2.spec["4"].pvalue < 0.01
    l3 = gate.run_level3(*pair, prompts=2, ks=(4,), greedy_tokens=4, samples=1200, tokens_per_run=25)
    assert l3.spec.pvalue < 0.01 and l3.verdict == "fail" and "differs" in l3.reason
    assert all(g.equal == g.prompts for g in l3.greedy)  # greedy decoding never calls the rule


def test_an_underpowered_test_is_inconclusive_not_a_pass():
    ok, weak = gate.ChiSquare(200.0, 200, 0.5, 201, (900, 900)), gate.ChiSquare(210.0, 200, 0.3, 201, (900, 900))
    greedy = [gate.Greedy("4", 2, 2)]
    level = gate.Level3(12, greedy, "4", spec=ok, power=weak, padded_ids=0)
    assert level.verdict == "inconclusive" and not level.passed and "900 tokens" in level.reason
    level = gate.Level3(12, [gate.Greedy("4", 2, 1, (1, 7))], "4", spec=ok, power=ok, padded_ids=0)
    assert level.verdict == "fail" and "prompt 1, token 7" in level.reason


def test_chi_square_helpers():
    a = np.array([500, 300, 150, 40, 6, 3, 1, 0])
    same = gate.two_sample(a, a)
    assert same.pvalue == pytest.approx(1.0) and same.bins == 5  # the 3 rarest bins pooled, topped up by 6
    shifted = gate.two_sample(a, np.array([300, 500, 150, 40, 6, 3, 1, 0]))
    assert shifted.pvalue < 1e-10 and shifted.n == (1000, 1000)
    p = np.array([0.5, 0.5, 0.0])
    assert gate.goodness_of_fit(np.array([50, 49, 1]), p).pvalue == 0.0  # a token with p = 0 was emitted
    assert gate.goodness_of_fit(np.array([100, 0, 0]), np.array([1.0, 0.0, 0.0])).pvalue == 1.0


def test_cli_passes_and_writes_json(tmp_path):
    out = tmp_path / "gate.json"
    args = ["gate", "--target", "synthetic:olmoe-tiny", "--draft", "synthetic:dense-tiny", "--samples", "1200",
            "--prompts", "1", "-k", "2", "--greedy-tokens", "8", "--trials", "5000", "--mock-runs", "100",
            "--json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "gate passed" in result.output and "power" in result.output
    payload = json.loads(out.read_text())["payload"]
    assert payload["result"]["passed"] and payload["result"]["settings"]["ks"] == ["2"]


def test_cli_rejects_a_bad_spec():
    result = CliRunner().invoke(app, ["gate", "--target", "synthetic:nope", "--draft", "synthetic:dense-tiny"])
    assert result.exit_code == 2
    assert "no synthetic preset" in result.output


def test_level3_on_a_llama_cpp_pair_against_its_own_plain_decoding(gguf_files):
    """The llama.cpp exports of the trained pair, the target exact: greedy equal to the target's plain
    decoding at each k, 1,500 sampled tokens per method pass the two-sample test (p > 0.01), and the
    draft's own sampling is rejected (the trained draft is far weaker than its target)."""
    target, tok = load(str(gguf_files["olmoe-q8_0"]), backend="llama.cpp", threads=1, exact=True)
    draft, _ = load(str(gguf_files["draft-q8_0"]), backend="llama.cpp", threads=1)
    l3 = gate.run_level3(target, draft, tok, prompts=2, ks=(1, 4, "auto"), greedy_tokens=12, samples=1500,
                         tokens_per_run=25)  # 60 runs per method: the runs are the two-sample test's unit
    assert all(g.equal == g.prompts == 2 and g.margins is None for g in l3.greedy)
    assert l3.spec.n == (1500, 1500) and l3.spec.pvalue > 0.01 and l3.power.pvalue < 0.01
    assert l3.verdict == "pass"


def test_a_greedy_difference_where_the_targets_argmax_moves_is_named_pass_size(pair):
    ok = gate.ChiSquare(200.0, 200, 0.5, 201, (900, 900))
    moved = gate.Greedy("3", 4, 3, (2, 17), margins=(0.004, 0.011), argmax_moves=True)
    level = gate.Level3(32, [moved], "3", spec=ok, power=gate.ChiSquare(400.0, 200, 1e-9, 201, (900, 900)),
                        padded_ids=0)
    assert level.verdict == "pass-size" and not level.passed
    assert "1 of 4 prompts" in level.reason and "0.004 in a one-token pass" in level.reason and "--exact" in level.reason
    assert moved.differing_share == 0.25
    level.greedy = [gate.Greedy("3", 4, 3, (2, 17), margins=(0.9, 0.8), argmax_moves=False)]
    assert level.verdict == "fail"


def test_pass_size_margins_see_a_target_whose_argmax_depends_on_the_pass_size(table_target):
    """A table model that adds a tie-breaker to one-token passes only: the margins name the move."""
    gaps, moves = gate._pass_size_margins(table_target, [1, 2], [3, 4], limit=table_target.width)
    assert moves and gaps[0] != gaps[1]


@pytest.fixture
def table_target():
    from moespec.backends.table_model import TableLM

    class OneTokenBias(TableLM):
        def extend(self, tokens, outputs=None):
            rows = super().extend(tokens, outputs)
            if tokens.numel() == 1:  # a different function for one-token passes: the runner-up wins
                top2 = rows.topk(2, dim=-1).indices[:, 1]
                rows = rows.clone()
                rows[torch.arange(rows.shape[0]), top2] += 100.0
            return rows

    return OneTokenBias(16, seed=3)
