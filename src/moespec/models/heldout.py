"""Held-out scores of a trained model: bits per byte, and a draft's top-1 agreement with its target
(`models.train` writes both into a preset's manifest)."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F


@torch.no_grad()
def bits_per_byte(model, ids: np.ndarray, *, seq: int = 512, batch: int = 8) -> float:
    """Held-out bits per token (per byte with the byte tokenizer): the mean next-token cross-entropy
    over `ids` [tokens] in log2, read in consecutive windows of `seq` + 1 (each window's first token
    is context only)."""
    t = torch.from_numpy(ids.astype(np.int64))
    n = (len(t) - 1) // seq
    if n < 1:
        raise ValueError(f"need more than {seq} tokens to score; got {len(t)}")
    windows = torch.stack([t[i * seq: i * seq + seq + 1] for i in range(n)])
    total = 0.0
    for chunk in windows.split(batch):
        logits = model(input_ids=chunk[:, :-1]).logits.float()
        total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1), reduction="sum"))
    return total / (n * seq) / math.log(2)


@torch.no_grad()
def agreement(model, teacher, ids: np.ndarray, *, seq: int = 256, batch: int = 4) -> float:
    """Top-1 agreement of `model` with `teacher` on `ids` [tokens], in consecutive windows of `seq`:
    the share of positions where both predict the same next token (what greedy acceptance at draft
    position 1 is, on text the target itself did not write)."""
    t = torch.from_numpy(ids.astype(np.int64))
    n = len(t) // seq
    if n < 1:
        raise ValueError(f"need at least {seq} tokens; got {len(t)}")
    same = 0
    for chunk in torch.stack([t[i * seq: (i + 1) * seq] for i in range(n)]).split(batch):
        a = model(input_ids=chunk).logits
        b = teacher(input_ids=chunk).logits
        same += int((a.argmax(-1) == b[..., : a.shape[-1]].argmax(-1)).sum())
    return same / (n * seq)
