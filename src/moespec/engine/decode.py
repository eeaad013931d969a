"""`generate`: lossless speculative decoding of one sequence, read top to bottom.

`generate` checks its arguments and sets the call up (the policy, the proposer, the sampler's width
and vocabulary, the store's key); `_decode` is the timed part: `round.prefill`, the warm start
(`engine.warm_start`), then `round.run_round` until the budget, an EOS or max_steps, each round's
record counted by a `stats.RoundLog` and fed to the policy (`policy.Policy`), which alone decides
the next round's draft length.
"""

from __future__ import annotations

import time
from itertools import accumulate
from typing import Sequence

import torch

from moespec.backends.protocol import as_spec_model
from moespec.device import peak_rss_bytes, synchronize
from moespec.engine.policy import Policy, make_policy, record_plain_run
from moespec.engine.proposers import DraftModel, Proposer
from moespec.engine.round import plain_rounds, prefill, quiet_rounds, run_round
from moespec.engine.sampling import Sampler, SamplingConfig
from moespec.engine.stats import GenerationResult, RoundLog
from moespec.engine.step_store import remember, store_key
from moespec.engine.warm_start import prepare, resolve_mode


def check_pairing(target_tok, draft_tok) -> None:
    """Raise ValueError unless the two tokenizers map the same ids to the same tokens.

    Same length first; then `get_vocab()` where both have it, otherwise every id decoded alone with
    its special tokens (the engine paper's id->text round trip for pairs across backends). The error
    names the first differing ids.
    """
    nt, nd = len(target_tok), len(draft_tok)
    if nt != nd:
        raise ValueError(f"the target's tokenizer ({target_tok!r}) has {nt} ids and the draft's ({draft_tok!r}) "
                         f"{nd}; pair models that share one tokenizer")
    if hasattr(target_tok, "get_vocab") and hasattr(draft_tok, "get_vocab"):
        t_by_id = {i: s for s, i in target_tok.get_vocab().items()}
        d_by_id = {i: s for s, i in draft_tok.get_vocab().items()}
        diff = [i for i in sorted(set(t_by_id) | set(d_by_id)) if t_by_id.get(i) != d_by_id.get(i)]
    else:
        text = lambda tok, i: tok.decode([i], skip_special_tokens=False)
        diff = [i for i in range(nt) if text(target_tok, i) != text(draft_tok, i)]
        t_by_id = {i: text(target_tok, i) for i in diff[:5]}
        d_by_id = {i: text(draft_tok, i) for i in diff[:5]}
    if diff:
        shown = ", ".join(f"id {i}: target {t_by_id.get(i)!r} vs draft {d_by_id.get(i)!r}" for i in diff[:5])
        raise ValueError(
            f"draft and target tokenizers disagree on {len(diff)} ids (first: {shown}); "
            f"pair models that share one tokenizer"
        )


def as_prompt(input_ids) -> torch.Tensor:
    """input_ids (list of ints, [P] or [1, P] tensor) -> [P] int64 CPU tensor."""
    ids = torch.as_tensor(input_ids, dtype=torch.long).cpu()
    if ids.dim() == 2:
        if ids.shape[0] != 1:
            raise ValueError(f"generate() decodes one sequence; got input_ids of shape {tuple(ids.shape)}")
        ids = ids[0]
    if ids.dim() != 1:
        raise ValueError(f"input_ids must be [P] or [1, P], got shape {tuple(ids.shape)}")
    if ids.numel() == 0:
        raise ValueError("input_ids is empty; pass at least one prompt token (e.g. the BOS id)")
    return ids


def _narrow_message(vocab: int, target_width: int, draft_width: int | None) -> str:
    """Why a vocabulary of `vocab` ids does not fit the output layers (logits per position)."""
    if draft_width is not None and draft_width < vocab:
        return (f"the draft's output layer has {draft_width} logits, fewer than the {vocab} ids of the vocabulary "
                f"(the target has {target_width}); pair a draft whose output layer covers the tokenizer")
    return f"vocab_limit={vocab} is above the target's logit width {target_width}; give vocab_limit <= {target_width}"


def _check_room(role: str, model, P: int, max_new_tokens: int, max_k: int) -> None:
    """Raise before any pass when a round could need more positions than the model's cache holds."""
    capacity = getattr(model, "capacity", None)
    need = P + max_new_tokens + max_k
    if capacity is not None and need > capacity:
        raise ValueError(f"the {role}'s context holds {capacity} positions, but a {P}-token prompt, max_new_tokens="
                         f"{max_new_tokens} and drafts of up to {max_k} need {need}; shorten the prompt or "
                         f"max_new_tokens, or load the model with a larger context (n_ctx)")


