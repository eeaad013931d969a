"""summarize(): fits, eps, bandwidths, r(n), u_bar(n), verdicts and crossover from timed points.

Points with times that follow (4) and (E.1) exactly (no timing involved) must give exact fits,
eps = 0, and the bandwidths, r and crossover that the chosen coefficients imply.
"""

import numpy as np
import pytest

from moespec.bench.characterize import summarize
from moespec.bench.expert_op import Pass, chosen_passes, recorded_passes, requested_bytes
from moespec.costmodel.bandwidth import u_bar
from moespec.moe.synthetic_routing import sticky
from moespec.moe.traces import RoutingTrace, mean_union

M, N, B = 4, 16, 1_000_000
SLOT = (1e-4, 1e-10, 0.3e-10)  # t_op, c_u, c_re
DEDUP = (4e-4, 1.6e-10, 2e-5)  # t_op, c_g, c_t


def exact_time(kernel, p: Pass):
    if kernel == "slot":
        return SLOT[0] + SLOT[1] * p.U * B + SLOT[2] * (p.n * M - p.U) * B
    return DEDUP[0] + DEDUP[1] * p.U * B + DEDUP[2] * p.n


def records_for(trace, layers, n_values):
    out = []
    for l in layers:
        passes = chosen_passes([n for n in n_values if n >= 2], M, N, u_points=4, seed=l)
        passes += recorded_passes(trace.documents, l, n_values, windows=6, seed=l)
        for p in passes:
            for k in ("slot", "dedup"):
                t = exact_time(k, p)
                out.append({"layer": l, "kernel": k, "source": p.source, "n": p.n, "m": M, "U": p.U,
                            "placement": p.placement, "index": p.index, "b": B, "bytes": requested_bytes(k, p, B),
                            "timing": {"samples": [t], "median": t, "q1": t, "q3": t}})
    return out


@pytest.fixture(scope="module")
def trace():
    rng = np.random.default_rng(0)
    return RoutingTrace(documents=[sticky(60, 2, M, N, 0.5, rng) for _ in range(2)], num_experts=N,
                        expert_bytes=(B, B))


def test_exact_times_give_exact_fits_and_zero_eps(trace):
    n_values = list(range(1, 10))
    payload = summarize(records_for(trace, [0, 1], n_values), trace, [0, 1], n_values)
    assert payload["fits"][0]["slot"]["coefficients"] == pytest.approx(dict(zip(("t_op", "c_u", "c_re"), SLOT)))
    assert payload["fits"][1]["dedup"]["coefficients"] == pytest.approx(dict(zip(("t_op", "c_g", "c_t"), DEDUP)))
    assert payload["re_read_cost"][0] == pytest.approx(0.3)
    assert payload["eps"] == pytest.approx({"slot": 0.0, "dedup": 0.0, "engine": 0.0}, abs=1e-9)
    assert payload["u_bar"][4] == pytest.approx(u_bar(mean_union(trace, 4), 4, M, trace.expert_bytes))


def test_bandwidths_ratio_and_crossover_follow_the_times(trace):
    n_values = list(range(1, 10))
    recs = records_for(trace, [0], n_values)
    payload = summarize(recs, trace, [0], n_values)
    for n in n_values:
        rec = [r for r in recs if r["source"] == "recorded" and r["n"] == n]
        slot = [r for r in rec if r["kernel"] == "slot"]
        dedup = [r for r in rec if r["kernel"] == "dedup"]
        beta_s = sum(r["bytes"] for r in slot) / sum(r["timing"]["median"] for r in slot)
        beta_d = sum(r["bytes"] for r in dedup) / sum(r["timing"]["median"] for r in dedup)
        assert payload["beta"]["slot"][n]["aggregate"] == pytest.approx(beta_s)
        assert payload["r"][n] == pytest.approx(beta_d / beta_s)
        v = payload["verdict"][n]
        assert v["dedup_faster"] == (v["u_bar"] < v["r"])
    S = payload["saving"]
    expected = next((n for n in range(2, 10) if all(S[j] > 0 for j in range(n, 10))), None)
    assert payload["crossover"] == expected
