"""GET /curve-terrain/surface and the page at /curve-terrain, in-process:
the HLG family as a surface, computed by the engine's own `hlg.transfer`
(numpy here, MLX in the engine: the same numbers), over the server's
`--hlg-sampling` defaults, with clear refusals and open CORS like the
Curve Designer's other backends."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def app(served):
    return served("--no-worker", "--hlg-sampling", "width=3,toe=8")


def test_the_surface_is_the_engines_curve_for_each_value(app):
    import mlx.core as mx

    from inference.engine.hlg import transfer
    from inference.engine.types import HlgParams

    r = app.get("/curve-terrain/surface", params={"vary": "shoulder", "low": 0, "high": 6, "steps": 4, "depth": 20,
                                                  "points": 41})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["vary"] == "shoulder" and body["values"] == [0.0, 2.0, 4.0, 6.0]
    assert body["params"] == {"width": 3.0, "shoulder": 4.0, "toe": 8.0, "pivot_offset": 6.0}  # the server's defaults
    assert len(body["depths"]) == 41 and body["depths"][0] == 0 and body["depths"][-1] == 20
    for value, row in zip(body["values"], body["heights"], strict=True):
        engine = transfer(-mx.array(body["depths"]), HlgParams(width=3, shoulder=value, toe=8)).tolist()
        assert max(abs(a - b) for a, b in zip(row, engine, strict=True)) < 1e-4
        assert row[0] == 0 and all(later < earlier for earlier, later in zip(row[:-1], row[1:], strict=True))
    wider = app.get("/curve-terrain/surface", params={"vary": "width", "steps": 2, "toe": 0}).json()
    assert wider["params"]["toe"] == 0 and len(wider["heights"]) == 2 and len(wider["depths"]) == 97


@pytest.mark.parametrize("query, message", [
    ({"vary": "temperature"}, "vary must be one of width, shoulder, toe, pivot_offset"),
    ({"steps": 1}, "steps must be between 2 and 61"), ({"points": 500}, "points must be between 2 and 161"),
    ({"low": 5, "high": 5}, "high must be above low"), ({"depth": 0.5}, "depth must be between 1 and 64"),
    ({"width": -1}, "width must be between 0 and 64"), ({"high": 99}, "high must be between 0 and 64"),
])
def test_refusals_name_the_argument(app, query, message):
    r = app.get("/curve-terrain/surface", params=query)
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text
    assert r.headers["access-control-allow-origin"] == "*"


def test_any_origin_may_read_it_and_the_page_is_uncached(app):
    pre = app.request("OPTIONS", "/curve-terrain/surface", headers={"Origin": "https://lab.example",
                                                                     "Access-Control-Request-Method": "GET"})
    assert pre.status_code == 204 and "GET" in pre.headers["access-control-allow-methods"]
    page = app.get("/curve-terrain")
    assert page.status_code == 200 and page.headers["cache-control"] == "no-store"
    assert "/assets/js/curve_terrain.js" in page.text and 'href="/curves"' in page.text
    assert 'href="/curve-terrain"' in app.get("/curves").text  # next to the Curve Designer