def _as_proposer(draft) -> Proposer | None:
    if draft is None or isinstance(draft, Proposer):
        return draft
    if hasattr(draft, "extend") or hasattr(draft, "config"):
        return DraftModel(draft)
    raise TypeError(
        f"draft must be None, a causal LM, or a proposer (DraftModel, PromptLookup, OracleDraft, or an object "
        f"with the Proposer protocol's cache, begin, propose, commit and identity); got {type(draft).__name__}"
    )


def eos_ids(eos_token_id: int | Sequence[int] | None) -> set[int]:
    """The EOS ids of `eos_token_id`: none, one id, or several."""
    if eos_token_id is None:
        return set()
    return {int(eos_token_id)} if isinstance(eos_token_id, int) else set(eos_token_id)


def _sampling_width(target, draft_cache, vocab_limit: int | None) -> tuple[int, int | None]:
    """(W, vocab limit) of the sampler: the narrower output layer, and the limit given or declared."""
    width = target.width if draft_cache is None else min(target.width, draft_cache.width)
    if vocab_limit is None:
        declared = [m.vocab_limit for m in (target, draft_cache) if m is not None and m.vocab_limit]
        vocab_limit = min(declared) if declared else None
    if vocab_limit is not None and vocab_limit > width:
        raise ValueError(_narrow_message(vocab_limit, target.width, None if draft_cache is None else draft_cache.width))
    return width, vocab_limit


def generate(target, input_ids: Sequence[int] | torch.Tensor, *, draft=None, k: int | str | Policy = 4, max_k: int = 8,
             step_times: Sequence[float] | None = None, temperature: float = 0.0, top_k: int | None = None,
             top_p: float | None = None, max_new_tokens: int = 128, eos_token_id: int | Sequence[int] | None = None,
             seed: int = 0, vocab_limit: int | None = None, max_steps: int | None = None, prefill_last: bool = True,
             warm_start: bool | str = True) -> GenerationResult:
    """Lossless speculative decoding of `target` from `input_ids`.

    target: a transformers causal LM or any `backends.SpecModel` (a llama.cpp `LlamaModel`, ...).
    draft: None (plain decoding), a causal LM or SpecModel (wrapped as DraftModel) or a `Proposer`.
    k: drafts per round (0 = plain decoding), or "auto": each round drafts the k in 0..max_k with the
    most expected tokens per second (`policy.AutoK`), from acceptance by position and step times learned
    from the past rounds; `step_times` (V(0..max_k), seconds) seeds the step times. An `AutoK` instance
    (any `policy.Policy`) as k is used and updated in place: pass the same one to successive calls with
    the same pair and it starts from what it learned (max_k is then its own). The choice depends on past
    rounds only, so decoding stays lossless (greedy output is the same tokens); as it follows measured
    times, at temperature > 0 a seed fixes the law of the output, not its tokens. Sampling is
    temperature/top-k/top-p target sampling, greedy at temperature 0, seeded by `seed`.
    vocab_limit: ids >= vocab_limit are never produced (the tokenizer's length when the output
    layer is padded); default: the smaller of the models' declared `moespec_vocab_limit` (synthetic
    presets declare theirs), else the shared logit width; a limit above that width (a draft narrower
    than the vocabulary) is a ValueError. Stops after exactly `max_new_tokens` tokens
    or at an EOS (kept in the output), whichever comes first; with `max_steps`, also after that many
    rounds (benchmarks that want every round at its full draft length give max_new_tokens room
    for max_steps * (k + 1) tokens).
    prefill_last: the prefill's last row gives the first round's first token, so that round's pass
    verifies only the k drafts (none at k = 0). False: the prefill stops before the prompt's last
    token, which the first round feeds with its drafts, so every round's pass verifies k + 1 tokens:
    each round is a step of the cost model (benchmarks of the step time). The output is the same.
    warm_start: for k="auto" without step_times (an AutoK as k: one not yet seeded nor timed), the
    seed of V(0..max_k) right after the prefill (`engine.warm_start`), inside the call's time:
    True or "store": the step times that earlier calls of the same models on this machine measured
    (`engine.step_store`: `~/.cache/moespec/step-times.json`; $MOESPEC_STEP_TIMES names another file,
    empty: none) under the models' own `identity()`, else none, and the call's measured step times
    are written back for the next; "timed": a short timing of target passes of 1..max_k+1 tokens and
    of the draft's steps on the real caches (restored: the output is the same), no file; False:
    none, the policy opens with timed rounds. Ignored for a fixed k. `stats.policy["warm_start"]`
    says where the seed came from and what it cost; the store's key hashes a torch model's weights
    once per loaded model, before the call's clock starts.
    """
    policy = make_policy(k, max_k, step_times)
    _check_budget(max_new_tokens, max_steps)
    config = SamplingConfig(temperature=float(temperature), top_k=top_k, top_p=top_p)
    prompt = as_prompt(input_ids)
    tgt = as_spec_model(target)
    tgt.reset()
    proposer = _as_proposer(draft) if policy.max_k > 0 else None
    mode = resolve_mode(warm_start, policy) if proposer is not None else None
    key = store_key(tgt, proposer) if mode == "store" else None  # hashes a torch model's weights once
    sampler = _sampler(config, tgt, proposer, vocab_limit=vocab_limit, seed=seed, prompt_tokens=prompt.shape[0],
                       max_new_tokens=max_new_tokens, max_k=policy.max_k)
    if proposer is not None:
        proposer.begin(target=tgt, prompt=prompt, max_new_tokens=max_new_tokens, sampler=sampler)
        tgt.forward_s = 0.0
    return _decode(tgt, proposer, sampler, policy, prompt, max_new_tokens=max_new_tokens, max_steps=max_steps,
                   eos=eos_ids(eos_token_id), prefill_last=prefill_last, warm_mode=mode, key=key,
                   clock=time.perf_counter)


