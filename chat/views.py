"""`/ws/chat` over plain HTTP: it only speaks WebSocket."""
from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from core.surfaces import API


def ws_chat_upgrade_required(request: HttpRequest) -> JsonResponse:
    return API.response(426, "/ws/chat is a WebSocket: connect with an Upgrade header",
                        headers={"Upgrade": "websocket", "Connection": "Upgrade"})
