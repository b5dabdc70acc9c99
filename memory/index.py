"""Full-text search over a vault: an SQLite FTS5 index of sections.

Each article (and Reference document) is split at its headings; every
section is one row, ranked with BM25 (a heading counts five times its
text). The index lives outside the vault and is kept in step with the
files: every search first compares each file's size and modification time
with what was indexed and re-reads only what changed, so edits made by hand
are found and deleted files drop out. No Django here."""
from __future__ import annotations

import os
import re
import sqlite3
import threading
from pathlib import Path

from core.paths import PathRefused, read_text
from memory import vault

MAX_TERMS = 16
EXCERPT = 200
_lock = threading.Lock()

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (path TEXT PRIMARY KEY, mtime_ns INTEGER, size INTEGER);
CREATE TABLE IF NOT EXISTS section_files (id INTEGER PRIMARY KEY, path TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS section_files_path ON section_files (path);
CREATE VIRTUAL TABLE IF NOT EXISTS sections USING fts5(
    doc UNINDEXED, kind UNINDEXED, path UNINDEXED, anchor UNINDEXED, line UNINDEXED, title, body,
    tokenize = 'unicode61 remove_diacritics 2');
"""


def connect(index_path: Path) -> sqlite3.Connection:
    index_path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(index_path, timeout=30, check_same_thread=False)
    db.executescript(SCHEMA)
    return db


def _files(root: Path) -> dict[str, tuple[str, str, int, int]]:
    """Every indexable file: relative path -> (kind, path, mtime_ns, size).
    One scandir per folder and one lstat per file (this runs before every
    search); the same rule as `vault._docs` (no symlinks, no dot files, and
    regular files only: a FIFO or a device is never opened)."""
    out = {}
    for kind, folder in (("article", vault.ARTICLES), ("reference", vault.REFERENCE)):
        try:
            entries = os.scandir(root / folder)
        except (FileNotFoundError, NotADirectoryError):
            continue
        with entries:
            for e in entries:
                if e.name.endswith(".md") and not e.name.startswith(".") and e.is_file(follow_symlinks=False):
                    st = e.stat(follow_symlinks=False)
                    out[f"{folder}/{e.name}"] = (kind, e.path, st.st_mtime_ns, st.st_size)
    return out


def sections(name: str, text: str) -> list[dict]:
    """The text split at its headings: the part above the first `##` is the
    lead section (anchor ""), then one section per heading. Front matter is
    left out (its `kind: thing` would match every article)."""
    lines = text.split("\n")
    heads = vault.structure(text)
    starts = [vault.split_front_matter(text)[2]] + [h["line"] - 1 for h in heads]
    titles = [(name, "")] + [(h["title"], h["anchor"]) for h in heads]
    out = []
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else len(lines)
        body = "\n".join(lines[start:end])
        if body.strip():
            out.append({"title": titles[i][0], "anchor": titles[i][1], "line": start + 1, "body": body})
    return out


def sync(root: Path, index_path: Path) -> int:
    """Bring the index in step with the files; returns how many files were (re)read."""
    root = Path(root)
    with _lock:
        db = connect(index_path)
        try:
            known = {row[0]: (row[1], row[2]) for row in db.execute("SELECT path, mtime_ns, size FROM files")}
            current = _files(root)
            changed = 0
            with db:
                for rel in set(known) - set(current):
                    _forget(db, rel)
                    changed += 1
                for rel, (kind, path, mtime_ns, size) in current.items():
                    if known.get(rel) == (mtime_ns, size):
                        continue
                    try:  # through open_regular: a FIFO swapped in since the scan is never opened
                        text = read_text(Path(path), "article", encoding="utf-8", errors="replace")
                    except (PathRefused, OSError):  # deleted or replaced since the scan
                        continue
                    stem = os.path.basename(path)[:-3]
                    doc = stem if kind == "article" else f"{vault.REFERENCE}/{stem}"
                    if rel in known:
                        _forget(db, rel)
                    for s in sections(stem, text):
                        row = db.execute("INSERT INTO section_files (path) VALUES (?)", (rel,)).lastrowid
                        db.execute("INSERT INTO sections (rowid, doc, kind, path, anchor, line, title, body) "
                                   "VALUES (?,?,?,?,?,?,?,?)",
                                   (row, doc, kind, rel, s["anchor"], s["line"], s["title"], s["body"]))
                    db.execute("INSERT OR REPLACE INTO files VALUES (?, ?, ?)", (rel, mtime_ns, size))
                    changed += 1
            return changed
        finally:
            db.close()


def _forget(db: sqlite3.Connection, rel: str) -> None:
    """Drop a file's sections (FTS5 cannot look rows up by an unindexed
    column, so `section_files` maps each section's rowid to its file)."""
    db.execute("DELETE FROM sections WHERE rowid IN (SELECT id FROM section_files WHERE path = ?)", (rel,))
    db.execute("DELETE FROM section_files WHERE path = ?", (rel,))
    db.execute("DELETE FROM files WHERE path = ?", (rel,))


def terms(query: str) -> list[str]:
    # lower(), not casefold(): FTS5's tokenizer folds case but keeps ß, so "Straße" must stay "straße".
    return list(dict.fromkeys(re.findall(r"\w+", query.lower())))[:MAX_TERMS]


def _term_pattern(words: list[str]) -> re.Pattern:
    return re.compile(r"(?<!\w)(" + "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)) + r")\w*",
                      re.IGNORECASE)


