"""Vault search at scale: the FTS5 section index against a plain scan of
every file (what a grep-style search does), on a synthetic vault.

    python bench/memory_search.py --articles 5000 [--record]

Measures: building the index from nothing, a warm search (nothing changed),
a search right after one article was edited by hand (the index re-reads
that file only), and the plain scan, each the median of --runs queries."""
from __future__ import annotations

import argparse
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from memory import index  # noqa: E402

WORDS = ("garden fox river lamp harbour bread apple kettle stone lantern meadow orchard bee cellar ferry "
         "violin ledger pepper copper willow thistle beacon quarry saddle tide walnut".split())
QUERIES = ["lantern harbour", "walnut", "copper kettle", "orchard bee", "quarry"]


def make_vault(root: Path, n: int, seed: int = 0) -> None:
    r = random.Random(seed)
    (root / "articles").mkdir(parents=True)
    for i in range(n):
        sections = []
        for s in range(4):
            lines = [" ".join(r.choice(WORDS) for _ in range(12)) + "." for _ in range(6)]
            sections.append(f"## Section {s}\n\n" + "\n".join(lines))
        (root / "articles" / f"Article {i}.md").write_text(f"# Article {i}\n\nLead {i}.\n\n" + "\n\n".join(sections))


def scan(root: Path, query: str) -> int:
    """A grep-style search: read every file, match every line."""
    pattern = re.compile("|".join(re.escape(w) for w in query.split()), re.IGNORECASE)
    hits = 0
    for path in (root / "articles").glob("*.md"):
        for line in path.read_text().split("\n"):
            if pattern.search(line):
                hits += 1
    return hits


def timed(fn, runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--articles", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root, db = Path(tmp) / "vault", Path(tmp) / "index.sqlite3"
        make_vault(root, args.articles)
        size = sum(p.stat().st_size for p in (root / "articles").glob("*.md"))
        start = time.perf_counter()
        index.sync(root, db)
        build_ms = (time.perf_counter() - start) * 1000
        q = iter(QUERIES * args.runs)
        warm_ms = timed(lambda: index.search(root, db, next(q), "all", 50), args.runs)
        edited = root / "articles" / "Article 7.md"

        def edit_then_search():
            edited.write_text(edited.read_text() + f"\nA zeppelin note {time.time_ns()}.\n")
            found = index.search(root, db, "zeppelin", "all", 50)
            assert found["summaries"][0]["article"] == "Article 7"

        edit_ms = timed(edit_then_search, args.runs)
        q = iter(QUERIES * args.runs)
        scan_ms = timed(lambda: scan(root, next(q)), args.runs)
    rows = [("build the index from nothing", build_ms), ("search, nothing changed", warm_ms),
            ("search after one hand edit", edit_ms), ("plain scan of every file (grep-style)", scan_ms)]
    table = "\n".join(f"| {name} | {ms:.0f} |" for name, ms in rows)
    print(f"{args.articles} articles, {size / 1e6:.1f} MB\n{table}")
    if args.record:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        dirty = " (+ local changes)" if subprocess.run(["git", "status", "--porcelain"], capture_output=True,
                                                       text=True).stdout.strip() else ""
        with open(Path(__file__).with_name("RESULTS.md"), "a") as f:
            f.write(f"\n## {time.strftime('%Y-%m-%d')} · commit {commit}{dirty}\n\n"
                    f"`python bench/memory_search.py --articles {args.articles} --runs {args.runs} --record` on "
                    f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}; a synthetic vault "
                    f"of {args.articles} articles ({size / 1e6:.1f} MB, 4 sections each), median of "
                    f"{args.runs}.\n\n| what | ms |\n| --- | ---: |\n{table}\n")


if __name__ == "__main__":
    main()
