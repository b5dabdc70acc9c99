"""The process that renders client chat templates: `python -m
inference.protocols.template_worker`, one request a line on stdin, one
answer a line on stdout (JSON both ways).

It renders with transformers' own sandboxed Jinja environment, the one
`apply_chat_template` uses, so a client template sees exactly what the
model's template would. What it cannot bound, its parent does: the parent
kills it when a render outlives its time budget or the client leaves. It
bounds its own memory (RLIMIT_AS) and the text it returns, and dies with
its parent (`core.procs.spawn`).

No Django here, and no imports of the project's apps."""
from __future__ import annotations

import json
import os
import sys
from typing import cast

from core.workers import confine

MEMORY_BYTES = 2 << 30


def render(job: dict) -> dict:
    from transformers.utils.chat_template_utils import render_jinja_template

    try:
        # Annotated as str; it answers (rendered texts, generation indices).
        rendered, _ = cast("tuple[list[str], list]", render_jinja_template(
            conversations=[job["messages"]], tools=job.get("tools"), chat_template=job["template"],
            add_generation_prompt=not job.get("continued"), continue_final_message=bool(job.get("continued")),
            **job.get("variables", {})))
    except MemoryError:
        return {"error": "the chat template needed more memory than a render may use"}
    except Exception as exc:  # jinja syntax and runtime errors, raise_exception() in the template
        return {"error": f"{type(exc).__name__}: {exc}"}
    text = rendered[0]
    if len(text) > job["max_chars"]:
        return {"error": f"the chat template rendered {len(text)} characters; at most {job['max_chars']} are allowed "
                         "(--max-prompt-chars)"}
    return {"text": text}


def main() -> int:
    confine(MEMORY_BYTES)
    from core import torchless

    torchless.install()  # transformers without torch: its Jinja environment needs none
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    sys.stdout = sys.stderr  # nothing but answers on the answer channel
    from transformers.utils import chat_template_utils  # noqa: F401  (loaded before the first request)

    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        try:
            answer = render(json.loads(line))
        except (ValueError, KeyError, TypeError) as exc:
            answer = {"error": f"bad render request: {exc}"}
        out.write(json.dumps(answer, ensure_ascii=False) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
