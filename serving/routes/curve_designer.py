"""`POST /signal` and `POST /generate`: the Curve Designer's backends (the
page is `GET /curves`, hearth/pages.py); `GET /curve-terrain/surface`: the
HLG curve family as a surface for the Curve Terrain (`GET /curve-terrain`),
pure arithmetic on the server's HLG defaults, no model needed, so the
router answers it itself.

Both answer any origin (`access-control-allow-origin: *`, preflights
included) so the page works opened from a file or another host; the API
key is still needed where keys are configured, sent as a header (a
preflight carries none, so hearth/access.py lets these two through
unchecked). Both run through `Engine.exclusive`: admission of serving
requests pauses, the rows running finish, and the work runs alone on the
engine thread (inference/engine/solo.py). In router mode the router
forwards them to the process of the model the body names (`model`, else
the default), like a /v1 request.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from django.http import HttpRequest, HttpResponse, JsonResponse

from core.surfaces import OPENAI
from inference.engine import curve_sampler, hlg
from inference.engine.engine import Engine
from inference.engine.errors import EngineError, InvalidRequest
from inference.engine.loader import LoadedModel
from inference.engine.types import HlgParams
from inference.protocols import chat, curve_bodies, params
from inference.protocols.errors import RequestError

log = logging.getLogger("hearth.api")

router = OPENAI.router(tags=["curves"])
CORS = {"Access-Control-Allow-Origin": "*", "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
        "Access-Control-Allow-Headers": "authorization, x-api-key, content-type", "Access-Control-Max-Age": "600"}
WAIT_S = 300.0  # how long a call waits for the running requests to finish before it gives up


def _answer(body: dict, status: int = 200) -> JsonResponse:
    return JsonResponse(body, status=status, headers=CORS)


def _refuse(message: str, status: int = 400, code: str | None = None, param: str | None = None) -> JsonResponse:
    """A refusal in OpenAI's error shape (the Curve Designer reads `error.message`), naming the field at fault."""
    return OPENAI.response(status, message, code, param=param, headers=CORS)


def prompt_tokens(model: LoadedModel, text: str) -> list[int]:
    """The prompt as one user turn in the model's chat template (the raw text
    for a model without one)."""
    if not getattr(chat.hf_tokenizer(model), "chat_template", None):
        return list(model.tokenizer.encode(text))
    try:
        tokens, _ = chat.build_prompt(model, [{"role": "user", "content": text}], None, {})
    except RequestError as exc:
        raise curve_bodies.CurveError(exc.message, param="prompt") from None
    return tokens


def _check_room(engine: Engine, tokens: list[int], generated: int) -> None:
    limit = engine.context_limit
    if limit is not None and len(tokens) + generated > limit:
        raise curve_bodies.CurveError(f"the prompt has {len(tokens)} tokens; with {generated} more it does not fit "
                                      f"this model's context of {limit} tokens", param="prompt")


async def _read(request: HttpRequest) -> dict:
    try:
        return await params.read_json_body(request.body, request.runtime.options.limits.max_json_depth)
    except RequestError:
        raise curve_bodies.CurveError("invalid JSON") from None


async def _alone(engine: Engine, fn):
    """`fn()` run with the model to itself; gives up (503) after WAIT_S."""
    future = asyncio.wrap_future(engine.exclusive(fn))
    try:
        return await asyncio.wait_for(future, WAIT_S)
    except TimeoutError:
        raise curve_bodies.CurveError("the model stayed busy with other requests; try again later", 503) from None


def _engine(request: HttpRequest) -> Engine:
    engine = request.runtime.engine
    if engine is None or engine.loaded is None:
        raise curve_bodies.CurveError("no model is loaded in this process; start it with `hearth serve`", 503)
    return engine


