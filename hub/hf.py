"""The saved Hugging Face write token and uploads made with it.

The token lives in HEARTH_HOME/hf.json, readable by this user only (0600);
nothing ever sends it back over the API."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from core import home
from core.fs import write_atomically
from core.paths import ADAPTER_FILES, is_inside

# Hugging Face tokens are "hf_" and 34 letters; room for longer ones, none for a pasted file.
TOKEN_MAX = 256


def saved_token() -> str | None:
    try:
        token = json.loads(home.hf_token().read_text()).get("token")
    except (OSError, ValueError, AttributeError):
        return None
    return token if isinstance(token, str) and token else None


def save_token(token: str) -> None:
    write_atomically(home.hf_token(), json.dumps({"token": token}), mode=0o600)  # this user only, whatever was there


def forget_token() -> bool:
    try:
        home.hf_token().unlink()
        return True
    except FileNotFoundError:
        return False


# The files each kind of artifact consists of: a push sends these, from the
# folder's top level only, never dotfiles, hf.json or anything else found there.
ARTIFACT_FILES = {
    "finetune": (*ADAPTER_FILES, "README.md"),
    "quantize": ("*.safetensors", "*.json", "*.jinja", "*.model", "*.tiktoken", "merges.txt", "vocab.txt",
                 "README.md", "LICENSE"),
    "dataset": ("*.jsonl", "*.csv", "*.parquet", "README.md"),
}
NEVER = ("hf.json", "*.tmp", "*_adapters.safetensors")  # the saved token; partial files; checkpoints


def describe_files(kind: str) -> str:
    return ", ".join(ARTIFACT_FILES[kind])


def artifact_files(folder: Path, kind: str) -> list[Path]:
    """The artifact's own files in `folder`: names the kind uses, each a
    regular file (an HF snapshot's symlinks into the cache's blobs count)
    that resolves inside the allowed roots."""
    from fnmatch import fnmatchcase

    out = []
    for path in sorted(folder.iterdir()):
        name = path.name
        if name.startswith(".") or any(fnmatchcase(name, p) for p in NEVER):
            continue
        if not any(fnmatchcase(name, p) for p in ARTIFACT_FILES[kind]):
            continue
        try:
            target = path.resolve(strict=True)
            regular = stat.S_ISREG(os.stat(target).st_mode)
        except (OSError, RuntimeError):
            continue
        if regular and is_inside(target):
            out.append(path)
    return out


def push(folder: Path, files: list[Path], repo_id: str, repo_type: str, private: bool) -> str:
    """Upload `files` (from `folder`) to `repo_id`, created if missing; the repo's URL."""
    from huggingface_hub import CommitOperationAdd, HfApi

    token = saved_token()
    if token is None:
        raise ValueError("no Hugging Face token saved; POST /api/settings/hf-token first")
    api = HfApi(token=token)
    url = api.create_repo(repo_id, repo_type=repo_type, private=private, exist_ok=True)
    operations = [CommitOperationAdd(path_in_repo=path.name, path_or_fileobj=str(path.resolve())) for path in files]
    api.create_commit(repo_id=repo_id, repo_type=repo_type, operations=operations,
                      commit_message=f"Upload from Hearth ({folder.name})")
    return str(url)
