"""The decode loop on the synthetic presets: greedy speculative output equals transformers' own
greedy `generate` (float32, CPU), and bad input gives a clear error or the exact expected tokens."""

import pytest
import torch

from moespec.backends.torch_model import CachedModel
from moespec.engine.decode import check_pairing, generate
from moespec.engine.proposers import OracleDraft
from moespec.models import synthetic
from moespec.models.tokenizer import ByteTokenizer

MOE_TINY = [n for n in synthetic.preset_names() if n.endswith("-tiny") and n != "dense-tiny"]
REAL = 259  # the byte tokenizer's ids; 259..271 are output-layer padding
NEW = 24


@pytest.fixture(scope="module")
def dense():
    return synthetic.build("dense-tiny", seed=1)[0]


def _hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    out = model.generate(
        torch.tensor([prompt]), do_sample=False, max_new_tokens=n, min_new_tokens=n,
        suppress_tokens=list(range(REAL, synthetic.VOCAB)), eos_token_id=None,
    )
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("name", MOE_TINY)
def test_greedy_speculative_equals_transformers_generate(name, dense):
    target, tok = synthetic.build(name, seed=0)
    prompt = tok.encode("The quick brown fox", add_bos=True)
    expected = _hf_greedy(target, prompt, NEW)
    for draft in (dense, OracleDraft(0.8, seed=3)):
        out = generate(target, prompt, draft=draft, k=3, max_new_tokens=NEW, vocab_limit=REAL)
        assert out.tokens == expected, (name, type(draft).__name__)
    auto = generate(target, prompt, draft=dense, k="auto", max_k=4, max_new_tokens=NEW, vocab_limit=REAL)
    assert auto.tokens == expected, (name, auto.stats.k_per_round)
    assert generate(target, prompt, k=0, max_new_tokens=NEW, vocab_limit=REAL).tokens == expected
    # the prompt's last token fed by the first round instead of the prefill: the same tokens
    late = generate(target, prompt, draft=OracleDraft(0.8, seed=3), k=3, max_new_tokens=NEW, vocab_limit=REAL,
                    prefill_last=False)
    assert late.tokens == expected, name


class _Passes(CachedModel):
    """A CachedModel that records how many tokens each pass feeds."""

    def __init__(self, model):
        super().__init__(model)
        self.sizes: list[int] = []

    def extend(self, tokens, outputs=None):
        self.sizes.append(int(tokens.shape[-1]))
        return super().extend(tokens, outputs)


@pytest.mark.parametrize("k", [0, 3])
def test_without_the_prefills_last_row_every_round_verifies_k_plus_one_tokens(olmoe, dense, k):
    prompt = list(range(40, 52))
    passes = {}
    for prefill_last in (True, False):
        target = _Passes(olmoe)
        out = generate(target, prompt, draft=dense if k else None, k=k, max_new_tokens=5 * (k + 1),
                       max_steps=5, vocab_limit=REAL, prefill_last=prefill_last)
        assert out.stats.rounds == 5
        passes[prefill_last] = target.sizes
    # the first round reads its first row from the prefill: it feeds the k drafts, at k = 0 nothing
    assert passes[True] == [12] + ([k] if k else []) + [k + 1] * 4
    assert passes[False] == [11] + [k + 1] * 5


@pytest.fixture(scope="module")
def olmoe():
    return synthetic.build("olmoe-tiny", seed=0)[0]


