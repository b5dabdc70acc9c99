"""HLG tone-curve sampling: a logits processor that reshapes each row's
logits with one monotone transfer curve before the sampler sees them.

The curve borrows its shape from hybrid log-gamma, the broadcast transfer
function that joins a logarithmic segment for the highlights to a power
segment for the shadows. Here the "highlights" are the tokens near the top
logit and the "shadows" the long tail. For one row, with m its largest
logit and d = m - logit >= 0 a token's depth below the top:

    knee(d)  = S * (ln(1 + e^((d - W) / S)) - ln(1 + e^(-W / S)))    S > 0
             = max(0, d - W)                                          S = 0
    upper(d) = F * d + (1 - F) * knee(d)                     (the log segment)
    toe(d)   = 0                          d <= P
             = (d - P)^2 / T              P < d <= P + T      (the power segment)
             = T + 2 * (d - P - T)        d > P + T
             (toe = 0 when T = 0)
    logit'   = m - upper(d) - toe(d)     (served as -upper(d) - toe(d): see below)

W is `width`, S `shoulder`, P `pivot_offset`, T `toe`, F = 1/16.

- Plateau (d up to about W): the softplus knee is nearly flat there, so
  tokens within W of the top keep only a small share of their gaps
  (at least F): near-ties are drawn more evenly.
- Shoulder: S sets how softly the plateau bends into the middle, where
  the slope returns to 1 (gaps kept as they were). S = 0 is a hard knee.
- Pivot and toe: from P below the top the quadratic toe adds depth, its
  slope growing from 0 to 2 over T logits and staying 2 beyond, so the
  long tail falls away about three times as fast as before.

The slope d(logit')/d(logit) is F + (1 - F) * sigmoid((d - W) / S) + toe'(d),
between F and 3 and never 0: the curve is strictly increasing, so the
order of tokens is kept and a masked token (-inf) stays masked. It is
computed in float32 relative to the top (the top token lands on 0, a shift
softmax does not see), in a form where every other token comes out strictly
below 0: the greedy token is exactly the one it was, near-ties included.
Temperature, top-p, top-k, min-p and XTC then act on the reshaped logits.
"""
from __future__ import annotations

import math
from dataclasses import fields, replace
from typing import Any

from inference.engine import checks
from inference.engine.errors import InvalidRequest
from inference.engine.types import HlgParams

FLOOR = 1 / 16  # the least share of a gap the plateau keeps: ranks never tie
SPANS = checks.HLG_SPANS
FIELDS = ("enabled", *SPANS)


def transfer(logits, params: HlgParams, xp=None):
    """The reshaped logits in float32 (any shape; the curve runs along the
    last axis), the top token of each row at 0. `xp` is the array module:
    MLX (the default, on the engine thread) or numpy, for which every
    function used here has the same name (the Curve Terrain draws the
    family with it, outside any engine)."""
    if xp is None:
        import mlx.core as xp

    logits = logits.astype(xp.float32)
    depth = xp.max(logits, axis=-1, keepdims=True) - logits
    out = FLOOR * depth + (1 - FLOOR) * _knee(depth, params.width, params.shoulder, xp)
    toe = params.toe
    if toe > 0:
        below = depth - params.pivot_offset
        bent = xp.where(below <= toe, below * below / toe, toe + 2 * (below - toe))
        out = out + xp.where(below > 0, bent, 0.0)
    return -out


MIN_SHOULDER = 1e-3


def _knee(depth, width: float, shoulder: float, xp):
    """knee(d) of the module docstring, written so that nothing cancels or
    overflows: within the width, S * ln(1 + c * (e^(d/S) - 1)) with
    c = 1 / (1 + e^(W/S)) is computed as S * log1p(e^(d/S + ln c) * -expm1(-d/S)),
    which is exactly 0 at the top and never below 0; beyond it, the softplus
    (d - W)/S + log1p(e^-(d-W)/S) less its value at d = 0."""
    if shoulder < MIN_SHOULDER:  # a knee sharper than float32 can bend: the hard one (S = 0)
        return xp.maximum(depth - width, 0.0)
    ratio = width / shoulder
    log_c = -(ratio + math.log1p(math.exp(-ratio)))  # ln(1 / (1 + e^(W/S))), without overflow
    at_top = math.log1p(math.exp(-ratio))  # the softplus at d = 0
    x = xp.minimum(depth, width) / shoulder
    inside = shoulder * xp.log1p(xp.exp(x + log_c) * -xp.expm1(-x))
    z = xp.maximum(depth - width, 0.0) / shoulder
    outside = shoulder * (z + xp.log1p(xp.exp(-z)) - at_top)
    return xp.where(depth <= width, inside, outside)


