"""A candidate on the user's prompts (bench.candidate): the acceptance estimate against a proposer of
known acceptance by position, h(k) on the fake clock, the prompts file and the refusals."""

import json
from fractions import Fraction as F

import gguf
import numpy as np
import pytest
import torch

import moespec.backends.protocol as protocol
import moespec.bench.timing as timing
from moespec.backends.table_model import TableLM
from moespec.bench.candidate import (
    CandidateAcceptance,
    DraftCost,
    check_draft_file,
    check_vocabulary,
    encode_prompts,
    expected_draft_cost,
    measure_acceptance,
    measure_draft_cost,
    read_prompts,
    split_prompts,
)
from moespec.costmodel.positional import PositionalAcceptance
from moespec.engine.decode import generate
from moespec.engine.proposers import DraftModel, Proposal
from tests.bench.conftest import FakeClock

V = 48


class PositionalDraft:
    """Drafts the target's greedy tokens, each position j right with probability p[j-1], independently:
    at greedy verification alpha_j = p_j exactly. reference: prompt -> its greedy continuation."""

    def __init__(self, p, reference: dict, seed: int = 0):
        self.p, self.reference = p, reference
        self.gen = torch.Generator().manual_seed(seed)

    cache = None

    def begin(self, *, target, prompt, max_new_tokens, sampler):
        self.ref = self.reference[tuple(prompt.tolist())]  # [P + max_new_tokens]

    def propose(self, context, k):
        L = context.shape[0]
        drafts = self.ref[L: L + k].clone()  # [k'] the target's greedy tokens
        wrong = torch.rand(drafts.shape[0], generator=self.gen) >= torch.tensor(self.p[: drafts.shape[0]])
        drafts[wrong] = (drafts[wrong] + 1) % V
        return Proposal(drafts)

    def commit(self, keep):
        pass

    def identity(self):
        return {"proposer": "PositionalDraft", "options": {"p": list(self.p)}, "draft": None}


def test_estimate_holds_the_known_acceptance_by_position():
    # 12 prompts x 200 tokens at kmax = 3: about 920 rounds, ~500 at risk at position 3; each p_j must
    # lie in its 95% Wilson interval (seeded, so the outcome is fixed), and the estimate within 0.06
    target, p = TableLM(V, seed=1), (0.9, 0.6, 0.3)
    prompts = [torch.randint(0, V, (5,), generator=torch.Generator().manual_seed(s)).tolist() for s in range(12)]
    reference = {tuple(q): torch.tensor(q + generate(target, q, k=0, max_new_tokens=200).tokens) for q in prompts}
    got = measure_acceptance(target, PositionalDraft(p, reference), prompts, kmax=3, max_new_tokens=200)
    acc = got.acceptance
    assert got.prompts == 12 and got.new_tokens == 12 * 200 and min(acc.at_risk) > 400
    for j, (pj, (lo, hi), a) in enumerate(zip(p, acc.intervals, acc.alpha), 1):
        assert lo <= pj <= hi, (j, lo, hi)
        assert abs(float(a) - pj) < 0.06
    assert CandidateAcceptance.from_dict(got.to_dict()).acceptance == acc


def test_draft_cost_on_the_fake_clock(monkeypatch):
    # every extend of n tokens costs 1/16 + n/32 s: a round at k is k one-token steps (3k/32); after a
    # round that accepted everything, one more one-token extend first (3/32 more)
    clock = FakeClock().install(monkeypatch, timing, protocol)
    draft = TableLM(V, seed=2)
    extend = draft.extend

    def timed(tokens, outputs=None):
        clock.advance(1 / 16 + tokens.numel() / 32)
        return extend(tokens, outputs)

    monkeypatch.setattr(draft, "extend", timed)
    cost = measure_draft_cost(DraftModel(draft), target=TableLM(V, seed=1), context=list(range(10)), kmax=3, reps=4)
    assert cost.plain == (0.0, 3 / 32, 6 / 32, 9 / 32)
    assert cost.catch_up == (0.0, 6 / 32, 9 / 32, 12 / 32)
    assert DraftCost.from_dict(cost.to_dict()) == cost
    # alternating: before every round (warm-ups included) the target verifies k + 1 tokens, untimed
    target, passes = TableLM(V, seed=1), []
    verify = target.extend

    def pass_of(tokens, outputs=None):
        passes.append(tokens.numel())
        clock.advance(1.0)
        return verify(tokens, outputs)

    monkeypatch.setattr(target, "extend", pass_of)
    alternating = measure_draft_cost(DraftModel(draft), target=target, context=list(range(10)), kmax=3, reps=4,
                                     warmup=1, alternate=True)
    assert alternating == cost
    assert passes == [9] + [k + 1 for k in (1, 2, 3) for _ in range(2 * (1 + 4))]  # the context, then each round


