"""HLG tone-curve sampling: the curve itself (monotone, rank-keeping, the
formula), and the `hlg` request field through the app: both lanes, every
protocol, the server's --hlg-sampling defaults merged under it, and its 400s."""
from __future__ import annotations

import concurrent.futures
import math

import pytest

from tests.helpers import free_port
from tests.inproc import refusal

PROMPT = "The quick brown"
PLATEAU = {"width": 4, "shoulder": 4, "toe": 0, "pivot_offset": 6}  # compresses near-ties only
TOE = {"width": 0, "shoulder": 0, "toe": 1, "pivot_offset": 1}  # leaves the top alone, pushes the tail down


def depths(gaps: list[float], params: dict) -> list[float]:
    """Where the curve puts tokens `gaps` below the top (the top itself at 0)."""
    import mlx.core as mx

    from inference.engine.hlg import transfer
    from inference.engine.types import HlgParams

    return transfer(mx.array([0.0, *(-g for g in gaps)]), HlgParams(**params)).tolist()[1:]


# -- the curve ------------------------------------------------------------------------------------

@pytest.mark.parametrize("params", [{}, PLATEAU, TOE, {"shoulder": 0}, {"width": 64, "shoulder": 0.01},
                                    {"shoulder": 1e-40}, {"shoulder": 1e-3}, {"width": 0, "shoulder": 0, "toe": 0}])
def test_the_curve_is_strictly_increasing_and_keeps_the_top(params):
    import mlx.core as mx

    from inference.engine.hlg import FLOOR, transfer
    from inference.engine.types import HlgParams

    mx.random.seed(1)
    logits = mx.random.normal((4, 2000)) * 8
    out = transfer(logits, HlgParams(**params))
    order = mx.argsort(logits, axis=-1)
    before = mx.take_along_axis(logits, order, axis=-1)
    after = mx.take_along_axis(out, order, axis=-1)
    assert mx.all(mx.diff(after, axis=-1) >= 0).item()  # the order is kept (float32 may round a 1-ulp gap away)
    apart = mx.diff(before, axis=-1) > 0.05  # gaps wide enough for float32 to measure a slope
    slopes = mx.diff(after, axis=-1) / mx.maximum(mx.diff(before, axis=-1), 1e-9)
    assert mx.all(mx.where(apart, (slopes >= FLOOR * 0.99) & (slopes <= 3.01), True)).item()
    assert mx.array_equal(mx.argmax(out, axis=-1), mx.argmax(logits, axis=-1)).item()
    assert mx.all(mx.max(out, axis=-1) == 0).item()  # the top token lands on 0
    masked = transfer(mx.array([[1.0, -mx.inf, 0.5]]), HlgParams(**params))
    assert masked[0, 1].item() == -math.inf and math.isfinite(masked[0, 2].item())
    # A near-tie one float32 step below the top stays strictly below it: greedy keeps its token.
    for top in (0.3, 7.0, 31.0):
        below = float(mx.array(top).view(mx.int32).__add__(-1).view(mx.float32).item())
        near = transfer(mx.array([below, top, top - 50.0]), HlgParams(**params)).tolist()
        assert near[1] == 0 and near[0] < 0 and near[2] < near[0], (top, near)
        assert mx.isfinite(mx.array(near[:2])).all().item()


def test_the_formula():
    # Hard knee, no toe: gaps within the width keep 1/16, the rest beyond it in full.
    assert depths([2.0, 6.0], {"width": 4, "shoulder": 0, "toe": 0}) == pytest.approx([-2 / 16, -(4 / 16 + 2)])
    # The toe alone (width and shoulder 0 leave the top as it was): quadratic, then slope 3 in all.
    got = depths([1.0, 1.5, 3.0], TOE)
    assert got == pytest.approx([-1.0, -(1.5 + 0.25), -(3.0 + 1 + 2 * 1)])
    # The soft knee: softplus, shifted so the top stays at 0.
    s, w, d = 4.0, 4.0, 3.0
    knee = s * (math.log1p(math.exp((d - w) / s)) - math.log1p(math.exp(-w / s)))
    assert depths([d], {"width": w, "shoulder": s, "toe": 0}) == pytest.approx([-(d / 16 + 15 / 16 * knee)], rel=1e-5)


def test_the_server_flag_spec():
    from inference.engine.hlg import canonical, parse_spec
    from inference.engine.types import HlgParams

    assert parse_spec("on") == parse_spec("") == HlgParams()
    assert parse_spec("off") == HlgParams(enabled=False)
    assert parse_spec("width=3, toe=8") == HlgParams(width=3, toe=8)
    assert parse_spec("enabled=false,pivot-offset=2") == HlgParams(enabled=False, pivot_offset=2)
    assert canonical("toe=2") == "enabled=true,width=4,shoulder=4,toe=2,pivot_offset=6"
    for bad, message in (("width", "key=value"), ("depth=3", "key=value"), ("width=x", "width must be a number"),
                         ("width=-1", "width must be between 0 and 64"), ("toe=1,toe=2", "given twice"),
                         ("enabled=maybe", "true or false"), ("shoulder=nan", "finite")):
        with pytest.raises(ValueError, match=message):
            parse_spec(bad)


def test_the_router_hands_the_flag_to_every_model():
    from hearth.router_mode import child_args

    spec = "enabled=true,width=3,shoulder=4,toe=6,pivot_offset=6"
    args = child_args({"hlg_sampling": spec, "batch": 2})
    assert args[args.index("--hlg-sampling") + 1] == spec


def test_a_bad_flag_stops_serve_before_loading():
    message = refusal("some/model", "--hlg-sampling", "width=99", "--port", str(free_port()))
    assert "--hlg-sampling" in message and "between 0 and 64" in message


