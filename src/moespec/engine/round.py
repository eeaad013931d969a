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

from dataclasses import dataclass, replace
from typing import Callable, Collection

import torch

from moespec.backends.protocol import NoMaximum, SpecModel, StepStop
from moespec.engine.proposers import Proposal, Proposer
from moespec.engine.sampling import Sampler, no_distribution


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


def prefill(target: SpecModel, prompt: torch.Tensor, *, prefill_last: bool,
            sampler: Sampler) -> torch.Tensor | int | None:
    """Feed the prompt ([P] int64) to the target's empty cache. prefill_last: the whole prompt, and
    its last row is the first round's row 0, returned: [1, W] logits at position P, or under greedy
    decoding its greedy token. Otherwise all but the last prompt token, which counts as committed but
    not yet fed (the first round feeds it with its drafts, so every round verifies drafted + 1
    tokens); returns None."""
    if prefill_last:
        if not sampler.greedy:
            return target.extend(prompt, outputs=1)
        try:
            return target.extend_argmax(prompt, sampler.vocab_limit, outputs=1)[0]
        except NoMaximum as e:
            raise ValueError(no_distribution(e.what, 0, prompt.shape[0])) from None
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


def verify_greedy(target: SpecModel, seq: torch.Tensor, length: int, drafts: torch.Tensor, pending: int | None,
                  limit: int) -> list[int]:
    """`verify` under greedy decoding: the target's greedy token for each of its n + 1 rows, which the
    backend takes from its logits itself (`SpecModel.extend_argmax`); `pending` the prefill's one."""
    n = drafts.shape[0]
    first = 1 if pending is not None else 0  # the row the pass's first row is, of the round's n + 1
    try:
        if pending is not None:
            return [pending, *target.extend_argmax(drafts, limit)] if n else [pending]
        last = seq[length - 1: length]
        return target.extend_argmax(torch.cat((last, drafts)) if n else last, limit)
    except NoMaximum as e:
        raise ValueError(no_distribution(e.what, first + e.row, length)) from None


def greedy_walk(targets: list[int], drafts: list[int]) -> tuple[int, int]:
    """The accept walk at temperature 0: (drafts accepted, the next token). A draft is accepted while it
    is the target's greedy token; the next token is the target's where the walk stopped."""
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == targets[accepted]:
        accepted += 1
    return accepted, targets[accepted]


def plain_rounds(*, target: SpecModel, seq: torch.Tensor, length: int, rounds: int, limit: int,
                 eos: Collection[int], chosen: int = 0, stop: StepStop | None = None) -> list[Round]:
    """Up to `rounds` plain greedy rounds in one call to the target (`SpecModel.greedy_steps`): each
    feeds the last committed token and commits its greedy token into seq, until an EOS or a token
    `stop` fires on; recorded at the policy's choice `chosen` (0: plain decoding)."""
    try:
        produced, seconds = target.greedy_steps(int(seq[length - 1]), rounds, limit, eos, stop)
    except NoMaximum as e:  # step i's row predicts position length + i
        raise ValueError(no_distribution(e.what, e.row, length)) from None
    seq[length: length + len(produced)] = torch.tensor(produced, dtype=torch.long)
    return [Round(chosen=chosen, drafted=0, tested=0, accepted=0, new_tokens=1, eos=token in eos, timed=True,
                  draft_s=0.0, verify_s=s, sampling_s=0.0, seconds=s) for token, s in zip(produced, seconds)]


def quiet_rounds(*, target: SpecModel, proposer: Proposer, seq: torch.Tensor, length: int, chosen: int, rounds: int,
                 limit: int, eos: Collection[int], clock: Callable[[], float]) -> list[Round] | None:
    """Up to `rounds` rounds at draft length `chosen` in which the host drafter proposes nothing, run as
    plain greedy steps in one call to the target (`HostDrafter.quiet`, `plain_rounds` with its stop),
    as rounds with an empty proposal would, until a token may let the drafter propose, an EOS, or
    `rounds`. None (and nothing run) when the drafter may propose now. The check's time counts in the
    first round's."""
    t0 = clock()
    quiet = proposer.quiet(seq[:length], target.width)
    if quiet is None:
        return None
    checked = clock() - t0
    done = plain_rounds(target=target, seq=seq, length=length, rounds=min(rounds, quiet.steps), limit=limit, eos=eos,
                        chosen=chosen, stop=quiet.stop)
    proposer.commit(length + len(done))
    done[0] = replace(done[0], draft_s=checked, seconds=done[0].seconds + checked)
    return done


def until_eos(emitted: list[int], eos: Collection[int]) -> int | None:
    """The index of the first EOS among the round's committed tokens, or None."""
    return next((j for j, token in enumerate(emitted) if token in eos), None)


def run_round(*, target: SpecModel, proposer: Proposer | None, sampler: Sampler, seq: torch.Tensor,
              length: int, chosen: int, k: int, pending: torch.Tensor | None, eos: Collection[int],
              clock: Callable[[], float]) -> Round:
    """One round at draft length k <= chosen: propose, verify, accept, roll back.

    seq: [>= length + k + 1] int64, the committed tokens in seq[:length]; the round writes the ones it
    commits after them. pending: the prefill's last row for the first round (its greedy token under
    greedy decoding), else None. eos: ids that end the call (the EOS is committed, nothing after it).
    """
    t0 = clock()
    proposal = proposer.propose(seq[:length], k) if proposer is not None and k > 0 else Proposal(seq[:0])
    t1 = clock()
    drafts, n = proposal.tokens, proposal.tokens.shape[0]
    if n > k:
        raise ValueError(f"{type(proposer).__name__}.propose returned {n} drafts for k={k}; return at most k")
    if sampler.greedy:
        targets = verify_greedy(target, seq, length, drafts, pending, sampler.vocab_limit)  # [n + 1] ids
        t2 = clock()
        accepted, token = greedy_walk(targets, drafts.tolist())
    else:
        logits = verify(target, seq, length, drafts, pending)  # [n + 1, W]
        t2 = clock()
        accepted, token = sampler.verify(sampler.prepare(logits, position=length), drafts, proposal.q)
    accepted, token = proposal.settle(accepted, token)  # the oracle's mark or verdict (`Proposal.settle`)
    t3 = clock()
    seq[length: length + accepted] = drafts[:accepted]
    seq[length + accepted] = token
    new_tokens = accepted + 1
    hit = until_eos(seq[length: length + new_tokens].tolist(), eos) if eos else None
    if hit is not None:
        new_tokens, accepted = hit + 1, min(accepted, hit)
    target.truncate(length + new_tokens - 1)
    if proposer is not None:
        proposer.commit(length + accepted)
    return Round(chosen=chosen, drafted=n, tested=min(accepted + 1, n), accepted=accepted, new_tokens=new_tokens,
                 eos=hit is not None, timed=pending is None, draft_s=t1 - t0, verify_s=t2 - t1,
                 sampling_s=t3 - t2, seconds=clock() - t0)
