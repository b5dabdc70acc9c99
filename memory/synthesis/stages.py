"""The synthesis stages. Each takes the run's state and the folder it may
write (the scratch worktree); the ones that ask the served model for
structure pass a JSON schema, so the answer always parses, and a cut-off
or unusable answer skips that item with a log line instead of failing the
run. No Django here."""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from jobs.llm import ServedModel, text_schema
from memory import index, vault

SEGMENT_CHARS = 360
PARALLEL = 4
NEW = "(new article)"
FACTS, SOURCES = "Facts", "Sources"
_CLEAN = re.compile(r"[^\w' -]+")
_MARKUP = re.compile(r"<\|[^|>]*\|>|</?[A-Za-z_]+>|[{}<>|\[\]]")


def plain(text) -> str:
    """Model text for an article: no chat markup, brackets or pipes (they
    would turn into wikilinks or tables), whitespace collapsed."""
    return " ".join(_MARKUP.sub(" ", str(text or "")).split())


@dataclass
class Run:
    root: Path  # the folder this run writes (the scratch worktree), or the vault itself on a dry run
    model: ServedModel | None  # None on a dry run, which asks the model nothing
    say: Callable[[str], object]  # say(message): a log line
    sessions: list[dict] = field(default_factory=list)
    segments: list[dict] = field(default_factory=list)
    facts: list[dict] = field(default_factory=list)
    routes: dict[str, str] = field(default_factory=dict)  # entity -> article name
    new: dict[str, dict] = field(default_factory=dict)  # article name -> {"kind", "facts"}
    placements: dict[str, list[tuple[str, dict]]] = field(default_factory=dict)  # article -> [(section, fact)]
    touched: set[str] = field(default_factory=set)
    created: list[str] = field(default_factory=list)
    asked: int = 0
    covered: str | None = None  # updatedAt of the last session this run read whole


def _ask(run: Run, system: str, user: str, schema: dict, max_tokens: int) -> dict | None:
    assert run.model is not None  # only a dry run has no model, and it asks nothing
    run.asked += 1
    text, finish = run.model.complete([{"role": "system", "content": system}, {"role": "user", "content": user}],
                                      schema, max_tokens, temperature=0.0)
    if finish == "length":
        run.say("the model's answer was cut off at its length limit; skipped")
        return None
    try:
        value = json.loads(text)
    except ValueError:
        run.say(f"the model's answer did not parse; skipped: {text[:80]!r}")
        return None
    return value if isinstance(value, dict) else None


def _parallel(fn, items: list) -> list:
    with ThreadPoolExecutor(PARALLEL) as pool:
        return list(pool.map(fn, items))


def clean_name(raw: str) -> str | None:
    """An entity as an article name: words only, single spaces, first letter up."""
    name = " ".join(_CLEAN.sub(" ", raw or "").split())[:60].strip(" -'")
    if len(name) < 2 or not re.search(r"[^\W\d_]", name):
        return None
    name = name[0].upper() + name[1:]
    try:
        return vault.check_name(name)
    except vault.VaultError:
        return None


# -- ingest, segment -----------------------------------------------------------
def ingest(run: Run, sessions: list[dict]) -> str:
    run.sessions = [s for s in sessions if any(m.get("content", "").strip() for m in s.get("messages", []))]
    messages = sum(len(s["messages"]) for s in run.sessions)
    return f"{len(run.sessions)} chat session(s), {messages} message(s)"


def segment(run: Run, limit: int) -> str:
    """One segment per question and its answer, long ones cut into pieces."""
    for session in run.sessions:
        if len(run.segments) >= limit:
            break
        turns: list[list[dict]] = []
        current: list[dict] = []
        for message in session["messages"]:
            if message["role"] == "user" and current:
                turns.append(current)
                current = []
            current.append(message)
        if current:
            turns.append(current)
        for turn in turns:
            text = "\n".join(f"{m['role'].capitalize()}: {' '.join(m['content'].split())}" for m in turn)
            for start in range(0, len(text), SEGMENT_CHARS):
                run.segments.append({"session": session["id"], "title": session.get("title") or session["id"],
                                     "date": (session.get("updatedAt") or "")[:10],
                                     "text": text[start:start + SEGMENT_CHARS]})
        run.covered = session.get("updatedAt")
    read = len({s["session"] for s in run.segments})
    left = len(run.sessions) - read
    if left:  # whole sessions wait for the next run; the vault's mark moves only past what was read
        run.sessions = run.sessions[:read]
    del run.segments[limit:]
    return f"{len(run.segments)} segment(s)" + (f"; {left} session(s) over the run's cap of {limit} segments "
                                                f"are left for the next run" if left else "")


