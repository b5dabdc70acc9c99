"""A memory vault on disk: a git repository of markdown.

    articles/<Name>.md     one article per file, [[Wikilinks]] between them
    Reference/<doc>.md     documents the owner drops in (searchable, never rewritten)
    Meta/*.md              how the vault works (conventions, how Hearth writes it)
    README.md

An article may open with front matter that holds its infobox:

    ---
    type: Programming language
    kind: thing            (the entity kind: person, place, project, concept, event, thing)
    series: Hearth internals
    first release: 2023
    ---
    # Name
    The lead paragraph.
    ## A section

No Django here: the routes, the chat tools and the synthesis job all call
these functions with a root folder."""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from core.fs import write_atomically
from core.paths import PathRefused, read_text
from memory import git

ARTICLES, REFERENCE, META = "articles", "Reference", "Meta"
KINDS = ("person", "place", "project", "concept", "event", "thing")
MAX_NAME = 120
WIKILINK = re.compile(r"\[\[([^\[\]|#\n]+)(?:#([^\[\]|\n]*))?(?:\|([^\[\]\n]*))?\]\]")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_BAD_NAME = re.compile(r"[/\\\x00-\x1f\x7f]|^\.|^\s|\s$")

README = """# Memory vault

This folder is a personal wiki that Hearth keeps for you. It is a git
repository: every change Hearth makes is a commit by "Hearth", so you can
read it (`git log -p`), and undo it (`git revert <hash>`).

- `articles/`: one markdown article per file, linked with `[[Wikilinks]]`.
  Hearth writes these from your chat sessions (`hearth memory synthesize`).
- `Reference/`: drop your own documents here; they are searched, never rewritten.
- `Meta/`: how the vault is laid out and how Hearth writes it.

Edit anything by hand: search picks up your edits, and the next synthesis
commits them (as "Edits made outside Hearth") before it changes anything.
"""

CONVENTIONS = """# Conventions

- One article per file in `articles/`; the file name is the article name.
- The first line is `# Name`; the paragraph under it is the lead.
- Optional front matter (between `---` lines, before the title) is the
  infobox: `type`, `kind` (person, place, project, concept, event or thing),
  `series`, and any other `key: value` facts.
- Sections are `##` headings; facts go under the section they belong to.
- Link other articles with `[[Name]]`, `[[Name|shown text]]` or `[[Name#Section]]`.
"""

SYNTHESIS = """# Synthesis

`hearth memory synthesize` (or the Memory page's button) reads the chat
sessions changed since the last run and updates the articles in stages:
ingest, segment, extract, route, create, section-route, patch, link,
wikify. Each stage works in a scratch copy and lands here as one commit
only when it succeeds, so a crash or a cancel leaves the vault at its last
good commit.
"""

STARTER_FILES = {
    "README.md": README,
    f"{META}/Conventions.md": CONVENTIONS,
    f"{META}/Synthesis.md": SYNTHESIS,
    f"{ARTICLES}/.gitkeep": "",
    f"{REFERENCE}/.gitkeep": "",
}


