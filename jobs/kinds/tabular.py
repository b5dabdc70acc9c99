"""Rows from pasted text or a file: CSV (with a header) or JSONL."""
from __future__ import annotations

import csv
import io
import json

from core.paths import confine, read_text

MAX_INPUT_BYTES = 64 << 20


def source_text(inputs: dict) -> str:
    """The `data` field, or the file named by `path`."""
    data, path = inputs.get("data"), inputs.get("path")
    if isinstance(data, str) and data.strip():
        return data
    if isinstance(path, str) and path.strip():
        # Confined to the allowed roots and refused unless a regular file, before it is opened.
        return read_text(confine(path, "path"), "path", MAX_INPUT_BYTES, "utf-8-sig")
    raise ValueError("paste the rows into `data` or give a file `path`")


def parse(text: str, fmt: str = "auto") -> list[dict]:
    """Dict rows from CSV or JSONL; `auto` picks JSONL when the first
    non-empty line is a JSON object."""
    text = text.lstrip("\ufeff")
    if fmt not in ("auto", "csv", "jsonl"):
        raise ValueError("format must be auto, csv or jsonl")
    if fmt == "auto":
        first = next((line.strip() for line in text.splitlines() if line.strip()), "")
        fmt = "jsonl" if first.startswith("{") else "csv"
    if fmt == "jsonl":
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"line {n} is not JSON: {exc}") from None
            if not isinstance(row, dict):
                raise ValueError(f"line {n} is not a JSON object")
            rows.append(row)
        return rows
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames:
        raise ValueError("the CSV has no header row")
    return [{k.strip(): (v or "").strip() for k, v in row.items() if k is not None} for row in reader]


def column(rows: list[dict], wanted: str | None, candidates: tuple[str, ...], what: str) -> str:
    """The column to read: the one asked for, else the first candidate present."""
    names = list(rows[0]) if rows else []
    if wanted:
        if wanted not in names:
            raise ValueError(f"no column {wanted!r} for the {what} (columns: {', '.join(names)})")
        return wanted
    for name in candidates:
        if name in names:
            return name
    raise ValueError(f"no {what} column: name one (columns: {', '.join(names)}; "
                     f"looked for {', '.join(candidates)})")
