"""The cost-model chain on llama.cpp (`moespec demo --backend llama.cpp`) at smoke size, on trained:olmoe
exported to q8_0: the file's identity and expert bytes carried by the routing, llama.cpp's expert
operation characterized through ggml, the prediction's arithmetic recomputed by hand from the
artifacts, the score with one kernel, and the report beside the torch chain's."""

from pathlib import Path

import numpy as np
import pytest

from moespec import artifacts
from moespec.models import gguf_info
from moespec.moe.traces import RoutingTrace
from moespec.chain.demo import DemoConfig, run_demo
from tests.conftest import require_llama

# the module's fixture is built once: its tests run in one pytest-xdist worker (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("llama_chain")

BATCH_STEPS = ("batch-trace", "batch-characterize", "batch-measure", "batch-predict", "batch-score")
LLAMA_STEPS = ("export", "trace", "trace-verified", "characterize", "measure-base", "predict", "measure-sweep", "score", *BATCH_STEPS)
OPENED: dict = {}  # the most llama.cpp instances of one file open at once during the llama.cpp chain, and after it


def _counting(init):
    def counted(self, *args, **kwargs):
        from moespec.backends.llama_model import open_models

        init(self, *args, **kwargs)
        most = OPENED.setdefault("most", {})
        for path, n in open_models().items():
            most[path] = max(most.get(path, 0), n)

    return counted


@pytest.fixture(scope="module")
def chains(tmp_path_factory):
    """The torch chain in OUT and the llama.cpp chain in OUT/llama.cpp, both on trained:olmoe."""
    require_llama()
    out = tmp_path_factory.mktemp("demo")
    smoke = DemoConfig.smoke(model="trained:olmoe")
    from moespec.backends.llama_model import LlamaModel, open_models

    torch_run = run_demo(out, config=smoke, progress=False, echo=lambda _: None)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LlamaModel, "__init__", _counting(LlamaModel.__init__))
        llama_run = run_demo(out / "llama.cpp", config=DemoConfig.smoke(model="trained:olmoe", backend="llama.cpp",
                                                                         threads=1), progress=False, echo=lambda _: None)
    OPENED["after"] = open_models()
    return out, torch_run, llama_run


def _payload(folder: Path, name: str, kind: str) -> dict:
    return artifacts.load(folder / name, kind)["payload"]


def test_the_llama_chain_runs_every_step_on_the_exported_file(chains):
    out, _, result = chains
    assert result.ran == LLAMA_STEPS
    gguf = out / "llama.cpp" / "trained-olmoe-q8_0.gguf"
    assert gguf_info.weight_type(gguf) == "q8_0"
    base = _payload(out / "llama.cpp", "measurement-base.json", "measure")
    assert base["provenance"]["experts"] == "llama.cpp" and base["provenance"]["fingerprint"] == gguf_info.fingerprint(gguf)
    # llama.cpp runs one kernel: only the deduplicating (grouped) verify times and sweep
    assert set(base["verify"][0]["samples"]) == {"moespec_dedup"}
    sweep = _payload(out / "llama.cpp", "measurement.json", "measure")
    assert {e["kernel"] for e in sweep["oracle"]} == {"moespec_dedup"}


def test_the_routing_carries_the_files_identity_and_its_own_expert_bytes(chains):
    out, _, _ = chains
    llama_trace = RoutingTrace.load(out / "llama.cpp" / "traces.parquet")
    torch_trace = RoutingTrace.load(out / "traces.parquet")
    gguf = out / "llama.cpp" / "trained-olmoe-q8_0.gguf"
    assert list(llama_trace.expert_bytes) == gguf_info.expert_bytes(gguf)
    # q8_0 stores 34 bytes per 32 weights, the f32 model 128: the file's bytes, not the model's
    ratio = np.array(llama_trace.expert_bytes) / np.array(torch_trace.expert_bytes)
    assert np.allclose(ratio, 34 / 128, rtol=0.02)
    assert llama_trace.model_fingerprint == gguf_info.fingerprint(gguf) and llama_trace.dtype == "q8_0"
    # the routing is llama.cpp's own on the q8_0 file: the same tokens as the torch trace read, the same
    # expert sets as the f32 weights chose but for near ties that quantization moves (measured: 0.96 of
    # the 200 x 6 (token, layer) pairs; trained routers sit nearer ties than the random ones of
    # tests/bench/test_converted_gguf.py)
    assert [len(d) for d in llama_trace.documents] == [len(d) for d in torch_trace.documents]
    same = np.concatenate([(np.sort(a, axis=-1) == np.sort(b, axis=-1)).all(axis=-1).ravel()
                           for a, b in zip(llama_trace.documents, torch_trace.documents)])
    assert same.mean() >= 0.93, same.mean()


