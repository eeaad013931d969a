"""Speculative decoding of B sequences at once on llama.cpp (`engine.batch.generate_batch`, `LlamaBatch`),
on the exports of the trained pair. Each sequence must be lossless on its own: under exact passes its
greedy tokens equal its own plain decoding's, whatever the draft and k, as sequences finish and move
slots; sampled, each sequence's tokens follow plain sampling's law (two-sample chi-square)."""

import numpy as np
import pytest
import torch

from moespec.backends.exact import ExactPasses, exact_llama_environment
from moespec.backends.llama_batch import LlamaBatch
from moespec.backends.llama_model import LlamaModel
from moespec.checks.gate import two_sample
from moespec.engine.batch import generate_batch
from moespec.engine.decode import generate
from moespec.engine.proposers import OracleDraft, PromptLookup
from moespec.engine.sampling import Sampler, SamplingConfig
from moespec.models.tokenizer import ByteTokenizer
from tests.conftest import require_llama

TEXTS = ["def area(r):\n    return 3.14 * r * r\n\ndef ", "The river ran past the old mill, and the",
         "for i in range(10):\n    total += i\nprint(", "import os\nimport sys\n\n"]


@pytest.fixture(autouse=True)
def _llama():
    require_llama()
    exact_llama_environment()  # the session sets it too; exact passes need it before llama.cpp's first product


def prompts(n: int = 3) -> list[list[int]]:
    tok = ByteTokenizer()
    return [tok.encode(t, add_bos=True) for t in TEXTS[:n]]


def plain_exact(path, prompt, n: int) -> list[int]:
    model = ExactPasses(LlamaModel(path, threads=1, n_ctx=512, flash_attn=False))
    return generate(model, prompt, k=0, max_new_tokens=n, vocab_limit=259).tokens


@pytest.mark.parametrize("draft_kind, k", [("none", 0), ("model", 2), ("model", "auto"), ("lookup", 3), ("oracle", 4)])
def test_each_sequence_is_its_own_plain_decoding_under_exact_passes(gguf_files, draft_kind, k):
    ps, n = prompts(3), 24
    target = LlamaBatch(gguf_files["olmoe-q8_0"], sequences=3, threads=1, n_ctx=512, flash_attn=False, exact=True)
    want = [plain_exact(gguf_files["olmoe-q8_0"], p, n) for p in ps]
    draft = {"none": None, "lookup": PromptLookup(3),
             "model": LlamaBatch(gguf_files["draft-q8_0"], sequences=3, threads=1, n_ctx=512, flash_attn=False,
                                 exact=True),
             "oracle": [OracleDraft(0.7, seed=i, reference=torch.tensor(p + w)) for i, (p, w) in enumerate(zip(ps, want))]
             }[draft_kind]
    out = generate_batch(target, ps, draft=draft, k=k, max_new_tokens=n, vocab_limit=259)
    assert [r.tokens for r in out] == want
    batch = out[0].batch
    assert batch.sequences == 3 and batch.new_tokens == 3 * n and all(r.batch is batch for r in out)
    assert batch.live_per_round[0] == 3 and sum(r.stats.new_tokens for r in out) == batch.new_tokens
    if draft_kind != "none":
        assert sum(r.stats.drafted for r in out) > 0


def test_sequences_that_finish_early_leave_the_batch_and_the_rest_stay_exact(gguf_files):
    """An EOS ends a sequence; the live ones move into its slot and still decode their own text."""
    ps, n = prompts(4), 30
    want = [plain_exact(gguf_files["olmoe-q8_0"], p, n) for p in ps]
    eos = want[1][5]  # a token the second sequence produces early
    cut = [w[: w.index(eos) + 1] if eos in w else w for w in want]
    target = LlamaBatch(gguf_files["olmoe-q8_0"], sequences=4, threads=1, n_ctx=512, flash_attn=False, exact=True)
    out = generate_batch(target, ps, draft=PromptLookup(2), k=3, max_new_tokens=n, eos_token_id=eos, vocab_limit=259)
    assert [r.tokens for r in out] == cut
    assert out[1].stats.stop_reason == "eos" and len(out[1].tokens) <= 6
    lives = out[0].batch.live_per_round
    assert lives[0] == 4 and min(lives) < 4 and list(lives) == sorted(lives, reverse=True)


def plain_tokens(model, prompt: list[int], seeds, n: int) -> list[list[int]]:
    """The first n tokens of plain sampling at temperature 1 (vocab_limit 259), one run per seed, drawn as
    `generate(model, prompt, k=0, temperature=1.0, seed=s)` draws them but with the prompt prefilled once:
    the prefill's last row is kept, and each run rolls the cache back to the prompt, draws its first token
    from that row and then feeds each token it draws, with the seed's `Sampler` (the same calls, so the
    same logits and draws: the test checks it against `generate` itself)."""
    model.reset()
    first = model.extend(torch.tensor(prompt), outputs=1)  # [1, W], as generate's prefill
    runs, none = [], torch.zeros(0, dtype=torch.long)
    for seed in seeds:
        sampler = Sampler(SamplingConfig(temperature=1.0), width=model.width, vocab_limit=259, seed=seed)
        model.truncate(len(prompt))
        logits, tokens = first, []
        while True:
            tokens.append(sampler.verify(sampler.prepare(logits, position=len(prompt) + len(tokens)), none, None)[1])
            if len(tokens) == n:
                break
            logits = model.extend(torch.tensor(tokens[-1:]))
        runs.append(tokens)
    return runs


