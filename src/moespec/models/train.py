"""Training the shipped presets: byte-level language models on the standard library and the corpus.

A `Recipe` is a transformers config plus the optimisation settings. `train` runs it: windows of
`seq` bytes drawn by a seeded generator (`corpus_share` of them from the shipped corpus, the rest
from the standard library; `models.text` holds documents back), AdamW with warm-up and cosine decay,
OLMoE's router load-balancing loss where the model has one, and for a draft the target's
distribution as the label (`teacher`: the draft learns to agree with the target it will draft
for). It checkpoints every `checkpoint_every` steps and resumes from the checkpoint; at the end it
writes float32-trained weights in `Recipe.save_dtype` as safetensors, with a manifest.

Deterministic for a given seed and thread count: the same command gives the same weights.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
import transformers

from moespec.models.text import CORPUS_HOLDOUT, TextSplit, corpus_documents, held_out, training_text
from moespec.models.tokenizer import BOS_ID, EOS_ID, PAD_ID, ByteTokenizer

VOCAB = 272  # the byte tokenizer's ids padded to a multiple of 16, as in the synthetic presets
CHECKPOINT = "checkpoint.pt"
MANIFEST = "manifest.json"
SLICE_BYTES = 8192  # the held-out slice a test re-scores against the manifest


@dataclass(frozen=True)
class Recipe:
    """What `train` builds and how. `arch` names a transformers config class; `config` its kwargs."""

    arch: str
    config: dict
    steps: int
    batch: int = 8
    seq: int = 512
    lr: float = 3e-3
    warmup: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    corpus_share: float = 0.1
    aux_loss: float = 0.01  # OLMoE's router_aux_loss_coef; 0 for dense models
    teacher: str | None = None  # trained preset whose distribution is the label (distillation)
    save_dtype: str = "bfloat16"
    checkpoint_every: int = 100
    description: str = ""
    extra: dict = field(default_factory=dict)

    def build_config(self) -> transformers.PretrainedConfig:
        kwargs = dict(vocab_size=VOCAB, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
                      tie_word_embeddings=False, max_position_embeddings=4096, **self.config)
        return getattr(transformers, self.arch)(**kwargs)


RECIPES: dict[str, Recipe] = {
    "olmoe": Recipe(
        "OlmoeConfig",
        dict(hidden_size=128, intermediate_size=64, num_hidden_layers=6, num_experts=64, num_experts_per_tok=8,
             num_attention_heads=4, num_key_value_heads=4),
        steps=1500,
        description="OLMoE layout, OLMoE's 64 experts and top-8 routing, hidden 128, 6 layers",
    ),
    "draft": Recipe(
        "LlamaConfig",
        dict(hidden_size=128, intermediate_size=384, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4),
        steps=1000, aux_loss=0.0, teacher="olmoe",
        description="dense Llama-style draft, 1 layer, distilled from trained:olmoe",
    ),
    # For tests: trains in a second.
    "tiny-moe": Recipe(
        "OlmoeConfig",
        dict(hidden_size=32, intermediate_size=16, num_hidden_layers=1, num_experts=8, num_experts_per_tok=2,
             num_attention_heads=2, num_key_value_heads=2),
        steps=20, batch=4, seq=64, warmup=2, checkpoint_every=5, description="test-sized OLMoE",
    ),
}


def recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; recipes: {', '.join(RECIPES)}")
    return RECIPES[name]


def learning_rate(r: Recipe, step: int) -> float:
    """Linear warm-up to `lr`, then cosine decay to `lr * min_lr_ratio` at `steps`."""
    if step < r.warmup:
        return r.lr * (step + 1) / r.warmup
    t = min(1.0, (step - r.warmup) / max(1, r.steps - r.warmup))
    return r.lr * (r.min_lr_ratio + (1 - r.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def sample_batch(streams: list[torch.Tensor], r: Recipe, g: torch.Generator) -> torch.Tensor:
    """[batch, seq + 1] int64 windows: each from the corpus with probability `corpus_share`."""
    rows = []
    for _ in range(r.batch):
        s = streams[1] if float(torch.rand((), generator=g)) < r.corpus_share else streams[0]
        start = int(torch.randint(0, len(s) - r.seq - 1, (), generator=g))
        rows.append(s[start: start + r.seq + 1])
    return torch.stack(rows).long()


def _soft_labels(teacher, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return F.softmax(teacher(input_ids=ids).logits.float(), dim=-1)


def step_loss(model, x: torch.Tensor, r: Recipe, teacher=None) -> tuple[torch.Tensor, float]:
    """(loss to minimise, cross-entropy in nats per byte) of one batch `x` [batch, seq + 1]."""
    inputs, targets = x[:, :-1], x[:, 1:]
    out = model(input_ids=inputs)
    logp = F.log_softmax(out.logits.float(), dim=-1)  # [batch, seq, VOCAB]
    ce = F.nll_loss(logp.reshape(-1, VOCAB), targets.reshape(-1))
    loss = ce if teacher is None else -(_soft_labels(teacher, inputs) * logp).sum(-1).mean()
    aux = getattr(out, "aux_loss", None)
    if r.aux_loss and aux is not None:
        loss = loss + r.aux_loss * aux
    return loss, float(ce.detach())


@torch.no_grad()
def bits_per_byte(model, ids: np.ndarray, *, seq: int = 512, batch: int = 8) -> float:
    """Held-out bits per byte: the mean next-token cross-entropy over `ids` [tokens] in log2,
    read in consecutive windows of `seq` + 1 (each window's first token is context only)."""
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


def heldout_slice() -> np.ndarray:
    """[SLICE_BYTES + 1] int16: the start of the shipped corpus's held-out code, the same on every
    machine (the standard library's held-out files differ between Python versions)."""
    docs = [d for d in corpus_documents() if d.kind == "code" and held_out(d.name, CORPUS_HOLDOUT)]
    return np.concatenate([d.ids for d in docs])[: SLICE_BYTES + 1]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def train(
    name: str,
    out: str | Path,
    *,
    r: Recipe | None = None,
    seed: int = 0,
    threads: int | None = None,
    split: TextSplit | None = None,
    teacher=None,
    on_step: Callable[[int, float, float], None] | None = None,
    command: str | None = None,
) -> dict:
    """Train recipe `name` (or `r`) into folder `out`, resuming from `out/checkpoint.pt`; the manifest.

    `teacher`: the model the draft distils from (default: the recipe's trained preset). `on_step`
    gets (step, cross-entropy in bits per byte, tokens per second) after every step.
    """
    r = r or recipe(name)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    transformers.utils.logging.disable_progress_bar()
    if threads is not None:
        torch.set_num_threads(threads)
    split = split or training_text()
    streams = [torch.from_numpy(split.train_ids(0)), torch.from_numpy(split.train_ids(1))]
    if r.teacher and teacher is None:
        from moespec.models.trained import load_trained

        teacher, _ = load_trained(r.teacher)
    if teacher is not None:
        teacher.eval().requires_grad_(False)

    torch.manual_seed(seed)
    cfg = r.build_config()
    if r.aux_loss:
        cfg.output_router_logits = True
        cfg.router_aux_loss_coef = r.aux_loss
    model = transformers.AutoModelForCausalLM.from_config(cfg).float().train()
    if r.aux_loss:
        model.set_experts_implementation("grouped_mm")  # the fastest of transformers' kernels to train here
    opt = torch.optim.AdamW(model.parameters(), lr=r.lr, betas=(0.9, 0.95), weight_decay=r.weight_decay)
    g = torch.Generator().manual_seed(seed)
    step, tokens, wall = 0, 0, 0.0
    ckpt = out / CHECKPOINT
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        if state["recipe"] != asdict(r) or state["seed"] != seed:
            raise ValueError(f"{ckpt} was written by another recipe or seed; delete it or train into another folder")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        g.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        step, tokens, wall = state["step"], state["tokens"], state["wall_s"]

    while step < r.steps:
        t0 = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = learning_rate(r, step)
        loss, ce = step_loss(model, sample_batch(streams, r, g), r, teacher)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += r.batch * r.seq
        dt = time.perf_counter() - t0
        wall += dt
        if on_step is not None:
            on_step(step, ce / math.log(2), r.batch * r.seq / dt)
        if step % r.checkpoint_every == 0 or step == r.steps:
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"recipe": asdict(r), "seed": seed, "model": model.state_dict(), "opt": opt.state_dict(),
                        "generator": g.get_state(), "torch_rng": torch.get_rng_state(), "step": step,
                        "tokens": tokens, "wall_s": wall}, tmp)
            os.replace(tmp, ckpt)
    return finish(model, r, name, out, split=split, seed=seed, tokens=tokens, wall=wall, command=command)


