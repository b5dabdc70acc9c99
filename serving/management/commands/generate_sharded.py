"""`hearth generate-sharded MODEL --prompt TEXT`: greedy generation with the
model sharded across the processes `mlx.launch` started (inference.engine.sharded).

    mlx.launch --backend ring -n 2 -- hearth generate-sharded MODEL --prompt "Hi"

Every rank loads its shard and runs the same forward passes; rank 0 decides
the prompt's tokens, shares them, and alone prints the answer. Started
without `mlx.launch` it is one process holding the whole model, which gives
the reference output and speed to compare with.
"""
from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from inference.engine import sharded
from inference.engine.errors import EngineError


class Command(BaseCommand):
    help = ("Generate greedily with a model sharded across the ranks mlx.launch started (mx.distributed, "
            "tensor or pipeline parallel); rank 0 prints the answer.")
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        parser.add_argument("model", help="a local model directory or a repo id in the local HF cache")
        parser.add_argument("--prompt", required=True, help="the user message (or the raw text with --raw)")
        parser.add_argument("--raw", action="store_true", help="tokenize the prompt as is, without the chat template")
        parser.add_argument("--max-tokens", type=int, default=64)
        parser.add_argument("--pipeline", action="store_true",
                            help="split the layers across the ranks instead of every layer's weights "
                                 "(models with pipeline support; needs model.safetensors.index.json)")
        parser.add_argument("--backend", choices=sharded.BACKENDS, default="any",
                            help="the mx.distributed backend (default: whichever mlx.launch configured)")
        parser.add_argument("--keep-dtype", action="store_true", help="keep the stored dtype on the CPU")
        parser.add_argument("--json", dest="as_json", action="store_true",
                            help="print one JSON object: tokens, their log-probabilities, text, timings")

    def handle(self, *args, model: str, prompt: str, raw: bool, max_tokens: int, pipeline: bool, backend: str,
               keep_dtype: bool, as_json: bool, **options):
        if max_tokens < 1:
            raise CommandError("--max-tokens must be at least 1")
        try:
            group = sharded.join_group(backend)
            loaded = sharded.load_sharded(model, group, pipeline=pipeline, keep_dtype=keep_dtype)
        except EngineError as exc:
            raise CommandError(str(exc)) from None
        tokenizer = loaded.tokenizer
        if raw:
            ids = list(tokenizer.encode(prompt))
        else:
            ids = list(tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                     add_generation_prompt=True))
        out = sharded.greedy(loaded, sharded.share_ids(group, ids), max_tokens)
        if group.rank() != 0:
            return
        mode = "single" if group.size() == 1 else "pipeline" if pipeline else "tensor"
        if as_json:
            self.stdout.write(json.dumps({
                "model": loaded.model_id, "ranks": group.size(), "mode": mode, "dtype": loaded.dtype,
                "prompt_tokens": out.prompt_tokens, "tokens": out.tokens, "text": out.text,
                "logprobs": [round(v, 6) for v in out.logprobs],
                "prompt_seconds": round(out.prompt_seconds, 4), "decode_steps": out.decode_steps,
                "decode_seconds": round(out.decode_seconds, 4),
                "decode_tokens_per_second": round(out.decode_tps, 2)}))
            return
        self.stdout.write(out.text)
        self.stderr.write(f"{group.size()} rank(s), {mode}: {out.prompt_tokens} prompt tokens in "
                          f"{out.prompt_seconds:.2f}s, {len(out.tokens)} generated, "
                          f"{out.decode_tps:.1f} tokens/s decoding")
