"""`/api/settings/api-keys`: what the dashboard's Settings page says about
Hearth's API keys. Keys are set where `hearth serve` starts (`--api-key`,
`--api-key-file`, `HEARTH_API_KEY`; hearth/access_settings.py), never
through the API, so this route only reads: whether a key is needed here and
why, never a key or anything derived from one."""
from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest

from core.surfaces import API
from hearth import access
from hearth.root import RUNTIME as runtime

router = API.router(tags=["access"])


@router.get("/settings/api-keys")
def api_keys(request: HttpRequest) -> dict:
    """Whether every request needs an API key (`required`), whether the server
    was told to serve off loopback without one (`insecure_no_auth`), and whether
    it stands behind a reverse proxy (`behind_proxy`, which requires a key)."""
    return {"ok": True, "required": access.keys_required(), "insecure_no_auth": runtime.insecure_no_auth,
            "behind_proxy": bool(settings.HEARTH_BEHIND_PROXY)}
