"""The saved Hugging Face write token and uploads made with it.

The token lives in HEARTH_HOME/hf.json, readable by this user only (0600);
nothing ever sends it back over the API."""
from __future__ import annotations

import json
import os
from pathlib import Path

from django.conf import settings


def token_path() -> Path:
    return settings.HEARTH_HOME / "hf.json"


def saved_token() -> str | None:
    try:
        token = json.loads(token_path().read_text()).get("token")
    except (OSError, ValueError, AttributeError):
        return None
    return token if isinstance(token, str) and token else None


def save_token(token: str) -> None:
    path = token_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # also when the file was left behind with other bits
        os.write(fd, json.dumps({"token": token}).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def forget_token() -> bool:
    try:
        token_path().unlink()
        return True
    except FileNotFoundError:
        return False


def push(folder: Path, repo_id: str, repo_type: str, private: bool) -> str:
    """Upload `folder` to `repo_id` (created if missing); the repo's URL."""
    from huggingface_hub import HfApi

    token = saved_token()
    if token is None:
        raise ValueError("no Hugging Face token saved; POST /api/settings/hf-token first")
    api = HfApi(token=token)
    url = api.create_repo(repo_id, repo_type=repo_type, private=private, exist_ok=True)
    api.upload_folder(repo_id=repo_id, repo_type=repo_type, folder_path=str(folder),
                      commit_message=f"Upload from Hearth ({folder.name})",
                      ignore_patterns=["*.tmp", ".DS_Store", "*_adapters.safetensors", "hf.json", "**/hf.json"])
    return str(url)