# -- extract -------------------------------------------------------------------
EXTRACT_SYSTEM = ("Extract lasting facts for a personal wiki from this chat excerpt. "
                  "Each fact names one entity (a person, place, project, concept, event or thing) "
                  "and states one short fact about it.")
EXTRACT_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["facts"], "properties": {
    "facts": {"type": "array", "maxItems": 2, "items": {
        "type": "object", "additionalProperties": False, "required": ["entity", "kind", "fact"],
        "properties": {"entity": text_schema(24), "kind": {"type": "string", "enum": list(vault.KINDS)},
                       "fact": text_schema(60)}}}}}


def extract(run: Run) -> str:
    def one(seg: dict) -> list[dict]:
        answer = _ask(run, EXTRACT_SYSTEM, seg["text"], EXTRACT_SCHEMA, 280)
        out = []
        items = (answer or {}).get("facts")
        for item in items if isinstance(items, list) else []:
            if not isinstance(item, dict):
                continue
            name, fact = clean_name(plain(item.get("entity"))), plain(item.get("fact"))
            if name and len(fact) >= 3:
                out.append({"entity": name, "kind": item.get("kind", "thing"), "fact": fact,
                            "session": seg["session"], "title": seg["title"], "date": seg["date"]})
        return out

    seen = set()
    for found in _parallel(one, run.segments):
        for fact in found:
            key = (fact["entity"].casefold(), fact["fact"].casefold())
            if key not in seen:
                seen.add(key)
                run.facts.append(fact)
    entities = {f["entity"] for f in run.facts}
    return f"{len(run.facts)} fact(s) about {len(entities)} entit{'y' if len(entities) == 1 else 'ies'}"


# -- route -----------------------------------------------------------------------
ROUTE_SYSTEM = "Choose the wiki article this entity belongs in, or the new-article option if none fits."


def route(run: Run, index_path: Path) -> str:
    existing = {n.casefold(): n for n in vault.articles(run.root)}
    entities = list(dict.fromkeys(f["entity"] for f in run.facts))
    asks = []
    for entity in entities:
        if entity.casefold() in existing:
            run.routes[entity] = existing[entity.casefold()]
            continue
        candidates = []
        if existing:
            found = index.search(run.root, index_path, entity, "articles", 20)
            candidates = [s["article"] for s in found["summaries"][:5]]
        if candidates:
            asks.append((entity, candidates))
        else:
            run.routes[entity] = entity

    def one(item):
        entity, candidates = item
        facts = "; ".join(f["fact"] for f in run.facts if f["entity"] == entity)[:200]
        schema = {"type": "object", "additionalProperties": False, "required": ["article"],
                  "properties": {"article": {"type": "string", "enum": candidates + [NEW]}}}
        answer = _ask(run, ROUTE_SYSTEM, f"Entity: {entity}\nFacts: {facts}", schema, 100)
        chosen = (answer or {}).get("article")
        return entity, chosen if chosen in candidates else NEW  # only what was offered (grammar off, too)

    for entity, chosen in _parallel(one, asks):
        run.routes[entity] = entity if chosen == NEW else chosen
    for fact in run.facts:
        target = run.routes[fact["entity"]]
        if target.casefold() in existing:
            run.placements.setdefault(existing[target.casefold()], [])
        else:  # names that differ only in case are one article
            key = next((k for k in run.new if k.casefold() == target.casefold()), target)
            run.new.setdefault(key, {"kind": fact["kind"], "facts": []})["facts"].append(fact)
    return (f"{len(run.new)} new article(s), facts for {len(run.placements)} existing article(s); "
            f"asked the model about {len(asks)} entit{'y' if len(asks) == 1 else 'ies'}")