def test_the_characterization_times_both_reads_through_ggml(chains):
    out, _, _ = chains
    char = _payload(out / "llama.cpp", "characterization.json", "characterize")
    gguf = out / "llama.cpp" / "trained-olmoe-q8_0.gguf"
    # ggml's expert operation of this file (`bench.ggml_expert_op`), not transformers' experts module
    prov = char["provenance"]
    assert prov["experts"] == "llama.cpp" and Path(char["model"]).resolve() == gguf.resolve()
    assert prov["fingerprint"] == gguf_info.fingerprint(gguf) and prov["dtype"] == "q8_0"
    kernels = {p["kernel"] for p in char["points"]}
    assert kernels == {"slot", "dedup"}
    b = gguf_info.expert_bytes(gguf)[0]
    assert {p["b"] for p in char["points"]} == {b}
    assert all(p["timing"]["median"] > 0 for p in char["points"])
    # the verify passes' own windows (llama.cpp's routing of the greedy continuation) are timed too: by
    # the characterization (both kernels) and, llama.cpp's grouped one, right after each verify pass;
    # the measured-time version reads those (cost-model paper, Sec. 4)
    verified = RoutingTrace.load(out / "llama.cpp" / "verified.parquet")
    assert verified.model_fingerprint == gguf_info.fingerprint(gguf)
    assert {"recorded", "verified"} <= {p["source"] for p in char["points"]}
    base = _payload(out / "llama.cpp", "measurement-base.json", "measure")["verify"][0]
    assert set(base["ops"]) == {"moespec_dedup"} and base["op_layers"] == char["layers"]
    assert all(np.array(t).shape == np.array(base["samples"]["moespec_dedup"][n]).shape + (len(char["layers"]),)
               and np.min(t) > 0 for n, t in base["ops"]["moespec_dedup"].items())
    pred = _payload(out / "llama.cpp", "prediction.json", "predict")["depths"][0]
    assert pred["measured_time_windows"] == "between-passes"


def _union(doc: np.ndarray, n: int, layer: int) -> list[int]:
    return [len(set(doc[s : s + n, layer].ravel().tolist())) for s in range(doc.shape[0] - n + 1)]


def test_the_prediction_is_eq_22_on_the_files_bytes_recomputed_by_hand(chains):
    """τ̂_dedup(n) = τ_meas(1) + Σ_l (t̄_dedup,l(n) − t̄_slot,l(1)) (22), each t̄ the fit (4)/(E.1) at the
    window's union bytes with the file's w_l, averaged over the trace's windows; τ_meas(1) the even
    verify repetitions' per-prompt medians, averaged."""
    out, _, _ = chains
    run = out / "llama.cpp"
    char = _payload(run, "characterization.json", "characterize")
    base = _payload(run, "measurement-base.json", "measure")
    pred = _payload(run, "prediction.json", "predict")["depths"][0]["versions"]["prediction"]
    trace = RoutingTrace.load(run / "traces.parquet")
    m = trace.top_k
    samples = np.array(base["verify"][0]["samples"]["moespec_dedup"]["1"])  # [P, R]
    tau1 = np.median(samples[:, ::2], axis=1).mean()
    characterized = [int(c) for c in char["layers"]]

    def fit_time(kernel: str, layer: int, U: np.ndarray, n: int) -> np.ndarray:
        source = min(characterized, key=lambda c: (abs(c - layer), c))
        c = char["fits"][str(source)][kernel]["coefficients"]
        b = trace.expert_bytes[layer]
        if kernel == "dedup":
            return c["t_op"] + c["c_g"] * U * b + c["c_t"] * n
        return c["t_op"] + c["c_u"] * U * b + c["c_re"] * (n * m - U) * b

    def mean_time(kernel: str, n: int) -> float:
        total = 0.0
        for layer in range(trace.num_layers):
            U = np.array([u for doc in trace.documents for u in _union(doc, n, layer)], dtype=float)
            total += fit_time(kernel, layer, U, n).mean()
        return total

    one = mean_time("slot", 1)
    for i, n in enumerate(pred["n"]):
        want = tau1 + (one if n == 1 else mean_time("dedup", n)) - one
        assert pred["tau"]["dedup"][i] == pytest.approx(want, rel=1e-9)