def _excerpt(line: str, pattern: re.Pattern) -> tuple[str, list[list[int]]]:
    text = line.strip()
    first = pattern.search(text)
    left = 0
    if len(text) > EXCERPT and first is not None:
        left = max(0, min(first.start() - EXCERPT // 3, len(text) - EXCERPT))
    prefix = "…" if left else ""
    window = text[left:left + EXCERPT]
    suffix = "…" if left + EXCERPT < len(text) else ""
    excerpt = prefix + window + suffix
    ranges = [[m.start() + len(prefix), m.end() + len(prefix)] for m in pattern.finditer(window)]
    return excerpt, ranges


def search(root: Path, index_path: Path, query: str, scope: str = "all", limit: int = 50) -> dict:
    words = terms(query)
    if not words:
        raise vault.VaultError("q has no words to search for")
    sync(root, index_path)
    match = " OR ".join(f'"{w}"*' for w in words)
    sql = ("SELECT doc, kind, anchor, line, title, body, bm25(sections, 0, 0, 0, 0, 0, 5.0, 1.0) AS score "
           "FROM sections WHERE sections MATCH ?")
    args: list = [match]
    if scope in ("articles", "reference"):
        sql += " AND kind = ?"
        args.append(scope[:-1] if scope == "articles" else scope)
    sql += " ORDER BY score LIMIT 400"  # the best sections; enough for the summaries and hits
    db = connect(index_path)
    try:
        rows = db.execute(sql, args).fetchall()
    finally:
        db.close()
    pattern = _term_pattern(words)
    summaries: dict[str, dict] = {}
    hits: list[dict] = []
    for doc, kind, anchor, line, title, body, score in rows:
        found = [m.group(1).lower() for m in pattern.finditer(body)]
        summary = summaries.setdefault(doc, {"article": doc, "kind": kind, "occurrences": 0, "matched_terms": [],
                                             "score": -score, "title": doc})
        summary["occurrences"] += len(found)
        summary["matched_terms"] = sorted(set(summary["matched_terms"]) | set(found))
        for offset, text in enumerate(body.split("\n")):
            if len(hits) >= limit:
                break
            if pattern.search(text):
                excerpt, ranges = _excerpt(text, pattern)
                hits.append({"article": doc, "anchor": anchor, "section": title, "line": int(line) + offset,
                             "excerpt": excerpt, "ranges": ranges})
    ranked = sorted(summaries.values(), key=lambda s: -s["score"])[:limit]
    return {"summaries": ranked, "hits": hits, "terms": words, "mode": "fts"}
