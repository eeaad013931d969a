"""The compiled expert kernels against transformers' eager experts, and their fallback without a compiler."""

import copy
import functools
import warnings

import pytest
import torch
import transformers
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts
from transformers.models.olmoe.modeling_olmoe import OlmoeExperts

from moespec.engine.decode import generate
from moespec.engine.proposers import OracleDraft
from moespec.models.synthetic import build
from moespec.moe import compiled, kernels, registry
from moespec.moe.experts import expert_views, find_experts
from tests.moe.conftest import needs_compiler

from tests.moe.test_kernels import MOE_PRESETS, PATTERNS, _eager, _no_gate_experts, _routing

FNS = {"compiled_dedup": compiled.compiled_dedup, "compiled_slot": compiled.compiled_slot}


@pytest.fixture(scope="module")
def models():
    return {name: build(name, seed=3)[0] for name in MOE_PRESETS}


def _needs_compiler():
    needs_compiler(compiled)


def _tolerance(dtype: torch.dtype, scale: float) -> dict:
    # float32: the tolerance of tests/moe/test_kernels.py (sums in another order). bfloat16: eager
    # rounds the gate/up output, the activation and each weighted expert output to 8 bits, the
    # compiled kernel accumulates in float32 and rounds once, so they differ by a few ulps of the scale.
    if dtype == torch.float32:
        return dict(rtol=1e-5, atol=1e-5 * scale)
    return dict(rtol=2e-2, atol=2e-2 * scale)