MOST_STEPS = 61  # curves in a terrain
MOST_POINTS = 161  # depths along each
MOST_DEPTH = 64.0  # logits below the top a terrain reaches


def terrain(params: HlgParams, vary: str, low: float, high: float, steps: int, depth: float, points: int) -> dict:
    """The HLG family as a surface: for `steps` values of the span `vary`
    from `low` to `high` (the other spans as in `params`), the curve's output
    at `points` depths from 0 to `depth` below the top. Raises
    InvalidRequest naming the first argument out of range."""
    import numpy as np

    if vary not in SPANS:
        raise InvalidRequest(f"vary must be one of {', '.join(SPANS)}, got {vary!r}", "vary")
    checks.integer("steps", steps, 2, MOST_STEPS)
    checks.integer("points", points, 2, MOST_POINTS)
    checks.finite("depth", depth, 1.0, MOST_DEPTH)
    checks.finite("low", low, 0.0, checks.MAX_HLG_SPAN)
    checks.finite("high", high, 0.0, checks.MAX_HLG_SPAN)
    if high <= low:
        raise InvalidRequest(f"high must be above low, got {low:g} to {high:g}", "high")
    checks.check_hlg(params, prefix="")
    depths = np.linspace(0.0, depth, points, dtype=np.float32)
    values = np.linspace(low, high, steps)
    changed: list[dict[str, Any]] = [{vary: float(v)} for v in values]
    rows = [transfer(-depths, replace(params, **span), xp=np).tolist() for span in changed]
    return {"vary": vary, "values": values.tolist(), "depths": depths.tolist(), "heights": rows,
            "params": {name: getattr(params, name) for name in SPANS}}


class HlgProcessor:
    """mlx-lm's logits-processor signature: (tokens so far, logits) -> logits."""

    def __init__(self, params: HlgParams):
        self.params = params

    def __call__(self, tokens, logits):
        return transfer(logits, self.params)


# -- `hearth serve --hlg-sampling` ----------------------------------------------
def parse_spec(text: str) -> HlgParams:
    """The server's HLG defaults from `key=value` pairs joined by commas
    (`width=3,toe=8`), keys among FIELDS; `on` (or nothing) is the built-in
    defaults, `off` holds them switched off. Given at all, the defaults are
    enabled unless `enabled=false`. Raises ValueError saying what is wrong."""
    words = text.strip().lower()
    if words in ("", "on", "true"):
        return HlgParams()
    if words in ("off", "false"):
        return HlgParams(enabled=False)
    given: dict[str, Any] = {}
    for part in (p.strip() for p in text.split(",")):
        key, sep, value = part.partition("=")
        key, value = key.strip().replace("-", "_"), value.strip()
        if not sep or key not in FIELDS:
            raise ValueError(f"expected key=value pairs with keys among {', '.join(FIELDS)}, got {part!r}")
        if key in given:
            raise ValueError(f"{key} is given twice")
        given[key] = _flag_value(key, value)
    params = replace(HlgParams(), **given)
    try:
        checks.check_hlg(params, prefix="")
    except InvalidRequest as exc:
        raise ValueError(str(exc)) from None
    return params


def _flag_value(key: str, value: str) -> bool | float:
    if key == "enabled":
        lowered = value.lower()
        if lowered not in ("true", "false", "on", "off", "1", "0", "yes", "no"):
            raise ValueError(f"enabled must be true or false, got {value!r}")
        return lowered in ("true", "on", "1", "yes")
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{key} must be a number, got {value!r}") from None


def canonical(text: str) -> str:
    """`text` checked and written out in full (the form the router hands its children)."""
    return spec_text(parse_spec(text))


def spec_text(params: HlgParams) -> str:
    """`parse_spec`'s input that stands for `params`."""
    parts = []
    for f in fields(params):
        value = getattr(params, f.name)
        parts.append(f"{f.name}={str(value).lower() if isinstance(value, bool) else f'{value:g}'}")
    return ",".join(parts)
