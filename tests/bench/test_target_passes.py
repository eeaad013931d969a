"""The target's passes as decoding meets them (`bench.target_passes`) on a fake clock, and the rounds they
price (`costmodel.positional.steady_round_times`) on exact rationals."""

from fractions import Fraction as F

import pytest
import torch

from moespec.bench.target_passes import TargetPasses, measure_target_passes
from moespec.costmodel.positional import proposal_lengths, steady_round_times

BASE, PER_TOKEN, REBUILD = 3.0, 1.0, 0.5  # a fake pass: BASE + n PER_TOKEN, + REBUILD after another size


class GraphModel:
    """A SpecModel whose pass of n tokens costs BASE + n PER_TOKEN on `clock`, and REBUILD more when the
    pass before it had another size (llama.cpp's graph rebuilt); prefills and passes alike."""

    def __init__(self, clock, per_cached=0.0):
        self.clock, self.tokens, self.last, self.width, self.vocab_limit = clock, [], None, 16, None
        self.per_cached = per_cached  # more per token of the pass and per token already in the cache

    @property
    def length(self):
        return len(self.tokens)

    def reset(self):
        self.tokens = []

    def truncate(self, n):
        del self.tokens[n:]

    def extend(self, tokens, outputs=None):
        n = int(tokens.numel())
        self.clock.now += BASE + n * PER_TOKEN + n * self.per_cached * len(self.tokens) + \
            (REBUILD if n != self.last else 0.0)
        self.last = n
        self.tokens += tokens.tolist()
        return torch.zeros(n if outputs is None else outputs, self.width)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_warm_and_cold_passes_and_a_plain_step_on_a_fake_clock():
    # 2 prompts, 5 repetitions shared between them, kmax = 3: every pass size after another (cold) and
    # after itself (warm); the plain step is a one-token pass after one (no greedy_steps here)
    clock = Clock()
    model = GraphModel(clock)
    got = measure_target_passes(model, [[1, 2, 3, 4, 5], [6, 7, 8]], kmax=3, reps=5, clock=clock)
    assert got.warm == tuple(BASE + n * PER_TOKEN for n in range(1, 5))
    assert got.cold == tuple(BASE + n * PER_TOKEN + REBUILD for n in range(1, 5))
    assert got.plain == BASE + PER_TOKEN and got.depths == (5, 3) and got.reps == 5
    assert model.length == 0  # cut back and reset: the passes leave no trace in the cache
    assert TargetPasses.from_dict(got.to_dict()) == got


def test_passes_timed_past_the_prompt_at_the_depth_asked():
    # a pass of n tokens also costs n * DEPTH per cached token (attention over the cache); the prompt of 5
    # and 3 tokens decoded past it: the passes run on a cache of 7 (the text's last token is each pass's
    # first), where at ahead = 0 they ran on 4
    DEPTH = 0.25
    for ahead, cached in ((0, 4), (3, 7)):
        clock = Clock()
        model = GraphModel(clock, per_cached=DEPTH)
        got = measure_target_passes(model, [[1, 2, 3, 4, 5]], kmax=2, reps=3, ahead=ahead, clock=clock)
        assert got.warm == tuple(BASE + n * PER_TOKEN + n * DEPTH * cached for n in range(1, 4))
        assert got.depths == (cached + 1,) and got.ahead == ahead and model.length == 0
        assert TargetPasses.from_dict(got.to_dict()) == got


class SlowingModel(GraphModel):
    """GraphModel whose passes of n >= 2 tokens cost twice as much from its `after`-th call on (another
    tenant took the memory bandwidth): one-token passes, the plain steps here, are untouched."""

    def __init__(self, clock, after):
        super().__init__(clock)
        self.calls, self.after = 0, after

    def extend(self, tokens, outputs=None):
        start, n = self.clock.now, int(tokens.numel())
        out = super().extend(tokens, outputs)
        if n >= 2 and self.calls >= self.after:
            self.clock.now += self.clock.now - start
        self.calls += 1
        return out


def test_each_block_of_the_timing_keeps_its_own_medians():
    # one prompt, 8 repetitions at kmax = 1: 4 blocks of 2. A repetition makes 6 calls (n = 1, 2 cold and
    # warm, the plain step's two), after the prefill's one: from repetition 4 on (call 1 + 4 * 6) the pass
    # of 2 costs twice. Blocks 0, 1 read warm (4, 5), blocks 2, 3 (4, 10); the whole's median warm(2) 7.5
    clock = Clock()
    got = measure_target_passes(SlowingModel(clock, after=1 + 4 * 6), [[1, 2, 3, 4, 5]], kmax=1, reps=8, clock=clock)
    assert [b.warm for b in got.blocks] == [(4, 5), (4, 5), (4, 10), (4, 10)]
    assert [b.cold[1] for b in got.blocks] == [5.5, 5.5, 11, 11]
    assert got.warm == (4, 7.5) and all(b.plain == 4 for b in got.blocks)
    assert TargetPasses.from_dict(got.to_dict()) == got
    # fewer repetitions than blocks: the blocks with no sample are left out
    assert len(measure_target_passes(GraphModel(clock), [[1, 2, 3]], kmax=1, reps=2, clock=clock).blocks) == 2


def test_refusals():
    clock = Clock()
    for bad in (dict(kmax=-1), dict(reps=0), dict(ahead=-1), dict(prompts=[[1]]), dict(prompts=[])):
        kw = dict(prompts=[[1, 2, 3]], kmax=2, reps=2) | bad
        with pytest.raises(ValueError):
            measure_target_passes(GraphModel(clock), **kw, clock=clock)


def test_proposal_lengths_and_steady_rounds_by_hand():
    share = [F(1, 2), F(1, 4)]
    assert proposal_lengths(share, 0) == [1] and proposal_lengths(share, 2) == [F(1, 2), F(1, 4), F(1, 4)]
    warm, cold, plain, extra = [1, 2, 3], [2, 3, 4], F(1, 2), [0, F(1, 10), F(1, 5)]
    # k = 1: half the rounds are plain steps, half pass 2 tokens, warm half the time (the round before
    # passed 2 as well): 1/2 * 1/2 + 1/2 (1/2 * 2 + 1/2 * 3 + 1/10) = 31/20
    # k = 2: 1/2 plain, 1/4 propose 1 (warm a quarter of the time), 1/4 propose 2:
    # 1/4 + 1/4 (2/4 + 9/4 + 1/10) + 1/4 (3/4 + 12/4 + 1/5) = 39/20
    assert steady_round_times(warm, cold, plain, extra, share) == [F(1, 2), F(31, 20), F(39, 20)]
    # a draft model proposes k every round: its pass is always warm
    assert steady_round_times(warm, cold, plain, extra, [1, 1]) == [F(1, 2), F(21, 10), F(16, 5)]
    with pytest.raises(ValueError):
        steady_round_times(warm, cold[:2], plain, extra, share)
