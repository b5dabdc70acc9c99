"""The chat model's read-only view of the default vault: memory_search,
memory_list, memory_read and memory_links. They return plain text for the
model; none of them can write."""
from __future__ import annotations

import functools
from pathlib import Path

from chat.tools import ToolError
from memory import git, index, vault

MAX_READ = 12_000
MAX_LIST = 300


def _fn(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


SPECS = [
    _fn("memory_search", "Search the user's memory vault (markdown articles and reference documents) "
        "for words; returns matching articles and the lines that match.",
        {"query": {"type": "string", "description": "words to look for"},
         "scope": {"type": "string", "enum": ["all", "articles", "reference"]},
         "limit": {"type": "integer", "description": "most line hits to return (default 20)"}}, ["query"]),
    _fn("memory_list", "List the articles and reference documents in the user's memory vault.", {}, []),
    _fn("memory_read", "Read one article (or Reference/<doc>) from the memory vault, whole or one section.",
        {"name": {"type": "string", "description": "article name, or Reference/<doc>"},
         "section": {"type": "string", "description": "a section heading or anchor (optional)"}}, ["name"]),
    _fn("memory_links", "The wikilinks of an article: articles it links to and articles linking to it.",
        {"name": {"type": "string"}}, ["name"]),
]
NAMES = tuple(spec["function"]["name"] for spec in SPECS)


def specs() -> list[dict]:
    """The tools to offer: none until a vault exists (they would only answer
    "no vault", and each spec costs prompt tokens on every turn)."""
    from memory import service  # Django; the specs above are importable without it

    row = service.find()
    if row is None or not Path(row.root).is_dir():
        return []
    return [dict(spec) for spec in SPECS]


def run(name: str, args: dict) -> str:
    """Run a memory tool; a failure raises ToolError, which the chat hands
    the model as the tool's result."""
    if name not in NAMES:
        raise ToolError(f"unknown memory tool {name!r}")
    if not isinstance(args, dict):
        raise ToolError("arguments must be an object")
    from memory import service

    row = service.find()
    if row is None or not Path(row.root).is_dir():
        raise ToolError("there is no memory vault yet (the user can create one on the Memory page)")
    try:
        return _RUN[name](Path(row.root), args)
    except (vault.VaultError, git.GitError) as exc:
        raise ToolError(str(exc)) from None


def register_chat_tools() -> None:
    """Offer these tools to the dashboard chat (called from memory's AppConfig)."""
    from chat.tools import register_provider

    register_provider(_chat_tools)


def _chat_tools() -> dict:
    from chat.tools import Tool

    out = {}
    for spec in specs():
        fn = spec["function"]
        out[fn["name"]] = Tool(fn["name"], fn.get("description", ""), fn.get("parameters") or {"type": "object"},
                               gated=False, run=functools.partial(run, fn["name"]))
    return out


def _search(root: Path, args: dict) -> str:
    query = args.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ToolError("query required")
    scope = args.get("scope") or "all"
    if scope not in ("all", "articles", "reference"):
        raise ToolError("scope must be all, articles or reference")
    limit = args.get("limit")
    if not isinstance(limit, int) or limit <= 0:
        limit = 20
    from memory import service

    found = service.search(root, query, scope, min(limit, 200))
    if not found["summaries"]:
        return f"No matches for {query!r}."
    lines = ["Articles: " + "; ".join(f"{s['article']} ({s['occurrences']}× {', '.join(s['matched_terms'])})"
                                      for s in found["summaries"][:20])]
    for hit in found["hits"]:
        where = f"{hit['article']}#{hit['anchor']}" if hit["anchor"] else hit["article"]
        lines.append(f"- {where} line {hit['line']}: {hit['excerpt']}")
    return "\n".join(lines)


def _list(root: Path, args: dict) -> str:
    names, refs = vault.articles(root), vault.references(root)
    more = f" (and {len(names) - MAX_LIST} more)" if len(names) > MAX_LIST else ""
    return (f"Articles ({len(names)}): " + (", ".join(names[:MAX_LIST]) or "none") + more
            + f"\nReference ({len(refs)}): " + (", ".join(refs[:MAX_LIST]) or "none"))


def _read(root: Path, args: dict) -> str:
    doc = vault.read_article(root, args.get("name"))
    text = doc["content"]
    section = args.get("section")
    if isinstance(section, str) and section.strip():
        wanted = section.strip().casefold()
        for part in index.sections(doc["name"], text):
            if part["anchor"] and (part["anchor"] == vault.slug(section) or part["title"].casefold() == wanted):
                text = part["body"]
                break
        else:
            titles = ", ".join(h["title"] for h in doc["structure"]) or "none"
            raise ToolError(f"{doc['name']} has no section {section!r} (sections: {titles})")
    if len(text) > MAX_READ:
        text = text[:MAX_READ] + f"\n… ({len(text) - MAX_READ} more characters; read one section)"
    return text


def _links(root: Path, args: dict) -> str:
    found = vault.links(root, args.get("name"))
    return (f"{found['name']} links to: {', '.join(found['outbound']) or 'nothing'}\n"
            f"Linked from: {', '.join(found['inbound']) or 'nothing'}"
            + (f"\nNot written yet: {', '.join(found['missing'])}" if found["missing"] else ""))


_RUN = {"memory_search": _search, "memory_list": _list, "memory_read": _read, "memory_links": _links}