def test_expected_draft_cost_by_hand():
    cost = DraftCost(plain=(0, F(1), F(2)), catch_up=(0, F(3), F(5)), reps=1, context_tokens=2)
    # P(1) = 1/2, P(2) = 1/2 * 1/4: h(1) = 1/2*1 + 1/2*3 = 2, h(2) = 7/8*2 + 1/8*5 = 19/8
    assert expected_draft_cost(cost, [F(1, 2), F(1, 4)]) == [0, 2, F(19, 8)]
    # from the runs at each k: the run at k = 1 accepted 3 of 4 (P(1) = 3/4: h(1) = 1/4*1 + 3/4*3 = 5/2), the
    # run at k = 2 alpha = 1/2, 1/2 (P(2) = 1/4: h(2) = 3/4*2 + 1/4*5 = 11/4); the alphas at kmax unread
    runs = (PositionalAcceptance((4,), (3,)), PositionalAcceptance((4, 2), (2, 1)))
    assert expected_draft_cost(cost, [F(1, 2), F(1, 4)], runs) == [0, F(5, 2), F(11, 4)]
    with pytest.raises(ValueError, match="1 runs at each k"):
        expected_draft_cost(cost, [F(1, 2), F(1, 4)], runs[:1])


def test_prompts_file_lines_and_chats(tmp_path):
    lines = tmp_path / "p.txt"
    lines.write_text("first prompt\n\nsecond prompt\n")
    assert read_prompts(lines) == ["first prompt", "second prompt"]
    chats = tmp_path / "p.jsonl"
    chat = [{"role": "user", "content": "hi"}]
    chats.write_text(json.dumps(chat) + "\n" + json.dumps({"messages": chat}) + "\n")
    assert read_prompts(chats) == [chat, chat]

    class Tok:
        chat_template = "t"
        encode = staticmethod(lambda text: [len(text)])
        apply_chat_template = staticmethod(lambda messages, add_generation_prompt: [7, len(messages)])

    assert encode_prompts(Tok(), ["abc", chat]) == [[3], [7, 1]]


def test_split_is_deterministic_and_order_free():
    prompts = [f"prompt {i}" for i in range(7)]
    cal, held = split_prompts(prompts)
    assert len(cal) == 4 and len(held) == 3 and set(cal).isdisjoint(held) and set(cal) | set(held) == set(prompts)
    cal2, held2 = split_prompts(prompts[::-1])
    assert set(cal2) == set(cal) and set(held2) == set(held)


