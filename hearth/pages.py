"""The dashboard's pages, same-origin, from frontend/ (no CDN, no build
step): the shell at `/` (its pages are hash routes, `/#/chat`, drawn by
frontend/js/main.js), the Curve Designer at `/curves` and the Curve Terrain
at `/curve-terrain`. They are Django
views, so every access check applies (without a key a browser is sent to
sign in); their files come from WhiteNoise, as the shell's modules and
vendored libraries under `/assets/` do (hearth/static.py). Legacy page
paths redirect to the single page's hash routes."""
from __future__ import annotations

from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.views.decorators.http import require_safe

from hearth import static


@require_safe
def shell(request: HttpRequest) -> HttpResponse:
    return static.page(request, "app.html")


@require_safe
def curves(request: HttpRequest) -> HttpResponse:
    """The Curve Designer (drives POST /signal and POST /generate)."""
    return static.page(request, "curves.html")


@require_safe
def curve_terrain(request: HttpRequest) -> HttpResponse:
    """The HLG curve family as a surface (reads GET /curve-terrain/surface)."""
    return static.page(request, "curve-terrain.html")


def legacy(request: HttpRequest, page: str) -> HttpResponseRedirect:
    return HttpResponseRedirect(f"/#/{page}")
