"""The engine on llama.cpp: plain decoding is llama.cpp's own greedy decoding; with exact=True the
speculative output is the plain output bit for bit at every k, "auto" included, for every kind of
draft, mixed backends included; the statistics carry the same fields as on torch."""

import pytest

from moespec.checks.llama_reference import llama_greedy
from moespec.engine.decode import generate
from moespec.engine.proposers import OracleDraft, PromptLookup
from moespec.models import load
from moespec.models.train import heldout_slice

NEW = 32


def _code_prompts(count: int = 3, length: int = 48) -> list[list[int]]:
    """Held-out code (never trained on), cut into `count` prompts of `length` byte tokens."""
    ids = heldout_slice().tolist()
    return [[256, *ids[1 + 400 * i: length + 400 * i]] for i in range(count)]


def test_plain_decoding_is_llama_cpps_own_greedy_decoding(gguf_files, smollm2_gguf):
    cases = [(gguf_files["olmoe-q8_0"], p, 257) for p in _code_prompts()]
    smol, tok = load(str(smollm2_gguf), backend="llama.cpp", threads=1)
    chats = ["Rename x to count in: x = x + 1", "List three prime numbers.", "Write a haiku about rain."]
    cases += [(smollm2_gguf, tok.apply_chat_template([{"role": "user", "content": c}]), tok.eos_token_id)
              for c in chats]
    for path, prompt, eos in cases:
        model = smol if path == smollm2_gguf else load(str(path), backend="llama.cpp", threads=1)[0]
        ours = generate(model, prompt, k=0, max_new_tokens=NEW, eos_token_id=eos).tokens
        assert ours == llama_greedy(path, prompt, NEW, threads=1, eos=eos), path.name
        assert len(set(ours)) > 3  # a real continuation, not one repeated token


@pytest.mark.parametrize("kind", ["olmoe-q8_0", "olmoe-q4_k"])
def test_exact_speculative_output_is_exact_plain_output_at_every_k(gguf_files, kind):
    target, _ = load(str(gguf_files[kind]), backend="llama.cpp", threads=1, exact=True)
    draft, _ = load(str(gguf_files["draft-q8_0"]), backend="llama.cpp", threads=1)
    for prompt in _code_prompts():
        plain = generate(target, prompt, k=0, max_new_tokens=NEW, vocab_limit=259).tokens
        for proposer, k in [(draft, 1), (draft, 3), (draft, "auto"), (PromptLookup(2), 4),
                            (OracleDraft(0.8, seed=1), 5)]:
            out = generate(target, prompt, draft=proposer, k=k, max_new_tokens=NEW, vocab_limit=259)
            assert out.tokens == plain, (kind, type(proposer).__name__, k)
            assert out.stats.drafted > 0


def test_exact_holds_on_smollm2s_q4_1_with_prompt_lookup(smollm2_gguf):
    target, tok = load(str(smollm2_gguf), backend="llama.cpp", threads=1, exact=True)
    request = "Repeat this list exactly: apples, pears, plums, figs, dates, limes, kiwis, grapes."
    prompt = tok.apply_chat_template([{"role": "user", "content": request}])
    plain = generate(target, prompt, k=0, max_new_tokens=NEW, eos_token_id=tok.eos_token_id).tokens
    accepted = {}
    for k in (2, 6, "auto"):
        out = generate(target, prompt, draft=PromptLookup(3), k=k, max_new_tokens=NEW, eos_token_id=tok.eos_token_id)
        assert out.tokens == plain, k
        accepted[k] = out.stats.accepted
    # lookup copies the list: at a fixed k some drafts are accepted. "auto" is left out of this
    # check: on a loaded machine its policy may rightly judge that drafting does not pay and stop.
    assert accepted[2] > 0 and accepted[6] > 0, accepted


def test_mixed_pairs_torch_draft_for_llama_target_and_the_reverse(gguf_files):
    llama_target, _ = load(str(gguf_files["olmoe-q8_0"]), backend="llama.cpp", threads=1, exact=True)
    torch_draft, _ = load("trained:draft")
    torch_target, _ = load("trained:olmoe")
    llama_draft, _ = load(str(gguf_files["draft-q8_0"]), backend="llama.cpp", threads=1)
    for prompt in _code_prompts(2):
        plain = generate(llama_target, prompt, k=0, max_new_tokens=NEW, vocab_limit=259).tokens
        mixed = generate(llama_target, prompt, draft=torch_draft, k=3, max_new_tokens=NEW, vocab_limit=259)
        assert mixed.tokens == plain and mixed.stats.accepted > 0
        plain = generate(torch_target, prompt, k=0, max_new_tokens=NEW, vocab_limit=259).tokens
        mixed = generate(torch_target, prompt, draft=llama_draft, k=3, max_new_tokens=NEW, vocab_limit=259)
        assert mixed.tokens == plain and mixed.stats.accepted > 0


def test_stats_carry_the_same_fields_on_both_backends(gguf_files):
    prompt = _code_prompts(1)[0]
    on_llama = generate(load(str(gguf_files["olmoe-q8_0"]), backend="llama.cpp", threads=1)[0], prompt,
                        draft=load(str(gguf_files["draft-q8_0"]), backend="llama.cpp", threads=1)[0], k="auto",
                        max_new_tokens=16, vocab_limit=259).stats.to_dict()
    on_torch = generate(load("trained:olmoe")[0], prompt, draft=load("trained:draft")[0], k="auto", max_new_tokens=16,
                        vocab_limit=259).stats.to_dict()
    assert on_llama.keys() == on_torch.keys()
    assert on_llama["target_forward_s"] > 0 and on_llama["draft_forward_s"] > 0 and on_llama["policy"]["policy"] == "auto"
    assert 0 < on_llama["overhead_share"] < 1


def test_rounds_without_a_proposal_run_in_the_compiled_loop_with_the_same_records(gguf_files, monkeypatch):
    """Prompt lookup and ngram-mod on llama.cpp: the quiet runs (`round.quiet_rounds`, compiled steps
    with the drafter's stop rule) give the tokens and round records of asking the drafter every round."""
    from moespec.backends import llama_steps
    from moespec.engine.ngram import NgramMod
    from moespec.engine.proposers import HostDrafter

    target, _ = load(str(gguf_files["olmoe-q8_0"]), backend="llama.cpp", threads=1)
    real, quiet_calls = llama_steps.greedy_steps, []

    def counted(*args):
        quiet_calls.append(args[-1] is not None and len(args) == 9)
        return real(*args)

    monkeypatch.setattr(llama_steps, "greedy_steps", counted)
    runs = {}
    for asked in (False, True):
        if asked:
            assert any(quiet_calls)  # the quiet runs were taken
            monkeypatch.setattr(HostDrafter, "quiet", lambda self, context, width: None)
            for cls in (PromptLookup, NgramMod):
                monkeypatch.delattr(cls, "quiet")
        for prompt in _code_prompts(2):
            for name, make in (("lookup", lambda: PromptLookup(2)), ("ngram-mod", lambda: NgramMod(2, 3, 1))):
                out = generate(target, prompt, draft=make(), k=3, max_new_tokens=NEW, vocab_limit=259)
                runs.setdefault(asked, []).append((out.tokens, out.stats.tokens_per_round, out.stats.k_per_round,
                                                   out.stats.drafted_by_position, out.stats.accepted_by_position))
    assert runs[False] == runs[True]
    assert all(sum(r[3]) > 0 for r in runs[False])  # each drafted somewhere; the quiet runs filled the rest
