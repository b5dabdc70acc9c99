"""The Curve Designer's bodies through the app in this process: a field the
route does not read is a 400 naming it, and every refusal names its field in
`param`, as the other OpenAI-shaped routes do; `model` (what a router reads
to pick the model's process) is taken."""
from __future__ import annotations

import pytest

PROMPT = "Tell me about tides."


@pytest.mark.parametrize("path,fields,param", [
    ("/signal", {"temperature": 0.5}, "temperature"),
    ("/generate", {"n": 1, "max_tokens": 2, "temprature": 0.5}, "temprature"),
    ("/generate", {"n": 1, "max_tokens": 2, "model": 7}, "model"),
    ("/signal", {"prompt": ""}, "prompt"),
    ("/generate", {"n": 9}, "n"),
    ("/generate", {"max_tokens": 0}, "max_tokens"),
    ("/generate", {"default": "yes"}, "default"),
    ("/generate", {"curve": [[-20, -20], [0, 0]]}, "curve"),
    ("/generate", {"curve": {"points": [[-20, -5], [-10, -8], [0, 0]]}}, "curve.points[1]"),
    ("/generate", {"curve": {"points": [[-30, -5], [0, 0]]}}, "curve.points[0]"),
    ("/generate", {"prompt": "tides and moons " * 2000, "max_tokens": 8}, "prompt"),
])
def test_a_refusal_names_its_field(served, path, fields, param):
    app = served()
    r = app.post(path, json={"prompt": PROMPT, **fields})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    assert param.partition(".")[0] in error["message"], error
    assert r.headers["access-control-allow-origin"] == "*"


def test_the_model_field_is_taken(served):
    app = served()
    signal = app.post("/signal", json={"prompt": PROMPT, "model": "any"})
    assert signal.status_code == 200 and len(signal.json()["bins"]) == 80, signal.text
    out = app.post("/generate", json={"prompt": PROMPT, "n": 1, "max_tokens": 2, "model": "any"})
    assert out.status_code == 200 and len(out.json()["samples"]) == 1, out.text
