"""A small llama that has learned to copy, for measuring prompt lookup.

A random model never repeats its prompt, so prompt lookup's guesses would
all be rejected and the benchmark would measure nothing. This one (13M
parameters, float32) is trained for a couple of minutes on two cores on
rows of one random line of twelve words said over and over: its one skill
is to continue such a line, which is what a model does when it quotes,
edits code or extracts. (A variable line length, which needs a real
induction head, did not train in 600 steps here; a fixed one trains in
about 50.)

    .venv/bin/python bench/copy_model.py OUT [--steps 150]

`build_copy_model` caches the result under `~/.cache/hearth-bench` keyed by
its settings, so later benchmark runs reuse it.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Words that the tokenizer learns whole, so a line is a run of word tokens to copy.
WORDS = ("the river house quiet keeper light tower stone window garden morning evening bread tea letter road hill "
         "winter summer boat harbor lamp book chair table door field bird rain wind cloud snow apple pear plum "
         "cat dog horse sheep goat mouse fox owl bee ant fish frog duck swan crow wolf bear deer hare seal "
         "red blue green gold grey white black brown pink old new small big long short warm cold soft hard "
         "slow fast dark bright open shut near far high low early late first last good bad "
         "walk run read write sing sleep cook paint build carry find keep lose send take give hold turn").split()
SETTINGS = {"hidden": 512, "layers": 4, "heads": 8, "ffn": 1408, "vocab": 1024, "seq": 96, "batch": 32,
            "lr": 2e-3, "warmup": 20, "seed": 0, "period": 12}


def words(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(WORDS) for _ in range(n)]


def _corpus_text(rng: random.Random) -> str:
    """Text the tokenizer learns its words from: lines said two to four times."""
    out = []
    for _ in range(12):
        said = " ".join(words(rng, rng.randint(5, 15)))
        out += [said] * rng.randint(2, 4)
    return "\n".join(out) + "\n"


def copy_prompt(seed: int, repeats: int = 2) -> str:
    """A line of `period` words said `repeats` times and begun again: the
    model's continuation copies it, which prompt lookup can guess."""
    rng = random.Random(10_000 + seed)
    said = words(rng, SETTINGS["period"])
    return " " + " ".join(said * repeats + said[:3])


def build_copy_model(out: Path, steps: int = 150, progress=print) -> Path:
    """Train (or reuse from the cache) the copy model; a model directory in `out`."""
    key = hashlib.sha1(json.dumps([SETTINGS, steps, 1]).encode()).hexdigest()[:12]
    cached = Path.home() / ".cache" / "hearth-bench" / f"copy-model-{key}"
    if not (cached / "model.safetensors").exists():
        _train(cached, steps, progress)
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(cached, out)
    return out


def _train(out: Path, steps: int, progress) -> None:
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx.utils import tree_flatten
    from mlx_lm.models.llama import Model, ModelArgs

    from serving.demo.files import IM_END, llama_config, train_tokenizer, write_model_dir

    s = SETTINGS
    rng = random.Random(s["seed"])
    tok = train_tokenizer([_corpus_text(rng) for _ in range(400)], s["vocab"], markup=False)
    assert all(len(tok.encode(" " + w).ids) == 1 for w in WORDS), "every word should be one token"
    config = llama_config(tok.get_vocab_size(), s["hidden"], s["layers"], s["heads"], s["ffn"], 4096,
                          tok.token_to_id(IM_END))
    mx.random.seed(s["seed"])
    model = Model(ModelArgs.from_dict(config))
    schedule = optim.join_schedules([optim.linear_schedule(1e-5, s["lr"], s["warmup"]),
                                     optim.cosine_decay(s["lr"], steps - s["warmup"], s["lr"] / 20)], [s["warmup"]])
    opt = optim.AdamW(learning_rate=schedule, weight_decay=0.0)

    word_ids = [tok.encode(" " + w).ids[0] for w in WORDS]

    def batch() -> mx.array:
        """Rows of word tokens: a random line of `period` words said over and
        over, so every token after the first line is a copy from one line up."""
        rows = []
        for _ in range(s["batch"]):
            span = [rng.choice(word_ids) for _ in range(s["period"])]
            rows.append((span * (s["seq"] // s["period"] + 2))[: s["seq"] + 1])
        return mx.array(rows)

    def loss_fn(model, x):
        logits = model(x[:, :-1])
        return nn.losses.cross_entropy(logits, x[:, 1:], reduction="mean")

    step_fn = nn.value_and_grad(model, loss_fn)
    start = time.time()
    for step in range(1, steps + 1):
        loss, grads = step_fn(model, batch())
        opt.update(model, grads)
        mx.eval(model.parameters(), opt.state, loss)
        if step % 25 == 0 or step == 1:
            progress(f"copy model: step {step}/{steps} loss {loss.item():.3f} ({time.time() - start:.0f} s)")
    weights = dict(tree_flatten(model.parameters()))
    tmp = out.with_name(out.name + ".tmp")
    write_model_dir(tmp, weights, config, tok, {"eos_token_id": config["eos_token_id"]})
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args()
    print(build_copy_model(args.out, args.steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
