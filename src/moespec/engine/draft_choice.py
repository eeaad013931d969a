"""Which proposer a call drafts with: a draft model, n-gram prompt lookup, the oracle, or none.

The one place that turns a caller's draft options into the `draft` argument of `decode.generate`
(one sequence) and `batch.generate_batch` (B sequences), and the draft length that goes with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from moespec.engine.decode import check_pairing
from moespec.engine.proposers import OracleDraft, PromptLookup


@dataclass(frozen=True)
class DraftChoice:
    """At most one of a draft model (its spec, loaded by the caller's `load_draft`), n-gram prompt
    lookup (n >= 1) and the oracle draft (its acceptance A in [0, 1], greedy decoding only); none of
    them is plain decoding."""

    model: str | None = None
    prompt_lookup: int | None = None
    oracle_acceptance: float | None = None
    temperature: float = 0.0

    def __post_init__(self):
        if sum(x is not None for x in (self.model, self.prompt_lookup, self.oracle_acceptance)) > 1:
            raise ValueError("choose at most one of --draft, --prompt-lookup, --oracle-acceptance")
        if self.oracle_acceptance is not None and self.temperature > 0:
            raise ValueError(f"the oracle draft needs greedy decoding (--temperature 0), got --temperature "
                             f"{self.temperature}")

    @property
    def speculative(self) -> bool:
        """Whether anything drafts: False is plain decoding."""
        return any(x is not None for x in (self.model, self.prompt_lookup, self.oracle_acceptance))

    def draft_length(self, k: int | str) -> int | str:
        """The k to decode with: the one asked for when something drafts, else 0 (plain decoding)."""
        return k if self.speculative else 0

    def proposer(self, *, tokenizer, load_draft: Callable[[str], tuple], seed: int = 0, sequences: int | None = None):
        """The `draft` argument of `generate` (or of `generate_batch` when `sequences` is B), None for
        plain decoding. `load_draft(spec)` gives the draft model's (model, tokenizer); its tokenizer
        must map ids as the target's `tokenizer` does. A batch gets one oracle per sequence, seeded
        seed, seed + 1, ..., so that the sequences' draws differ."""
        if self.model is not None:
            model, draft_tokenizer = load_draft(self.model)
            check_pairing(tokenizer, draft_tokenizer)
            return model
        if self.prompt_lookup is not None:
            return PromptLookup(self.prompt_lookup)
        if self.oracle_acceptance is not None:
            if sequences is None:
                return OracleDraft(self.oracle_acceptance, seed=seed)
            return [OracleDraft(self.oracle_acceptance, seed=seed + i) for i in range(sequences)]
        return None
