"""`hearth serve`'s flags, declared once (`serving/serve_flags.py`), against
their three readers and the manual: the command's parser and `--help`, the
keys of a `--models-preset` file, and the flags the router hands every
model's process. In this process, on the parser the command builds."""
from __future__ import annotations

import re

import pytest

from serving import serve_flags
from serving.router import presets
from tests.helpers import ROOT

ROUTER_OWN = {"alias", "tags", "pin"}  # preset keys the router reads itself, never handed to a model's process
SINGLE_TOO = {"alias", "tags"}  # of those, also `hearth serve MODEL` flags (--alias, --tags)


@pytest.fixture(scope="module")
def parser():
    import django

    django.setup()
    from hearth.management.commands.serve import Command

    return Command().create_parser("hearth", "serve")


def _options(parser) -> dict[str, str]:
    """Every option string of the parser -> where its value goes."""
    return {name: action.dest for action in parser._actions for name in action.option_strings}


def test_the_parser_has_every_declared_flag_and_no_other(parser):
    from django.core.management.base import BaseCommand

    django_own = _options(BaseCommand().create_parser("hearth", "any"))  # --help, --verbosity, …
    declared = {name: flag.target for flag in serve_flags.FLAGS for name in flag.names}
    assert _options(parser) == {**django_own, **declared}
    shown = parser.format_help()
    for flag in serve_flags.FLAGS:
        assert all((name in shown) != flag.hidden for name in flag.names), flag.name


def test_every_preset_key_is_a_serve_flag_or_the_routers_own(parser):
    options = _options(parser)
    assert {key for key in presets.KEYS if f"--{key}" not in options} == ROUTER_OWN - SINGLE_TOO
    assert {key for key in ROUTER_OWN if f"--{key}" in options} == SINGLE_TOO
    assert not SINGLE_TOO & set(serve_flags.PRESET_KEYS)  # the router's keys, not the flags handed down
    assert all(f"--{flag.key}" in options for flag in serve_flags.PRESET_KEYS.values())


def test_a_preset_hands_its_model_flags_that_its_process_reads_back(parser, tmp_path):
    """Every preset key at once: the flags a model's process gets parse, as the values the preset read."""
    (tmp_path / "adapter").mkdir()
    samples = {"adapter": "adapter", "batch": "4", "hlg-sampling": "toe=8", "kv-quant": "8", "draft-kind": "ngram",
               "memory-budget": "2GiB", "prompt-cache-bytes": "1G", "ssd-cache-bytes": "3G", "ssd-cache": "cache",
               "draft-model": "org/draft", "temperature": "0.5", "top-p": "0.9", "idle-unload": "60",
               "thinking": "off"}
    lines = [f"{key} = {samples.get(key, 'true' if flag.switch else '3')}"
             for key, flag in serve_flags.PRESET_KEYS.items()]
    (tmp_path / "p.ini").write_text("[m]\n" + "\n".join(lines) + "\n")
    preset = presets.parse(tmp_path / "p.ini")["m"]
    handed = {key for key, flag in serve_flags.PRESET_KEYS.items() if flag.preset == serve_flags.FLAG}
    assert set(preset.flags) == handed and preset.idle_unload == 60.0
    read = vars(parser.parse_args(["m", *preset.child_args()]))
    for key, value in preset.flags.items():
        assert read[serve_flags.PRESET_KEYS[key].target] == value, key


def test_the_router_hands_every_shared_flag_with_its_own_value(parser):
    from hearth.router_mode import child_args

    given = ["--batch", "3", "--max-tokens", "7", "--temperature", "0.4", "--top-p", "0.8", "--top-k", "5",
             "--hlg-sampling", "on", "--thinking", "on", "--keep-dtype", "--embeddings", "--drain-seconds", "4",
             "--flush-seconds", "6",
             "--response-ttl", "60", "--max-context", "512", "--kv-quant", "4", "--draft-kind", "ngram",
             "--draft-tokens", "2", "--no-jump-forward", "--prompt-cache-bytes", "1M", "--ssd-cache-bytes", "2M",
             "--prefill-chunk", "64",
             "--whisper-model", "/tmp/w", "--whisper-idle-unload", "9",
             "--memory-budget", "1G", "--ssd-cache", "/tmp/x", "--models-max", "2"]
    router = vars(parser.parse_args(given))
    assert {f.name for f in serve_flags.SHARED} <= set(given)  # every shared flag is tried
    args = child_args(router)
    child = vars(parser.parse_args(["m", *args]))
    for flag in serve_flags.FLAGS:
        expected = router[flag.target] if flag.shared else flag.default
        assert child[flag.target] == expected, flag.name
    assert not {"--memory-budget", "--ssd-cache", "--models-max"} & set(args)  # each model's own, or the router's


def test_the_manual_names_every_flag_and_every_preset_key():
    settings = (ROOT / "docs/serving/settings.md").read_text()
    limits = (ROOT / "docs/serving/limits.md").read_text()
    for flag in serve_flags.FLAGS:
        if not flag.hidden:
            assert all(f"`{name}" in (limits if flag.limit else settings) for name in flag.names), flag.name
    router = (ROOT / "docs/serving/router.md").read_text()
    keys = re.search(r"^Keys: (.*?)\.$", router, re.S | re.M)
    assert keys and set(re.findall(r"`([a-z-]+)`", keys.group(1))) == presets.KEYS
