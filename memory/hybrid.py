"""Hybrid search: FTS5's BM25 ranking fused with vector similarity over
section embeddings, by reciprocal rank fusion. Used when the served model
answers embeddings (`hearth serve --embeddings`, or an embedding model).

Section vectors are cached in the index database, keyed by the section's
text hash and the model, so each section is embedded once; a search embeds
at most EMBED_PER_SEARCH new sections (a big vault fills in over a few
searches) and says how many are still waiting. No Django here."""
from __future__ import annotations

import hashlib
import struct
from pathlib import Path

from memory import index

EMBED_PER_SEARCH = 64
RRF_K = 60
SCHEMA = "CREATE TABLE IF NOT EXISTS vectors (hash TEXT, model TEXT, vec BLOB, PRIMARY KEY (hash, model))"


def _pack(vector: list[float]) -> bytes:
    return struct.pack(f"{len(vector)}f", *vector)


def _unpack(blob: bytes) -> list[float]:
    return list(struct.unpack(f"{len(blob) // 4}f", blob))


def search(root: Path, index_path: Path, query: str, scope: str, limit: int, embed, model_id: str) -> dict:
    """`embed(texts) -> unit vectors` runs the served model."""
    found = index.search(root, index_path, query, scope, limit)
    db = index.connect(index_path)
    try:
        db.execute(SCHEMA)
        sql = "SELECT doc, kind, anchor, line, title, body FROM sections"
        if scope in ("articles", "reference"):
            sql += " WHERE kind = ?"
        rows = db.execute(sql, [scope[:-1] if scope == "articles" else scope] if scope != "all" else []).fetchall()
        keyed = [(hashlib.sha256(r[5].encode()).hexdigest(), r) for r in rows]
        cached = {h: _unpack(v) for h, v in db.execute("SELECT hash, vec FROM vectors WHERE model = ?", (model_id,))}
        missing = list(dict.fromkeys(h for h, _ in keyed if h not in cached))
        todo = missing[:EMBED_PER_SEARCH]
        if todo:
            texts = {h: r[5][:2000] for h, r in keyed}
            vectors = embed([texts[h] for h in todo])
            with db:
                db.executemany("INSERT OR REPLACE INTO vectors VALUES (?, ?, ?)",
                               [(h, model_id, _pack(v)) for h, v in zip(todo, vectors, strict=True)])
            cached.update(zip(todo, vectors, strict=True))
    finally:
        db.close()
    (q,) = embed([query])
    scored = sorted(((sum(a * b for a, b in zip(q, cached[h], strict=True)), r) for h, r in keyed if h in cached),
                    key=lambda pair: -pair[0])
    fused: dict[str, float] = {}
    for rank, summary in enumerate(found["summaries"]):
        fused[summary["article"]] = 1 / (RRF_K + rank)
    best_section: dict[str, tuple] = {}
    for similarity, row in scored[:limit * 2]:
        doc = row[0]
        if doc not in best_section:
            fused[doc] = fused.get(doc, 0.0) + 1 / (RRF_K + len(best_section))
            best_section[doc] = (similarity, row)
    summaries = {s["article"]: s for s in found["summaries"]}
    for doc, (similarity, row) in best_section.items():
        summary = summaries.setdefault(doc, {"article": doc, "kind": row[1], "occurrences": 0, "matched_terms": [],
                                             "title": doc})
        summary["similarity"] = round(similarity, 4)
        if summary["occurrences"] == 0 and len(found["hits"]) < limit:  # found by meaning only: show its section
            first = next((line.strip() for line in row[5].split("\n") if line.strip()), "")
            found["hits"].append({"article": doc, "anchor": row[2], "section": row[4], "line": int(row[3]),
                                  "excerpt": first[:index.EXCERPT], "ranges": []})
    for doc, summary in summaries.items():
        summary["score"] = round(fused.get(doc, 0.0), 6)
    ranked = sorted(summaries.values(), key=lambda s: -s["score"])[:limit]
    return {**found, "summaries": ranked, "mode": "hybrid", "pending_embeddings": len(missing) - len(todo)}
