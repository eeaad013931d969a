"""Training the shipped presets: language models on the standard library and the corpus.

A `Recipe` is a transformers config plus the optimisation settings and its vocabulary
(`models.vocabulary`): the byte tokenizer (`trained:olmoe`, `trained:draft`) or SmolLM2's
(`trained:smollm2-draft`). `train` runs it: windows of
`seq` tokens drawn by a seeded generator (`corpus_share` of them from the shipped corpus, the rest
from the standard library; `texts` holds documents back), AdamW with warm-up and cosine decay,
OLMoE's router load-balancing loss where the model has one, and for a draft the target's
distribution as the label (`teacher`: the draft learns to agree with the target it will draft
for; with `init_embedding="teacher-layers"` the draft takes the teacher's shape, its embedding,
frozen and not shipped, and some of its layers). It checkpoints every `checkpoint_every` steps and
resumes from the checkpoint; at the end it writes float32-trained weights in `Recipe.save_dtype`
as safetensors, with a manifest.

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

from moespec.models.heldout import agreement, bits_per_byte  # noqa: F401 (also moespec.models.train's API)
from moespec.texts import CORPUS_HOLDOUT, TextSplit, corpus_documents, held_out, training_text
from moespec.models.tokenizer import MARKER_FILE, ByteTokenizer
from moespec.models.vocabulary import SMOLLM2, held_out_tokens, token_streams, vocabulary

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
    tokenizer: str = "bytes"  # "bytes" or "smollm2" (the vocabulary of the installed SmolLM2 GGUF file)
    teacher_dtype: str = "float32"  # the teacher's weights while it labels (bfloat16: twice as fast here)
    init_embedding: str | None = None  # "teacher-layers": the teacher's shape, embedding and some of its layers

    def build_config(self, teacher=None) -> transformers.PretrainedConfig:
        if self.init_embedding == "teacher-layers":
            if teacher is None:
                raise ValueError("a teacher-layers recipe takes its shape from the teacher; pass teacher=")
            return draft_config(teacher.config, self.config["num_hidden_layers"], shared=self.teacher)
        v = vocabulary(self.tokenizer)
        kwargs = dict(vocab_size=v.width, bos_token_id=v.bos, eos_token_id=v.eos, pad_token_id=v.pad,
                      tie_word_embeddings=False, max_position_embeddings=4096)
        kwargs.update(self.config)
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
    "smollm2-draft": Recipe(
        "LlamaConfig", dict(num_hidden_layers=2),
        steps=400, batch=8, seq=256, lr=1e-3, warmup=20, aux_loss=0.0, teacher=SMOLLM2, tokenizer=SMOLLM2,
        teacher_dtype="bfloat16", init_embedding="teacher-layers", extra={"teacher_layers": [0, 29]},
        description="2-layer draft for SmolLM2-135M: its embedding (shared, not shipped) and layers 0 and 29, "
                    "distilled from its logits",
    ),
    # For tests: trains in a second.
    "tiny-moe": Recipe(
        "OlmoeConfig",
        dict(hidden_size=32, intermediate_size=16, num_hidden_layers=1, num_experts=8, num_experts_per_tok=2,
             num_attention_heads=2, num_key_value_heads=2),
        steps=20, batch=4, seq=64, warmup=2, checkpoint_every=5, description="test-sized OLMoE",
    ),
    # For tests where SmolLM2 is installed: the smollm2-draft path at a few steps.
    "tiny-smollm2-draft": Recipe(
        "LlamaConfig", dict(num_hidden_layers=1),
        steps=3, batch=2, seq=32, warmup=1, aux_loss=0.0, teacher=SMOLLM2, tokenizer=SMOLLM2,
        teacher_dtype="bfloat16", init_embedding="teacher-layers", checkpoint_every=2,
        description="test-sized SmolLM2 draft", extra={"teacher_layers": [0], "agreement_tokens": 512},
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


def _soft_labels(teacher, ids: torch.Tensor, width: int) -> torch.Tensor:
    with torch.no_grad():
        return F.softmax(teacher(input_ids=ids).logits[..., :width].float(), dim=-1)


def step_loss(model, x: torch.Tensor, r: Recipe, teacher=None) -> tuple[torch.Tensor, float]:
    """(loss to minimise, cross-entropy in nats per token) of one batch `x` [batch, seq + 1]."""
    inputs, targets = x[:, :-1], x[:, 1:]
    out = model(input_ids=inputs)
    logp = F.log_softmax(out.logits.float(), dim=-1)  # [batch, seq, width]
    ce = F.nll_loss(logp.reshape(-1, logp.shape[-1]), targets.reshape(-1))
    loss = ce if teacher is None else -(_soft_labels(teacher, inputs, logp.shape[-1]) * logp).sum(-1).mean()
    aux = getattr(out, "aux_loss", None)
    if r.aux_loss and aux is not None:
        loss = loss + r.aux_loss * aux
    return loss, float(ce.detach())


def heldout_slice(tokenizer: str = "bytes") -> np.ndarray:
    """[SLICE_BYTES + 1] bytes (or SmolLM2's tokens of those bytes, at most SLICE_BYTES // 2 + 1): the
    start of the shipped corpus's held-out code, the same on every machine (the standard library's
    held-out files differ between Python versions)."""
    docs = [d for d in corpus_documents() if d.kind == "code" and held_out(d.name, CORPUS_HOLDOUT)]
    if tokenizer == "bytes":
        return np.concatenate([d.ids for d in docs])[: SLICE_BYTES + 1]
    text = b"".join(d.text.encode() for d in docs)[:SLICE_BYTES].decode("utf-8", errors="ignore")
    v = vocabulary(tokenizer)
    return np.asarray([v.bos, *v.tokenizer()(text, add_special_tokens=False)["input_ids"]], dtype=np.int32)[
        : SLICE_BYTES // 2 + 1]


def draft_config(teacher_config, layers: int, *, shared: str | None = None):
    """The teacher's config cut to `layers` layers, float32; `shared` names where the embedding comes
    from at load (`moespec_shared_embedding`: the draft's folder ships without it)."""
    import copy

    cfg = copy.deepcopy(teacher_config)
    cfg.num_hidden_layers = layers
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = list(cfg.layer_types[:layers])
    cfg.dtype = torch.float32
    if shared is not None:
        cfg.moespec_shared_embedding = shared
    return cfg


def init_from_teacher(model, teacher, layers: list[int]) -> None:
    """Copy into the draft the teacher's embedding (frozen: with tied embeddings it is also the
    output layer), its final norm, and its layers `layers` as the draft's layers 0, 1, ... At
    `layers` = all of them the draft is the teacher; fewer is an early exit that training repairs."""
    if len(layers) != len(model.model.layers):
        raise ValueError(f"teacher_layers {layers} must name one teacher layer per draft layer "
                         f"({len(model.model.layers)})")
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(teacher.get_input_embeddings().weight.float())
        model.model.norm.load_state_dict({k: v.float() for k, v in teacher.model.norm.state_dict().items()})
        for mine, theirs in zip(model.model.layers, layers, strict=True):
            mine.load_state_dict({k: v.float() for k, v in teacher.model.layers[theirs].state_dict().items()})
    model.get_input_embeddings().weight.requires_grad_(False)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def build_student(r: Recipe, teacher, seed: int):
    """The recipe's untrained model, initialised from `seed` (and from the teacher's layers where the
    recipe says so), in float32 and training mode."""
    torch.manual_seed(seed)
    cfg = r.build_config(teacher)
    if r.aux_loss:
        cfg.output_router_logits = True
        cfg.router_aux_loss_coef = r.aux_loss
    model = transformers.AutoModelForCausalLM.from_config(cfg).float().train()
    if r.init_embedding == "teacher-layers":
        init_from_teacher(model, teacher, list(r.extra["teacher_layers"]))
    elif r.init_embedding is not None:
        raise ValueError(f"unknown init_embedding {r.init_embedding!r}; use 'teacher-layers' or None")
    if r.aux_loss:
        model.set_experts_implementation("grouped_mm")  # the fastest of transformers' kernels to train here
    return model


def _resume(ckpt: Path, r: Recipe, seed: int, model, opt, g: torch.Generator) -> tuple[int, int, float]:
    """(step, tokens, wall seconds) so far: the checkpoint's, its model, optimiser and generators restored;
    (0, 0, 0.0) without one."""
    if not ckpt.exists():
        return 0, 0, 0.0
    state = torch.load(ckpt, weights_only=False)
    if state["recipe"] != asdict(r) or state["seed"] != seed:
        raise ValueError(f"{ckpt} was written by another recipe or seed; delete it or train into another folder")
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    g.set_state(state["generator"])
    torch.set_rng_state(state["torch_rng"])
    return state["step"], state["tokens"], state["wall_s"]


def _optimizer_step(model, opt, x: torch.Tensor, r: Recipe, teacher, step: int) -> float:
    """One AdamW step on the batch x [batch, seq + 1] at step's learning rate; its cross-entropy (nats)."""
    for group in opt.param_groups:
        group["lr"] = learning_rate(r, step)
    loss, ce = step_loss(model, x, r, teacher)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return ce


def _checkpoint(ckpt: Path, r: Recipe, seed: int, model, opt, g: torch.Generator, *, step: int, tokens: int,
                wall: float) -> None:
    """Everything `_resume` restores, written atomically."""
    tmp = ckpt.with_suffix(".tmp")
    torch.save({"recipe": asdict(r), "seed": seed, "model": model.state_dict(), "opt": opt.state_dict(),
                "generator": g.get_state(), "torch_rng": torch.get_rng_state(), "step": step,
                "tokens": tokens, "wall_s": wall}, tmp)
    os.replace(tmp, ckpt)


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
    v = vocabulary(r.tokenizer)
    streams = [torch.from_numpy(a) for a in token_streams(split, v)]
    if r.teacher and teacher is None:
        teacher = load_teacher(r)
    if teacher is not None:
        teacher.eval().requires_grad_(False)

    model = build_student(r, teacher, seed)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=r.lr, betas=(0.9, 0.95),
                            weight_decay=r.weight_decay)
    g = torch.Generator().manual_seed(seed)
    ckpt = out / CHECKPOINT
    step, tokens, wall = _resume(ckpt, r, seed, model, opt, g)
    while step < r.steps:
        t0 = time.perf_counter()
        ce = _optimizer_step(model, opt, sample_batch(streams, r, g), r, teacher, step)
        step += 1
        tokens += r.batch * r.seq
        dt = time.perf_counter() - t0
        wall += dt
        if on_step is not None:
            on_step(step, ce / math.log(2), r.batch * r.seq / dt)
        if step % r.checkpoint_every == 0 or step == r.steps:
            _checkpoint(ckpt, r, seed, model, opt, g, step=step, tokens=tokens, wall=wall)
    return finish(model, r, name, out, split=split, seed=seed, tokens=tokens, wall=wall, command=command,
                  teacher=teacher)