def test_the_calibrated_version_adds_the_growth_of_the_terms_timed_beside_the_passes(chains):
    """On llama.cpp g(n) = o(n) − o(1), o = D + R_d: D the file's dense products and R_d the rest of its
    pass at the verify depth d (`ggml_dense_op`, `ggml_rest_op`), each computed right after every verify
    pass of the base measurement (`ggml_outside`) and summarized as the passes are over the fit half,
    added to the measured-time version's τ̂(n). The characterization still times both alone and keeps
    every sample (the growth-shares benchmark reads them)."""
    from moespec.chain.prediction import repetition_half, verify_times_at
    from moespec.costmodel.verify_times import pass_time

    out, _, _ = chains
    char = _payload(out / "llama.cpp", "characterization.json", "characterize")
    dense = char["dense"]
    assert "output.weight" in dense["tensors"] and not any("_exps" in t for t in dense["tensors"])
    assert all(len(v) == 15 and np.median(v) == dense["median"][n] for n, v in dense["samples"].items())
    depth = _payload(out / "llama.cpp", "prediction.json", "predict")["depths"][0]
    assert depth["calibrated_outside"] == "beside-passes" and "calibrated" not in depth.get("unavailable", {})
    base = _payload(out / "llama.cpp", "measurement-base.json", "measure")
    times = verify_times_at(base, depth["depth"])
    samples = times.samples["moespec_dedup"]
    assert set(times.outside) == {"dense", "rest"}
    assert all(times.outside[t][n].shape == samples[n][:, 0::2].shape and (times.outside[t][n] > 0).all()
               for t in times.outside for n in times.ns)  # after the passes of the even repetitions
    fit = repetition_half(times, "fit").outside_samples()
    o = {n: pass_time(fit[n]) for n in times.ns}
    cal, meas = depth["versions"]["calibrated"], depth["versions"]["measured-time"]
    for i, n in enumerate(cal["n"]):
        assert cal["tau"]["dedup"][i] == pytest.approx(meas["tau"]["dedup"][i] + o[n] - o[1], rel=1e-9)


def test_the_score_has_no_saving_rules_on_one_kernel(chains):
    out, _, _ = chains
    score = _payload(out / "llama.cpp", "score.json", "score")["depths"][0]["versions"]["prediction"]
    names = [r["name"] for r in score["rules"]]
    assert len(names) == 4 and not any(n.startswith(("crossover", "sign")) for n in names)
    assert score["S_measured"] == [] and score["crossover_measured"] is None
    assert 0 <= score["tau_error_dedup"] == score["tau_error"]


def test_the_report_shows_both_backends_side_by_side(chains):
    out, _, result = chains
    for folder in (out, out / "llama.cpp"):
        text = (folder / "summary.txt").read_text()
        if folder == out:  # the torch report was written before the llama.cpp chain ran: build it again
            from moespec.report.build import build_report

            build_report(out, out=out / "report.html")
            text = (out / "summary.txt").read_text()
        table = text.split("Both backends")[1].split("\n\n")[0]
        rows = [line.split() for line in table.splitlines() if line.startswith("  ")][1:]  # under the header
        assert {r[0] for r in rows} == {"torch", "llama.cpp"}


def test_the_llama_chain_ends_with_the_schedule_at_batch_size_b(chains):
    """The batch steps after B = 1's: V̂_B for each smoke batch size, the score of every (a, B) cell,
    and the report's Figure 7 and Table 9 beside the summary's goal line."""
    out, _, _ = chains
    folder = out / "llama.cpp"
    pred = _payload(folder, "batch-prediction.json", "batch-predict")
    assert sorted(pred["versions"]["prediction"]) == ["1", "2"]
    assert all(len(V) == 3 and min(V) > 0 for V in pred["versions"]["prediction"].values())
    score = _payload(folder, "batch-score.json", "batch-score")
    assert sorted((c["B"], c["a"]) for c in score["versions"]["prediction"]["cells"]) == [
        (1, 0.5), (1, 0.9), (2, 0.5), (2, 0.9)]
    assert (folder / "schedule.png").stat().st_size > 1000
    html = (folder / "report.html").read_text()
    assert "Figure 7: best draft length per batch size" in html and "Table 9" in html
    assert "at batch size B (prediction)" in (folder / "summary.txt").read_text()


