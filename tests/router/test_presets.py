"""Preset files of router mode (`serving/router/presets.py`): a table of
good files with what they parse to, and a table of bad files with the
`FILE:LINE: ` message each must give. Paths in the tables are relative to
the file's folder, `tmp_path`, where an `adapter` directory exists."""
from __future__ import annotations

import os

import pytest

from serving.router import presets
from serving.router.presets import KEYS, Preset, PresetError

EVERY_KEY = """\
[vendor/model]
adapter = adapter
batch = 4
prefill-chunk = 128
max-context = 4096
memory-budget = 2GiB
prompt-cache-bytes = 512MiB
ssd-cache = cache
ssd-cache-bytes = 1G
kv-quant = 8
keep-dtype = yes
embeddings = off
temperature = 0.7
top-p = 0.9
top-k = 40
hlg-sampling = width=3, toe=8
max-tokens = 0
alias = m
tags = chat
pin = true
idle-unload = 0
"""

# (id, file text, {section: (header line, fields that differ from an empty Preset)}); "{tmp}" is tmp_path.
GOOD = [
    ("two sections and star", "[*]\nbatch = 2\n\n[a/b]\nbatch = 4\n[c]\ntop-k = 5\n",
     {"*": (1, {"flags": {"batch": 2}}), "a/b": (4, {"flags": {"batch": 4}}), "c": (6, {"flags": {"top-k": 5}})}),
    ("aliases with spaces and duplicates", "[m]\nalias =  one , two,,one ,three, \n",
     {"m": (1, {"aliases": ("one", "two", "three")})}),
    ("tags", "[m]\ntags = chat,code, chat\n", {"m": (1, {"tags": ("chat", "code")})}),
    ("end-of-line comments", "[m] # the model\nbatch = 3 # three\ntop-k = 7\t; seven\nalias = a#b ;c\n",
     {"m": (1, {"flags": {"batch": 3, "top-k": 7}, "aliases": ("a#b",)})}),
    ("full-line comments and blanks", "# intro\n; more\n\n  # indented\n[m]\n\n# x = 1\nbatch = 1\n",
     {"m": (5, {"flags": {"batch": 1}})}),
    ("no trailing newline", "[m]\nbatch = 9", {"m": (1, {"flags": {"batch": 9}})}),
    ("batch left to auto", "[m]\nbatch = Auto\n", {"m": (1, {"flags": {"batch": "auto"}})}),
    ("CRLF", "[m]\r\nbatch = 9\r\n\r\n[n]\r\npin = no\r\n",
     {"m": (1, {"flags": {"batch": 9}}), "n": (4, {"pinned": False})}),
    ("spaces around names and =", "  [ hearth-test/tiny-random ]  \n  max-tokens=12  \n",
     {"hearth-test/tiny-random": (1, {"flags": {"max-tokens": 12}})}),
    ("every key once", EVERY_KEY, {"vendor/model": (1, {
        "flags": {"adapter": "{tmp}/adapter", "batch": 4, "prefill-chunk": 128, "max-context": 4096,
                  "memory-budget": 2 << 30, "prompt-cache-bytes": 512 << 20, "ssd-cache": "{tmp}/cache",
                  "ssd-cache-bytes": 1 << 30, "kv-quant": 8, "keep-dtype": True, "embeddings": False,
                  "temperature": 0.7, "top-p": 0.9, "top-k": 40,
                  "hlg-sampling": "enabled=true,width=3,shoulder=4,toe=8,pivot_offset=6", "max-tokens": 0},
        "aliases": ("m",), "tags": ("chat",), "pinned": True, "idle_unload": 0.0})}),
    ("boolean forms", "[a]\npin = 1\n[b]\npin = On\n[c]\npin = FALSE\n[d]\npin = 0\n[e]\npin = yes\n",
     {"a": (1, {"pinned": True}), "b": (3, {"pinned": True}), "c": (5, {"pinned": False}),
      "d": (7, {"pinned": False}), "e": (9, {"pinned": True})}),
    ("absolute adapter path", "[m]\nadapter = {tmp}/adapter/\nidle-unload = 2.5\n",
     {"m": (1, {"flags": {"adapter": "{tmp}/adapter"}, "idle_unload": 2.5})}),
    ("empty file", "# nothing\n", {}),
]


