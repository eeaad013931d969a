"""The training text's held-out split: fixed by names alone, disjoint, and covering code and prose."""

import hashlib
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from moespec import texts as text


def _fake_stdlib(root: Path, count: int = 200) -> Path:
    for i in range(count):
        (root / "pkg").mkdir(parents=True, exist_ok=True)
        (root / "pkg" / f"mod{i}.py").write_text(f"def f{i}():\n    return {i}\n")
    for skipped in ("test", "site-packages/thing", "pkg/test"):
        (root / skipped).mkdir(parents=True, exist_ok=True)
        (root / skipped / "skipme.py").write_text("x = 1\n")
    return root


def _sha256_rule(name: str, every: int) -> bool:
    """The split's rule, computed here on its own: sha256 of the UTF-8 name modulo `every` is 0,
    the digest read as its first 8 bytes, big-endian (how every split so far was made)."""
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % every == 0


@given(st.text(min_size=1, max_size=40))
def test_the_rule_depends_on_the_name_only(name):
    # A rule that read anything but the name's bytes (Python's salted hash(), a counter, the
    # process) disagrees with sha256 of the name: at every = 2 a salted hash agrees on a name with
    # probability 1/2, so on n distinct names with 2**-n; hypothesis tries up to 100 names.
    for every in (1, 2, 3, 20, text.STDLIB_HOLDOUT, text.CORPUS_HOLDOUT):
        assert text.held_out(name, every) == _sha256_rule(name, every), (name, every)
    assert text.held_out(name, 1)  # every name is held out when one in one is


def test_split_is_disjoint_stable_and_skips_tests(tmp_path):
    root = _fake_stdlib(tmp_path)
    a, b = text.training_text(root), text.training_text(root)
    names = lambda docs: [d.name for d in docs]  # noqa: E731
    train = names(a.train[0]) + names(a.train[1])
    assert not set(train) & set(names(a.held_out))
    assert names(a.held_out) == names(b.held_out) and a.fingerprint() == b.fingerprint()
    assert not any("skipme" in n for n in train + names(a.held_out))
    lib_held = [n for n in names(a.held_out) if n.startswith("stdlib/")]
    # 200 files, one in 20 expected: 10; a binomial(200, 0.05) lies in [2, 22] with probability > 0.999
    assert 2 <= len(lib_held) <= 22
    assert {d.kind for d in a.held_out} >= {"code", "prose"}


def test_ids_start_each_document_with_bos(tmp_path):
    split = text.training_text(_fake_stdlib(tmp_path, 20))
    ids = split.train_ids(0)
    assert ids[0] == text.BOS_ID and (ids == text.BOS_ID).sum() == len(split.train[0])
    assert bytes(ids[1:10].astype("uint8")) == split.train[0][0].text.encode()[:9]