# -- create ----------------------------------------------------------------------
def _sources(facts: list[dict]) -> list[str]:
    seen: dict[str, str] = {}
    for f in facts:
        seen.setdefault(f["session"], f"- Chat “{f['title']}” ({f['date'] or 'undated'}, session {f['session']})")
    return list(seen.values())


def create(run: Run) -> str:
    folder = run.root / vault.ARTICLES
    folder.mkdir(exist_ok=True)
    for name, item in run.new.items():
        if clean_name(name) != name:  # every name was cleaned; checked again before it names a file
            run.say(f"skipped an unusable article name {name[:40]!r}")
            continue
        path = folder / f"{name}.md"
        if path.exists():  # a name that differs only in case from an article written meanwhile
            run.placements.setdefault(path.stem, [])
            continue
        facts = item["facts"]
        lines = ["---", f"kind: {item['kind'] if item['kind'] in vault.KINDS else 'thing'}", "---", f"# {name}", "",
                 f"{facts[0]['fact']}", "", f"## {FACTS}", ""]
        lines += [f"- {f['fact']}" for f in facts] + ["", f"## {SOURCES}", ""] + _sources(facts) + [""]
        vault.write_text(path, "\n".join(lines))
        run.created.append(name)
        run.touched.add(name)
    shown = ", ".join(run.created[:8]) + (f" and {len(run.created) - 8} more" if len(run.created) > 8 else "")
    return f"created {len(run.created)} article(s)" + (f": {shown}" if run.created else "")


# -- section-route, patch ---------------------------------------------------------
SECTION_SYSTEM = "Choose the section of the wiki article where this fact belongs."


def section_route(run: Run) -> str:
    asks = []
    for article in run.placements:
        text = (run.root / vault.ARTICLES / f"{article}.md").read_text(encoding="utf-8", errors="replace")
        titles = [h["title"] for h in vault.structure(text) if h["level"] == 2 and h["title"] != SOURCES]
        for fact in run.facts:
            if run.routes.get(fact["entity"], "").casefold() != article.casefold():
                continue
            if len(titles) <= 1:
                run.placements[article].append((titles[0] if titles else FACTS, fact))
            else:
                asks.append((article, titles, fact))

    def one(item):
        article, titles, fact = item
        options = list(dict.fromkeys(titles + [FACTS]))
        schema = {"type": "object", "additionalProperties": False, "required": ["section"],
                  "properties": {"section": {"type": "string", "enum": options}}}
        answer = _ask(run, SECTION_SYSTEM, f"Article: {article}\nFact: {fact['fact']}", schema, 100)
        section = (answer or {}).get("section")
        return article, section if section in options else FACTS, fact

    for article, section, fact in _parallel(one, asks):
        run.placements[article].append((section, fact))
    placed = sum(len(v) for v in run.placements.values())
    return f"{placed} fact(s) placed in sections; asked the model about {len(asks)}"


def _insert(lines: list[str], section: str, bullets: list[str]) -> list[str]:
    """Bullets at the end of `## section`, made (before Sources) when missing."""
    start = next((i for i, line in enumerate(lines) if line.strip() == f"## {section}"), None)
    if start is None:
        at = next((i for i, line in enumerate(lines) if line.strip() == f"## {SOURCES}"), len(lines))
        block = [f"## {section}", ""] + bullets + [""]
        if at and lines[at - 1].strip():
            block.insert(0, "")
        return lines[:at] + block + lines[at:]
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"^#{1,2}\s", lines[i])), len(lines))
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1
    return lines[:end] + bullets + lines[end:]


def patch(run: Run) -> str:
    added = 0
    for article, placed in run.placements.items():
        if not placed:
            continue
        path = run.root / vault.ARTICLES / f"{article}.md"
        text = path.read_text(encoding="utf-8", errors="replace")
        present = text.casefold()
        lines = text.rstrip("\n").split("\n")
        by_section: dict[str, list[str]] = {}
        for section, fact in placed:
            if fact["fact"].casefold() not in present:
                by_section.setdefault(section, []).append(f"- {fact['fact']}")
                present += "\n" + fact["fact"].casefold()
        if not by_section:
            continue
        for section, bullets in by_section.items():
            lines = _insert(lines, section, bullets)
            added += len(bullets)
        sources = [s for s in _sources([f for _, f in placed]) if s.split(", session ")[-1] not in text]
        if sources:
            lines = _insert(lines, SOURCES, sources)
        vault.write_text(path, "\n".join(lines) + "\n")
        run.touched.add(article)
    return f"added {added} fact(s) to {len([a for a in run.placements if a in run.touched])} article(s)"