def _check(experts, dtype, pattern, m, ns=range(1, 17), seed=0):
    """Both compiled groupings equal eager at every n; experts: float32, cast here to `dtype`."""
    experts = experts if dtype == torch.float32 else copy.deepcopy(experts).to(dtype)
    views = expert_views(experts)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n in ns:
            index, weights = _routing(pattern, n, m, views.num_experts, gen)
            hidden = torch.randn(n, views.hidden_size, generator=gen).to(dtype)
            weights = weights.to(dtype)
            expected = _eager(experts, hidden, index, weights)
            tol = _tolerance(dtype, expected.abs().max().item())
            for name, fn in FNS.items():
                got = fn(experts, hidden, index, weights)
                assert got.shape == expected.shape and got.dtype == expected.dtype, name
                torch.testing.assert_close(got, expected, **tol, msg=lambda s: f"{name} n={n} {pattern} {dtype}: {s}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("preset", MOE_PRESETS)
def test_compiled_equals_eager_experts(models, preset, pattern, dtype):
    _needs_compiler()
    experts = find_experts(models[preset])[0]
    assert compiled.unsupported(experts, torch.zeros(1, expert_views(experts).hidden_size)) is None, preset
    _check(experts, dtype, pattern, models[preset].config.num_experts_per_tok)


def _wide(cls, config) -> torch.nn.Module:
    """An experts module wide enough (> 1 MB per expert) that both threads split its rows."""
    config._experts_implementation = "eager"
    experts = cls(config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for p in experts.parameters():
            torch.nn.init.normal_(p, std=0.05)
    return experts.requires_grad_(False)


# H = 264 and I = 660 leave tails past every vector width, tile and 64-row thread share.
WIDE = {
    "olmoe": lambda: _wide(OlmoeExperts, transformers.OlmoeConfig(
        hidden_size=264, intermediate_size=660, num_experts=8, num_experts_per_tok=3)),
    "gptoss": lambda: _wide(GptOssExperts, transformers.GptOssConfig(
        hidden_size=264, intermediate_size=660, num_local_experts=8, num_experts_per_tok=3)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("layout", sorted(WIDE))
def test_two_threads_share_each_expert(layout, dtype):
    _needs_compiler()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _check(WIDE[layout](), dtype, "repeats", m=3, ns=(1, 2, 5, 9, 16))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["olmoe-tiny", "gptoss-tiny"])
def test_avx2_path_equals_eager(models, preset, fresh, monkeypatch):
    """The AVX2 build, forced on a machine that has AVX-512 (a second build, cached after the first)."""
    monkeypatch.setenv(compiled.FORCE_ISA, "avx2")
    if compiled.isa() != "avx2":
        pytest.skip("this CPU has no AVX2")
    _needs_compiler()
    assert str(compiled._ops().isa()) == "avx2"
    for dtype in (torch.float32, torch.bfloat16):
        _check(find_experts(models[preset])[0], dtype, "repeats", models[preset].config.num_experts_per_tok)


def _same_as_torch_kernels(experts, m: int) -> None:
    gen = torch.Generator().manual_seed(5)
    index, weights = _routing("repeats", 6, m, expert_views(experts).num_experts, gen)
    hidden = torch.randn(6, expert_views(experts).hidden_size, generator=gen)
    with torch.no_grad():
        assert torch.equal(compiled.compiled_dedup(experts, hidden, index, weights),
                           kernels.dedup(experts, hidden, index, weights))
        assert torch.equal(compiled.compiled_slot(experts, hidden, index, weights),
                           kernels.per_slot(experts, hidden, index, weights))


def test_no_compile_variable_runs_the_torch_kernels_without_building(models, fresh, monkeypatch):
    monkeypatch.setenv(compiled.NO_COMPILE, "1")
    monkeypatch.setattr(compiled, "_build", lambda name: pytest.fail("MOESPEC_NO_COMPILE=1 must not build"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a deliberate switch, not a fault: no warning
        assert not compiled.available()
    assert compiled.unavailable_reason() == "MOESPEC_NO_COMPILE=1"
    _same_as_torch_kernels(find_experts(models["olmoe-tiny"])[0], m=4)


def test_failed_build_warns_once_and_falls_back(models, fresh, monkeypatch):
    def no_compiler(name):
        raise RuntimeError("c++: command not found\nmore detail")

    monkeypatch.setattr(compiled, "_build", no_compiler)
    with pytest.warns(RuntimeWarning, match=r"unavailable \(building the .* failed: RuntimeError: c\+\+: command not found\)"):
        assert not compiled.available()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process, not per call
        assert not compiled.available()
        _same_as_torch_kernels(find_experts(models["gptoss-tiny"])[0], m=models["gptoss-tiny"].config.num_experts_per_tok)
    assert "c++: command not found" in compiled.unavailable_reason()


def test_isa_is_the_best_the_cpu_reports(fresh, monkeypatch):
    flags = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl"}
    monkeypatch.setattr(compiled, "_cpu_flags", functools.cache(lambda: flags))  # one set, changed below
    assert compiled.isa() == "avx512"
    flags.add("avx512_bf16")
    assert compiled.isa() == "avx512bf16"
    monkeypatch.setenv(compiled.FORCE_ISA, "avx2")
    assert compiled.isa() == "avx2"
    monkeypatch.setenv(compiled.FORCE_ISA, "sse2")
    with pytest.raises(ValueError, match="sse2"):
        compiled.isa()
    monkeypatch.delenv(compiled.FORCE_ISA)
    flags.clear()
    assert compiled.isa() is None
    with pytest.warns(RuntimeWarning, match="neither AVX2"):
        assert not compiled.available()


def test_unsupported_layouts_fall_back_to_the_torch_kernels(models):
    no_gate = _no_gate_experts()
    assert "no gate" in compiled.unsupported(no_gate, torch.zeros(1, 64))
    _check(no_gate, torch.float32, "repeats", m=2, ns=(1, 4))
    trained = copy.deepcopy(find_experts(models["olmoe-tiny"])[0]).requires_grad_(True)
    hidden = torch.randn(3, 64)
    assert "autograd" in compiled.unsupported(trained, hidden)
    index, weights = _routing("random", 3, 4, 16, torch.Generator().manual_seed(0))
    (got,) = torch.autograd.grad(compiled.compiled_dedup(trained, hidden, index, weights).sum(), trained.gate_up_proj)
    (expected,) = torch.autograd.grad(_eager(trained, hidden, index, weights).sum(), trained.gate_up_proj)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    half = copy.deepcopy(find_experts(models["olmoe-tiny"])[0]).to(torch.float16)
    assert "float16" in compiled.unsupported(half, hidden)


def test_expert_ids_out_of_range_raise(models):
    _needs_compiler()
    experts = find_experts(models["olmoe-tiny"])[0]
    with torch.no_grad(), pytest.raises(RuntimeError, match="outside"):
        compiled.compiled_dedup(experts, torch.zeros(1, 64), torch.tensor([[0, 1, 2, 16]]), torch.ones(1, 4))


def test_greedy_speculative_output_unchanged_with_the_compiled_kernel(monkeypatch):
    _needs_compiler()
    target, tok = build("olmoe-tiny", seed=0)
    dense = build("dense-tiny", seed=1)[0]
    prompt = tok.encode("The quick brown fox", add_bos=True)
    expected = generate(target, prompt, k=0, max_new_tokens=24, vocab_limit=259).tokens  # the preset's kernel
    ran = []
    run = compiled._run
    monkeypatch.setattr(compiled, "_run", lambda *a, **kw: ran.append(1) or run(*a, **kw))
    target.set_experts_implementation(registry.DEDUP)
    assert generate(target, prompt, k=0, max_new_tokens=24, vocab_limit=259).tokens == expected
    for draft in (dense, OracleDraft(0.8, seed=3)):
        assert generate(target, prompt, draft=draft, k=3, max_new_tokens=24, vocab_limit=259).tokens == expected
    assert ran and compiled.unsupported(find_experts(target)[0], torch.zeros(1, 64)) is None  # really compiled


def test_a_killed_builds_lock_file_is_removed_and_the_build_holds_an_flock(tmp_path, monkeypatch):
    """torch's lock file, left by a build that was killed, would make every later process wait on it
    forever: the builder holding moespec's flock removes it before torch looks, and holds the flock
    for as long as torch builds (a second holder is refused)."""
    import fcntl

    from torch.utils import cpp_extension

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    name = next(iter(compiled.ISAS))
    ops = f"moespec_experts_{name}"
    build_dir = tmp_path / "moespec" / "torch_extensions" / f"torch-{torch.__version__}" / ops
    build_dir.mkdir(parents=True)
    (build_dir / compiled.TORCH_LOCK).write_text("")  # what a killed build leaves
    seen = {}

    def fake_load(**kwargs):
        seen["lock_left"] = (build_dir / compiled.TORCH_LOCK).exists()
        with open(build_dir / "moespec-build.flock") as other:
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                seen["held"] = False
            except BlockingIOError:
                seen["held"] = True
        seen["build_directory"] = kwargs["build_directory"]

    monkeypatch.setattr(cpp_extension, "load", fake_load)
    compiled.build_extension("experts", compiled.SOURCE, name)
    assert seen == {"lock_left": False, "held": True, "build_directory": str(build_dir)}
    with open(build_dir / "moespec-build.flock") as after:  # released once the build ends
        fcntl.flock(after, fcntl.LOCK_EX | fcntl.LOCK_NB)