def test_sampled_sequences_follow_plain_samplings_law(gguf_files):
    """The 3rd new token of each of 3 sequences, 600 batched runs (k = 2, the trained draft) against 600
    plain runs per prompt, temperature 1: a two-sample chi-square per sequence, p > 0.001 each (three
    tests: a false alarm under 0.3%); the same test tells apart the law of another prompt's position
    (the power check: p < 0.001). The plain runs are single-sequence plain sampling with the prompt
    prefilled once (`plain_tokens`: 1,800 re-prefills were most of this test's time); its first runs
    must be `generate`'s own tokens, seed for seed."""
    ps, runs, j = prompts(3), 600, 2
    target = LlamaBatch(gguf_files["olmoe-q8_0"], sequences=3, threads=1, n_ctx=256)
    draft = LlamaBatch(gguf_files["draft-q8_0"], sequences=3, threads=1, n_ctx=256)
    single = LlamaModel(gguf_files["olmoe-q8_0"], threads=1, n_ctx=256)
    batched = np.array([[r.tokens[j] for r in generate_batch(target, ps, draft=draft, k=2, temperature=1.0,
                                                             max_new_tokens=j + 1, seed=10 * s, vocab_limit=259)]
                        for s in range(runs)])  # [runs, 3]
    seeds = [7 + 10 * s for s in range(runs)]
    runs_of = [plain_tokens(single, p, seeds, j + 1) for p in ps]  # [3][runs][j + 1]
    for p, got in zip(ps, runs_of):  # the reference is plain `generate`, token for token
        assert got[:5] == [generate(single, p, k=0, temperature=1.0, max_new_tokens=j + 1, seed=seed,
                                    vocab_limit=259).tokens for seed in seeds[:5]]
    plain = np.array([[r[j] for r in got] for got in runs_of]).T  # [runs, 3]
    counts = lambda col: np.bincount(col, minlength=259)  # noqa: E731
    for i in range(3):
        assert two_sample(counts(batched[:, i]), counts(plain[:, i])).pvalue > 0.001, i
    assert two_sample(counts(batched[:, 0]), counts(plain[:, 1])).pvalue < 0.001


def test_bad_batches_are_refused(gguf_files):
    single = LlamaModel(gguf_files["olmoe-q8_0"], threads=1, n_ctx=128)
    with pytest.raises(TypeError, match="sequences=2"):
        generate_batch(single, prompts(2))
    target = LlamaBatch(gguf_files["olmoe-q8_0"], sequences=2, threads=1, n_ctx=128)
    with pytest.raises(ValueError, match="holds 2 sequences, the batch 3"):
        generate_batch(target, prompts(3))
    with pytest.raises(TypeError, match="a list of 2 proposers"):
        generate_batch(target, prompts(2), draft=OracleDraft(0.5), k=2)


def test_compiled_plain_rounds_commit_what_the_round_by_round_path_commits(gguf_files, monkeypatch):
    """Plain greedy rounds of the whole batch run in compiled code (`LlamaBatch.batch_greedy_steps`, no
    exact passes): the same passes as the Python rounds, so the same tokens, rounds and stops, with an
    EOS that ends one sequence in the middle of a compiled run (taken from that sequence's own text)."""
    ps, n = prompts(3), 20
    target = LlamaBatch(gguf_files["olmoe-q8_0"], sequences=3, threads=1, n_ctx=512)
    assert target.compiled_steps
    compiled = generate_batch(target, ps, k=0, max_new_tokens=n, vocab_limit=259)
    eos = compiled[1].tokens[6]  # sequence 1 stops at its 7th token (or earlier, where the id came before)
    compiled_eos = generate_batch(target, ps, k=0, max_new_tokens=n, vocab_limit=259, eos_token_id=eos)
    monkeypatch.setattr(LlamaBatch, "compiled_steps", property(lambda self: False))
    by_round = generate_batch(target, ps, k=0, max_new_tokens=n, vocab_limit=259)
    by_round_eos = generate_batch(target, ps, k=0, max_new_tokens=n, vocab_limit=259, eos_token_id=eos)
    assert [r.tokens for r in compiled] == [r.tokens for r in by_round]
    assert [r.tokens for r in compiled_eos] == [r.tokens for r in by_round_eos]
    stop = compiled[1].tokens.index(eos) + 1
    assert len(compiled_eos[1].tokens) == stop < n and compiled_eos[1].stats.stop_reason == "eos"
    for a, b in ((compiled, by_round), (compiled_eos, by_round_eos)):
        assert a[0].batch.live_per_round == b[0].batch.live_per_round
        assert [r.stats.new_tokens for r in a] == [r.stats.new_tokens for r in b]
    # the compiled rounds' time is their passes' (h = 0 inside a compiled run)
    assert compiled[0].batch.pass_s == compiled[0].batch.round_s
