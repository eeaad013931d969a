"""moespec's expert kernels against transformers' eager experts, on every synthetic MoE layout."""

import copy

import pytest
import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, batched_mm_experts_forward
from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHExperts

from moespec import artifacts
from moespec.models.synthetic import build
from moespec.moe import registry
from moespec.moe.experts import expert_bytes, expert_views, find_experts
from moespec.moe.kernels import dedup, per_slot, union_size
from tests.moe.conftest import moe_presets

MOE_PRESETS = moe_presets()
# the torch kernels; tests/moe/test_compiled.py runs the same checks on the compiled ones
KERNELS = {"per_slot": per_slot, "dedup": dedup, "auto": registry.torch_auto, "compiled_auto": registry.auto}
PATTERNS = ["random", "repeats", "one_expert", "top1"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices gain nothing from threads, and on a loaded machine OpenMP waits dominate."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def models():
    return {name: build(name, seed=3)[0] for name in MOE_PRESETS}


def _no_gate_experts() -> torch.nn.Module:
    """A NemotronH experts module: up_proj and an activation, no gate."""
    cfg = transformers.NemotronHConfig(
        hidden_size=64, moe_intermediate_size=32, n_routed_experts=8, moe_latent_size=None, mlp_hidden_act="relu2"
    )
    cfg._experts_implementation = "eager"
    experts = NemotronHExperts(cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        torch.nn.init.normal_(experts.up_proj, std=0.1)
        torch.nn.init.normal_(experts.down_proj, std=0.1)
    return experts.requires_grad_(False)


def _eager(experts, hidden, index, weights):
    forward = type(experts).forward
    return getattr(forward, "__wrapped__", forward)(experts, hidden, index, weights)


def _routing(pattern: str, n: int, m: int, N: int, gen: torch.Generator):
    """Expert ids [n, m'] (distinct within a row, as top-k gives) and weights [n, m']."""
    if pattern == "random":
        index = torch.stack([torch.randperm(N, generator=gen)[:m] for _ in range(n)])
    elif pattern == "repeats":  # every token picks from a pool of m + 1 experts: heavy reuse across tokens
        pool = torch.randperm(N, generator=gen)[: m + 1]
        index = torch.stack([pool[torch.randperm(m + 1, generator=gen)[:m]] for _ in range(n)])
    elif pattern == "one_expert":  # every token selects the same m experts, in the same slots
        index = torch.randperm(N, generator=gen)[:m].expand(n, m).clone()
    else:  # top1: one expert per token, all tokens on one expert
        index = torch.full((n, 1), int(torch.randint(N, (), generator=gen)))
    weights = torch.softmax(torch.randn(index.shape, generator=gen), dim=-1)
    return index, weights


def _check_all(experts, dtype: torch.dtype, pattern: str, m: int, N: int, H: int, seed: int = 0):
    experts = experts if dtype == torch.float32 else copy.deepcopy(experts).to(dtype)
    gen = torch.Generator().manual_seed(seed)
    for n in range(1, 17):
        index, weights = _routing(pattern, n, m, N, gen)
        hidden = torch.randn(n, H, generator=gen).to(dtype)
        weights = weights.to(dtype)
        expected = _eager(experts, hidden, index, weights)
        scale = expected.abs().max().item()
        for name, fn in KERNELS.items():
            got = fn(experts, hidden, index, weights)
            assert got.shape == expected.shape and got.dtype == expected.dtype, name
            # bfloat16 keeps 8 bits: both sides round each product, so allow a few ulps of the output's scale
            tol = dict(rtol=1e-5, atol=1e-5 * scale) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2 * scale)
            torch.testing.assert_close(got, expected, **tol, msg=lambda s: f"{name} n={n} {pattern} {dtype}: {s}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("preset", MOE_PRESETS)
def test_kernels_equal_eager_experts(models, preset, pattern, dtype):
    model = models[preset]
    experts = find_experts(model)[0]
    views = expert_views(experts)
    _check_all(experts, dtype, pattern, model.config.num_experts_per_tok, views.num_experts, views.hidden_size)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_kernels_equal_eager_without_gate(pattern, dtype):
    experts = _no_gate_experts()
    assert not expert_views(experts).has_gate
    _check_all(experts, dtype, pattern, m=2, N=8, H=64)


def test_gradients_flow_like_eager():
    """Outside no_grad, with weights that require grad, the kernels build an autograd graph."""
    experts = _no_gate_experts().requires_grad_(True)
    gen = torch.Generator().manual_seed(1)
    index, weights = _routing("repeats", 5, 2, 8, gen)
    hidden = torch.randn(5, 64, generator=gen)
    (expected,) = torch.autograd.grad(_eager(experts, hidden, index, weights).sum(), experts.up_proj)
    for fn in (per_slot, dedup):
        (got,) = torch.autograd.grad(fn(experts, hidden, index, weights).sum(), experts.up_proj)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_sizes_and_bytes_come_from_weight_shapes(models):
    for preset, model in models.items():
        experts = find_experts(model)[0]
        views = expert_views(experts)
        tensors = [p for p in experts.parameters(recurse=False)]
        assert views.num_experts == tensors[0].shape[0], preset
        assert expert_bytes(experts) * views.num_experts == sum(t.numel() * t.element_size() for t in tensors), preset
    gptoss = copy.deepcopy(find_experts(models["gptoss-tiny"])[0])
    I, H = gptoss.intermediate_size, gptoss.hidden_size
    assert expert_bytes(gptoss) == 4 * (3 * I * H + 2 * I + H)  # fp32 weights and both biases
    assert expert_bytes(gptoss.to(torch.bfloat16)) == 2 * (3 * I * H + 2 * I + H)


class _WeightAccessLog(TorchDispatchMode):
    """Records index ops applied to the expert weights and every tensor allocated by an op."""

    def __init__(self, weights):
        super().__init__()
        self.storages = {w.untyped_storage().data_ptr() for w in weights}
        self.gathers = []
        self.largest_output = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
        if func.__name__.split(".")[0] in ("index", "index_select", "gather", "take", "embedding", "_unsafe_index"):
            if any(t.untyped_storage().data_ptr() in self.storages for t in flat):
                self.gathers.append(func.__name__)
        out = func(*args, **kwargs)
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in self.storages:
                self.largest_output = max(self.largest_output, t.numel())
        return out


@pytest.mark.parametrize("preset", ["olmoe-tiny", "gptoss-tiny"])
def test_kernels_never_gather_expert_weights(models, preset):
    """No W[expert_ids]: no index op touches a weight, and no op allocates a tensor the size of an expert."""
    experts = find_experts(models[preset])[0]
    views = expert_views(experts)
    smallest_matrix = min(views.down[0].numel(), views.up[0].numel())
    gen = torch.Generator().manual_seed(0)
    index, weights = _routing("repeats", 2, models[preset].config.num_experts_per_tok, views.num_experts, gen)
    hidden = torch.randn(2, views.hidden_size, generator=gen)
    weights_of = list(experts.parameters(recurse=False))
    for fn in (per_slot, dedup):
        with _WeightAccessLog(weights_of) as log:
            fn(experts, hidden, index, weights)
        assert log.gathers == [], f"{fn.__name__} indexed a weight tensor: {log.gathers}"
        assert log.largest_output < smallest_matrix, f"{fn.__name__} allocated {log.largest_output} elements"
    with _WeightAccessLog(weights_of) as log:  # the check catches a kernel that does gather
        batched_mm_experts_forward(experts, hidden, index, weights)
    assert log.gathers and log.largest_output >= smallest_matrix


@pytest.mark.parametrize("preset", MOE_PRESETS)
def test_whole_model_logits_equal_eager(models, preset):
    model = models[preset]
    ids = torch.randint(0, 259, (2, 11), generator=torch.Generator().manual_seed(4))
    model.set_experts_implementation("eager")
    with torch.no_grad():
        expected = model(ids).logits
        for name in registry.IMPLEMENTATIONS:
            model.set_experts_implementation(name)
            assert model.config._experts_implementation == name
            torch.testing.assert_close(model(ids).logits, expected, rtol=1e-4, atol=1e-4, msg=lambda s: f"{name}: {s}")
    model.set_experts_implementation("eager")


def test_register_is_idempotent_and_from_pretrained_accepts_it(tmp_path):
    registry.register()
    registry.register()
    for name, fn in registry.IMPLEMENTATIONS.items():
        assert ALL_EXPERTS_FUNCTIONS[name] is fn
    model, _ = build("olmoe-tiny", seed=1, layers=1)
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, experts_implementation="moespec_auto")
    assert loaded.config._experts_implementation == "moespec_auto"
    ids = torch.arange(2, 9).unsqueeze(0)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("auto, slot_fn, dedup_fn", [("auto", "compiled_slot", "compiled_dedup"),
                                                     ("torch_auto", "per_slot", "dedup")])
def test_auto_switches_at_the_crossover(models, monkeypatch, auto, slot_fn, dedup_fn):
    calls = []
    slot, dedup_ = getattr(registry, slot_fn), getattr(registry, dedup_fn)
    monkeypatch.setattr(registry, slot_fn, lambda *a: calls.append("slot") or slot(*a))
    monkeypatch.setattr(registry, dedup_fn, lambda *a: calls.append("dedup") or dedup_(*a))
    monkeypatch.setattr(registry, "_global_crossover", registry.DEFAULT_CROSSOVER)
    experts = copy.deepcopy(find_experts(models["olmoe-tiny"])[0])
    gen = torch.Generator().manual_seed(0)

    def run(n):
        calls.clear()
        index, weights = _routing("random", n, 4, 16, gen)
        getattr(registry, auto)(experts, torch.randn(n, 64, generator=gen), index, weights)
        return calls[0]

    assert [run(n) for n in (1, 2, 9)] == ["slot", "dedup", "dedup"]  # default: dedup from n = 2
    registry.set_crossover(5)
    assert [run(n) for n in (4, 5)] == ["slot", "dedup"]
    registry.set_crossover(None)  # dedup never pays on verify passes; a prefill still deduplicates
    assert run(registry.LONGEST_VERIFY_PASS) == "slot"
    assert run(registry.LONGEST_VERIFY_PASS + 1) == "dedup"
    model = models["olmoe-tiny"]
    registry.set_crossover(3, model=model)  # a model's own crossover wins over the global one
    assert all(registry.crossover(e) == 3 for e in find_experts(model))
    assert registry.crossover(experts) is None
    for e in find_experts(model):
        del e._moespec_crossover
    for bad in (0, -1, 2.5, True, "3"):
        with pytest.raises(ValueError, match="crossover"):
            registry.set_crossover(bad)


def test_crossover_from_characterization(tmp_path):
    path = tmp_path / "characterization.json"
    artifacts.write(path, "characterize", {"crossover": 6})
    assert registry.crossover_from_characterization(path) == 6
    artifacts.write(path, "characterize", {"crossover": None})
    assert registry.crossover_from_characterization(path) is None
    artifacts.write(path, "characterize", {"crossover": 0})
    with pytest.raises(ValueError, match="crossover"):
        registry.crossover_from_characterization(path)
    artifacts.write(path, "characterize", {"r": [1.0]})
    with pytest.raises(ValueError, match="crossover"):
        registry.crossover_from_characterization(path)


def test_union_size():
    assert union_size(torch.tensor([[0, 1], [1, 2], [2, 0]])) == 3


def test_rejects_wrong_shapes(models):
    experts = find_experts(models["olmoe-tiny"])[0]
    with pytest.raises(ValueError, match="hidden_states"):
        per_slot(experts, torch.zeros(2, 3, 64), torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="top_k_weights"):
        dedup(experts, torch.zeros(2, 64), torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 3))
    with pytest.raises(TypeError, match="experts module"):
        per_slot(torch.nn.Linear(2, 2), torch.zeros(1, 2), torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1))
