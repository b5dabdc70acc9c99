"""Vaults as the routes, the CLI and the chat tools see them: which vault a
request means, where its search index lives, and setting one up."""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

from django.db import transaction

from core import db, home
from core.paths import PathRefused, confine, holds_a_root
from memory import index, vault
from memory.models import MemoryVault

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
DEFAULT_NAME = "default"


def index_path(root: Path | str) -> Path:
    key = hashlib.sha256(str(Path(root).resolve()).encode()).hexdigest()[:16]
    return home.memory_index(key)


def find(name: str | None = None) -> MemoryVault | None:
    """The named vault, or the default one (the first made, when none is marked)."""
    if name:
        return MemoryVault.objects.filter(name=name).first()
    return MemoryVault.objects.filter(is_default=True).first() or MemoryVault.objects.order_by("created_at").first()


def no_vault(name: str | None = None) -> dict:
    """Why there is no vault, and where `init` would make it (None for a name it would refuse)."""
    root = home.vaults() / (name or DEFAULT_NAME) if not name or NAME.match(name) else None
    error = f"no memory vault named {name!r}" if name else "no memory vault yet"
    return {"ok": False, "enabled": False, "error": error, "root": str(root) if root else None}


def allowed_root(raw: str) -> Path:
    """A vault folder must resolve (symlinks followed) inside the allowed
    roots (core.paths), and be a folder of its own: not HEARTH_HOME or the
    hub cache, nor a folder above them."""
    try:
        resolved = confine(raw, "path")
    except PathRefused as exc:
        raise vault.VaultError(str(exc)) from None
    if holds_a_root(resolved):
        raise vault.VaultError("path must be a folder of its own, not HEARTH_HOME, the cache or a folder above them")
    return resolved


def init(path: str | None = None, name: str | None = None) -> tuple[MemoryVault, dict]:
    """Set up a vault on disk (idempotent) and record it; the first vault is the default."""
    if name is not None and (not isinstance(name, str) or not NAME.match(name)):
        raise vault.VaultError("name must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
    if path is not None and not isinstance(path, str):
        raise vault.VaultError("path must be a string")
    if path:
        root = allowed_root(path)
        name = name or re.sub(r"[^A-Za-z0-9._-]", "-", root.name).lstrip("._-")[:64] or DEFAULT_NAME
    else:
        name = name or DEFAULT_NAME
        root = (home.vaults() / name).resolve()
    for other in MemoryVault.objects.exclude(name=name):
        there = Path(other.root)
        if root != there and (root.is_relative_to(there) or there.is_relative_to(root)):
            raise vault.VaultError(f"{root} would nest with the vault {other.name!r} at {other.root}", 409)
    existing = MemoryVault.objects.filter(name=name).first()
    if existing is not None and Path(existing.root) != root:
        raise vault.VaultError(f"a vault named {name!r} already lives at {existing.root}", 409)
    other = MemoryVault.objects.filter(root=str(root)).exclude(name=name).first()
    if other is not None:
        raise vault.VaultError(f"{root} is already the vault {other.name!r}", 409)
    # A folder that already holds a git repository is only written to when Hearth made it (or recorded it).
    result = vault.setup(root, known=existing is not None)
    with transaction.atomic():
        db.serialize("memory.vaults")  # one first vault, the default, however many processes create one
        row = existing or MemoryVault.objects.create(name=name, root=str(root),
                                                      is_default=not MemoryVault.objects.exists())
    index.sync(root, index_path(root))
    return row, result


def search(root: Path, query: str, scope: str = "all", limit: int = 50, mode: str | None = None,
           engine=None) -> dict:
    """Full-text search; with `mode` "hybrid" (when `engine`, the served
    model, answers embeddings) fused with vector similarity over sections."""
    can_embed = engine is not None
    if mode not in (None, "", "fts", "hybrid"):
        raise vault.VaultError("mode must be fts or hybrid")
    if mode == "hybrid" and not can_embed:
        raise vault.VaultError("hybrid search needs a served model that answers embeddings "
                               "(an embedding model, or `hearth serve --embeddings`)")
    if mode != "hybrid":
        return index.search(root, index_path(root), query, scope, limit)
    from inference.engine.embed import embed_turns
    from memory import hybrid

    model = engine.loaded
    window = model.context_window or 4096

    def vectors(texts: list[str]) -> list[list[float]]:
        tokens = [(model.tokenizer.encode(t) or [0])[:window] for t in texts]
        # In turns of a prefill chunk, as /v1/embeddings runs: the streams being decoded go on between them.
        turns, out, done = embed_turns(model.model, tokens, engine.config.prefill_chunk), [], object()
        while (part := engine.call(lambda: model.adapters.base_only(lambda: next(turns, done)), 300.0)) is not done:
            out += part
        return out

    try:
        return hybrid.search(root, index_path(root), query, scope, limit, vectors, model.model_id)
    except Exception as exc:  # the engine is busy, shutting down, or failed: the words still find things
        found = index.search(root, index_path(root), query, scope, limit)
        return {**found, "note": f"vector search unavailable ({type(exc).__name__}: {exc}); full-text only"}
