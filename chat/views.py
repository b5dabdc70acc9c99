"""`/ws/chat` over plain HTTP: it only speaks WebSocket."""
from __future__ import annotations

from django.http import HttpRequest, JsonResponse


def ws_chat_upgrade_required(request: HttpRequest) -> JsonResponse:
    response = JsonResponse({"ok": False, "error": "/ws/chat is a WebSocket: connect with an Upgrade header"},
                            status=426)
    response["Upgrade"] = "websocket"
    response["Connection"] = "Upgrade"
    return response
