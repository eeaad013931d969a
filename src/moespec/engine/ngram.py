"""llama.cpp's n-gram drafters, `--spec-type ngram-simple` and `ngram-mod`, as `Proposer`s.

Each is the rule llama.cpp runs under that name, so the acceptance moespec measures is that of the
settings it emits. Read from the llama.cpp that llama-cpp-python 0.3.36 vendors (0c1e570):
common/ngram-map.cpp (`common_ngram_simple_draft`), common/ngram-mod.cpp (the hashed pool),
common/speculative.cpp (`common_speculative_impl_ngram_mod`, and the truncation of every draft to
the caller's n_max), common/common.h (the defaults), common/arg.cpp (the flags). Our own code.

llama.cpp drafts from `prompt` (the tokens in the target's cache) and `id_last` (the token sampled
last, not yet in it); here the committed context is prompt + [id_last], and the engine's k is the
caller's n_max: a draft longer than k is cut to k after the rule has run.
"""

from __future__ import annotations

import numpy as np
import torch

from moespec.backends.protocol import StepStop, fold
from moespec.engine.proposers import HostDrafter, Proposal, Quiet, quiet_until_repeat, until_repeat
from moespec.engine.sampling import Sampler

MOD_POOL = 4 * 1024 * 1024  # entries of ngram-mod's hash table (speculative.cpp: mod(n_match, 4*1024*1024))
MOD_CHUNK = 32  # new n-grams enter the pool once more than this many tokens are waiting
MOD_OCCUPANCY = 0.25  # begin() empties a pool fuller than this
MOD_LOW_SHARE, MOD_LOW_STREAK = 0.25, 5  # accept(): 5 drafts in a row with < 25% accepted empty the pool
EMPTY = -1  # a pool slot no n-gram has entered (llama.cpp's EMPTY)