class VaultError(ValueError):
    """A bad request against a vault (unknown article, bad name): the message says why."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


# -- set-up and status -------------------------------------------------------
MARKER = "hearth-vault"  # a file in .git: Hearth made this repository


def made_by_hearth(root: Path) -> bool:
    return (Path(root) / ".git" / MARKER).is_file()


def setup(root: Path, known: bool = False) -> dict:
    """Create what is missing, write nothing that exists, and make it a git
    repository with one initial commit. Running it again changes nothing.

    A folder that already holds a `.git` Hearth did not create is refused
    before git runs there (its history and its config, e.g. a
    core.fsmonitor command, are the owner's); `known` is a vault already
    recorded in the database whose repository carries no Hearth mark yet."""
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise VaultError(f"{root} exists and is not a folder")
    if os.path.lexists(root / ".git") and not made_by_hearth(root) and not (known and (root / ".git").is_dir()):
        raise VaultError(f"{root} already holds a git repository that Hearth did not create; "
                         "pick a new or empty folder for the vault", 409)
    created: list[str] = []
    if not root.exists():
        root.mkdir(parents=True)
        created.append(str(root))
    for rel, text in STARTER_FILES.items():
        path = root / rel
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, text)
        created.append(rel)
    initialized = False
    if not git.is_repo(root):
        git.run(root, "init", "-q", "-b", "main")
        initialized = True
    if not made_by_hearth(root):
        write_text(root / ".git" / MARKER, "This repository is a Hearth memory vault.\n")
    # Commit only the starter files: anything else the owner has staged stays theirs to commit.
    if git.head(root) is None:
        git.run(root, "add", "--", *STARTER_FILES)
        git.run(root, "commit", "-q", "--no-verify", "-m", "Start the memory vault", "--", *STARTER_FILES)
        initialized = True
    elif created:
        restored = [rel for rel in created if rel in STARTER_FILES]
        git.run(root, "add", "--", *restored)
        git.run(root, "commit", "-q", "--no-verify", "-m", "Restore the vault's starter files", "--", *restored)
    return {"root": str(root), "created": created, "git_initialized": initialized,
            "already_set_up": not created and not initialized}


def status(root: Path, recent: int = 10) -> dict:
    root = Path(root)
    articles = _docs(root / ARTICLES)
    recents = sorted(articles, key=lambda p: p.stat().st_mtime, reverse=True)[:recent]
    return {"root": str(root), "exists": root.is_dir(), "article_count": len(articles),
            "reference_count": len(_docs(root / REFERENCE)), "is_git_repo": git.is_repo(root),
            "recent_articles": [{"article": p.stem, "mtime_ms": int(p.stat().st_mtime * 1000)} for p in recents]}


def _docs(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    # Symlinks are left out: a vault cloned from elsewhere must not expose files outside it.
    # So are FIFOs, devices and sockets (is_file is False for them): they are never opened.
    return sorted(p for p in folder.glob("*.md") if p.is_file() and not p.is_symlink() and not p.name.startswith("."))


def read(path: Path) -> str:
    """The text of a vault document, opened only if it is a regular file
    (checked again on the opened descriptor): a FIFO put in place of an
    article would block the reader forever. Refusals are VaultErrors (400)."""
    try:
        return read_text(path, "article", encoding="utf-8", errors="replace")
    except PathRefused as exc:
        raise VaultError(str(exc)) from None


def articles(root: Path) -> list[str]:
    return [p.stem for p in _docs(Path(root) / ARTICLES)]


def references(root: Path) -> list[str]:
    return [f"{REFERENCE}/{p.stem}" for p in _docs(Path(root) / REFERENCE)]


# -- names and files -----------------------------------------------------------
def check_name(name) -> str:
    if not isinstance(name, str) or not name.strip():
        raise VaultError("name required")
    name = name.strip()
    if name.endswith(".md"):
        name = name[:-3]
    if len(name) > MAX_NAME or len(name.encode()) > 240 or _BAD_NAME.search(name) or name in (".", ".."):
        raise VaultError(f"{name[:MAX_NAME]!r} is not an article name (no slashes, no leading dot, "
                         f"at most {MAX_NAME} characters)")
    return name


def resolve(root: Path, name: str | None, allow_reference: bool = False) -> Path:
    """The file of an article (exact name, then ignoring case), or a 404."""
    root = Path(root)
    folder = root / ARTICLES
    if allow_reference and isinstance(name, str) and name.startswith(f"{REFERENCE}/"):
        folder, name = root / REFERENCE, name[len(REFERENCE) + 1:]
    name = check_name(name)
    path = folder / f"{name}.md"
    if path.is_file() and not path.is_symlink():
        return path
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        mode = None
    if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
        raise VaultError(f"article: {path} is not a regular file")
    lowered = name.casefold()
    for candidate in _docs(folder):
        if candidate.stem.casefold() == lowered:
            return candidate
    raise VaultError(f"no article {name!r}", 404)


def relpath(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix()


def write_text(path: Path, text: str) -> None:
    """Write through a temporary file and a rename, so a crash never leaves half a file."""
    write_atomically(path, text)


# -- the deterministic parts of an article ---------------------------------------
def split_front_matter(text: str) -> tuple[dict[str, str], str, int]:
    """(front matter as ordered key/values, the body, how many lines the front matter took)."""
    lines = text.split("\n")
    if not lines or lines[0].strip() != "---":
        return {}, text, 0
    for end in range(1, min(len(lines), 200)):
        if lines[end].strip() == "---":
            fields: dict[str, str] = {}
            for line in lines[1:end]:
                key, sep, value = line.partition(":")
                if sep and key.strip():
                    fields[key.strip()] = value.strip()
            return fields, "\n".join(lines[end + 1:]), end + 1
    return {}, text, 0


def slug(title: str) -> str:
    text = re.sub(r"\[\[([^\]|#]+)(?:#[^\]|]*)?(?:\|([^\]]*))?\]\]", lambda m: m.group(2) or m.group(1), title)
    text = re.sub(r"[^\w\s-]", "", text.casefold()).strip()
    return re.sub(r"[\s_]+", "-", text) or "section"


def structure(text: str) -> list[dict]:
    """Headings below the title: level, title, anchor and 1-based line in the file."""
    out: list[dict] = []
    fence = False
    seen: dict[str, int] = {}
    for number, line in enumerate(text.split("\n"), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
            continue
        match = None if fence else HEADING.match(line)
        if match and len(match.group(1)) > 1:
            anchor = slug(match.group(2))
            seen[anchor] = seen.get(anchor, 0) + 1
            if seen[anchor] > 1:
                anchor = f"{anchor}-{seen[anchor] - 1}"
            out.append({"level": len(match.group(1)), "title": match.group(2), "anchor": anchor, "line": number})
    return out


def lead(body: str) -> str:
    """The first paragraph after the title that is not a heading, list, table or quote."""
    paragraph: list[str] = []
    for line in body.split("\n"):
        stripped = line.strip()
        if stripped.startswith("#"):
            if paragraph:
                break
            continue
        if not stripped:
            if paragraph:
                break
            continue
        if not paragraph and stripped[0] in "-*|>`{" and not stripped.startswith("**"):
            continue
        paragraph.append(stripped)
    return " ".join(paragraph)


def infobox(fields: dict[str, str]) -> dict | None:
    if not fields:
        return None
    kind = fields.get("kind", "thing").strip().lower()
    rest = [{"key": k, "value": v} for k, v in fields.items() if k not in ("type", "kind", "series") and v]
    return {"type": fields.get("type") or None, "entity_kind": kind if kind in KINDS else "thing", "fields": rest}


def wikilinks(text: str) -> list[str]:
    """Link targets in order of first appearance."""
    seen: dict[str, None] = {}
    for match in WIKILINK.finditer(text):
        target = match.group(1).strip()
        if target:
            seen.setdefault(target, None)
    return list(seen)


def read_article(root: Path, name: str | None) -> dict:
    path = resolve(root, name, allow_reference=True)
    content = read(path)
    fields, body, _ = split_front_matter(content)
    shown = f"{REFERENCE}/{path.stem}" if path.parent.name == REFERENCE else path.stem
    return {"name": shown, "path": relpath(Path(root), path), "content": content, "infobox": infobox(fields),
            "lead": lead(body), "series": fields.get("series") or None, "structure": structure(content)}


def links(root: Path, name: str | None) -> dict:
    root = Path(root)
    path = resolve(root, name)
    names = articles(root)
    by_fold = {n.casefold(): n for n in names}
    outbound = [by_fold.get(t.casefold(), t) for t in wikilinks(read(path))]
    me = path.stem.casefold()
    inbound = []
    for other in _docs(root / ARTICLES):
        if other.stem.casefold() == me:
            continue
        try:
            targets = wikilinks(read(other))
        except VaultError:  # swapped for a FIFO since the listing: passed over, never opened
            continue
        if any(t.casefold() == me for t in targets):
            inbound.append(other.stem)
    return {"name": path.stem, "outbound": list(dict.fromkeys(outbound)), "inbound": inbound,
            "missing": [t for t in outbound if t.casefold() not in by_fold]}


# -- history -------------------------------------------------------------------
REV = re.compile(r"^[0-9a-f]{4,40}$")


def history(root: Path, name: str | None, limit: int) -> dict:
    root = Path(root)
    path = resolve(root, name)
    if not git.is_repo(root):
        return {"name": path.stem, "is_git_repo": False, "entries": []}
    out = git.run(root, "log", f"-n{limit}", "--follow", "--format=%H%x1f%ad%x1f%an%x1f%s", "--date=short",
                  "--", relpath(root, path))
    entries = []
    for line in out.splitlines():
        parts = line.split("\x1f")
        if len(parts) == 4:
            entries.append({"hash": parts[0], "date": parts[1], "author": parts[2], "subject": parts[3]})
    return {"name": path.stem, "is_git_repo": True, "entries": entries}


def diff(root: Path, name: str | None, rev: str | None) -> dict:
    root = Path(root)
    if not isinstance(rev, str) or not REV.match(rev):
        raise VaultError("rev must be a commit hash (4 to 40 lowercase hex digits)")
    path = resolve(root, name)
    if not git.is_repo(root):
        raise VaultError("this vault is not a git repository", 404)
    full = git.run(root, "rev-parse", "--verify", "-q", f"{rev}^{{commit}}", check=False).strip()
    if not full:
        raise VaultError(f"no commit {rev} in this vault", 404)
    # The article's path in that commit: history follows renames, so must this.
    at = relpath(root, path)
    log = git.run(root, "log", "--follow", "--format=%x00%H", "--name-only", "--", at)
    for block in log.split("\0")[1:]:
        lines = [line for line in block.split("\n") if line]
        if lines and lines[0] == full and len(lines) > 1:
            at = lines[1]
            break
    text = git.run(root, "show", "--format=", "--no-color", "--no-ext-diff", full, "--", at)
    if not text.strip():
        raise VaultError(f"commit {rev} did not change {path.stem!r}", 404)
    return {"name": path.stem, "rev": full, "diff": text}
