"""The dataset builder: templates that turn what a user has (pasted text, a
CSV or JSONL file) into a fine-tune dataset folder (`train.jsonl`, and
`valid.jsonl` when a validation share is asked for) under
HEARTH_HOME/datasets.

LLM-backed templates ask the served model through this server's own
`/v1/chat/completions` (so through its engine, batched with everyone
else), with a JSON schema on the grammar path so even a small model
answers in a shape that parses."""
from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path

from core.fs import write_atomically
from core.paths import confine, regular_file
from jobs.events import EventLog
from jobs.kinds import tabular
from jobs.llm import ServedModel as _Model
from jobs.llm import text_schema as _text

_DATA = {"name": "data", "type": "textarea", "label": "Rows (CSV with a header, or JSONL)",
         "hint": "or leave empty and give a file path below"}
_PATH = {"name": "path", "type": "text", "label": "File path", "hint": "a .csv or .jsonl file on this machine"}
_VALID = {"name": "valid_fraction", "type": "number", "label": "Validation share", "default": 0.1,
          "minimum": 0, "maximum": 0.5, "hint": "0 to 0.5 of the rows go to valid.jsonl"}
_FORMAT = {"name": "format", "type": "text", "label": "Format", "default": "auto", "choices": ["auto", "csv", "jsonl"],
           "hint": "auto, csv or jsonl"}

TEMPLATES = [
    {"id": "qa-from-text", "label": "Questions and answers from a text",
     "description": "Paste notes or an article; the served model writes question/answer pairs about each "
                    "passage, as chat examples.",
     "output_format": "messages", "needs_llm": True,
     "fields": [{"name": "text", "type": "textarea", "label": "Source text", "required": True},
                {"name": "pairs_per_passage", "type": "number", "label": "Pairs per passage", "default": 2,
                 "integer": True, "minimum": 1, "maximum": 20},
                {"name": "passage_chars", "type": "number", "label": "Passage length (characters)",
                 "default": 1200, "integer": True, "minimum": 200, "maximum": 20000},
                {"name": "system", "type": "text", "label": "System prompt for the examples",
                 "hint": "optional; added to every example"},
                _VALID]},
    {"id": "table-to-messages", "label": "CSV / JSONL to chat examples",
     "description": "Convert rows with a prompt column and a response column into chat examples.",
     "output_format": "messages", "needs_llm": False,
     "fields": [_DATA, _PATH, _FORMAT,
                {"name": "prompt_column", "type": "text", "label": "Prompt column",
                 "hint": "default: prompt, question, instruction or input"},
                {"name": "response_column", "type": "text", "label": "Response column",
                 "hint": "default: response, answer, completion or output"},
                {"name": "system", "type": "text", "label": "System prompt", "hint": "optional"},
                _VALID]},
    {"id": "dpo-pairs", "label": "Preference pairs (DPO / ORPO)",
     "description": "Rows with a prompt, a chosen and a rejected reply become prompt/chosen/rejected pairs. "
                    "Rows without a rejected reply can take the served model's own answer as the rejected one.",
     "output_format": "dpo", "needs_llm": False,
     "fields": [_DATA, _PATH, _FORMAT,
                {"name": "prompt_column", "type": "text", "label": "Prompt column", "hint": "default: prompt"},
                {"name": "chosen_column", "type": "text", "label": "Chosen column", "hint": "default: chosen"},
                {"name": "rejected_column", "type": "text", "label": "Rejected column", "hint": "default: rejected"},
                {"name": "model_rejects", "type": "number", "label": "Fill missing rejected replies from the model",
                 "default": 0, "integer": True, "minimum": 0, "maximum": 1,
                 "hint": "1 = ask the served model, 0 = skip such rows"},
                _VALID]},
]
BY_ID = {t["id"]: t for t in TEMPLATES}
QUESTION_CHARS, ANSWER_CHARS = 200, 600


