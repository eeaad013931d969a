"""The prefill and one round of the draft-verify loop (engine paper Algorithm 1 and Sec. 4, Cache choreography).

Terms (as `engine.sampling`): a round *drafts* x_1..x_n (n <= k), the accept walk *tests* positions
1..tested and *accepts* x_1..x_accepted, then commits those and one recovered or bonus token.

Invariant between rounds, with the committed sequence s of length L (prompt + new tokens): the
target's cache holds s[:L-1] and the proposer's state a prefix of s. A round proposes x_1..x_n,
extends the target once with [s[L-1], x_1..x_n], so that its n+1 logit rows are p_1..p_{n+1}
(row i predicts x_{i+1}), runs the accept walk, commits the accepted drafts and one more token,
and truncates both caches back to the committed prefix. The first round after a prefill that
returned the prompt's last row (`pending`) feeds only its drafts. k = 0 or no proposer is plain
decoding through the same code: every round is then one target token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection

import torch

from moespec.backends.protocol import SpecModel
from moespec.engine.proposers import Proposal, Proposer
from moespec.engine.sampling import Sampler


@dataclass(frozen=True)
class Round:
    """What one round did. Times are seconds of the call's clock."""

    chosen: int  # the policy's draft length (the token budget may have cut the round's k below it)
    drafted: int  # drafts the proposer returned, n <= k
    tested: int  # draft positions the accept walk tested, min(accepted + 1, drafted) before an EOS
    accepted: int  # drafts committed
    new_tokens: int  # tokens committed: accepted + 1, fewer when an EOS ended the round early
    eos: bool  # an EOS was committed: the call stops
    timed: bool  # the round verified drafted + 1 tokens, a step of V(k) (not the round after a prefill)
    draft_s: float  # proposing
    verify_s: float  # the target's pass
    sampling_s: float  # the accept walk
    seconds: float  # the whole round, proposal to rollback


def prefill(target: SpecModel, prompt: torch.Tensor, *, prefill_last: bool) -> torch.Tensor | None:
    """Feed the prompt ([P] int64) to the target's empty cache. prefill_last: the whole prompt, and
    its last row ([1, W] logits at position P) is the first round's row 0, returned. Otherwise all but
    the last prompt token, which counts as committed but not yet fed (the first round feeds it with
    its drafts, so every round verifies drafted + 1 tokens); returns None."""
    if prefill_last:
        return target.extend(prompt, outputs=1)
    if prompt.shape[0] > 1:
        target.extend(prompt[:-1], outputs=1)
    return None


def verify(target: SpecModel, seq: torch.Tensor, length: int, drafts: torch.Tensor,
           pending: torch.Tensor | None) -> torch.Tensor:
    """[n + 1, W] the target's logits p_1..p_{n+1} for the n drafts ([n] int64) after the committed
    seq[:length]: one pass of the last committed token and the drafts, or of the drafts alone after
    `pending` ([1, W], the prefill's last row)."""
    n = drafts.shape[0]
    if pending is not None:
        return torch.cat((pending, target.extend(drafts))) if n else pending
    last = seq[length - 1: length]
    return target.extend(torch.cat((last, drafts)) if n else last)


def _until_eos(emitted: list[int], eos: Collection[int]) -> int | None:
    """The index of the first EOS among the round's committed tokens, or None."""
    return next((j for j, token in enumerate(emitted) if token in eos), None)


def run_round(*, target: SpecModel, proposer: Proposer | None, sampler: Sampler, seq: torch.Tensor,
              length: int, chosen: int, k: int, pending: torch.Tensor | None, eos: Collection[int],
              clock: Callable[[], float]) -> Round:
    """One round at draft length k <= chosen: propose, verify, accept, roll back.

    seq: [>= length + k + 1] int64, the committed tokens in seq[:length]; the round writes the ones it
    commits after them. pending: the prefill's last row for the first round, else None. eos: ids
    that end the call (the EOS is committed, nothing after it).
    """
    t0 = clock()
    proposal = proposer.propose(seq[:length], k) if proposer is not None and k > 0 else Proposal(seq[:0])
    t1 = clock()
    drafts, n = proposal.tokens, proposal.tokens.shape[0]
    if n > k:
        raise ValueError(f"{type(proposer).__name__}.propose returned {n} drafts for k={k}; return at most k")
    logits = verify(target, seq, length, drafts, pending)  # [n + 1, W]
    t2 = clock()
    accepted, token = sampler.verify(sampler.prepare(logits, position=length), drafts, proposal.q)
    if proposal.marked_from is not None and proposal.marked_from < accepted:  # drafts from the mark on are rejected
        accepted, token = proposal.marked_from, drafts[proposal.marked_from]  # the target's token there
    t3 = clock()
    seq[length: length + accepted] = drafts[:accepted]
    seq[length + accepted] = token
    new_tokens = accepted + 1
    hit = _until_eos(seq[length: length + new_tokens].tolist(), eos) if eos else None
    if hit is not None:
        new_tokens, accepted = hit + 1, min(accepted, hit)
    target.truncate(length + new_tokens - 1)
    if proposer is not None:
        proposer.commit(length + accepted)
    return Round(chosen=chosen, drafted=n, tested=min(accepted + 1, n), accepted=accepted, new_tokens=new_tokens,
                 eos=hit is not None, timed=pending is None, draft_s=t1 - t0, verify_s=t2 - t1,
                 sampling_s=t3 - t2, seconds=clock() - t0)
