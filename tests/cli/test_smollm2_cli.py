"""The CLI on SmolLM2: `--chat` wraps the prompt in its chat template; `presets` lists its draft."""

import json

from typer.testing import CliRunner

from moespec.cli.main import app

runner = CliRunner(env={"COLUMNS": "200"})


def test_generate_chat_with_the_distilled_draft_matches_plain_decoding(smollm2, tmp_path):
    out = tmp_path / "gen.json"
    r = runner.invoke(app, ["generate", "--target", "smollm2", "--backend", "torch", "--draft", "trained:smollm2-draft",
                            "--draft-backend", "torch", "-k", "2", "--chat",
                            "--prompt", "Name three primary colors.", "--max-new-tokens", "12", "--compare",
                            "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "identical tokens" in r.output
    payload = json.loads(out.read_text())["payload"]
    _, tok = smollm2
    assert payload["chat"] and payload["result"]["stats"]["prompt_tokens"] > 20  # the template's system turn
    assert tok.decode(payload["result"]["tokens"]).strip()


def test_presets_lists_the_smollm2_draft_with_its_agreement():
    r = runner.invoke(app, ["presets"])
    assert r.exit_code == 0, r.output
    assert "trained:smollm2-draft" in r.output and "agreement" in r.output


def test_a_missing_gguf_file_is_a_usage_error(tmp_path):
    r = runner.invoke(app, ["generate", "--target", str(tmp_path / "nope.gguf"), "--prompt", "x"])
    assert r.exit_code == 2 and "nope.gguf" in r.output


def test_an_empty_prompt_starts_from_the_bos_token(smollm2_gguf, tmp_path):
    """SmolLM2's tokenizer adds no BOS, so "" gave no tokens and the engine asked for a BOS id a CLI user
    cannot pass; decoding now starts from the file's BOS token."""
    out = tmp_path / "gen.json"
    r = runner.invoke(app, ["generate", "--target", str(smollm2_gguf), "--prompt", "", "--max-new-tokens", "4",
                            "--threads", "1", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["payload"]["result"]["stats"]["prompt_tokens"] == 1