def check_inputs(template: dict, inputs: dict) -> None:
    """Every input is a field of the template, required ones present, numbers numbers in their
    field's range, choices one of theirs: checked before a job is queued, and again as it runs. A
    ValueError names the field (`inputs.NAME`)."""
    fields = {field["name"]: field for field in template["fields"]}
    unknown = sorted(set(inputs) - set(fields))
    if unknown:
        raise ValueError(f"inputs.{unknown[0]}: not a field of the {template['id']} template "
                         f"(its fields: {', '.join(fields)})")
    for name, field in fields.items():
        value = inputs.get(name)
        if field.get("required") and (not isinstance(value, str) or not value.strip()):
            raise ValueError(f"inputs.{name}: {name} is required")
        if value is not None and field["type"] == "number":
            _in_range(field, value)
        if value is not None and field["type"] in ("text", "textarea") and not isinstance(value, str):
            raise ValueError(f"inputs.{name}: {name} must be a string")
        if isinstance(value, str) and value and "choices" in field and value not in field["choices"]:
            raise ValueError(f"inputs.{name}: {name} must be {', '.join(field['choices'])}, not {value!r}")
    path, data = inputs.get("path"), inputs.get("data")
    pasted = isinstance(data, str) and data.strip()
    if "data" in fields and not pasted and not (isinstance(path, str) and path.strip()):
        raise ValueError("inputs.data: paste the rows into data or give a file path")
    if isinstance(path, str) and path.strip() and not pasted:
        regular_file(confine(path, "path"), "path")  # again in the job's child, just before it is read


def _in_range(field: dict, value: object) -> None:
    name, low, high = field["name"], field["minimum"], field["maximum"]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"inputs.{name}: {name} must be a number")
    if field.get("integer") and not (isinstance(value, int) or value.is_integer()):
        raise ValueError(f"inputs.{name}: {name} must be a whole number, not {value}")
    if not low <= value <= high:  # NaN included
        raise ValueError(f"inputs.{name}: {name} must be between {low} and {high}, not {value}")


def _number(template: dict, inputs: dict, name: str) -> float:
    """The number `inputs` gives for `name` (checked by check_inputs), or its field's default."""
    field = next(f for f in template["fields"] if f["name"] == name)
    value = inputs.get(name)
    return field["default"] if value is None else value


def _passages(text: str, size: int) -> list[str]:
    """Paragraph-aligned chunks of about `size` characters."""
    out, current = [], ""
    for para in [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]:
        if current and len(current) + len(para) > size:
            out.append(current)
            current = ""
        current = f"{current}\n\n{para}" if current else para
        while len(current) > size * 2:
            out.append(current[:size])
            current = current[size:]
    if current:
        out.append(current)
    return out


def _qa_from_text(inputs: dict, model: _Model, log: EventLog) -> tuple[list[dict], int]:
    per = int(_number(BY_ID["qa-from-text"], inputs, "pairs_per_passage"))
    passages = _passages(inputs["text"], int(_number(BY_ID["qa-from-text"], inputs, "passage_chars")))
    schema = {"type": "object", "required": ["pairs"], "properties": {"pairs": {
        "type": "array", "minItems": 1, "maxItems": per, "items": {
            "type": "object", "required": ["question", "answer"],
            "properties": {"question": _text(QUESTION_CHARS), "answer": _text(ANSWER_CHARS)}}}}}
    system = inputs.get("system") or None
    rows, skipped = [], 0
    for n, passage in enumerate(passages, 1):
        ask = [{"role": "system", "content": "You write study questions. Answer only from the passage."},
               {"role": "user", "content": f"Passage:\n{passage}\n\nWrite {per} question and answer pairs "
                                           "about this passage as JSON."}]
        # A token is at least one character, so this always fits the longest reply the schema allows.
        reply = model.ask(ask, schema, max_tokens=per * (QUESTION_CHARS + ANSWER_CHARS + 40) + 40)
        try:
            pairs = json.loads(reply)["pairs"]
        except (ValueError, KeyError, TypeError):
            skipped += 1
            log.emit("log", line=f"passage {n}: the model's answer did not parse, skipped: {reply[:200]!r}")
            continue
        for pair in pairs:
            messages = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": pair["question"].strip()},
                {"role": "assistant", "content": pair["answer"].strip()}]
            if all(m["content"] for m in messages):
                rows.append({"messages": messages})
            else:
                skipped += 1
                log.emit("log", line=f"passage {n}: an empty question or answer, skipped: {reply[:200]!r}")
        log.emit("stage", stage="generate", progress=round(0.1 + 0.8 * n / len(passages), 3),
                 message=f"passage {n}/{len(passages)}: {len(rows)} examples")
    return rows, skipped