def test_bad_input(olmoe, dense):
    with pytest.raises(ValueError, match="empty"):
        generate(olmoe, [], max_new_tokens=4)
    with pytest.raises(ValueError, match="k must be"):
        generate(olmoe, [1, 2], k=-1)
    with pytest.raises(ValueError, match="or \"auto\".*got 'fast'"):
        generate(olmoe, [1, 2], k="fast")
    with pytest.raises(ValueError, match="max_k must be an int >= 0, got 2.5"):
        generate(olmoe, [1, 2], draft=dense, k="auto", max_k=2.5)
    with pytest.raises(ValueError, match="one sequence"):
        generate(olmoe, torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(olmoe, [1], max_new_tokens=-1)
    with pytest.raises(TypeError, match="draft must be"):
        generate(olmoe, [1], draft="dense-tiny")
    with pytest.raises(ValueError, match="temperature"):
        generate(olmoe, [1], draft=OracleDraft(0.5), temperature=1.0)
    out = generate(olmoe, [1, 2, 3], draft=dense, max_new_tokens=0)
    assert out.tokens == [] and out.stats.rounds == 0


def test_nan_logits(dense):
    broken, _ = synthetic.build("dense-tiny", seed=2)
    broken.lm_head.weight.data.fill_(float("nan"))
    with pytest.raises(ValueError, match="NaN"):
        generate(broken, [1, 2], max_new_tokens=3)
    with pytest.raises(ValueError, match="NaN"):
        generate(dense, [1, 2], draft=broken, max_new_tokens=3)


def test_vocab_mismatch_names_first_differing_ids():
    class Shuffled(ByteTokenizer):
        def get_vocab(self):
            v = super().get_vocab()
            v["<0x41>"], v["<0x42>"] = 66, 65
            return v

    check_pairing(ByteTokenizer(), ByteTokenizer())
    with pytest.raises(ValueError, match="id 65: target '<0x41>' vs draft '<0x42>'"):
        check_pairing(ByteTokenizer(), Shuffled())


def test_eos_inside_an_accepted_run_and_budget_smaller_than_k(olmoe):
    prompt = [256, 72, 105]
    ref = generate(olmoe, prompt, k=0, max_new_tokens=12, vocab_limit=REAL).tokens
    eos = ref[5]
    stop = ref.index(eos)
    target = CachedModel(olmoe)
    # a = 1: every draft is the target's greedy token, so the EOS arrives inside an accepted run
    out = generate(target, prompt, draft=OracleDraft(1.0), k=8, max_new_tokens=12, eos_token_id=eos, vocab_limit=REAL)
    assert out.tokens == ref[: stop + 1] and out.stats.stop_reason == "eos"
    assert target.length == len(prompt) + stop  # the cache holds the committed text minus its last token
    for budget in (1, 2, 5):  # k = 8 exceeds the budget: exactly `budget` tokens
        out = generate(olmoe, prompt, draft=OracleDraft(1.0), k=8, max_new_tokens=budget, vocab_limit=REAL)
        assert out.tokens == ref[:budget]


def test_stats_round_trip_and_padding_never_sampled(olmoe, dense):
    out = generate(olmoe, [256, 65], draft=dense, k=4, temperature=1.5, max_new_tokens=30, seed=5, vocab_limit=REAL)
    assert max(out.tokens) < REAL and len(out.tokens) == 30
    s = out.stats
    assert sum(s.tokens_per_round) == 30 and s.drafted == sum(s.drafted_by_position)
    assert 0 < s.forward_s <= s.total_s and s.ttft_s <= s.total_s and s.peak_rss_bytes > 0
    assert len(s.round_s) == s.rounds and all(t > 0 for t in s.round_s)
    assert sum(s.round_s) <= s.total_s  # the rounds leave out the prefill
    again = type(out).from_dict(out.to_dict())
    assert again == out
    same_seed = generate(olmoe, [256, 65], draft=dense, k=4, temperature=1.5, max_new_tokens=30, seed=5, vocab_limit=REAL)
    assert same_seed.tokens == out.tokens


def test_auto_records_its_choices_and_follows_a_seed(olmoe, dense):
    prompt = [256, 72, 105]
    ref = generate(olmoe, prompt, k=0, max_new_tokens=12, vocab_limit=REAL).tokens
    # drafting 50x dearer than a plain round: E(k) <= k + 1 = 4 never pays, before or after the rescale
    out = generate(olmoe, prompt, draft=dense, k="auto", max_k=3, step_times=[1.0, 50.0, 60.0, 70.0],
                   max_new_tokens=12, vocab_limit=REAL)
    s = out.stats
    assert out.tokens == ref and s.k == 3 and s.k_per_round == (0,) * 12 and s.drafted == 0
    # the first round's row came with the prefill, the second is plain's warm-up: 10 timed plain rounds
    assert s.policy["policy"] == "auto" and s.policy["seeded"] and s.policy["timed_rounds"] == [10, 0, 0, 0]
    assert out.to_dict()["stats"]["k_per_round"] == [0] * 12 and type(out).from_dict(out.to_dict()) == out
    # free drafts and every one accepted: each round drafts max_k = 3 and commits 4 tokens
    out = generate(olmoe, prompt, draft=OracleDraft(1.0), k="auto", max_k=3, step_times=[1.0] * 4,
                   max_new_tokens=12, vocab_limit=REAL)
    assert out.tokens == ref and out.stats.k_per_round == (3, 3, 3) and out.stats.tokens_per_round == (4, 4, 4)
    assert out.stats.policy["tests"] == [3, 3, 3]


def test_synthetic_padding_ids_never_produced_without_a_tokenizer():
    """Synthetic presets declare their real vocabulary; no caller-side vocab_limit is needed."""
    model, _ = synthetic.build("olmoe-tiny", seed=0)
    # At a high temperature the 13 padded rows are sampled often when nothing masks them
    # (13/272 of the mass at T -> inf; 200 tokens make a miss vanishingly unlikely).
    unmasked = generate(model, [1, 2, 3], max_new_tokens=200, temperature=50.0, seed=1, vocab_limit=synthetic.VOCAB)
    assert max(unmasked.tokens) >= ByteTokenizer.vocab_size
    out = generate(model, [1, 2, 3], max_new_tokens=200, temperature=50.0, seed=1)
    assert max(out.tokens) < ByteTokenizer.vocab_size
