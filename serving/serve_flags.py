"""Every flag of `hearth serve`, declared once: its names, where its value
goes, how its text is read, its default and help, and where else it counts.

Three readers:

- the command (`hearth/management/commands/serve.py`) builds its argparse
  parser from `FLAGS`, in this order, each in its `--help` section;
- a `--models-preset` file (`serving/router/presets.py`) takes the flags
  marked `preset` as keys, by their name without the dashes: `FLAG` ones are
  handed to that model's process as its flag, `SETTING` ones are the
  router's own setting for that model (the `Preset` field named `dest`);
- the router (`hearth/router_mode.py`) hands the flags marked `shared` to
  every model's process, with its own value.

A flag's `parse` takes the text as written and answers the value, or raises
`ValueError` saying what is expected (`core.argtypes`); the command and the
preset file use the same one, so a value reads the same in both. None: the
text as it is.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

from core import argtypes
from core.argtypes import byte_count, non_negative, number, positive, seconds, whole
from inference.engine import hlg
from inference.engine.checks import MAX_TEMPERATURE
from serving.demo.build import DEMO_REPO

# The sections of `hearth serve --help`; "" is the top one.
SPEECH = "speech to text (/v1/audio/*, audio parts in chat)"
STREAMS = "resumable streams (X-Conversation-Id, the dashboard's chat turns)"
ACCESS = "access control"
LIMITS = "limits (each also an environment variable; see docs/serving/limits.md)"
ROUTER = ("router mode (`hearth serve` without a MODEL: every model in the library, each loaded in its own process "
          "when a request names it)")
THROUGHPUT = "throughput and memory"
SPECULATIVE = "speculative decoding (a lone request drafts; several batch)"

# What a preset key is (see the module's docstring).
FLAG: Final = "flag"
SETTING: Final = "setting"


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]  # "--adapter", then other spellings
    help: str | None = None
    parse: Callable[[str], Any] | None = None  # None: the text as written
    default: Any = None
    metavar: str | None = None
    dest: str = ""  # "": the first name, `--max-tokens` -> `max_tokens`
    group: str = ""  # its --help section
    switch: bool = False  # takes no value: given, it is True
    repeat: bool = False  # may be given again; the values in a list
    hidden: bool = False  # left out of --help: how the router talks to its model processes
    limit: bool = False  # a bound on requests, the `core.limits.Limits` field named `dest`
    preset: Literal["", "flag", "setting"] = ""  # a key of a --models-preset file
    preset_parse: Callable[[str], Any] | None = None  # as a preset key, when not `parse`
    path: bool = False  # as a preset key, relative to the file's folder
    shared: bool = False  # the router hands its value to every model's process

    @property
    def name(self) -> str:
        return self.names[0]

    @property
    def key(self) -> str:
        """Its name in a preset file."""
        return self.name.removeprefix("--")

    @property
    def target(self) -> str:
        """Where argparse puts its value."""
        return self.dest or self.key.replace("-", "_")


def _kv_bits(text: str) -> int:
    if int(text) not in (4, 8):
        raise ValueError(f"must be 4 or 8, got {text}")
    return int(text)


def _rows_as_written(text: str) -> int | str:
    """`auto` kept as written (the model's process reads the flag again), or a row count."""
    rows = argtypes.rows(text)
    return "auto" if rows is None else rows


_count = whole(non_negative(int))  # 0 or more
_positive = whole(positive)  # 1 or more
_seconds_or_0 = number(non_negative(float))
_seconds = number(seconds)  # above 0


def _limit(name: str, dest: str, parse: Callable[[str], Any], text: str) -> Flag:
    return Flag((name,), text, parse, dest=dest, group=LIMITS, limit=True)


FLAGS: tuple[Flag, ...] = (
    Flag(("--host",), default="127.0.0.1"),
    Flag(("--port",), parse=whole(int), default=8080),
    Flag(("--max-tokens",), "default cap on generated tokens when a request sets none", _count,
         preset=FLAG, shared=True),
    Flag(("--temperature",), parse=number(non_negative(float, MAX_TEMPERATURE)), preset=FLAG, shared=True),
    Flag(("--top-p",), parse=number(argtypes.unit), preset=FLAG, shared=True),
    Flag(("--top-k",), parse=_count, preset=FLAG, shared=True),
    Flag(("--hlg-sampling",), "HLG tone-curve sampling for every request: key=value pairs joined by commas "
         "(enabled, width, shoulder, toe, pivot_offset; e.g. width=3,toe=8), or `on` for the built-in values; a "
         "request's `hlg` object is merged over them", hlg.canonical, metavar="SPEC", preset=FLAG, shared=True),
    Flag(("--thinking",), "whether a thinking model thinks when a request does not say (enable_thinking, "
         "reasoning_effort): on, off, or auto (the model's chat template decides)",
         argtypes.choice("on", "off", "auto"), "auto", metavar="{on,off,auto}", preset=FLAG, shared=True),
    Flag(("--keep-dtype",), "serve the stored dtype instead of upcasting to float32 on the CPU", default=False,
         switch=True, preset=FLAG, shared=True),
    Flag(("--drain-seconds",), "on shutdown, how long running requests may take to finish", _seconds_or_0, 30.0,
         shared=True),
    Flag(("--flush-seconds",), "on shutdown, how long pending SSD cache snapshots may take to write", _seconds_or_0,
         120.0, shared=True),
    Flag(("--adapter", "--adapter-path"), "mount this LoRA adapter at start (id: the folder name) and use it for "
         "requests that send no `adapter` field", metavar="DIR", preset=FLAG, path=True),
    Flag(("--isolate",), "serve MODEL from a process of its own behind this one, as router mode serves each model: "
         "an engine that crashes is started again and the web server stays up (GET /engine says how it runs)",
         default=False, switch=True),
    Flag(("--no-worker",), "do not start a job worker beside the server (run `hearth worker` yourself)",
         default=False, switch=True),
    Flag(("--embeddings",), "answer /v1/embeddings with this model (on by default for embedding models)",
         default=False, switch=True, preset=FLAG, shared=True),
    Flag(("--response-ttl",), "seconds a stored Responses turn stays available to previous_response_id", _seconds_or_0,
         3600.0, shared=True),

    # Shared: in router mode the default model's process answers transcription (serving/routes/proxy.py).
    Flag(("--whisper-model",), "an mlx-whisper checkpoint (a repo id in the HF cache or a directory) for "
         "transcription; loaded on first use (default: the first Whisper in the library, the demo's "
         "hearth/demo-whisper last)", metavar="MODEL", group=SPEECH, shared=True),
    Flag(("--whisper-idle-unload",), "unload the Whisper model after this many idle seconds (0: keep it loaded; "
         "default 300)", _seconds_or_0, 300.0, metavar="SECONDS", group=SPEECH, shared=True),

    Flag(("--stream-ttl",), "how long a stream stays replayable after its generation ended (default 300)",
         _seconds_or_0, 300.0, metavar="SECONDS", group=STREAMS),
    Flag(("--stream-max-bytes",), "bytes kept per stream; past it the oldest go (default 4MiB)", byte_count,
         4 << 20, metavar="SIZE", group=STREAMS),
    Flag(("--streams-max-bytes",), "bytes kept by all streams together, on disk under HEARTH_HOME/streams "
         "(default 256MiB)", byte_count, 256 << 20, metavar="SIZE", group=STREAMS),

    Flag(("--api-key",), "require this key on every route but /health (repeatable; also HEARTH_API_KEY)",
         default=[], metavar="KEY", group=ACCESS, repeat=True),
    Flag(("--api-key-file",), "read keys from FILE, one per line (repeatable)", default=[], metavar="FILE",
         group=ACCESS, repeat=True),
    Flag(("--insecure-no-auth",), "serve off loopback with no key (anyone who reaches the address can use it)",
         default=False, group=ACCESS, switch=True),
    Flag(("--cors-origin",), "let pages on ORIGIN call the API from a browser (repeatable; also "
         "HEARTH_CORS_ORIGINS, comma-separated)", default=[], metavar="ORIGIN", group=ACCESS, repeat=True),
    Flag(("--allow-path",), "let requests name files under DIR, besides HEARTH_HOME and the HF cache (repeatable; "
         "also HEARTH_ALLOW_PATHS)", default=[], metavar="DIR", group=ACCESS, repeat=True),

    _limit("--max-body-bytes", "max_body_bytes", byte_count, "largest request body (default 32MiB); larger ones "
           "get 413"),
    _limit("--max-json-depth", "max_json_depth", _positive, "deepest nesting of arrays and objects in a body (64)"),
    _limit("--max-messages", "max_messages", _positive, "most messages (turns) in one request (4096)"),
    _limit("--max-prompt-chars", "max_prompt_chars", _positive, "most characters of messages, tools and template "
           "variables in one request (2000000)"),
    _limit("--max-grammar-bytes", "max_grammar_bytes", byte_count, "largest schema, grammar or regex (64KiB)"),
    _limit("--max-grammar-choices", "max_grammar_choices", _positive, "most guided_choice entries (1024)"),
    _limit("--max-schema-depth", "max_schema_depth", _positive, "deepest nesting of a JSON schema (32)"),
    _limit("--grammar-timeout", "grammar_timeout_s", _seconds, "seconds a grammar may compile, then stopped (10)"),
    _limit("--grammar-cache-bytes", "grammar_cache_bytes", byte_count, "RAM for compiled grammars (256MiB)"),
    _limit("--template-timeout", "template_timeout_s", _seconds, "seconds a client chat template may take to render "
           "(5)"),
    _limit("--header-timeout", "header_timeout_s", _seconds, "seconds a request's headers may take to arrive (30)"),
    _limit("--body-timeout", "body_timeout_s", _seconds, "seconds a request's body may take after its headers (120)"),
    _limit("--idle-timeout", "idle_timeout_s", _seconds, "seconds an idle keep-alive connection stays open (60)"),
    _limit("--write-timeout", "write_timeout_s", _seconds, "seconds a response (a stream included) may wait on a "
           "client that reads nothing, then the connection is cut (60)"),
    _limit("--max-socket-text", "max_socket_text", _positive, "most characters in a dashboard chat message "
           "(200000)"),
    _limit("--max-media-bytes", "max_media_bytes", byte_count, "largest image or audio clip named by URL or data: "
           "URL (64MiB)"),
    _limit("--max-video-bytes", "max_video_bytes", byte_count, "largest video clip named by URL or data: URL "
           "(256MiB)"),
    _limit("--media-timeout", "media_timeout_s", _seconds, "seconds one media URL fetch may take, redirects "
           "included (10)"),
    _limit("--max-audio-seconds", "max_audio_seconds", _seconds, "longest audio decoded from one upload, URL, chat "
           "part or live session (1800)"),
    Flag(("--allow-client-templates",), "let requests bring their own chat template "
         "(chat_template_kwargs.chat_template); each renders in a separate process with a time budget",
         group=LIMITS, switch=True, limit=True),
    Flag(("--allow-private-media",), "fetch image, audio and video URLs from loopback, private and link-local "
         "addresses too (a NAS, another machine on the LAN); refused by default", group=LIMITS, switch=True,
         limit=True),

    Flag(("--models-dir",), "also serve every model folder under DIR (scanned recursively; named by its path "
         "relative to DIR)", metavar="DIR", group=ROUTER),
    Flag(("--models-preset",), "per-model settings: an INI file with a [model] section each and [*] for all (see "
         "docs/serving/router.md, Presets)", metavar="FILE", group=ROUTER),
    Flag(("--models-max",), "most models loaded at once; the least recently used idle one is unloaded to load "
         "another (default: how many of the library's models fit in memory together)", _positive, metavar="N",
         group=ROUTER),
    Flag(("--idle-unload",), "unload a model idle this long (default 0: never; pinned models stay)", _seconds_or_0,
         metavar="SECONDS", group=ROUTER, preset=SETTING),
    Flag(("--default-model",), f"the model for requests that name none (default: {DEMO_REPO} once it is built, "
         "else none: such requests are refused with the list of models)", metavar="MODEL", group=ROUTER),
    Flag(("--build-demo",), f"train the demo chat model {DEMO_REPO} in the background if it is not built yet (what "
         "`make serve` does): served from its first checkpoint, seconds after the start, and swapped for each "
         "better one as it trains; then, when the library has no Whisper, the demo speech model "
         "hearth/demo-whisper, handed to the models' processes once built", default=False, group=ROUTER, switch=True),
    Flag(("--child-start-timeout",), "how long a model's process may take to load (600)", _seconds,
         metavar="SECONDS", group=ROUTER),
    Flag(("--child-timeout",), "how long the router waits for a model's next byte of a reply (600)", _seconds,
         metavar="SECONDS", group=ROUTER),
    Flag(("--no-preload",), "load nothing at start (default: the default model and pinned ones load at once)",
         default=False, group=ROUTER, switch=True),
    Flag(("--models-remote",), "also serve the models of another machine's `hearth serve` at URL, forwarding "
         "requests for them there (repeatable; looked at every 5 s: health, models, /fit)", metavar="URL",
         group=ROUTER, repeat=True),
    Flag(("--models-remote-key",), "the API key the remote hosts take (also HEARTH_MODELS_REMOTE_KEY; none by "
         "default: this server's own key is never sent on)", metavar="KEY", group=ROUTER),
    Flag(("--advertise-url",), "with HEARTH_REDIS_URL: where the other web nodes reach this one to use the models "
         "it has loaded (also HEARTH_ADVERTISE_URL; default http://HOST:PORT, this machine's name when bound to "
         "every address)", metavar="URL", group=ROUTER),
    Flag(("--alias",), "other names for the served model, comma-separated: /v1/models lists them and "
         "/v1/models/{name} finds it by any (in router mode, a model's alias key in --models-preset)", argtypes.names,
         metavar="NAMES", dest="aliases"),
    Flag(("--tags",), "labels for the served model, comma-separated, listed on /v1/models (in router mode, a "
         "model's tags key in --models-preset)", argtypes.names, metavar="NAMES"),
    Flag(("--model-id",), hidden=True),  # the router's name for its model's process
    Flag(("--download-only",), default=False, switch=True, hidden=True),  # the router's fetch of a missing model
    Flag(("--response-store",), hidden=True),  # the router's folder of stored Responses turns, shared by its models

    Flag(("--batch",), "most rows decoded together by continuous batching: auto (default) grows with the requests "
         "waiting, up to 64 as memory allows; N caps it; 1 = one at a time", argtypes.rows, metavar="auto|N",
         group=THROUGHPUT, preset=FLAG, preset_parse=_rows_as_written, shared=True),
    Flag(("--prefill-chunk",), "prompt tokens prefilled per step while other rows decode", _positive, 256,
         group=THROUGHPUT, preset=FLAG, shared=True),
    Flag(("--max-context",), "cap on prompt + generated tokens per request; a prompt that fills it is refused",
         _positive, group=THROUGHPUT, preset=FLAG, shared=True),
    # Not shared: in router mode it is the total, and each model's process gets its share (hearth/router_mode.py).
    Flag(("--memory-budget",), "bytes for weights + KV caches: sets the context cap from the model and how many "
         "rows may decode together (default: three quarters of RAM)", byte_count, group=THROUGHPUT, preset=FLAG),
    Flag(("--kv-budget",), "bytes the running requests' KV caches may take together: fewer rows decode at once "
         "and the context cap follows (default: what --memory-budget leaves)", byte_count, group=THROUGHPUT,
         preset=FLAG),
    Flag(("--prompt-cache-bytes",), "RAM for reusable prompt KV caches (0 turns the cache off; default 1GiB)",
         byte_count, 1 << 30, group=THROUGHPUT, preset=FLAG, shared=True),
    # Not shared: in router mode each model keeps its SSD tier in a folder of its own under it.
    Flag(("--ssd-cache",), "also keep prompt caches in DIR, found again after a restart", metavar="DIR",
         group=THROUGHPUT, preset=FLAG, path=True),
    Flag(("--ssd-cache-bytes",), "disk cap of the SSD tier (oldest entries go first; default 16GiB)", byte_count,
         16 << 30, group=THROUGHPUT, preset=FLAG, shared=True),
    Flag(("--kv-quant",), "quantize the KV cache to 4 or 8 bits (runs on the serial lane)", whole(_kv_bits),
         metavar="{4,8}", group=THROUGHPUT, preset=FLAG, shared=True),

    # Not shared: a draft model belongs to one model (a preset key in router mode).
    Flag(("--draft-model",), "a small model with the served model's tokenizer drafts tokens for it to check",
         metavar="MODEL", group=SPECULATIVE, preset=FLAG),
    Flag(("--draft-kind",), "ngram: prompt lookup, drafts copied from the context (no model); model: "
         "--draft-model (implied by it)", argtypes.choice("ngram", "model"), metavar="{ngram,model}",
         group=SPECULATIVE, preset=FLAG, shared=True),
    Flag(("--draft-tokens",), "most drafted tokens per step (default 8 for ngram, 3 for a draft model)", _positive,
         group=SPECULATIVE, preset=FLAG, shared=True),
    Flag(("--no-jump-forward",), "decode a lone request under a grammar token by token, never appending the text "
         "the grammar forces in one forward (usage.fill)", default=False, switch=True, group=SPECULATIVE,
         preset=FLAG, shared=True),
)

PRESET_KEYS = {flag.key: flag for flag in FLAGS if flag.preset}
SHARED = tuple(flag for flag in FLAGS if flag.shared)
ROUTER_ONLY = tuple(flag for flag in FLAGS if flag.group == ROUTER)
LIMIT_FLAGS = tuple(flag for flag in FLAGS if flag.limit)
