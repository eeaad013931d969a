"""moespec generate through typer's CliRunner."""

import json

import pytest

from typer.testing import CliRunner

from moespec.cli.main import app  # imports every command module, generate included

runner = CliRunner(env={"COLUMNS": "200"})
BASE = ["generate", "--target", "synthetic:olmoe-tiny", "--max-new-tokens", "8", "--seed", "1"]


def test_oracle_compare_writes_json(tmp_path):
    out = tmp_path / "gen.json"
    r = runner.invoke(app, [*BASE, "--oracle-acceptance", "0.8", "-k", "3", "--prompt", "Hello", "--compare", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "tokens/s" in r.output and "acceptance by position" in r.output and "speedup" in r.output
    assert "identical tokens" in r.output  # greedy: speculative and plain decoding agree
    doc = json.loads(out.read_text())
    assert doc["kind"] == "generate"
    assert doc["payload"]["result"]["tokens"] == doc["payload"]["plain"]["tokens"]
    assert len(doc["payload"]["result"]["tokens"]) <= 8


def test_draft_model_and_prompt_lookup_from_file(tmp_path, monkeypatch):
    from moespec.engine import proposers

    proposed = {}  # tokens each kind of proposer proposed

    def counting(cls, label):
        propose = cls.propose

        def spy(self, context, k):
            p = propose(self, context, k)
            proposed[label] = proposed.get(label, 0) + int(p.tokens.shape[0])
            return p

        monkeypatch.setattr(cls, "propose", spy)

    counting(proposers.DraftModel, "draft")
    counting(proposers.PromptLookup, "lookup")
    f = tmp_path / "prompt.txt"
    prompt = "abcabcabc héllo"  # recurring n-grams for the lookup; a 2-byte character for the count
    f.write_text(prompt, encoding="utf-8")
    # the byte tokenizer of the synthetic presets: BOS, then one token per UTF-8 byte
    file_tokens = 1 + len(prompt.encode("utf-8"))
    runs = {"draft": ["--draft", "synthetic:dense-tiny", "--temperature", "0.8", "--top-p", "0.9"],
            "lookup": ["--prompt-lookup", "2"]}
    for name, flags in runs.items():
        proposed.clear()
        out = tmp_path / f"{name}.json"
        r = runner.invoke(app, [*BASE, *flags, "-k", "2", "--prompt-file", str(f), "--json", str(out)])
        assert r.exit_code == 0, r.output
        assert "speculative" in r.output and "acceptance (pooled)" in r.output  # printed only when drafts ran
        doc = json.loads(out.read_text())["payload"]
        assert doc["text"] == prompt  # the file was read, whole
        expected = ("synthetic:dense-tiny", None) if name == "draft" else (None, 2)
        assert (doc["draft"], doc["prompt_lookup"]) == expected
        stats = doc["result"]["stats"]
        assert stats["prompt_tokens"] == file_tokens, (name, stats["prompt_tokens"])
        # the named proposer, and only it, proposed the drafts the run counted
        assert set(proposed) == {name}, (name, proposed)
        assert proposed[name] == sum(stats["drafted_by_position"]) > 0, (name, proposed, stats)
        assert stats["new_tokens"] == len(doc["result"]["tokens"]) > 0


def test_bad_options():
    r = runner.invoke(app, [*BASE, "--prompt-lookup", "2", "--oracle-acceptance", "0.5", "--prompt", "x"])
    assert r.exit_code != 0 and "at most one" in r.output
    r = runner.invoke(app, [*BASE])
    assert r.exit_code != 0 and "--prompt" in r.output


def test_experts_kernel_choice_keeps_tokens(tmp_path, monkeypatch):
    """Greedy tokens depend neither on the expert kernel nor on the linear layers; the artifact records
    which ran, and the default runs the compiled linear layers (moespec.fast_linear)."""
    from moespec.moe import dense

    calls = []
    linear = dense.linear
    monkeypatch.setattr(dense, "linear", lambda *a: calls.append(1) or linear(*a))
    tokens = {}
    for kernel, linear_flag in (("grouped_mm", ["--torch-linear"]), ("moespec_torch_auto", ["--torch-linear"]),
                                ("moespec_auto", [])):
        calls.clear()
        out = tmp_path / f"{kernel}.json"
        r = runner.invoke(app, [*BASE, "--oracle-acceptance", "0.7", "-k", "3", "--prompt", "Hello",
                                "--experts", kernel, *linear_flag, "--json", str(out)])
        assert r.exit_code == 0, r.output
        doc = json.loads(out.read_text())
        assert doc["payload"]["experts"] == kernel
        assert doc["payload"]["fast_linear"] is (not linear_flag)
        assert bool(calls) is (not linear_flag)  # the switched layers ran, and only by default
        tokens[kernel] = doc["payload"]["result"]["tokens"]
    assert tokens["grouped_mm"] == tokens["moespec_torch_auto"] == tokens["moespec_auto"]
    import moespec

    assert moespec.fast_linear is linear.__globals__["fast_linear"]  # the one opt-in call, exported
    r = runner.invoke(app, [*BASE, "--prompt", "x", "--experts", "fastest"])
    assert r.exit_code == 2 and "'fastest' is no experts implementation" in r.output, r.output


def test_auto_k_matches_fixed_k_greedy(tmp_path):
    """-k auto changes how many tokens each round drafts, never the greedy tokens; the artifact
    records the per-round choices and the policy's estimates."""
    docs = {}
    for k in ("auto", "4"):
        out = tmp_path / f"k{k}.json"
        r = runner.invoke(app, [*BASE, "--oracle-acceptance", "0.9", "-k", k, "--max-k", "6", "--prompt", "Hello",
                                "--json", str(out)])
        assert r.exit_code == 0, r.output
        docs[k] = json.loads(out.read_text())["payload"]
    auto = docs["auto"]
    assert auto["k"] == "auto" and auto["max_k"] == 6
    assert auto["result"]["tokens"] == docs["4"]["result"]["tokens"]
    stats = auto["result"]["stats"]
    assert stats["policy"]["policy"] == "auto" and len(stats["policy"]["acceptance"]) == 6
    assert len(stats["k_per_round"]) >= 1 and all(0 <= c <= 6 for c in stats["k_per_round"])
    assert docs["4"]["result"]["stats"]["policy"] == {"policy": "fixed", "k": 4}


def test_auto_k_prints_policy_summary():
    r = runner.invoke(app, [*BASE, "--oracle-acceptance", "0.9", "-k", "auto", "--prompt", "Hello"])
    assert r.exit_code == 0, r.output
    assert "chosen k: rounds" in r.output and "policy acceptance" in r.output and "policy V(0..max_k)" in r.output


def test_bad_draft_length():
    for bad in ("fast", "65", "-1"):
        r = runner.invoke(app, [*BASE, "--prompt", "x", "-k", bad])
        assert r.exit_code == 2 and f"{bad!r} is not valid" in r.output and "'auto'" in r.output, r.output
    r = runner.invoke(app, [*BASE, "--prompt", "x", "-k", "auto", "--max-k", "0"])
    assert r.exit_code == 2 and "--max-k" in r.output, r.output


def _prediction(path, V):
    from moespec import artifacts

    versions = {"calibrated": {"V": {"slot": V, "dedup": V, "auto": V}}}
    return artifacts.write(path, "predict", {"depths": [{"depth": 512, "versions": versions}]})


def test_auto_k_seeded_from_a_prediction(tmp_path):
    from moespec.chain.step_times import seed_step_times

    pred = _prediction(tmp_path / "prediction.json", [0.010, 0.011, 0.012, 0.013])
    assert seed_step_times(pred, max_k=2) == [0.010, 0.011, 0.012]
    with pytest.raises(ValueError, match="--max-k 3"):
        seed_step_times(pred, max_k=4)
    with pytest.raises(ValueError, match="512"):
        seed_step_times(pred, max_k=2, depth=4096)
    out = tmp_path / "gen.json"
    r = runner.invoke(app, [*BASE, "--oracle-acceptance", "0.9", "-k", "auto", "--max-k", "3", "--prompt", "Hi",
                            "--step-times-from", str(pred), "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["payload"]["result"]["stats"]["policy"]["seeded"] is True
    r = runner.invoke(app, [*BASE, "--oracle-acceptance", "0.9", "-k", "2", "--prompt", "Hi",
                            "--step-times-from", str(pred)])
    assert r.exit_code != 0 and "-k auto" in r.output


def test_a_prediction_of_another_model_does_not_seed_auto_k(tmp_path):
    """--step-times-from checks the model like every other artifact input (it took another model's,
    even another backend's, prediction)."""
    from moespec import artifacts

    versions = {"calibrated": {"V": {"slot": [0.01, 0.02], "dedup": [0.01, 0.02], "auto": [0.01, 0.02]}}}
    pred = artifacts.write(tmp_path / "prediction.json", "predict", {
        "provenance": {"model": "other.gguf", "num_experts": 64, "top_k": 8, "num_layers": 16},
        "depths": [{"depth": 512, "versions": versions}]})
    r = runner.invoke(app, [*BASE, "--oracle-acceptance", "0.9", "-k", "auto", "--max-k", "1", "--prompt", "Hi",
                            "--step-times-from", str(pred)])
    assert r.exit_code != 0 and "other.gguf" in r.output and "made for this target" in r.output, r.output


def test_several_prompt_files_decode_as_one_batch_each_its_own_text(tmp_path, gguf_files):
    """Three prompt files on llama.cpp under --exact with the trained draft: the JSON holds one result
    per file, in order, each the tokens that file alone decodes to; the batch's figures beside them."""
    from tests.conftest import require_llama

    require_llama()
    texts = ["def area(r):\n    return ", "The river ran past the", "import os\n"]
    files = []
    for i, t in enumerate(texts):
        files += ["--prompt-file", str(tmp_path / f"p{i}.txt")]
        (tmp_path / f"p{i}.txt").write_text(t, encoding="utf-8")
    common = ["--target", str(gguf_files["olmoe-q8_0"]), "--exact", "--max-new-tokens", "12", "--threads", "1"]
    out = tmp_path / "batch.json"
    r = runner.invoke(app, ["generate", *common, "--draft", str(gguf_files["draft-q8_0"]), "-k", "3", *files,
                            "--json", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())["payload"]
    assert [p.endswith(f"p{i}.txt") for i, p in enumerate(doc["prompt_files"])] == [True] * 3
    assert doc["batch"]["sequences"] == 3 and doc["batch"]["new_tokens"] == 36
    for i in range(3):
        one = tmp_path / f"one{i}.json"
        r = runner.invoke(app, ["generate", *common, "--prompt-file", str(tmp_path / f"p{i}.txt"), "--json", str(one)])
        assert r.exit_code == 0, r.output
        assert doc["results"][i]["tokens"] == json.loads(one.read_text())["payload"]["result"]["tokens"], i
    r = runner.invoke(app, ["generate", *common, *files, "--compare"])
    assert r.exit_code != 0 and "take one prompt" in r.output