def _route(path: str, summary: str):
    """`work` as the POST route at `path` that answers its preflight and sends
    CORS headers on every answer, refusals included (so they bypass the API's
    error handlers). `work` reads the body with `curve_bodies`, whose messages
    the page shows as they are."""
    def register(work):
        async def view(request: HttpRequest) -> HttpResponse:
            if request.method == "OPTIONS":
                return HttpResponse(status=204, headers=CORS)
            try:
                return _answer(await work(request))
            except curve_bodies.CurveError as exc:
                return _refuse(exc.message, exc.status, param=exc.param)
            except EngineError as exc:  # closed, or too many calls waiting
                return _refuse(str(exc), exc.status)
        view.__name__ = work.__name__.lstrip("_")
        router.api_operation(["POST", "OPTIONS"], path, summary=summary, description=work.__doc__)(view)
        return work
    return register


@_route("/signal", "The next-token log-probability histogram of a prompt")
async def _signal(request: HttpRequest) -> dict:
    """`{"prompt"}` -> the next-token log-probability histogram."""
    body = await _read(request)
    curve_bodies.known(body, curve_bodies.SIGNAL_FIELDS)
    text = curve_bodies.prompt(body, request.runtime.options.limits.max_prompt_chars)
    engine = _engine(request)
    model = engine.loaded_model
    tokens = await asyncio.to_thread(prompt_tokens, model, text)
    _check_room(engine, tokens, 0)
    try:
        return await _alone(engine, lambda: curve_sampler.signal(model, tokens))
    except (curve_bodies.CurveError, EngineError):
        raise
    except Exception as exc:
        log.exception("/signal failed")
        raise curve_bodies.CurveError(f"signal failed: {exc}", 500) from None


@_route("/generate", "Samples of a prompt's continuation, by a drawn curve or the model's default recipe")
async def _generate(request: HttpRequest) -> dict:
    """n samples with the drawn curve, or the model's default recipe."""
    body = await _read(request)
    ask = curve_bodies.ask(body, request.runtime.options.limits.max_prompt_chars)
    engine = _engine(request)
    model = engine.loaded_model
    tokens = await asyncio.to_thread(prompt_tokens, model, ask.prompt)
    _check_room(engine, tokens, ask.max_tokens)
    recipe = curve_bodies.recipe(request.runtime.options.defaults, model.generation_config, model.vocab_size)
    try:
        samples = await _alone(engine, lambda: curve_sampler.generate(
            model, tokens, ask.n, ask.max_tokens, ask.seed, ask.curve, recipe))
    except (curve_bodies.CurveError, EngineError):
        raise
    except Exception as exc:
        log.exception("/generate failed")
        raise curve_bodies.CurveError(f"generate failed: {exc}", 500) from None
    texts = [model.tokenizer.decode(ids) for ids in samples]
    out: dict = {"mode": "default" if ask.curve is None else "curve"}
    if ask.curve is None:
        out["recipe"] = curve_bodies.recipe_json(recipe)
    return {**out, "n": ask.n, "seed": ask.seed,
            "samples": [{"text": t, "junk": curve_bodies.junk(t)} for t in texts]}



@router.api_operation(["GET", "OPTIONS"], "/curve-terrain/surface", summary="The HLG curve family as a surface")
def curve_terrain_surface(request: HttpRequest, vary: str = "width", low: float = 0.0, high: float = 12.0,
                          steps: int = 25, depth: float = 24.0, points: int = 97, width: float | None = None,
                          shoulder: float | None = None, toe: float | None = None,
                          pivot_offset: float | None = None) -> HttpResponse:
    """For `steps` values of one HLG span (`vary`: width, shoulder, toe or pivot_offset) from `low` to `high`,
    the curve's output at `points` depths from the top down to `depth` logits below it; the other spans are the
    server's `--hlg-sampling` defaults unless given. `{vary, values, depths, heights: [[...] per value], params}`."""
    if request.method == "OPTIONS":
        return HttpResponse(status=204, headers=CORS)
    given = {"width": width, "shoulder": shoulder, "toe": toe, "pivot_offset": pivot_offset}
    base = request.runtime.options.defaults.hlg or HlgParams()
    params = replace(base, enabled=True, **{k: v for k, v in given.items() if v is not None})
    try:
        return _answer(hlg.terrain(params, vary, low, high, steps, depth, points))
    except InvalidRequest as exc:
        return OPENAI.response(400, str(exc), param=exc.param, headers=CORS)