def write(tmp_path, text: str) -> str:
    (tmp_path / "adapter").mkdir(exist_ok=True)
    path = tmp_path / "presets.ini"
    path.write_bytes(text.replace("{tmp}", str(tmp_path)).encode())
    return str(path)


@pytest.mark.parametrize("text, expected", [case[1:] for case in GOOD], ids=[case[0] for case in GOOD])
def test_good(tmp_path, text, expected):
    file = write(tmp_path, text)
    got = presets.parse(file)
    assert list(got) == list(expected)
    for name, (line, fields) in expected.items():
        fields = {key: ({k: v.replace("{tmp}", str(tmp_path)) if isinstance(v, str) else v for k, v in value.items()}
                        if key == "flags" else value) for key, value in fields.items()}
        assert got[name] == Preset(name=name, source=f"{file}:{line}", **fields)
        assert list(got[name].flags) == list(fields.get("flags", {}))


# (file text, substring of the error; "F" stands for the file's path)
BAD = [
    ("[m]\nbatchh = 4\n", "F:2: unknown key 'batchh' (known: adapter, alias, batch,"),
    ("[m]\nbatch = abc\n", "F:2: batch: expected auto or a whole number of rows, got 'abc'"),
    ("[m]\nbatch = 1.5\n", "F:2: batch: expected auto or a whole number of rows, got '1.5'"),
    ("[m]\n\nbatch = 0\n", "F:3: batch: must be at least 1, got 0"),
    ("[m]\nkv-quant = 3\n", "F:2: kv-quant: must be 4 or 8, got 3"),
    ("[m]\ntemperature = 2.5\n", "F:2: temperature: must be at most 2, got 2.5"),
    ("[m]\ntemperature = warm\n", "F:2: temperature: expected a number, got 'warm'"),
    ("[m]\ntop-p = 1.5\n", "F:2: top-p: must be between 0 and 1, got 1.5"),
    ("[m]\ntop-k = -1\n", "F:2: top-k: must be a number of at least 0, got -1"),
    ("[m]\nhlg-sampling = width=65\n", "F:2: hlg-sampling: width must be between 0 and 64, got 65"),
    ("[m]\nidle-unload = nan\n", "F:2: idle-unload: must be a number of at least 0, got nan"),
    ("# top\nbatch = 4\n[m]\n", "F:2: batch: a setting before any [section]"),
    ("[m]\n[n]\n[m]\n", "F:3: duplicate section [m] (first at line 1)"),
    ("[m]\nbatch = 4\ntop-k = 1\nbatch = 5\n", "F:4: duplicate key 'batch' in [m] (first at line 2)"),
    ("[m]\nbatch 4\n", "F:2: expected '[section]' or 'key = value'"),
    ("[m]\nBatch = 4\n", "F:2: expected '[section]' or 'key = value' (key in lowercase), got 'Batch = 4'"),
    ("[m]\nbatch =\n", "F:2: batch: empty value"),
    ("[m]\nbatch = # none\n", "F:2: batch: empty value"),
    ("[m]\nadapter = nowhere\n", "F:2: adapter: no such directory: {tmp}/nowhere"),
    ("[m]\nadapter = presets.ini\n", "F:2: adapter: no such directory: {tmp}/presets.ini"),
    ("[m]\npin = maybe\n", "F:2: pin: must be true or false, got maybe"),
    ("[m]\nmemory-budget = 2XB\n", "F:2: memory-budget: expected a size such as 512MiB or 2GiB, got '2XB'"),
    ("[m]\nalias = , ,\n", "F:2: alias: expected one or more names"),
    ("[*]\nalias = all\n", "F:2: alias: not allowed in [*]"),
    ("[ ]\n", "F:1: empty section name"),
    ("[m\n", "F:1: expected '[section]' or 'key = value'"),
    ("[m]\n[n]\r\nbatch = 0\r\n", "F:3: batch: must be at least 1"),
]


@pytest.mark.parametrize("text, message", BAD, ids=[case[1].split(": ", 1)[1][:40] for case in BAD])
def test_bad(tmp_path, text, message):
    file = write(tmp_path, text)
    with pytest.raises(PresetError) as info:
        presets.parse(file)
    assert message.replace("F:", f"{file}:", 1).replace("{tmp}", str(tmp_path)) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_unreadable(tmp_path):
    missing = str(tmp_path / "missing.ini")
    with pytest.raises(PresetError, match=f"^{missing}: cannot read: No such file or directory$"):
        presets.parse(missing)
    (tmp_path / "binary.ini").write_bytes(b"[m]\n\xff\xfe\n")
    with pytest.raises(PresetError, match="binary.ini: cannot read: "):
        presets.parse(tmp_path / "binary.ini")


