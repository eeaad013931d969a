"""llama.cpp's own greedy decoding, the way its `simple` example decodes: the reference that moespec's
plain decoding on llama.cpp must repeat token for token.

It shares nothing with moespec's engine or its `LlamaModel`: it opens its own model and context
through llama.h, feeds the prompt in one `llama_batch_get_one` call, and takes each next token from
llama.cpp's greedy sampler (`llama_sampler_init_greedy`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from moespec.backends import llama_lib


def llama_greedy(path: str | Path, prompt: Sequence[int], n: int, *, threads: int = 2, n_ctx: int = 2048,
                 flash_attn: bool | None = None, eos: int | None = None) -> list[int]:
    """The first n tokens (or up to an EOS, kept) that llama.cpp's greedy sampler gives after `prompt`."""
    L = llama_lib.bindings()
    params = L.llama_model_default_params()
    params.n_gpu_layers = 0
    params.use_extra_bufts = False  # as `LlamaModel`: the AMX repack crashes here
    model = L.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise llama_lib.load_failure(Path(path))
    ctx_params = L.llama_context_default_params()
    ctx_params.n_ctx = n_ctx
    ctx_params.n_batch = ctx_params.n_ubatch = max(512, len(prompt))
    ctx_params.n_threads = ctx_params.n_threads_batch = threads
    ctx_params.flash_attn_type = {None: -1, False: 0, True: 1}[flash_attn]
    ctx = L.llama_init_from_model(model, ctx_params)
    sampler = L.llama_sampler_init_greedy()
    out: list[int] = []
    try:
        ids = (L.llama_token * len(prompt))(*prompt)
        batch = L.llama_batch_get_one(ids, len(prompt))
        one = (L.llama_token * 1)()
        while len(out) < n:
            if L.llama_decode(ctx, batch) != 0:
                raise ValueError(f"llama_decode failed: {llama_lib.last_log()}")
            token = L.llama_sampler_sample(sampler, ctx, -1)
            out.append(int(token))
            if token == eos:
                break
            one[0] = token
            batch = L.llama_batch_get_one(one, 1)
    finally:
        L.llama_sampler_free(sampler)
        L.llama_free(ctx)
        L.llama_model_free(model)
    return out

