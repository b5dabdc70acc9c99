"""Scores a demo-chat build on dashboard turns: the app tools' calls, plain
questions asked beside them, the round after a call, and the older forms.

    .venv/bin/python bench/demo_app_eval.py HF_HOME [TEMPERATURE ...]

Each prompt runs once at T=0, and with ten seeds at any other temperature;
a reply counts as right when it holds the expected text. The prompts are
phrased apart from the corpus's where they can be ("Show me memory.",
"Set 500 iterations."). Record runs in bench/RESULTS.md.
"""
from __future__ import annotations

import glob
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NAV = '"navigate_app", "arguments": {"route": "%s"}'
SPOT = '"spotlight_ui", "arguments": {"target": "%s", "value": "%s", "route": "%s"}'
# (the ambient line, the question, what a right reply holds)
APP_CASES = [
    ("Chat", "Take me to quantize.", NAV % "quantize"),
    ("Chat", "Open jobs.", NAV % "jobs"),
    ("Chat", "Go to settings.", NAV % "settings"),
    ("Models", "Show me memory.", NAV % "memory"),
    ("Chat", "Take me to finetune.", NAV % "finetune"),
    ("Chat", "Take me to the quantize page.", NAV % "quantize"),
    ("Jobs", "Open the adapters page, please.", NAV % "adapters"),
    ("Models", "Take me to quantize and set bits to 4.", SPOT % ("quantize-bits", "4", "quantize")),
    ("Chat", "Take me to quantize and fill in 4 bits.", SPOT % ("quantize-bits", "4", "quantize")),
    ("Chat", "Set rank to 16.", SPOT % ("finetune-rank", "16", "finetune")),
    ("Chat", "Go to finetune and set rank 8.", SPOT % ("finetune-rank", "8", "finetune")),
    ("Chat", "Set 500 iterations.", SPOT % ("finetune-iters", "500", "finetune")),
    ("Chat", "Set the group size to 32.", SPOT % ("quantize-group", "32", "quantize")),
    ("Chat", "Where can I download a model?", '"target": "models-search"'),
    ("Chat", "Hello!", "!"),
    ("Chat", "List three fruits.", "1. "),
    ("Chat", "What do bees make?", "honey"),
    ("Chat", "What is 3 + 4?", "= 7"),
]
PLAIN_CASES = [  # no tools on offer: the forms the model had before
    ("Hello!", "!"),
    ("List three colors.", "1. "),
    ("Give me a JSON object for a person named Ana who is 31.", '"name": "Ana"'),
    ("What do bees make?", "honey"),
]


def main() -> None:
    import mlx.core as mx
    from mlx_lm import generate, load
    from mlx_lm.sample_utils import make_sampler

    from serving.demo import corpus
    from serving.demo.build import render

    model, tok = load(glob.glob(sys.argv[1] + "/hub/models--hearth--demo-chat/snapshots/*")[0])
    app = corpus.app_tool_specs()

    def ask(messages: list[dict], kwargs: dict, temperature: float, seed: int) -> str:
        mx.random.seed(seed)
        return generate(model, tok, render(messages, kwargs), max_tokens=60,
                        sampler=make_sampler(temperature, top_k=20), verbose=False)

    for temperature in [float(t) for t in sys.argv[2:]] or [0.0]:
        runs, total = (1 if temperature == 0 else 10), 0
        for page, question, want in APP_CASES:
            turn = [{"role": "system", "content": f"[user is on: {page}]"}, {"role": "user", "content": question}]
            outs = [ask(turn, {"tools": app}, temperature, seed) for seed in range(runs)]
            right = sum(want in out for out in outs)
            total += right
            print(f"T={temperature} {right}/{runs} {question!r} -> {outs[0]!r}")
        print(f"T={temperature} app turns: {total}/{runs * len(APP_CASES)} right")
    call = {"id": "c", "type": "function", "function": {"name": "navigate_app", "arguments": {"route": "quantize"}}}
    after = [{"role": "system", "content": "[user is on: Chat]"},
             {"role": "user", "content": "Take me to the quantize page."},
             {"role": "assistant", "content": "", "tool_calls": [call]},
             {"role": "tool", "tool_call_id": "c", "content": "ok: the user now sees the Quantize page"}]
    print("the round after the call:", repr(ask(after, {"tools": app}, 0.0, 0)))
    weather = [corpus.tool_spec("get_weather"), corpus.tool_spec("add")]
    print("weather:", repr(ask([{"role": "user", "content": "What is the weather in Paris?"}],
                               {"tools": weather}, 0.0, 0)))
    for question, want in PLAIN_CASES:
        out = ask([{"role": "user", "content": question}], {}, 0.0, 0)
        print(f"{'ok ' if want in out else 'NO '} {question!r} -> {out!r}")


if __name__ == "__main__":
    main()
