#!/usr/bin/env python
"""Real-time factor of transcription: seconds of processing per second of
audio, through `hearth serve --whisper-model` (POST /v1/audio/transcriptions,
the model already loaded) and through mlx-whisper's own `transcribe` in a
plain process, on one take of spoken digits (espeak-ng) padded with pauses
to --seconds.

    .venv/bin/python bench/transcribe.py [--whisper-model hearth/demo-whisper] [--seconds 60] [--runs 3] [--record]

The Whisper model is a repo id in the local HF cache or a directory; the
chat model beside it is a tiny random one (it does not take part). Both
runners get OpenBLAS preloaded when this machine has it, like bench/decode.py.
`--record` appends the table, the command and the commit to bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.decode import commit_label, preloaded_env, publish  # noqa: E402
from serving.demo import speech_data  # noqa: E402

RAW = r"""
import json, sys, time
import numpy as np
import mlx.core as mx
import mlx_whisper
from mlx_whisper.load_models import load_model
from mlx_whisper import transcribe as _
mw = sys.modules["mlx_whisper.transcribe"]
path, wav, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
audio = mlx_whisper.audio.load_audio(wav)
mw.ModelHolder.model, mw.ModelHolder.model_path = load_model(path, mx.float32), path
out = []
for run in range(runs + 1):
    start = time.perf_counter()
    r = mw.transcribe(np.array(audio), path_or_hf_repo=path, fp16=False, temperature=0.0, language="en")
    if run:
        out.append(time.perf_counter() - start)
print(json.dumps(out))
"""


def take(seconds: float) -> np.ndarray:
    """Digit strings every few seconds, silence between them, `seconds` long."""
    rng = np.random.default_rng(0)
    audio = np.zeros(int(seconds * speech_data.RATE), np.float32)
    at = speech_data.RATE // 2
    rand = __import__("random").Random(0)
    while True:
        clip = speech_data.say(speech_data.spoken(speech_data.random_digits(rand)), "en", 160, 50)
        if at + len(clip) >= len(audio):
            break
        audio[at:at + len(clip)] = clip
        at += len(clip) + int(rng.uniform(1.0, 3.0) * speech_data.RATE)
    return audio


def resolve(ref: str) -> Path:
    from inference.engine.speech import resolve as find

    return find(ref)


def measure_server(env: dict, whisper: Path, wav: Path, runs: int, work: Path) -> list[float]:
    import httpx

    from tests.helpers import TINY_REPO, ServerProcess, build_tiny_model

    build_tiny_model(work / "hf" / "hub")
    server = ServerProcess(env, TINY_REPO, "--whisper-model", str(whisper), "--whisper-idle-unload", "0",
                           "--no-worker", log_path=work / "server.log").wait_ready()
    try:
        out = []
        for run in range(runs + 1):
            start = time.perf_counter()
            r = httpx.post(server.url + "/v1/audio/transcriptions", timeout=600,
                           files={"file": ("take.wav", wav.read_bytes(), "audio/wav")},
                           data={"temperature": "0", "language": "en"})
            r.raise_for_status()
            if run:  # the first run loads the model
                out.append(time.perf_counter() - start)
        return out
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--whisper-model", default="hearth/demo-whisper")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    whisper = resolve(args.whisper_model)
    work = Path(tempfile.mkdtemp(prefix="hearth-bench-speech-"))
    env, blas = preloaded_env(work)
    wav = work / "take.wav"
    wav.write_bytes(speech_data.to_wav(take(args.seconds)))
    raw = subprocess.run([sys.executable, "-c", RAW, str(whisper), str(wav), str(args.runs)], env=env,
                         capture_output=True, text=True, check=True)
    rows = [("raw mlx_whisper.transcribe", json.loads(raw.stdout.strip().splitlines()[-1])),
            ("hearth serve /v1/audio/transcriptions", measure_server(env, whisper, wav, args.runs, work))]
    config = json.loads((whisper / "config.json").read_text())
    lines = [f"\n## {time.strftime('%Y-%m-%d')} · commit {commit_label()} · transcription real-time factor", "",
             f"`python bench/transcribe.py --whisper-model {args.whisper_model} --seconds {args.seconds:g} "
             f"--runs {args.runs}{' --record' if args.record else ''}` on {platform.machine()}, "
             f"{__import__('os').cpu_count()} cores, {platform.python_version()}, {blas}; Whisper "
             f"{config['n_audio_state']} wide, {config['n_audio_layer']}+{config['n_text_layer']} layers; "
             f"a {args.seconds:g} s take of spoken digits; temperature 0, language en; median of {args.runs} "
             "(warm: the model loaded).", "",
             "| runner | seconds | real-time factor | x real time |", "| --- | ---: | ---: | ---: |"]
    for name, times in rows:
        t = statistics.median(times)
        lines.append(f"| {name} | {t:.2f} | {t / args.seconds:.3f} | {args.seconds / t:.1f}x |")
    publish(args, lines, work)


if __name__ == "__main__":
    main()