def test_home_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    file = write(tmp_path, "[m]\nadapter = ~/adapter\nssd-cache = ~/ssd\n")
    assert presets.parse(file)["m"].flags == {"adapter": f"{tmp_path}/adapter", "ssd-cache": f"{tmp_path}/ssd"}


MERGE_FILE = """\
[*]
batch = 2
keep-dtype = true
tags = local
pin = true
idle-unload = 60

[a]
batch = 8
top-p = 0.5
alias = a1, a2
tags = chat, local
idle-unload = 0

[b]
keep-dtype = false
pin = false
"""

# (name, expected merged fields, expected child_args).
MERGED = [
    ("a", dict(flags={"batch": 8, "keep-dtype": True, "top-p": 0.5}, aliases=("a1", "a2"), tags=("local", "chat"),
               pinned=True, idle_unload=0.0),
     ["--batch", "8", "--keep-dtype", "--top-p", "0.5"]),
    ("b", dict(flags={"batch": 2, "keep-dtype": False}, tags=("local",), pinned=False, idle_unload=60.0),
     ["--batch", "2"]),
    ("absent", dict(flags={"batch": 2, "keep-dtype": True}, tags=("local",), pinned=True, idle_unload=60.0),
     ["--batch", "2", "--keep-dtype"]),
]


@pytest.mark.parametrize("name, fields, args", MERGED, ids=[case[0] for case in MERGED])
def test_merged(tmp_path, name, fields, args):
    file = write(tmp_path, MERGE_FILE)
    got = presets.merged(presets.parse(file), name)
    source = {"a": f"{file}:8", "b": f"{file}:15"}.get(name, "")
    assert got == Preset(name=name, source=source, **fields)
    assert got.child_args() == args


def test_merged_without_star(tmp_path):
    parsed = presets.parse(write(tmp_path, "[m]\nbatch = 3\n"))
    assert presets.merged(parsed, "m") == parsed["m"]
    assert presets.merged(parsed, "other") == Preset(name="other", source="")
    assert presets.merged({}, "x").child_args() == []


def test_child_args_every_key(tmp_path):
    preset = presets.parse(write(tmp_path, EVERY_KEY))["vendor/model"]
    assert preset.child_args() == [
        "--adapter", f"{tmp_path}/adapter", "--batch", "4", "--prefill-chunk", "128", "--max-context", "4096",
        "--memory-budget", str(2 << 30), "--prompt-cache-bytes", str(512 << 20), "--ssd-cache", f"{tmp_path}/cache",
        "--ssd-cache-bytes", str(1 << 30), "--kv-quant", "8", "--keep-dtype", "--temperature", "0.7",
        "--top-p", "0.9", "--top-k", "40", "--hlg-sampling", "enabled=true,width=3,shoulder=4,toe=8,pivot_offset=6",
        "--max-tokens", "0"]
    assert all(os.path.isabs(arg) for arg in (preset.flags["adapter"], preset.flags["ssd-cache"]))


def test_keys():
    assert KEYS == {"adapter", "batch", "prefill-chunk", "max-context", "memory-budget", "kv-budget",
                    "prompt-cache-bytes", "ssd-cache", "ssd-cache-bytes", "kv-quant", "draft-model", "draft-kind",
                    "draft-tokens", "no-jump-forward", "keep-dtype", "embeddings", "temperature", "top-p",
                    "top-k", "hlg-sampling", "max-tokens", "thinking", "alias", "tags", "pin", "idle-unload"}


def test_router_children_share_the_memory_budget():
    from serving.router.slots import Settings

    settings = Settings(models_max=4, memory_total=8 << 30)
    assert settings.memory_share(1 << 30) == 2 << 30  # an equal share of the total
    assert settings.memory_share(3 << 30) == 3 << 30  # a model larger than its share keeps its own estimate
    assert Settings(models_max=4).memory_share(1 << 30) is None  # no total: the child decides