def _table_to_messages(inputs: dict, log: EventLog) -> tuple[list[dict], int]:
    rows = tabular.parse(tabular.source_text(inputs), inputs.get("format") or "auto")
    if not rows:
        raise ValueError("no rows found")
    prompt = tabular.column(rows, inputs.get("prompt_column"), ("prompt", "question", "instruction", "input"),
                            "prompt")
    response = tabular.column(rows, inputs.get("response_column"),
                              ("response", "answer", "completion", "output"), "response")
    system = inputs.get("system") or None
    out, skipped = [], 0
    for row in rows:
        asked, said = str(row.get(prompt) or "").strip(), str(row.get(response) or "").strip()
        if not asked or not said:
            skipped += 1
            continue
        out.append({"messages": ([{"role": "system", "content": system}] if system else [])
                    + [{"role": "user", "content": asked}, {"role": "assistant", "content": said}]})
    return out, skipped


def _dpo_pairs(inputs: dict, model: _Model | None, log: EventLog) -> tuple[list[dict], int]:
    rows = tabular.parse(tabular.source_text(inputs), inputs.get("format") or "auto")
    if not rows:
        raise ValueError("no rows found")
    prompt = tabular.column(rows, inputs.get("prompt_column"), ("prompt", "question", "instruction"), "prompt")
    chosen = tabular.column(rows, inputs.get("chosen_column"), ("chosen",), "chosen")
    names = list(rows[0])
    rejected = inputs.get("rejected_column") or ("rejected" if "rejected" in names else None)
    if rejected and rejected not in names:
        raise ValueError(f"no column {rejected!r} for the rejected reply (columns: {', '.join(names)})")
    fill = bool(_number(BY_ID["dpo-pairs"], inputs, "model_rejects"))
    out, skipped = [], 0
    for n, row in enumerate(rows, 1):
        p, c = str(row.get(prompt) or "").strip(), str(row.get(chosen) or "").strip()
        r = str(row.get(rejected) or "").strip() if rejected else ""
        if p and c and not r and fill:
            if model is None:
                raise ValueError("model_rejects needs the served model; start the job from a running server")
            r = model.ask([{"role": "user", "content": p}], max_tokens=256).strip()
            log.emit("stage", stage="generate", progress=round(0.1 + 0.8 * n / len(rows), 3),
                     message=f"row {n}/{len(rows)}: asked the model for a rejected reply")
        if not p or not c or not r or r == c:
            skipped += 1
            continue
        out.append({"prompt": p, "chosen": c, "rejected": r})
    return out, skipped


def run(config: dict, log: EventLog, stage_delay: float = 0.0) -> tuple[str, dict]:
    template = BY_ID.get(config.get("template_id"))
    if template is None:
        raise ValueError(f"unknown template {config.get('template_id')!r}")
    inputs = config.get("inputs") or {}
    check_inputs(template, inputs)
    out = Path(config["output_dir"])
    share = _number(template, inputs, "valid_fraction")
    log.emit("stage", stage="read", progress=0.05, message=f"building {template['label']}")
    if stage_delay:
        time.sleep(stage_delay)
    needs_model = template["needs_llm"] or (template["id"] == "dpo-pairs" and inputs.get("model_rejects"))
    model = _Model(config.get("api_url"), config.get("model_name")) if needs_model else None
    if needs_model:
        log.emit("log", line=f"asking the model {config.get('model_name') or 'the server serves'}")
    if template["id"] == "qa-from-text":
        assert model is not None  # the template needs the model (needs_llm)
        rows, skipped = _qa_from_text(inputs, model, log)
    elif template["id"] == "table-to-messages":
        rows, skipped = _table_to_messages(inputs, log)
    else:
        rows, skipped = _dpo_pairs(inputs, model, log)
    if not rows:
        raise ValueError(f"no usable examples ({skipped} skipped)")
    random.Random(0).shuffle(rows)
    n_valid = int(len(rows) * share) if len(rows) > 1 else 0
    valid, train = rows[:n_valid], rows[n_valid:]
    log.emit("stage", stage="write", progress=0.95, message=f"writing {len(train)} train / {len(valid)} valid rows")
    out.mkdir(parents=True, exist_ok=True)
    _write(out / "train.jsonl", train)
    if valid:
        _write(out / "valid.jsonl", valid)
    return str(out), {"template": template["id"], "format": template["output_format"], "n_train": len(train),
                      "n_valid": len(valid), "skipped": skipped}


def _write(path: Path, rows: list[dict]) -> None:
    write_atomically(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