# -- link, wikify ------------------------------------------------------------------
def link(run: Run) -> str:
    """Turn the first plain mention of another article's name into a wikilink."""
    names = sorted(vault.articles(run.root), key=len, reverse=True)
    linked = 0
    for article in sorted(run.touched):
        path = run.root / vault.ARTICLES / f"{article}.md"
        text = path.read_text(encoding="utf-8", errors="replace")
        skip = vault.split_front_matter(text)[2]
        lines = text.split("\n")
        already = {t.casefold() for t in vault.wikilinks(text)}
        for name in names:
            if name.casefold() == article.casefold() or name.casefold() in already or len(name) < 3:
                continue
            pattern = re.compile(r"(?<![\w\[|])(" + re.escape(name) + r")(?![\w\]])", re.IGNORECASE)
            for i in range(skip, len(lines)):
                line = lines[i]
                if line.startswith("#") or ", session " in line:
                    continue
                masked = re.sub(r"\[\[[^\]]*\]\]", lambda m: "\0" * len(m.group(0)), line)
                found = pattern.search(masked)
                if found is None:
                    continue
                shown = line[found.start():found.end()]
                target = f"[[{name}]]" if shown == name else f"[[{name}|{shown}]]"
                lines[i] = line[:found.start()] + target + line[found.end():]
                already.add(name.casefold())
                linked += 1
                break
        new = "\n".join(lines)
        if new != text:
            vault.write_text(path, new)
    return f"linked {linked} mention(s)"


WIKIFY_SYSTEM = "Write the opening sentence of a wiki article from its facts, and a short type label."
WIKIFY_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["lead", "type"],
                 "properties": {"lead": text_schema(160), "type": text_schema(30)}}


def wikify(run: Run) -> str:
    """A lead and an infobox type for each new article; then the vault's index page."""

    def one(name: str):
        facts = "; ".join(f["fact"] for f in run.new[name]["facts"])[:300]
        return name, _ask(run, WIKIFY_SYSTEM, f"Article: {name}\nFacts: {facts}", WIKIFY_SCHEMA, 220)

    improved = 0
    for name, answer in _parallel(one, [n for n in run.created]):
        if not answer:
            continue
        lead, label = plain(answer.get("lead")), plain(answer.get("type"))[:30].replace(":", " ")
        path = run.root / vault.ARTICLES / f"{name}.md"
        text = path.read_text(encoding="utf-8", errors="replace")
        fields, body, skip = vault.split_front_matter(text)
        lines = text.split("\n")
        if label and "type" not in fields and skip:
            lines.insert(1, f"type: {label}")
        current = vault.lead(body)
        if len(lead.split()) >= 3 and current and current in lines:
            lines[lines.index(current)] = lead
        new = "\n".join(lines)
        if new != text:
            vault.write_text(path, new)
            improved += 1
    _index_page(run.root)
    return f"wrote the lead or type of {improved} article(s); refreshed Meta/Index.md"


def _index_page(root: Path) -> None:
    groups: dict[str, list[str]] = {}
    for name in vault.articles(root):
        text = (root / vault.ARTICLES / f"{name}.md").read_text(encoding="utf-8", errors="replace")
        box = vault.infobox(vault.split_front_matter(text)[0]) or {"entity_kind": "thing"}
        groups.setdefault(box["entity_kind"], []).append(name)
    lines = ["# Index", "", "Every article in this vault, by kind (written by synthesis).", ""]
    for kind in vault.KINDS:
        if groups.get(kind):
            lines += [f"## {kind.capitalize()}", ""] + [f"- [[{n}]]" for n in groups[kind]] + [""]
    (root / vault.META).mkdir(exist_ok=True)
    vault.write_text(root / vault.META / "Index.md", "\n".join(lines))