def _check_budget(max_new_tokens: int, max_steps: int | None) -> None:
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if max_steps is not None and max_steps < 1:
        raise ValueError(f"max_steps must be >= 1 round (or None), got {max_steps}")


def _sampler(config: SamplingConfig, target, proposer: Proposer | None, *, vocab_limit: int | None, seed: int,
             prompt_tokens: int, max_new_tokens: int, max_k: int) -> Sampler:
    """The call's sampler, over the narrower output layer and the vocabulary limit, once both models'
    caches are known to hold the prompt, the budget and a round's drafts."""
    draft_cache = proposer.cache if proposer is not None else None
    width, vocab_limit = _sampling_width(target, draft_cache, vocab_limit)
    for role, m in (("target", target), ("draft", draft_cache)):
        _check_room(role, m, prompt_tokens, max_new_tokens, max_k)
    return Sampler(config, width=width, vocab_limit=vocab_limit, seed=seed)


PLAIN_RUN_MIN = 2  # rounds: a shorter plain run goes through the round as any other


def _plain_run(policy: Policy, sampler: Sampler, pending, tokens: int, rounds: int | None) -> int:
    """How many plain rounds the loop runs in one call to the target now: greedy, no prefill row
    pending, the policy's plain run cut to the token budget and to max_steps; 0 for a normal round."""
    if not sampler.greedy or pending is not None:
        return 0
    return _cut(policy.plain_run(), tokens, rounds)


def _cut(run: int, tokens: int, rounds: int | None) -> int:
    """A run of one-token rounds cut to the tokens left and to max_steps' rounds left; 0 when under
    PLAIN_RUN_MIN (a shorter run goes through the round as any other)."""
    run = min(run, tokens, rounds if rounds is not None else tokens)
    return run if run >= PLAIN_RUN_MIN else 0


def _quiet_run(policy: Policy, sampler: Sampler, proposer, pending, chosen: int, budget: int,
               rounds_left: int | None) -> int:
    """How many rounds at the policy's choice may run as one call while the drafter proposes nothing
    (`round.quiet_rounds`): greedy, no prefill row pending, a settled policy (`FixedK.settled`) at
    k >= 1 and a drafter with a quiet rule, cut to the token budget and to max_steps; 0: none."""
    settled = getattr(policy, "settled", None)
    if (not sampler.greedy or pending is not None or chosen < 1 or budget < 1 or settled is None
            or getattr(proposer, "quiet", None) is None):
        return 0
    return _cut(settled(), budget + 1, rounds_left)


