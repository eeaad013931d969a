"""llama.cpp's own speculative decoding: the settings it is run at (`bench.llama_settings`), the
parsing of what llama-speculative-simple prints and the timing loop (`bench.llama_speculative`), on
runs faked in the binary's own print formats; one real run of the built binary (slow)."""

import subprocess

import pytest

from moespec.bench.llama_settings import (
    DEFAULTS,
    EMITTED,
    PLAIN,
    PLAIN_ARGS,
    LlamaSetting,
    emitted_setting,
    header_defaults,
    n_max_setting,
    settings_for,
)
from moespec.bench.llama_speculative import SUMMARY_TRIES, SpecRun, parse_output, run_once, time_settings
from moespec.costmodel.settings import llama_cpp_settings

DRAFT = {"kind": "draft", "draft": "/models/d.gguf", "n": None, "n_min": 1, "min_hits": 1, "name": "/models/d.gguf"}


def printed(decoded: int, seconds: float, *, encoded: int = 7, drafted: int = 0, accepted: int = 0) -> str:
    """What speculative-simple.cpp prints at its end, through its own printf formats."""
    rate = 100.0 * accepted / drafted if drafted else float("nan")
    return ("some log line\n\n"
            + "encoded %4d tokens in %8.3f seconds, speed: %8.3f t/s\n" % (encoded, 0.01, encoded / 0.01)
            + "decoded %4d tokens in %8.3f seconds, speed: %8.3f t/s\n" % (decoded, seconds, decoded / seconds)
            + "\n" + "n_draft   = %d\n" % 3 + "n_predict = %d\n" % decoded + "n_drafted = %d\n" % drafted
            + "n_accept  = %d\n" % accepted + "accept    = %.3f%%\n" % rate + "\ndraft:\n\n")


def test_the_decode_summary_is_parsed_from_the_binary_formats():
    run = parse_output(printed(33, 0.25, encoded=12, drafted=40, accepted=30))
    assert run == SpecRun(decoded=33, seconds=0.25, prompt_tokens=12, drafted=40, accepted=30)
    assert run.tokens_per_s == pytest.approx(132.0)
    assert parse_output(printed(5, 0.5)).drafted == 0  # plain: accept is nan, the counts still parse


def test_output_without_a_summary_is_refused_quoting_its_tail():
    with pytest.raises(ValueError, match="no decode summary.*failed to load model"):
        parse_output("llama_model_load: error\nfailed to load model\n")


def test_emitted_settings_are_the_fragment_llama_cpp_would_run():
    frag = llama_cpp_settings(k=4, n_min=2, p_min=0.25, draft="smollm2").fragment
    s = emitted_setting(frag, draft="/models/d.gguf")
    assert s.name == EMITTED and s.n_max == 4
    assert s.args == ("--spec-type", "draft-simple", "-md", "/models/d.gguf", "--spec-draft-n-max", "4",
                      "--spec-draft-n-min", "2", "--spec-draft-p-min", "0.25")
    assert emitted_setting("--spec-type none") == LlamaSetting(EMITTED, PLAIN_ARGS, 0)
    with pytest.raises(ValueError, match="no --spec-type"):
        emitted_setting("-md x.gguf")


def test_the_sets_are_plain_emitted_defaults_and_each_n_max():
    frag = llama_cpp_settings(k=2, n_min=1, p_min=0.1, draft="/models/d.gguf").fragment
    sets = settings_for(DRAFT, frag, kmax=3)
    assert [s.name for s in sets] == [PLAIN, EMITTED, DEFAULTS, "n-max 1", "n-max 2", "n-max 3"]
    assert sets[2].args == ("--spec-type", "draft-simple", "-md", "/models/d.gguf") and sets[2].n_max is None
    assert sets[4].args[-2:] == ("--spec-draft-n-max", "2") and sets[4].n_max == 2
    mod = n_max_setting({"kind": "ngram-mod", "n": 8, "n_min": 4}, 2)
    assert mod.args == ("--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "8", "--spec-ngram-mod-n-max", "2",
                        "--spec-ngram-mod-n-min", "2")
    simple = n_max_setting({"kind": "ngram-simple", "n": 3, "min_hits": 2}, 5)
    assert simple.args[-2:] == ("--spec-ngram-simple-size-m", "5")
    with pytest.raises(ValueError, match="no llama.cpp drafter"):
        settings_for({"kind": "oracle", "name": "oracle a=0.5"}, "--spec-type none", 3)


def test_defaults_are_read_from_the_header(tmp_path):
    header = tmp_path / "common.h"
    header.write_text("struct common_params_speculative_draft {\n    int32_t n_max = 5; // x\n    int32_t n_min = 1;\n"
                      "    float p_split = 0.1f;\n    float p_min   = 0.5f; // y\n};\n"
                      "struct common_params_speculative_ngram_mod {\n    int32_t n_match = 24;\n\n"
                      "    int32_t n_max = 64;\n    int32_t n_min = 48;\n};\n"
                      "struct common_params_speculative_ngram_map {\n    uint16_t size_n   = 12;\n"
                      "    uint16_t size_m   = 48;\n    uint16_t min_hits = 1;\n};\n")
    got = header_defaults(header)
    assert got["draft-simple"] == {"n_max": 5, "n_min": 1, "p_min": 0.5}
    assert got["ngram-mod"] == {"n_match": 24, "n_max": 64, "n_min": 48}
    assert got["ngram-simple"] == {"size_n": 12, "size_m": 48, "min_hits": 1}
    header.write_text("struct other {};\n")
    with pytest.raises(ValueError, match="no struct common_params_speculative_draft"):
        header_defaults(header)


