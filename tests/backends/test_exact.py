"""exact=True (`backends.exact`): every pass computes one function. Measured directly on the logits
with `checks.pass_agreement`, not through greedy tokens (near-ties are rare at short depths, so equal
tokens would prove little): text after a 600-token prefill, fed in passes of 1, 2, 3, 5 and 9 tokens,
on the f32 export (llamafile's sgemm takes passes of two or more tokens, ggml's dot products one)."""

import pytest
import torch

from moespec.backends import llama_lib
from moespec.backends.exact import ExactPasses, exact_llama_environment
from moespec.checks.pass_agreement import cuts, pass_sizes, prefill_chunks
from moespec.models import load
from moespec.models.train import heldout_slice

SIZES = (1, 2, 3, 5, 9)


def _text(depth: int = 600, length: int = 18) -> tuple[list[int], list[int]]:
    ids = [256, *heldout_slice().tolist()[1: depth + length]]
    return ids[:depth], ids[depth:]


def test_default_passes_compute_different_functions_and_exact_ones_do_not(gguf_files):
    prompt, text = _text()
    default, _ = load(str(gguf_files["olmoe-f32"]), backend="llama.cpp", threads=1)
    found = pass_sizes(default, prompt, text, SIZES)
    assert not found.uniform and found.classes[0] == (1,), found.classes  # a one-token pass is another function
    exact, _ = load(str(gguf_files["olmoe-f32"]), backend="llama.cpp", threads=1, exact=True)
    assert isinstance(exact, ExactPasses)
    same = pass_sizes(exact, prompt, text, SIZES)
    assert same.uniform and max(same.max_diff) == 0.0, same.classes
    assert prefill_chunks(exact, prompt, text, chunks=(600, 256, 64, 7)).uniform


def test_exact_torch_passes_are_two_tokens_at_least(monkeypatch):
    model, _ = load("synthetic:dense-tiny", exact=True)
    sizes = []
    extend = model.inner.extend
    monkeypatch.setattr(model.inner, "extend", lambda t, outputs=None: sizes.append((t.numel(), outputs)) or
                        extend(t, outputs))
    model.extend(torch.tensor([256, 5, 6]), outputs=1)
    model.extend(torch.tensor([7]))
    model.truncate(2)
    row = model.extend(torch.tensor([9]))
    assert sizes == [(3, 2), (2, 2), (2, 2)] and row.shape[0] == 1 and model.length == 3


def test_exact_refuses_a_process_whose_llama_cpp_already_fixed_the_kernel_choice(monkeypatch):
    monkeypatch.setenv("GGML_CPU_TILED_MM", "1")
    monkeypatch.setattr(llama_lib, "_PASSES", [1])
    with pytest.raises(ValueError, match="GGML_CPU_TILED_MM=0 before llama.cpp's first pass"):
        exact_llama_environment()
    monkeypatch.setattr(llama_lib, "_PASSES", [0])
    exact_llama_environment()
    import os

    assert os.environ["GGML_CPU_TILED_MM"] == "0"


def test_cuts_never_leave_a_one_token_pass_but_for_n_equal_one():
    for T in range(1, 40):
        for n in range(1, 12):
            sizes = cuts(T, n)
            assert sum(sizes) == T and all(s <= n + 1 for s in sizes)
            assert n == 1 or T == 1 or 1 not in sizes
