"""core.fs.write_atomically: the permission bits of what it writes."""
from __future__ import annotations

import os
import stat
from contextlib import contextmanager

import pytest

from core.fs import write_atomically


@contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def bits(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_new_file_gets_what_the_umask_leaves(tmp_path, mask, expected):
    path = tmp_path / "new.txt"
    with umask(mask):
        write_atomically(path, "text")
    assert path.read_text() == "text" and bits(path) == expected
    assert [p.name for p in tmp_path.iterdir()] == ["new.txt"]  # no temporary file left beside it


def test_an_existing_file_keeps_its_bits_whatever_the_umask(tmp_path):
    path = tmp_path / "kept.txt"
    path.write_text("old")
    path.chmod(0o640)
    with umask(0o000):
        write_atomically(path, b"new", durable=False)
    assert path.read_bytes() == b"new" and bits(path) == 0o640


def test_a_mode_given_wins_over_the_umask_and_the_old_bits(tmp_path):
    path = tmp_path / "token.json"
    path.write_text("{}")
    path.chmod(0o644)
    with umask(0o000):
        write_atomically(path, "{}", mode=0o600)
    assert bits(path) == 0o600
    fresh = tmp_path / "fresh.json"
    with umask(0o077):
        write_atomically(fresh, "{}", mode=0o640)
    assert bits(fresh) == 0o640


def test_a_path_in_an_unknown_users_home_is_refused_not_a_crash():
    """`~name` for a user the machine lacks makes Path.expanduser raise; a request's path is refused instead."""
    import pytest

    from core.paths import PathRefused, confine, confine_model_ref

    with pytest.raises(PathRefused, match="unknown user"):
        confine("~no-such-user-hearth/models", "path")
    with pytest.raises(PathRefused, match="surrogate"):
        confine("~\udb2b\udcd5Z9", "path")
    for ref in ("~no-such-user-hearth/models", "~\udb2b\udcd5Z9"):
        with pytest.raises(PathRefused):
            confine_model_ref(ref, "model_id")
