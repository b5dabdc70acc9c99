import pytest

from core.env import SettingError, env_bool, env_float, env_int, env_path


def test_typed_helpers_parse_and_default(monkeypatch, tmp_path):
    monkeypatch.setenv("X_INT", "12")
    monkeypatch.setenv("X_BOOL", "off")
    monkeypatch.setenv("X_FLOAT", "0.5")
    monkeypatch.setenv("X_PATH", str(tmp_path))
    assert env_int("X_INT", 3) == 12
    assert env_int("X_MISSING", 3) == 3
    assert env_bool("X_BOOL", True) is False
    assert env_float("X_FLOAT", None) == 0.5
    assert env_path("X_PATH", tmp_path / "other") == tmp_path


@pytest.mark.parametrize("reader,value", [(env_int, "twelve"), (env_bool, "maybe"), (env_float, "fast")])
def test_bad_values_fail_loudly(monkeypatch, reader, value):
    monkeypatch.setenv("X_BAD", value)
    with pytest.raises(SettingError, match="X_BAD"):
        reader("X_BAD", None)


def test_int_minimum(monkeypatch):
    monkeypatch.setenv("X_PORT", "-1")
    with pytest.raises(SettingError, match="at least 0"):
        env_int("X_PORT", 8080, minimum=0)