def load_teacher(r: Recipe):
    """The model a distilled recipe learns from: SmolLM2's GGUF file, or a shipped trained preset."""
    if r.teacher == SMOLLM2:
        from moespec.models import gguf

        return gguf.load_gguf(gguf.SMOLLM2, dtype=r.teacher_dtype)[0]
    from moespec.models.trained import load_trained

    return load_trained(r.teacher, dtype=r.teacher_dtype)[0]


AGREEMENT_TOKENS = 8192  # held-out tokens per kind on which a token-level draft's agreement is scored


def finish(model, r: Recipe, name: str, out: Path, *, split: TextSplit, seed: int, tokens: int, wall: float,
           command: str | None, teacher=None) -> dict:
    """Write the weights in `r.save_dtype` and the manifest; score held-out text on the saved weights.

    Byte-level presets record held-out bits per byte. A SmolLM2-vocabulary draft records held-out
    bits per token and its top-1 agreement with the teacher on the first AGREEMENT_TOKENS held-out
    tokens of each kind; its folder marks SmolLM2's tokenizer (read from the GGUF file at load).
    """
    v = vocabulary(r.tokenizer)
    model.config.output_router_logits = False
    model.config.moespec_vocab_limit = v.limit
    model.eval()
    model.to(getattr(torch, r.save_dtype))
    if getattr(model.config, "moespec_shared_embedding", None):  # the embedding is the teacher's: not shipped
        from safetensors.torch import save_file

        shared = {"model.embed_tokens.weight", "lm_head.weight"}
        save_file({k: t.contiguous() for k, t in model.state_dict().items() if k not in shared},
                  out / "model.safetensors", metadata={"format": "pt"})
        model.config.save_pretrained(out)
    else:
        model.save_pretrained(out, safe_serialization=True)
    if v.name == "bytes":
        ByteTokenizer().save_pretrained(out)
    else:
        (out / MARKER_FILE).write_text(json.dumps({"tokenizer": v.name, "vocab_size": v.limit}) + "\n")
    from moespec.models.trained import load_folder

    saved = load_folder(out)
    scored = {}
    if v.name == "bytes":
        scored["held_out_bits_per_byte"] = {kind: bits_per_byte(saved, split.held_out_ids(kind))
                                            for kind in ("code", "prose")}
    else:
        n = int(r.extra.get("agreement_tokens", AGREEMENT_TOKENS))
        held = {kind: held_out_tokens(split, v, kind)[: n + 1] for kind in ("code", "prose")}
        scored["held_out_bits_per_token"] = {kind: bits_per_byte(saved, ids, seq=256) for kind, ids in held.items()}
        if teacher is not None:
            scored["held_out_teacher_agreement"] = {kind: agreement(saved, teacher, ids) for kind, ids in held.items()}
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
        **scored,
        "tokenizer": v.name,
        "slice_bits_per_byte": bits_per_byte(saved, heldout_slice(v.name), seq=256),
        "text": split.fingerprint(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": sys.version.split()[0]},
        "files": {p.name: _sha256(p) for p in sorted(out.glob("*.safetensors"))},
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    (out / CHECKPOINT).unlink(missing_ok=True)
    return manifest
