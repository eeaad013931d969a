"""The compiled small-n dense layers against F.linear, on every preset, and their fallbacks."""

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

from moespec.engine.decode import generate
from moespec.models.synthetic import build
from moespec.moe import compiled, dense
from tests.moe.conftest import needs_compiler


PRESETS = ["olmoe-tiny", "dense-tiny", "qwen3moe-tiny", "mixtral-tiny", "gptoss-tiny", "deepseekv2-tiny"]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# [out, in]: tails past every vector width (16 and 32 lanes), 4-row tile and 16-row thread share
SHAPES = [(1, 1), (37, 70), (272, 64), (64, 2048), (129, 333), (300, 1024)]


def _needs_compiler():
    needs_compiler(dense)


def _tolerance(dtype: torch.dtype, scale: float) -> dict:
    # float32: F.linear sums in another order (relative error ~1e-6 of the terms' magnitude).
    # bfloat16: both sum in float32 and round once, but the float32 sums differ in their last bits,
    # so the rounding to 8 bits can fall on the neighbouring value: one ulp, at most 2^-7 relative.
    if dtype == torch.float32:
        return {"rtol": 1e-5, "atol": 1e-5 * scale}
    return {"rtol": 1e-2, "atol": 1e-5 * scale}


def _check_linear(shapes, dtype, ns, bias: bool, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for out_f, in_f in shapes:
            w = (torch.randn(out_f, in_f, generator=gen) / in_f**0.5).to(dtype)  # [out, in]
            b = torch.randn(out_f, generator=gen).to(dtype) if bias else None  # [out]
            for n in ns:
                x = torch.randn(n, in_f, generator=gen).to(dtype)  # [n, in]
                assert dense.unsupported(x, w, b) is None
                expected = F.linear(x, w, b)
                got = dense.linear(x, w, b)
                assert got.shape == expected.shape and got.dtype == expected.dtype
                torch.testing.assert_close(got, expected, **_tolerance(dtype, expected.abs().max().item()),
                                           msg=lambda s, at=f"{out_f}x{in_f} n={n}": f"{at} bias={bias}: {s}")


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_linear_equals_f_linear(dtype, bias):
    _needs_compiler()
    _check_linear(SHAPES, dtype, range(1, dense.MAX_ROWS + 1), bias)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_two_threads_split_the_rows(dtype):
    _needs_compiler()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:  # > 1 MB, so both threads take rows (a smaller weight runs on one)
        _check_linear([(1000, 600)], dtype, (1, 5, 16), bias=True)
    finally:
        torch.set_num_threads(threads)


def test_batch_and_sequence_dimensions_are_flattened():
    _needs_compiler()
    w, b = torch.randn(48, 40), torch.randn(48)
    x = torch.randn(2, 3, 40)  # batch 2 x sequence 3 = 6 rows
    torch.testing.assert_close(dense.linear(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    xt = torch.randn(40, 5).t()  # non-contiguous rows
    torch.testing.assert_close(dense.linear(xt, w, b), F.linear(xt, w, b), rtol=1e-5, atol=1e-5)


def test_fallbacks_run_f_linear():
    w, b = torch.randn(24, 16), torch.randn(24)
    cases = {
        "17 rows": (torch.randn(17, 16), w, b),
        "float16": (torch.randn(3, 16).half(), w.half(), b.half()),
        "non-contiguous": (torch.randn(3, 16), torch.randn(16, 24).t(), b),
    }
    for why, (x, wi, bi) in cases.items():
        assert dense.unsupported(x, wi, bi) is not None, why
        assert torch.equal(dense.linear(x, wi, bi), F.linear(x, wi, bi)), why
    with pytest.raises(RuntimeError):  # mixed dtypes: F.linear's own error
        dense.linear(torch.randn(2, 16, dtype=torch.bfloat16), w)
    trained = w.clone().requires_grad_(True)
    assert "autograd" in dense.unsupported(torch.randn(2, 16), trained)
    (grad,) = torch.autograd.grad(dense.linear(torch.ones(2, 16), trained).sum(), trained)
    assert torch.equal(grad, torch.full_like(w, 2.0))


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits  # [1, T, V]


def _same_model(preset: str, dtype: torch.dtype, greedy: bool, monkeypatch) -> None:
    """fast_linear keeps `preset`'s logits (a pass of 16 rows) and greedy tokens; restore_linear undoes it."""
    model, tok = build(preset, seed=2, dtype=dtype)
    prompt = tok.encode("The quick brown", add_bos=True)[: dense.MAX_ROWS]
    ids = torch.tensor([prompt])
    expected = _logits(model, ids)
    tokens = generate(model, prompt, k=0, max_new_tokens=16).tokens if greedy else None
    linears = sum(type(m) is torch.nn.Linear for m in model.modules())
    assert dense.fast_linear(model) == linears > 0
    assert type(model.lm_head) is dense.FastLinear
    why_not = []  # per call: None (compiled) or why F.linear ran
    run = dense.linear
    monkeypatch.setattr(dense, "linear", lambda x, w, b=None: why_not.append(dense.unsupported(x, w, b)) or run(x, w, b))
    got = _logits(model, ids)
    torch.testing.assert_close(got, expected, **_tolerance(dtype, expected.abs().max().item()), msg=preset)
    if greedy:
        assert generate(model, prompt, k=0, max_new_tokens=16).tokens == tokens, preset
    # Only more than MAX_ROWS rows run F.linear: DeepSeek-V2's kv_b_proj expands the whole cache
    assert why_not.count(None) >= linears and {w for w in why_not if w and "rows (compiled for" not in w} == set()
    assert dense.restore_linear(model) == linears
    assert not any(isinstance(m, dense.FastLinear) for m in model.modules())


@pytest.mark.parametrize("preset", PRESETS)
def test_fast_linear_keeps_logits_and_greedy_output(preset, monkeypatch):
    _needs_compiler()
    _same_model(preset, torch.float32, greedy=True, monkeypatch=monkeypatch)


@pytest.mark.parametrize("preset", ["olmoe-tiny", "gptoss-tiny", "deepseekv2-tiny"])
def test_fast_linear_keeps_bfloat16_logits(preset, monkeypatch):
    # Not greedy tokens: a one-ulp rounding difference (see _tolerance) may flip a near-tie.
    _needs_compiler()
    _same_model(preset, torch.bfloat16, greedy=False, monkeypatch=monkeypatch)


def test_fast_linear_keeps_the_module_and_its_state():
    model, _ = build("dense-tiny", seed=0)
    head, weight, keys = model.lm_head, model.lm_head.weight, list(model.state_dict())
    dense.fast_linear(model)
    assert model.lm_head is head and head.weight is weight and isinstance(head, torch.nn.Linear)
    assert list(model.state_dict()) == keys
    assert isinstance(copy.deepcopy(model).lm_head, dense.FastLinear)
    assert dense.fast_linear(model) == 0  # nothing left to switch
    dense.restore_linear(model)
    assert type(model.lm_head) is torch.nn.Linear


def test_no_compile_variable_runs_f_linear_without_building(fresh, monkeypatch):
    monkeypatch.setenv(compiled.NO_COMPILE, "1")
    monkeypatch.setattr(dense, "_build", lambda name: pytest.fail("MOESPEC_NO_COMPILE=1 must not build"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a deliberate switch, not a fault: no warning
        assert not dense.available()
        assert dense.unavailable_reason() == "MOESPEC_NO_COMPILE=1"
        model, tok = build("olmoe-tiny", seed=2)
        prompt = tok.encode("The quick brown", add_bos=True)
        expected = _logits(model, torch.tensor([prompt[:16]]))
        tokens = generate(model, prompt, k=0, max_new_tokens=16).tokens
        dense.fast_linear(model)
        assert torch.equal(_logits(model, torch.tensor([prompt[:16]])), expected)
        assert generate(model, prompt, k=0, max_new_tokens=16).tokens == tokens


def test_failed_build_warns_once_and_falls_back(fresh, monkeypatch):
    def no_compiler(name):
        raise RuntimeError("c++: command not found\nmore detail")

    monkeypatch.setattr(dense, "_build", no_compiler)
    x, w = torch.randn(3, 40), torch.randn(24, 40)
    with pytest.warns(RuntimeWarning, match=r"dense layers unavailable \(building the .* failed: RuntimeError: "
                                            r"c\+\+: command not found\); running F.linear"):
        assert torch.equal(dense.linear(x, w), F.linear(x, w))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process, not per call
        assert torch.equal(dense.linear(x, w), F.linear(x, w))
    assert "c++: command not found" in dense.unavailable_reason()


@pytest.mark.slow
def test_avx2_path_equals_f_linear(fresh, monkeypatch):
    """The AVX2 build, forced on a machine that has AVX-512 (a second build, cached after the first)."""
    monkeypatch.setenv(compiled.FORCE_ISA, "avx2")
    if compiled.isa() != "avx2":
        pytest.skip("this CPU has no AVX2")
    _needs_compiler()
    assert str(dense._ops().isa()) == "avx2"
    for dtype in DTYPES.values():
        _check_linear(SHAPES, dtype, (1, 3, 4, 9, 16), bias=True)