def test_the_vendored_defaults_are_llama_cpps():
    from moespec.models.llama_convert import source_dir

    got = header_defaults(source_dir() / "common" / "common.h")
    assert got["draft-simple"] == {"n_max": 3, "n_min": 0, "p_min": 0.0}


class FakeRun:
    """subprocess.run's stand-in: a setting's time per token from its n-max flag, every call recorded."""

    def __init__(self):
        self.calls = []

    def __call__(self, cmd, **kw):
        self.calls.append(cmd)
        k = int(cmd[cmd.index("--spec-draft-n-max") + 1]) if "--spec-draft-n-max" in cmd else 0
        seconds = 1.0 / (1 + k) + 0.01 * len(self.calls)  # later calls slower: medians over reps
        return subprocess.CompletedProcess(cmd, 0, stdout="", stderr=printed(20, seconds, drafted=3 * k, accepted=k))


def test_settings_are_interleaved_per_prompt_and_pooled_over_reps():
    fake = FakeRun()
    sets = [LlamaSetting(PLAIN, PLAIN_ARGS, 0), n_max_setting(DRAFT, 1), n_max_setting(DRAFT, 3)]
    times = time_settings("bin", target="t.gguf", prompts=["a", "b"], settings=sets, threads=2, new_tokens=20,
                          reps=3, context=512, run=fake)
    assert len(fake.calls) == 3 * 2 * 3
    assert [c[-1] for c in fake.calls[:3]] == ["0", "1", "3"]  # one prompt, every setting, then the next
    assert fake.calls[0][:3] == ["bin", "-m", "t.gguf"] and "--temp" in fake.calls[0] and "-t" in fake.calls[0]
    # prompt 0 of n-max 3 ran at calls 3, 9, 15: the median is the middle one's time
    assert times[2].seconds[0] == pytest.approx(0.25 + 0.01 * 9)
    assert times[2].tokens_per_s == pytest.approx(40 / (0.25 + 0.09 + 0.25 + 0.12))
    assert times[1].drafted == 3 * 6 and times[1].accepted == 6


def test_a_failed_or_hung_run_is_a_value_error():
    def failed(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="error: unknown argument: --bogus\n")

    def hung(cmd, **kw):
        raise subprocess.TimeoutExpired(cmd, kw["timeout"])

    with pytest.raises(ValueError, match="exited 1.*unknown argument"):
        run_once(["bin", "--bogus"], run=failed)
    with pytest.raises(ValueError, match="past 5 s"):
        run_once(["bin"], timeout=5, run=hung)


def test_settings_with_the_same_flags_run_once_and_share_their_times():
    fake = FakeRun()
    sets = [LlamaSetting(PLAIN, PLAIN_ARGS, 0), emitted_setting("--spec-type none"), n_max_setting(DRAFT, 2)]
    times = time_settings("bin", target="t.gguf", prompts=["a"], settings=sets, threads=None, new_tokens=20,
                          reps=2, context=512, run=fake)
    assert len(fake.calls) == 2 * 2 and "-t" not in fake.calls[0]
    assert times[0].seconds == times[1].seconds and times[1].setting.name == EMITTED


def test_a_run_whose_log_was_lost_at_exit_is_run_again_then_refused():
    # llama.cpp logs from a worker thread: a run can exit 0 before its summary was written
    calls = []

    def lost_twice(cmd, **kwargs):
        calls.append(cmd)
        said = printed(12, 0.5) if len(calls) == 3 else "<bos>The cat sat\n"
        return subprocess.CompletedProcess(cmd, 0, stdout="", stderr=said)

    assert run_once(["llama-speculative-simple"], run=lost_twice).decoded == 12 and len(calls) == 3
    calls.clear()
    never = lambda cmd, **kwargs: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0, stdout="", stderr="x\n")  # noqa: E731
    with pytest.raises(ValueError, match="printed no decode summary"):
        run_once(["llama-speculative-simple"], run=never)
    assert len(calls) == SUMMARY_TRIES


def test_a_generated_text_cut_inside_a_character_is_still_parsed(tmp_path):
    """A model's text may end inside a multi-byte UTF-8 character (a random-weight model's often does:
    the converter-written qwen3moe file stopped the candidates benchmark this way); the summary after it parses."""
    import sys

    out = tmp_path / "out.bin"
    out.write_bytes(b"text \xe4\xbd then more\n" + printed(20, 0.5, drafted=6, accepted=3).encode())
    run = run_once([sys.executable, "-c", f"import sys; sys.stdout.buffer.write(open({str(out)!r}, 'rb').read())"])
    assert run == SpecRun(decoded=20, seconds=0.5, prompt_tokens=7, drafted=6, accepted=3)
