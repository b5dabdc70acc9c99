"""The Curve Designer's wire format (`POST /signal`, `POST /generate`):
bodies read and checked, the default recipe, and the coherence heuristic
that marks a sample as junk. A refusal is a `CurveError` with its status and
the field at fault (the route answers it in OpenAI's error shape); nothing
here touches MLX."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from inference.engine import checks
from inference.engine.curve_sampler import X_MAX, X_MIN, DrawnCurve, Recipe
from inference.protocols import params
from inference.protocols.options import ServerDefaults

MAX_SAMPLES = 8
MAX_TOKENS = 256
MAX_POINTS = 64
MAX_SEED = checks.MAX_SEED - MAX_SAMPLES  # sample i draws with seed + i
FALLBACK_TEMPERATURE = 0.7  # default mode samples, unless the server or the model names a temperature
# The fields each body may hold; `model` is read by a router, which forwards the body to that model's process.
SIGNAL_FIELDS = ("prompt", "model")
GENERATE_FIELDS = ("prompt", "curve", "n", "max_tokens", "seed", "default", "model")


class CurveError(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.message, self.status, self.param = message, status, param


def known(body: dict, fields: tuple[str, ...]) -> None:
    """Refuse a field the route does not read, by its name: no option is taken and ignored."""
    for name in body:
        if name not in fields:
            raise CurveError(f"{name}: not a field of this route (it takes {', '.join(fields)})", param=name)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise CurveError("model: Input should be a valid string", param="model")


@dataclass(frozen=True)
class Ask:
    """A checked /generate body."""

    prompt: str
    curve: DrawnCurve | None  # None: default mode
    n: int
    max_tokens: int
    seed: int


def prompt(body: dict, max_chars: int) -> str:
    value = body.get("prompt")
    if not isinstance(value, str) or not value.strip():
        raise CurveError("prompt must be a non-empty string", param="prompt")
    if len(value) > max_chars:
        raise CurveError(f"prompt must be at most {max_chars} characters", param="prompt")
    return value


def _whole(body: dict, name: str, default: int, lo: int, hi: int) -> int:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise CurveError(f"{name} must be an integer from {lo} to {hi}", param=name)
    return value


def _point(raw, i: int) -> tuple[float, float]:
    """A point as `[x, y]` or `{"x": …, "y": …}`, both on the axis."""
    if isinstance(raw, dict):
        raw = [raw.get("x"), raw.get("y")]
    if not isinstance(raw, (list, tuple)) or len(raw) != 2 or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in raw):
        raise CurveError(f"curve.points[{i}] must be [x, y] or {{\"x\", \"y\"}} with finite numbers",
                         param=f"curve.points[{i}]")
    x, y = float(raw[0]), float(raw[1])
    if not (X_MIN <= x <= X_MAX and X_MIN <= y <= X_MAX):
        raise CurveError(f"curve.points[{i}] must lie within {X_MIN:g}..{X_MAX:g} on both axes",
                         param=f"curve.points[{i}]")
    return x, y


def curve(raw) -> DrawnCurve | None:
    """The drawn curve, or None when it has fewer than two points. Points
    must come in increasing x, and y must never go down: a curve that
    reorders tokens is refused."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("points", []), list):
        raise CurveError("curve must be an object with a list of points", param="curve")
    points = raw.get("points") or []
    if len(points) > MAX_POINTS:
        raise CurveError(f"curve takes at most {MAX_POINTS} points", param="curve.points")
    pts = [_point(p, i) for i, p in enumerate(points)]
    for i in range(1, len(pts)):
        if pts[i][0] <= pts[i - 1][0]:
            raise CurveError(f"curve is not monotone: points must come in increasing x (point {i} at "
                             f"x={pts[i][0]:g} is not right of point {i - 1} at x={pts[i - 1][0]:g})",
                             param=f"curve.points[{i}]")
        if pts[i][1] < pts[i - 1][1]:
            raise CurveError(f"curve is not monotone: point {i} (y={pts[i][1]:g}) is below point {i - 1} "
                             f"(y={pts[i - 1][1]:g})", param=f"curve.points[{i}]")
    return DrawnCurve(tuple(pts)) if len(pts) >= 2 else None


def ask(body: dict, max_chars: int) -> Ask:
    known(body, GENERATE_FIELDS)
    text = prompt(body, max_chars)
    drawn = curve(body.get("curve"))
    default = body.get("default", False)
    if not isinstance(default, bool) and default is not None:
        raise CurveError("default must be a boolean", param="default")
    n = _whole(body, "n", 3, 1, MAX_SAMPLES)
    most = _whole(body, "max_tokens", 80, 1, MAX_TOKENS)
    seed = _whole(body, "seed", 0, 0, MAX_SEED)
    return Ask(text, None if default else drawn, n, most, seed)


def recipe(defaults: ServerDefaults, generation_config: dict, vocab_size: int) -> Recipe:
    """Default mode's sampler: the server's flags over the model's
    generation_config.json, as a chat request naming no sampling field gets."""
    base = params.gen_defaults(defaults, generation_config)
    temperature = base.get("temperature")
    top_k = base.get("top_k") or 0
    return Recipe(temperature=FALLBACK_TEMPERATURE if temperature is None else float(temperature),
                  top_p=float(base.get("top_p") or 0.0), top_k=int(top_k) if top_k < vocab_size else 0)


def recipe_json(r: Recipe) -> dict:
    return {"temperature": r.temperature, "topP": r.top_p, "topK": r.top_k}


# -- coherence ------------------------------------------------------------------
_LOOP = re.compile(r"(.{2,40}?)\1{3,}", re.S)  # a piece of 2 to 40 characters four times in a row
_WORDISH = re.compile(r"[\w\s.,;:!?'\"()\-]")


def junk(text: str) -> bool:
    """Whether a sample reads as incoherent, by four checks, any of which
    trips it: nothing but whitespace; a U+FFFD (bytes that do not decode);
    a loop (one piece of 2 to 40 characters four times running); or
    symbol soup (under 70% of its characters are letters, digits, spaces
    or ordinary punctuation)."""
    if not text.strip() or "\ufffd" in text:
        return True
    if _LOOP.search(text):
        return True
    return len(_WORDISH.findall(text)) < 0.7 * len(text)