def check_range(flag: str, value: int, low: int, high: int = 1024) -> int:
    """value, after a ValueError naming llama.cpp's flag unless it lies in low..high (arg.cpp's checks)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{flag} = {value!r} must be an int in {low}..{high} (as llama.cpp's common/arg.cpp checks)")
    return value


class NgramSimple(HostDrafter):
    """`--spec-type ngram-simple`: copy what followed the latest earlier occurrence of the last size_n tokens.

    The pattern is the context's last size_n tokens. It is searched in the cache (the context less
    its last token) at starts from len - size_n - 1 down to 1, latest first (start 0 never matches);
    the draft is what followed the match, at most size_m tokens, taken from the cache. Nothing is
    drafted while the cache holds size_n + size_m + 1 tokens or fewer, nor when fewer than size_n
    tokens follow the match. min_hits is parsed by llama.cpp (--spec-ngram-simple-min-hits) but its
    ngram-simple rule does not read it; kept so each flag maps to one argument. size_m is the draft
    length (llama-server cuts a draft only to the context or token budget), and a size_m below
    size_n never drafts: a line that prices k drafts sets size_m = k >= size_n.
    """

    def __init__(self, size_n: int = 12, size_m: int = 48, min_hits: int = 1):
        self.size_n = check_range("--spec-ngram-simple-size-n", size_n, 1)
        self.size_m = check_range("--spec-ngram-simple-size-m", size_m, 1)
        self.min_hits = check_range("--spec-ngram-simple-min-hits", min_hits, 1, 1 << 16)

    def propose(self, context: torch.Tensor, k: int) -> Proposal:
        n, m = self.size_n, self.size_m
        cached = context[:-1]  # [L - 1] llama.cpp's prompt; context[-1] is its id_last
        length = cached.shape[0]
        if length <= n + m + 1:
            return Proposal(context[:0])
        windows = cached[1: length - 1].unfold(0, n, 1)  # [length - n - 1, n], row i starts at i + 1
        hits = (windows == context[-n:]).all(-1).nonzero()
        if not hits.numel():
            return Proposal(context[:0])
        start = int(hits[-1]) + 1 + n  # the first token after the latest match
        copy = min(m, length - start)
        if copy < n:
            return Proposal(context[:0])
        return Proposal(cached[start: start + min(copy, k)])

    def quiet(self, context: torch.Tensor, width: int) -> Quiet | None:
        """Quiet while no n-gram ending in a new token can match: a match needs its last token earlier
        in the context, so the rule fires on each repeated token (and the round asks the rule)."""
        quiet = quiet_until_repeat(context, width)
        if quiet is None and not self.propose(context, 1).tokens.numel():
            quiet = until_repeat(context, width)
        return quiet

    def identity(self) -> dict:
        """Its sizes: other sizes draft other tokens."""
        return {"proposer": type(self).__name__,
                "options": {"size_n": self.size_n, "size_m": self.size_m, "min_hits": self.min_hits}, "draft": None}


def mod_index(window: list[int]) -> int:
    """The pool slot of an n-gram: the uint64 fold res = res * 6364136223846793005 + token
    (`backends.protocol.fold`), modulo MOD_POOL."""
    return fold(window) % MOD_POOL


class NgramMod(HostDrafter):
    """`--spec-type ngram-mod`: chain lookups in a hashed pool of (n_match-gram -> next token).

    The pool maps the hash of each n_match-gram of the context (`mod_index`) to the token that last
    followed an n-gram with that hash; collisions overwrite, as in llama.cpp. A draft starts from the
    context's last n_match tokens and looks up the next token, appends it and slides, up to n_max
    times; a miss before n_min tokens drafts nothing, a later one ends the draft. The pool is one
    per proposer, kept across sequences as llama-server keeps it across requests: `begin` adds the
    prompt's n-grams and empties a pool over 25% full; later n-grams enter in chunks of more than 32
    tokens; after 5 drafts in a row with under 25% of their tokens accepted the pool is emptied.
    The default n_min = 48 drafts nothing shorter: a line that prices k drafts sets n_min <= n_max = k.
    """

    def __init__(self, n_match: int = 24, n_max: int = 64, n_min: int = 48):
        self.n_match = check_range("--spec-ngram-mod-n-match", n_match, 1)
        self.n_max = check_range("--spec-ngram-mod-n-max", n_max, 0)
        self.n_min = check_range("--spec-ngram-mod-n-min", n_min, 0)
        self.pool = np.full(MOD_POOL, EMPTY, dtype=np.int32)  # slot -> the token after its n-gram
        self.filled = 0  # slots not EMPTY
        self.resets = 0
        self._seq_state(0)

    def _seq_state(self, i_last: int) -> None:
        self.i_last, self.n_draft_last, self.n_low = i_last, 0, 0
        self._proposed_at: int | None = None  # the context length of the last proposal awaiting commit

    def reset(self) -> None:
        """Empty the pool (llama.cpp's common_ngram_mod::reset)."""
        self.pool.fill(EMPTY)
        self.filled = 0
        self.resets += 1

    def _add(self, tokens: list[int], start: int, stop: int) -> None:
        """Enter the n-grams starting at start..stop-1 of tokens, each with the token after it."""
        n = self.n_match
        for i in range(start, stop):
            slot = mod_index(tokens[i: i + n])
            self.filled += int(self.pool[slot] == EMPTY)
            self.pool[slot] = tokens[i + n]

    def begin(self, *, target, prompt: torch.Tensor, max_new_tokens: int, sampler: Sampler) -> None:
        tokens, n = prompt.tolist(), self.n_match
        self._seq_state(0)
        if len(tokens) < n:
            return
        self._add(tokens, 0, len(tokens) - n)
        self.i_last = len(tokens) - n
        if self.filled / MOD_POOL > MOD_OCCUPANCY:
            self.reset()

    def draft(self, cached: list[int], last: int) -> list[int]:
        """llama.cpp's draft_one: the drafts after `cached` (its prompt) and `last` (its id_last), uncut."""
        n = self.n_match
        self.n_draft_last = 0
        if len(cached) < n:
            return []
        if self.i_last + MOD_CHUNK < len(cached):
            self._add(cached, self.i_last, len(cached) - n)
            self.i_last = len(cached) - n
        run = cached[len(cached) - n + 1:] + [last]  # [n] the key, then the drafts as they come
        for i in range(self.n_max):
            token = int(self.pool[mod_index(run[i: i + n])])
            if token == EMPTY:
                if i < self.n_min:
                    return []
                break
            run.append(token)
        self.n_draft_last = len(run) - n
        return run[n:]

    def propose(self, context: torch.Tensor, k: int) -> Proposal:
        tokens = context.tolist()
        drafts = self.draft(tokens[:-1], tokens[-1])[:k]  # cut to the caller's n_max after the rule
        self._proposed_at = len(tokens)
        return Proposal(torch.tensor(drafts, dtype=torch.long))

    def quiet(self, context: torch.Tensor, width: int) -> Quiet | None:
        """Quiet while the pool holds no entry for the context's last n_match tokens (a draft's first
        lookup misses) and no chunk of n-grams is due to enter it: the rule hashes each new token's
        n-gram as `draft` does and fires on an entry, or on the token whose draft would add a chunk."""
        tokens, n = context.tolist(), self.n_match
        cached = len(tokens) - 1
        if cached < n or self.i_last + MOD_CHUNK < cached or self.pool[mod_index(tokens[-n:])] != EMPTY:
            return None
        tail = np.array(tokens[len(tokens) - n + 1:], dtype=np.int32)  # the last n - 1 tokens
        return Quiet(StepStop(pool=self.pool, tail=tail), self.i_last + MOD_CHUNK + 1 - cached)

    def commit(self, keep: int) -> None:
        """llama.cpp's accept(n_accepted), called once per proposal (a round at k = 0 proposes nothing)."""
        if self._proposed_at is None:
            return
        accepted, self._proposed_at = keep - self._proposed_at, None
        if self.n_draft_last == 0:
            return
        if accepted / self.n_draft_last < MOD_LOW_SHARE:
            self.n_low += 1
            if self.n_low >= MOD_LOW_STREAK:
                self.reset()
                self.n_low, self.i_last = 0, 0
        else:
            self.n_low = 0

    def identity(self) -> dict:
        """Its lookup length and draft bounds (the pool's state is not part of it)."""
        return {"proposer": type(self).__name__,
                "options": {"n_match": self.n_match, "n_max": self.n_max, "n_min": self.n_min}, "draft": None}
