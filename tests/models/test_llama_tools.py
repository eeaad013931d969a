"""Building llama.cpp's own tools (`models.llama_tools`): found when built, refused in one line without
cmake or ninja, a failed build quoting its log. The real build is exercised by the slow llama.cpp check
(tests/chain/test_candidate_llama.py)."""

import sys

import pytest

from moespec.models import llama_tools


def test_built_tools_are_found_without_building(tmp_path, monkeypatch):
    monkeypatch.setenv("MOESPEC_CACHE", str(tmp_path))
    binary = llama_tools.tools_dir() / "bin" / llama_tools.SPECULATIVE
    binary.parent.mkdir(parents=True)
    binary.write_text("")
    said = []
    assert llama_tools.build_speculative(progress=said.append) == binary and said == []


def test_missing_cmake_or_ninja_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("MOESPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(llama_tools.shutil, "which", lambda name: None if name == "ninja" else "/usr/bin/" + name)
    with pytest.raises(ValueError, match="needs ninja on PATH; install") as err:
        llama_tools.build_speculative(progress=lambda s: None)
    assert "\n" not in str(err.value)


def test_a_failed_build_step_quotes_its_log(tmp_path):
    log = tmp_path / "build.log"
    with pytest.raises(ValueError, match=r"exited 3; full log .*build.log\): .*boom"):
        llama_tools.run_build([sys.executable, "-c", "print('boom'); raise SystemExit(3)"], log)