def test_refusals(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    with pytest.raises(ValueError, match=f"prompts file {empty} is empty") as e:
        read_prompts(empty)
    assert "\n" not in str(e.value)
    bad_chat = tmp_path / "bad.jsonl"
    bad_chat.write_text('[{"role": "user"}]\n')
    with pytest.raises(ValueError, match="line 1 holds no chat"):
        read_prompts(bad_chat)
    not_gguf = tmp_path / "draft.bin"
    not_gguf.write_bytes(b"PK\x03\x04 not a model")
    with pytest.raises(ValueError, match="is not a GGUF file"):
        check_draft_file(not_gguf)
    with pytest.raises(ValueError, match="cannot be split"):
        split_prompts(["one"])


def write_gguf(path, tokens, model="gpt2", bos=1):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model(model)
    w.add_token_list(tokens)
    w.add_add_bos_token(True)
    w.add_bos_token_id(bos)
    w.add_tensor("token_embd.weight", np.zeros((len(tokens), 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


WORDS = ["<unk>", "<s>", "</s>", "a", "b", "c", "d", "e"]


def test_vocabulary_refusal_is_llama_cpps_rule(tmp_path):
    # llama.cpp pairs files whose sizes differ by <= 128 and whose texts agree from id 5 up, with the
    # same tokenizer model and BOS (common_speculative_are_compatible); anything else is refused in one line
    target = write_gguf(tmp_path / "t.gguf", WORDS)
    check_vocabulary(target, write_gguf(tmp_path / "same.gguf", WORDS))
    check_vocabulary(target, write_gguf(tmp_path / "pad.gguf", WORDS + [f"[PAD{i}]" for i in range(128)]))
    check_vocabulary(target, write_gguf(tmp_path / "low.gguf", WORDS[:2] + ["x"] + WORDS[3:]))  # id 2 < 5
    refused = {
        "id 6 is 'x' in the draft, 'd' in the target": WORDS[:6] + ["x", "e"],
        "137 tokens against the target's 8, more than 128 apart": WORDS + [f"[PAD{i}]" for i in range(129)],
    }
    for i, (why, tokens) in enumerate(refused.items()):
        with pytest.raises(ValueError, match=f"does not share the vocabulary .*{why}") as e:
            check_vocabulary(target, write_gguf(tmp_path / f"d{i}.gguf", tokens))
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="tokenizer.ggml.model is 'llama' in the draft, 'gpt2' in the target"):
        check_vocabulary(target, write_gguf(tmp_path / "spm.gguf", WORDS, model="llama"))
    with pytest.raises(ValueError, match="tokenizer.ggml.bos_token_id is 3 in the draft, 1 in the target"):
        check_vocabulary(target, write_gguf(tmp_path / "bos.gguf", WORDS, bos=3))
    text = tmp_path / "draft.gguf"
    text.write_text("not a model")
    with pytest.raises(ValueError, match="is not a GGUF file"):  # refused before its metadata is read
        check_vocabulary(target, text)


class HostDraft:
    """A lookup whose proposing costs k/64 s of host time on the fake clock and commits cost 1/128 s."""

    cache = None

    def __init__(self, clock):
        self.clock = clock

    def begin(self, *, target, prompt, max_new_tokens, sampler):
        pass

    def propose(self, context, k):
        self.clock.advance(k / 64)
        return Proposal(context[-k:])

    def commit(self, keep):
        self.clock.advance(1 / 128)

    def identity(self):
        return None


def test_host_time_of_a_lookup_on_the_fake_clock(monkeypatch):
    # the timed round is propose + commit (k/64 + 1/128); the reset before it (a commit) is not timed
    clock = FakeClock().install(monkeypatch, timing)
    cost = measure_draft_cost(HostDraft(clock), target=TableLM(V), context=[1, 2, 3], kmax=2, reps=3, warmup=1)
    assert cost.plain == cost.catch_up == (0.0, 1 / 64 + 1 / 128, 2 / 64 + 1 / 128)


def test_ngram_acceptance_under_sampling_is_counted():
    from moespec.engine.ngram import NgramSimple

    target = TableLM(6, seed=3)
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2, 3, 4, 5, 1, 2]] * 3
    got = measure_acceptance(target, NgramSimple(1, 3), prompts, kmax=3, max_new_tokens=30, temperature=1.0)
    acc = got.acceptance
    assert got.temperature == 1.0 and got.new_tokens == 90 and acc.at_risk[0] > 0
    assert all(a <= n for a, n in zip(acc.accepted, acc.at_risk))
    assert acc.at_risk[1] <= acc.accepted[0]  # less in the rounds the token budget cut to k = 1


def test_a_fresh_proposer_per_prompt_keeps_one_prompts_text_out_of_the_next_ones_pool():
    """ngram-mod's pool carries across the prompts one proposer decodes (as llama-server's across
    requests); made fresh for each prompt (a function, as the calibration passes), two copies of one
    greedy prompt count exactly the same rounds, while one shared proposer drafts the second copy from
    the first one's continuation and is accepted more often there."""
    from moespec.engine.ngram import NgramMod

    target = TableLM(V, seed=2)
    prompt = torch.randint(0, V, (6,), generator=torch.Generator().manual_seed(5)).tolist()
    kw = dict(kmax=3, max_new_tokens=60)
    fresh = measure_acceptance(target, lambda: NgramMod(n_match=2, n_max=3, n_min=1), [prompt, prompt], **kw)
    first, second = fresh.by_prompt
    assert (first.at_risk, first.accepted) == (second.at_risk, second.accepted)
    shared = measure_acceptance(target, NgramMod(n_match=2, n_max=3, n_min=1), [prompt, prompt], **kw)
    assert shared.by_prompt[0].accepted == first.accepted  # the first prompt meets an empty pool either way
    assert sum(shared.by_prompt[1].accepted) > sum(first.accepted)
    assert fresh.candidate == shared.candidate and fresh.candidate["proposer"] == "NgramMod"


def test_each_draft_length_is_counted_from_a_run_at_it():
    """With `at_k`, the prompts are decoded at every k = 1..kmax: the counts at k are exactly those a
    calibration at kmax = k counts, and the last are the run at kmax's; the record round-trips."""
    from moespec.engine.proposers import PromptLookup

    target = TableLM(V, seed=2)
    prompts = [torch.randint(0, 6, (12,), generator=torch.Generator().manual_seed(s)).tolist() for s in range(3)]
    kw = dict(max_new_tokens=40)
    got = measure_acceptance(target, lambda: PromptLookup(2), prompts, kmax=3, at_k=lambda k: PromptLookup(2), **kw)
    assert len(got.at_k) == 3 and got.at_k[-1] == got.acceptance
    assert [len(row) for row in got.at_k_by_prompt] == [3, 3, 3]
    for k in (1, 2):
        alone = measure_acceptance(target, lambda: PromptLookup(2), prompts, kmax=k, **kw)
        assert got.at_k[k - 1] == alone.acceptance and got.at_k[k - 1].kmax == k
        assert [(p.at_risk, p.accepted) for p in got.at_k_by_prompt[k - 1]] == \
            [(p.at_risk, p.accepted) for p in alone.by_prompt]
    assert sum(got.at_k[0].at_risk) != got.acceptance.at_risk[0]  # a run at k = 1 has rounds of its own
    assert CandidateAcceptance.from_dict(got.to_dict()) == got
    assert measure_acceptance(target, lambda: PromptLookup(2), prompts, kmax=3, **kw).at_k == ()