def test_a_chain_given_no_batch_sizes_stops_after_the_score(chains, tmp_path):
    """`batch=dict(sizes=())` (the real-size depth benchmark's --no-batch): the finished folder without
    its batch artifacts is resumed with nothing to run, and neither the steps nor the summary's line at
    batch size B come back."""
    import shutil

    out, _, _ = chains
    folder = tmp_path / "no-batch"
    shutil.copytree(out / "llama.cpp", folder, ignore=shutil.ignore_patterns("batch-*", "schedule.png"))
    config = DemoConfig.smoke(model="trained:olmoe", backend="llama.cpp", threads=1, batch=dict(sizes=()))
    assert not config.batched and DemoConfig.smoke(backend="llama.cpp").batched
    result = run_demo(folder, config=config, progress=False, echo=lambda _: None)
    assert result.ran == ()
    assert not list(folder.glob("batch-*"))
    assert "at batch size B" not in (folder / "summary.txt").read_text()


def test_measure_refuses_the_per_slot_kernel_on_llama_cpp(tmp_path, gguf_files):
    from moespec.bench.measure import measure

    with pytest.raises(ValueError, match="llama.cpp runs one kernel"):
        measure(str(gguf_files["olmoe-q8_0"]), backend="llama.cpp", threads=1, out=tmp_path / "m.json",
                kernels=("moespec_slot", "moespec_dedup"), progress=False)


def test_a_routing_of_another_shape_is_refused(gguf_files, tmp_path):
    from moespec.chain.llama_inputs import label_with_file

    trace = RoutingTrace([np.zeros((4, 1, 2), dtype=np.int16)], 8, (100,))
    with pytest.raises(ValueError, match="exported from"):
        label_with_file(trace, Path(gguf_files["olmoe-q8_0"]), "a model")


def test_the_files_identity_names_it_by_its_content(gguf_files, tmp_path):
    q8, q4 = Path(gguf_files["olmoe-q8_0"]), Path(gguf_files["olmoe-q4_k"])
    copy = tmp_path / q8.name
    copy.write_bytes(q8.read_bytes())
    assert gguf_info.identity(copy) == gguf_info.identity(q8)  # another path, the same file
    assert gguf_info.fingerprint(q4) != gguf_info.fingerprint(q8)
    data = bytearray(q8.read_bytes())
    data[-1] ^= 0xFF  # the last span of the file is always read
    copy.write_bytes(bytes(data))
    assert gguf_info.fingerprint(copy) != gguf_info.fingerprint(q8)


def test_the_chain_holds_at_most_one_open_instance_of_its_file(chains):
    """Issue 55: each phase reuses the model the chain holds or closes its own; none is left open."""
    out, _, _ = chains
    gguf = str((out / "llama.cpp" / "trained-olmoe-q8_0.gguf").resolve())
    assert OPENED["most"].get(gguf) == 1, OPENED
    assert OPENED["after"] == {}


def test_every_step_records_its_peak_memory_anonymous_and_file_backed_apart(chains):
    out, _, result = chains
    folder = out / "llama.cpp"
    steps = _payload(folder, "memory.json", "memory")["steps"]
    assert set(steps) == set(LLAMA_STEPS)
    assert all(s["anon_bytes"] > 0 and s["file_bytes"] > 0 for s in steps.values())
    # the measure phases read every weight of the mapped file: its pages are resident, file-backed
    size = (folder / "trained-olmoe-q8_0.gguf").stat().st_size
    assert steps["measure-base"]["file_bytes"] >= 0.9 * size
    for name, kind in (("measurement.json", "measure"), ("batch-measurement.json", "batch-measure")):
        assert artifacts.load(folder / name, kind)["memory"]["anon_bytes"] > 0
    assert "peak resident memory" in result.summary


def test_the_verified_routing_reaches_past_the_files_trained_context(gguf_files, tmp_path):
    """At d = 4096 the continuation runs past the exported file's 4096 trained positions: the
    recording sizes llama.cpp's context to the deepest continuation (a d = 4096 chain needs it)."""
    from tests.conftest import require_llama

    require_llama()
    from moespec.chain.llama_inputs import record_gguf_verified

    f = gguf_files["olmoe-q8_0"]
    trace = record_gguf_verified(f, tmp_path / "v.parquet", depths=(4096,), prompts=1, n_max=2, length=5, threads=1)
    assert trace.doc_ids == ("d4096/p0",) and [d.shape[0] for d in trace.documents] == [5]
    assert RoutingTrace.load(tmp_path / "v.parquet").model_fingerprint == gguf_info.fingerprint(f)