def finish(model, r: Recipe, name: str, out: Path, *, split: TextSplit, seed: int, tokens: int, wall: float,
           command: str | None) -> dict:
    """Write the weights in `r.save_dtype` and the manifest; score held-out text on the saved weights."""
    model.config.output_router_logits = False
    model.config.moespec_vocab_limit = ByteTokenizer.vocab_size
    model.eval()
    model.to(getattr(torch, r.save_dtype)).save_pretrained(out, safe_serialization=True)
    ByteTokenizer().save_pretrained(out)
    saved = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    bpb = {kind: bits_per_byte(saved, split.held_out_ids(kind)) for kind in ("code", "prose")}
    manifest = {
        "preset": f"trained:{name}",
        "command": command or " ".join(sys.argv),
        "recipe": asdict(r),
        "seed": seed,
        "threads": torch.get_num_threads(),
        "steps": r.steps,
        "tokens_seen": tokens,
        "train_wall_s": round(wall, 1),
        "parameters": sum(p.numel() for p in saved.parameters()),
        "held_out_bits_per_byte": bpb,
        "slice_bits_per_byte": bits_per_byte(saved, heldout_slice(), seq=256),
        "text": split.fingerprint(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": sys.version.split()[0]},
        "files": {p.name: _sha256(p) for p in sorted(out.glob("*.safetensors"))},
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    (out / CHECKPOINT).unlink(missing_ok=True)
    return manifest