# -- on a server ----------------------------------------------------------------------------------

@pytest.fixture
def app(served):
    """The serving stack in this process, with `hearth serve`'s defaults."""
    return served()


def first_step(app, **fields) -> tuple[list[int], list[float], int]:
    """The first token's top-11 ids and logprobs (after the processors), and the greedy text's ids."""
    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "top_logprobs": 11, **fields}
    r = app.post("/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    top = content[0]["top_logprobs"]
    return [t["id"] for t in top], [t["logprob"] for t in top], [e["id"] for e in content]


def check_curve(plain: list[float], shaped: list[float], params: dict) -> None:
    """The shaped logprobs sit below their top where the curve puts the plain ones' gaps."""
    gaps = [plain[0] - p for p in plain[1:]]
    assert [p - shaped[0] for p in shaped[1:]] == pytest.approx(depths(gaps, params), abs=2e-3)


def test_hlg_reshapes_the_distribution_and_keeps_greedy(app):
    ids, plain, greedy = first_step(app)
    flat_ids, flat, flat_greedy = first_step(app, hlg=PLATEAU)
    toe_ids, toed, toe_greedy = first_step(app, hlg=TOE)
    assert flat_ids == ids == toe_ids  # the ranking is kept ...
    assert flat_greedy == greedy == toe_greedy  # ... so greedy decoding is unchanged
    check_curve(plain, flat, PLATEAU)
    check_curve(plain, toed, TOE)
    # The plateau spreads the mass over the near-ties: the top token gets less; the toe takes the
    # tail's share away: it gets more.
    assert flat[0] < plain[0] - 0.05 and flat[1] - flat[0] > plain[1] - plain[0]
    assert toed[0] > plain[0] + 0.05
    assert first_step(app, hlg={**PLATEAU, "enabled": False})[1] == pytest.approx(plain, abs=1e-4)


def test_rows_of_one_batch_keep_their_own_curves(app):
    """Sent together, the rows share batched steps; each gets its own processor."""
    asks = [{}, {"hlg": PLATEAU}, {"hlg": TOE}, {}, {"hlg": PLATEAU}, {"hlg": TOE}]
    with concurrent.futures.ThreadPoolExecutor(len(asks)) as pool:
        got = list(pool.map(lambda fields: first_step(app, max_tokens=40, **fields)[1], asks))
    plain = got[0]
    for fields, shaped in zip(asks, got, strict=True):
        if "hlg" in fields:
            check_curve(plain, shaped, fields["hlg"])
        else:
            assert shaped == pytest.approx(plain, abs=1e-4)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"])
def test_every_protocol_takes_hlg_and_names_the_bad_field(app, path):
    body = {"messages": [{"role": "user", "content": "hi"}], "prompt": "hi", "input": "hi", "max_tokens": 3,
            "max_output_tokens": 3}
    ok = app.post(path, json={**body, "hlg": {"enabled": True, "width": 2}}, timeout=60)
    assert ok.status_code == 200, ok.text
    for hlg, name, message in (({"width": -1}, "hlg.width", "hlg.width must be between 0 and 64"),
                               ({"toe": "big"}, "hlg.toe", "hlg.toe must be a finite number"),
                               ({"enabled": 1}, "hlg.enabled", "hlg.enabled must be a boolean"),
                               ({"depth": 2}, "hlg.depth", "hlg.depth is not an hlg field"),
                               ("on", "hlg", "hlg must be an object")):
        r = app.post(path, json={**body, "hlg": hlg}, timeout=60)
        assert r.status_code == 400, (hlg, r.text)
        error = r.json()["error"]
        assert message in error["message"], (hlg, error)
        if path == "/v1/messages":
            assert r.json()["type"] == "error" and error["type"] == "invalid_request_error"
        else:
            assert error["param"] == name


def test_request_fields_merge_over_the_server_defaults(served):
    """The serial lane, with server defaults that leave the top alone and push the tail down."""
    app = served("--no-worker", "--batch", "1", "--hlg-sampling", ",".join(f"{k}={v}" for k, v in TOE.items()))
    ids, plain, greedy = first_step(app, hlg={"enabled": False})  # off for this request
    assert first_step(app)[1:] == first_step(app, hlg={})[1:]  # no field, or an empty one: the defaults
    default_ids, shaped, default_greedy = first_step(app)
    assert default_ids == ids and default_greedy == greedy  # the serial lane keeps greedy too
    check_curve(plain, shaped, TOE)
    # One field over the defaults: the other three stay the server's.
    _, merged, _ = first_step(app, hlg={"toe": 3})
    check_curve(plain, merged, {**TOE, "toe": 3})
    _, identity, _ = first_step(app, hlg={"toe": 0})  # width 0, shoulder 0, no toe: the curve is the identity
    assert identity == pytest.approx(plain, abs=1e-4)
    chat = app.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                   "max_tokens": 3, "hlg": {"enabled": False}}, timeout=60)
    assert chat.status_code == 200


def test_the_curve_runs_after_the_grammar_mask(app):
    """With the curve on, the grammar's masked tokens stay masked: constrained
    output is still one of the choices."""
    choices = ["alpha", "beta", "gamma delta"]
    seen = set()
    for seed in range(6):
        body = {"messages": [{"role": "user", "content": "Pick one"}], "max_tokens": 20, "seed": seed,
                "temperature": 1.5, "guided_choice": choices,
                "hlg": {"width": 6, "shoulder": 1, "toe": 2, "pivot_offset": 8}}
        r = app.post("/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        seen.add(r.json()["choices"][0]["message"]["content"])
    assert seen <= set(choices) and seen