def _next_rounds(plain: int, *, target, proposer, sampler: Sampler, policy: Policy, seq: torch.Tensor, length: int,
                 budget: int, rounds_left: int | None, pending, eos: set[int], clock) -> tuple[list, list[float]]:
    """The next rounds and the clock reading each ended at: `plain` greedy plain rounds run by the target
    in one call (each ending when its step did), else rounds at the policy's choice: those in which
    the drafter proposes nothing in one call, or one round."""
    started = clock()
    if plain:
        rounds = plain_rounds(target=target, seq=seq, length=length, rounds=plain, limit=sampler.vocab_limit, eos=eos)
        return rounds, list(accumulate((r.seconds for r in rounds), initial=started))[1:]
    chosen = policy.choose()
    quiet = _quiet_run(policy, sampler, proposer, pending, chosen, budget, rounds_left)
    if quiet:
        rounds = quiet_rounds(target=target, proposer=proposer, seq=seq, length=length, chosen=chosen, rounds=quiet,
                              limit=sampler.vocab_limit, eos=eos, clock=clock)
        if rounds is not None:
            return rounds, list(accumulate((r.seconds for r in rounds), initial=started))[1:]
    r = run_round(target=target, proposer=proposer, sampler=sampler, seq=seq, length=length, chosen=chosen,
                  k=min(chosen, budget), pending=pending, eos=eos, clock=clock)
    return [r], [clock()]


def _update(policy: Policy, rounds: list, *, plain: bool) -> None:
    """The policy after `rounds`: a run of plain rounds at once (`policy.record_plain_run`), else an
    `update` per round."""
    if plain:
        record_plain_run(policy, [r.seconds if r.timed else None for r in rounds])
        return
    for r in rounds:
        policy.update(drafted=r.drafted, accepted=r.accepted, tested=r.tested, seconds=r.seconds if r.timed else None)


def _decode(target, proposer: Proposer | None, sampler: Sampler, policy: Policy, prompt: torch.Tensor, *,
            max_new_tokens: int, max_steps: int | None, eos: set[int], prefill_last: bool, warm_mode: str | None,
            key: dict | None, clock) -> GenerationResult:
    """The timed part of `generate`: the prefill, the warm start, then rounds until max_new_tokens
    tokens, an EOS or max_steps rounds. prompt: [P] int64."""
    P = prompt.shape[0]
    seq = torch.empty(P + max_new_tokens + policy.max_k + 1, dtype=torch.long)  # committed tokens, room for a round
    seq[:P] = prompt
    device = getattr(target, "device", None)
    synchronize(device)
    log = RoundLog(policy.max_k, start=clock())
    pending, warm = None, None  # the prefill's last row (its greedy token when greedy), the first round's row 0
    if max_new_tokens > 0:
        pending = prefill(target, prompt, prefill_last=prefill_last, sampler=sampler)
        log.add_passes(verify_s=clock() - log.start)
        if warm_mode is not None:
            warm = prepare(warm_mode, target=target, proposer=proposer, context=prompt, max_k=policy.max_k,
                           max_new_tokens=max_new_tokens, key=key, clock=clock)
            policy.start(V=warm.V, anchors=warm.anchors, acceptance=warm.acceptance)
            log.add_passes(verify_s=warm.seconds - warm.draft_s, draft_s=warm.draft_s)  # as the prefill's
    length, stop = P, "max_new_tokens"
    while length - P < max_new_tokens:
        if max_steps is not None and log.rounds == max_steps:
            stop = "max_steps"
            break
        budget = max_new_tokens - (length - P) - 1  # a round commits up to k + 1 tokens: never past the budget
        left = None if max_steps is None else max_steps - log.rounds
        plain = _plain_run(policy, sampler, pending, budget + 1, left)
        rounds, ends = _next_rounds(plain, target=target, proposer=proposer, sampler=sampler, policy=policy,
                                    seq=seq, length=length, budget=budget, rounds_left=left, pending=pending,
                                    eos=eos, clock=clock)
        for r, end in zip(rounds, ends):
            pending, length = None, length + r.new_tokens
            log.add(r, end)
        _update(policy, rounds, plain=bool(plain))
        if rounds[-1].eos:
            stop = "eos"
            break
    synchronize(device)
    total_s = clock() - log.start
    if warm is not None and warm.key is not None:  # after the decode's time: the store's write (~0.5 ms) is for the next call
        remember(warm.key, policy.learned())
    state = policy.state()
    if warm is not None:
        state["warm_start"] = warm.to_dict()
    draft_cache = proposer.cache if proposer is not None else None
    stats = log.stats(prompt_tokens=P, stop_reason=stop, total_s=total_s, target_forward_s=target.forward_s,
                      draft_forward_s=draft_cache.forward_s if draft_cache is not None else 0.0,
                      peak_rss_bytes=peak_rss_bytes(), policy=state)
    return GenerationResult(tokens=seq[P:length].tolist(), stats=stats)
