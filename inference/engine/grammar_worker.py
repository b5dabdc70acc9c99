"""The process that compiles grammars: `python -m
inference.engine.grammar_worker`, run by `GrammarCompiler` in a
`core.workers.WorkerPool`.

Its first line on stdin is the tokenizer, as `xgrammar.TokenizerInfo.
serialize_json` writes it; it answers `{"ready": true}`. Then each line is
one spec (`{"kind", "source", "any_whitespace", "strict"}`), answered with
`{"grammar": <CompiledGrammar.serialize_json()>}` or `{"error": reason}`.
A compile cannot be interrupted inside xgrammar, so one that outlives its
time budget ends with this process: its parent kills it. It bounds its own
memory (RLIMIT_AS) and dies with its parent (`core.procs.spawn`).

No Django here, and no imports of the project's apps."""
from __future__ import annotations

import json
import os
import sys

from core.workers import confine

MEMORY_BYTES = 8 << 30  # address space, torch's reservations included


def main() -> int:
    confine(MEMORY_BYTES)
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    sys.stdout = sys.stderr  # nothing but answers on the answer channel
    import xgrammar as xgr

    from inference.engine.grammar import GrammarCompileError, GrammarSpec, clean_reason, compile_spec

    hello = sys.stdin.readline()
    if not hello:
        return 0
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.deserialize_json(hello), cache_enabled=False)
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        try:
            spec = GrammarSpec(**json.loads(line))
            answer = {"grammar": compile_spec(compiler, spec).serialize_json()}
        except GrammarCompileError as exc:
            answer = {"error": str(exc)}
        except MemoryError:
            answer = {"error": "the grammar needed more memory than a compile may use"}
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError with a reason
            answer = {"error": clean_reason(exc)}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
