"""The app-aware assistant: what the dashboard shows, and three tools that
read it, move it and point into it.

The browser sends a `context` frame on every route and wizard-step change:
the route, the wizard step, and a capped list of the page's visible
interactive elements (`{ref, label, kind, role?, selector, spotlightId?}`).
The socket keeps the last one and shares it with the chat session it has
open (`remember`), so a turn, which runs apart from any socket
(`chat/live.py`), reads the newest one for its session (`latest`).

While a session has a context, its turns get:
- an ambient line first in the system prompt (`[user is on: Quantize · step 2/3]`),
  never the whole snapshot;
- `get_current_app_context`, `navigate_app` and `spotlight_ui`, offered
  first and never gated: they change nothing on the machine. The last two
  write `ui_navigate` / `ui_spotlight` frames to the turn's stream; the
  browser moves or highlights. `spotlight_ui` may also fill one of the
  catalog's fields (`SPOTS`) with `value`, and only those: never the chat's
  own switches, and never submitting a form (starting a job stays the
  user's click). A catalog target goes to the page its element lives on
  (`Spot.route`), whatever route the model named.

A spotlight waits (UI_CONFIRM_S at most) for the dashboard's `ui_result`:
what it found, on which page, and the value the field took. The model
reads that: the result it was trained on when the control was found (and
the page, through the next round's ambient line), an error when it was
not, and "sent … no dashboard confirmed it" when no answer came.

A route outside `ROUTES` is a tool error the model reads; it never reaches
the browser."""
from __future__ import annotations

import json
from collections import OrderedDict
from typing import NamedTuple, TypeGuard

from chat.tools import Tool, check_args

# The dashboard's pages the assistant can take the user to (frontend/js/main.js has them all), with the
# names the user sees. The demo chat model is trained on exactly these (serving/demo/corpus.py, held to this
# list by tests/demo): Lineage joins them when the corpus is trained on it.
ROUTES = {"chat": "Chat", "status": "Status", "models": "Models", "memory": "Memory", "jobs": "Jobs",
          "finetune": "Fine-tune", "quantize": "Quantize", "dataset": "Dataset", "adapters": "Adapters",
          "settings": "Settings"}


class Spot(NamedTuple):
    route: str | None  # the page its element lives on; None: every page (the dock's message box)
    label: str


# Curated spotlight targets: elements the pages mark with `data-spot` (tests/chat/test_app_aware.py
# checks that the frontend marks every one).
SPOTS = {
    "quantize-source": Spot("quantize", "the model to quantize (Quantize, step 1)"),
    "quantize-mode": Spot("quantize", "uniform bits, a bits-per-weight target, or calibrated GPTQ/AWQ "
                                      "(Quantize, step 2)"),
    "quantize-bits": Spot("quantize", "bits per weight (Quantize, step 2)"),
    "quantize-group": Spot("quantize", "group size (Quantize, step 2)"),
    "quantize-calibration": Spot("quantize", "the calibration text for GPTQ or AWQ (Quantize, step 2)"),
    "finetune-model": Spot("finetune", "the base model (Fine-tune, step 1)"),
    "finetune-data": Spot("finetune", "the dataset folder (Fine-tune, step 2)"),
    "finetune-iters": Spot("finetune", "training iterations (Fine-tune, step 3)"),
    "finetune-rank": Spot("finetune", "LoRA rank (Fine-tune, step 3)"),
    "dataset-template": Spot("dataset", "the dataset template (Dataset, step 1)"),
    "chat-input": Spot(None, "the chat's message box"),
    "models-search": Spot("models", "search and download models (Models)"),
    "settings-keys": Spot("settings", "Hearth's API keys: whether this server needs one, how to set and send one "
                                      "(Settings)"),
    "settings-token": Spot("settings", "the Hugging Face token, for pushing to the Hub (Settings)"),
}
TOOL_NAMES = ("get_current_app_context", "navigate_app", "spotlight_ui")
MAX_ELEMENTS = 120
MAX_TEXT = 200  # characters of any one string in a context
MAX_RESULT = 8000  # characters of get_current_app_context's answer
MAX_SESSIONS = 1024  # sessions whose last context is kept
UI_CONFIRM_S = 5.0  # how long a spotlight waits for the dashboard's answer (a page change takes up to 2 s)

_latest: OrderedDict[str, dict] = OrderedDict()


class ContextRefused(ValueError):
    pass


# -- the context ----------------------------------------------------------
def check(raw) -> dict:
    """A browser's context, normalised: known route, short strings, at most
    MAX_ELEMENTS elements; raises ContextRefused saying what is wrong."""
    if not isinstance(raw, dict):
        raise ContextRefused("context must be an object")
    route = raw.get("route")
    if route not in ROUTES:
        raise ContextRefused(f"context.route must be one of {', '.join(ROUTES)}")
    out: dict = {"route": route}
    if isinstance(raw.get("view"), str) and raw["view"]:
        out["view"] = raw["view"][:MAX_TEXT]
    step = raw.get("step")
    if step is not None:
        index, count = (step.get("index"), step.get("count")) if isinstance(step, dict) else (None, None)
        if not (_count(index) and _count(count) and index < count):
            raise ContextRefused("context.step needs index and count (whole numbers, index < count)")
        out["step"] = {"index": index, "count": count, "label": _short(step.get("label"))}
    snapshot = raw.get("snapshot")
    if snapshot is not None:
        elements = snapshot.get("elements") if isinstance(snapshot, dict) else None
        if not isinstance(elements, list):
            raise ContextRefused("context.snapshot.elements must be a list")
        out["snapshot"] = {"route": route, "capturedAt": _short(snapshot.get("capturedAt")),
                           "elements": [_element(e) for e in elements[:MAX_ELEMENTS] if isinstance(e, dict)]}
    return out


def _count(value) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1000


def _short(value) -> str:
    return value[:MAX_TEXT] if isinstance(value, str) else ""


def _element(raw: dict) -> dict:
    keys = ("ref", "label", "kind", "role", "selector", "spotlightId")
    return {k: raw[k][:MAX_TEXT] for k in keys if isinstance(raw.get(k), str) and raw[k]}


def offered_to(model_id: str | None) -> bool:
    """Whether a model's turns get the ambient line and the app tools: any
    model but the demo models that never learned them (the demo chat model
    was trained on them, serving/demo/corpus.py; the vision demo was not,
    and with tools on offer it answers every question with a broken call)."""
    from serving.demo.build import DEMO_REPO, is_demo

    return model_id is not None and (model_id == DEMO_REPO or not is_demo(model_id))


def remember(session_id: str, context: dict) -> None:
    _latest[session_id] = context
    _latest.move_to_end(session_id)
    while len(_latest) > MAX_SESSIONS:
        _latest.popitem(last=False)


def latest(session_id: str) -> dict | None:
    return _latest.get(session_id)


def ambient(context: dict) -> str:
    """One line for the system prompt: where the user is, never what is on the page."""
    where = ROUTES[context["route"]]
    step = context.get("step")
    if step:
        where += f" · step {step['index'] + 1}/{step['count']}"
    return f"[user is on: {where}]"


def with_ambient(messages: list[dict], context: dict | None) -> list[dict]:
    """`messages` with the ambient line first in the system message (one is added when there is none)."""
    if context is None:
        return messages
    line = ambient(context)
    if messages and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
        return [{**messages[0], "content": f"{line}\n{messages[0]['content']}"}, *messages[1:]]
    return [{"role": "system", "content": line}, *messages]


# -- the tools ------------------------------------------------------------
def route_of(value) -> str | None:
    """A route id from what a model may write: `quantize`, `Quantize`, `fine-tune`, `#/jobs`."""
    if not isinstance(value, str):
        return None
    key = value.strip().lower().lstrip("#/").replace("-", "").replace(" ", "").replace("_", "")
    return key if key in ROUTES else None


def tools() -> dict[str, Tool]:
    return {t.name: t for t in _TOOLS}


async def _get_context(args: dict, turn) -> tuple[bool, str]:
    context = latest(turn.session.id)
    if context is None:
        return False, "error: no dashboard page has said what it shows"
    text = json.dumps(context, ensure_ascii=False)
    if len(text) > MAX_RESULT:  # the snapshot's tail goes first
        cut = dict(context, snapshot=dict(context["snapshot"], elements=[]))
        elements = context["snapshot"]["elements"]
        while elements and len(text) > MAX_RESULT:
            elements = elements[: len(elements) * 3 // 4]
            cut["snapshot"]["elements"] = elements
            text = json.dumps(cut, ensure_ascii=False)
    return True, text


async def _navigate(args: dict, turn) -> tuple[bool, str]:
    raw = args.get("route", args.get("page"))
    route = route_of(raw)
    if route is None:
        return False, f"error: unknown route {raw!r}; the routes are {', '.join(ROUTES)}"
    await turn.send_json({"type": "ui_navigate", "route": route})
    remember(turn.session.id, {"route": route})  # what the next round's ambient line says
    return True, f"ok: the user now sees the {ROUTES[route]} page"


async def _spotlight(args: dict, turn) -> tuple[bool, str]:
    frame = _spot_frame(args)
    if isinstance(frame, str):
        return False, frame
    answer = await turn.ask_browser(frame, UI_CONFIRM_S)
    return _spot_result(frame, None if answer is None else ui_answer(answer), turn.session.id)


def _spot_frame(args: dict) -> dict | str:
    """The `ui_spotlight` frame a call asks for, or the error the model reads.
    A catalog target goes to its own page; any other target to `route`, if given."""
    frame: dict = {"type": "ui_spotlight"}
    for key in ("target", "ref", "label", "selector", "message"):
        value = args.get(key)
        if isinstance(value, str) and value.strip():
            frame[key] = value.strip()[:MAX_TEXT if key != "message" else 300]
    if not any(k in frame for k in ("target", "ref", "label", "selector")):
        return "error: say what to highlight: target (one of " + ", ".join(SPOTS) + "), ref, label or selector"
    spot = SPOTS.get(frame.get("target", ""))
    if spot is not None:  # the catalog knows its page: the call's route, right or wrong, is not needed
        if spot.route is not None:
            frame["route"] = spot.route
    elif args.get("route") not in (None, ""):
        route = route_of(args["route"])
        if route is None:
            return f"error: unknown route {args['route']!r}; the routes are {', '.join(ROUTES)}"
        frame["route"] = route
    value = args.get("value")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = format(value, "g")
    if isinstance(value, str):
        if spot is None:  # only the catalog's fields: never a switch of the chat itself
            return "error: value fills only a named target: one of " + ", ".join(SPOTS)
        frame["value"] = value[:MAX_TEXT]
    return frame


def ui_answer(raw) -> dict:
    """What a dashboard says it did with a `ui_spotlight` frame (frontend/js/appctx.js), cut down to
    what a tool result may use: {ok, found?: page | step, route?, value?, step?, stepLabel?}."""
    raw = raw if isinstance(raw, dict) else {}
    out: dict = {"ok": raw.get("ok") is True}
    if raw.get("found") in ("page", "step"):
        out["found"] = raw["found"]
    if raw.get("route") in ROUTES:
        out["route"] = raw["route"]
    if isinstance(raw.get("value"), str):
        out["value"] = raw["value"][:MAX_TEXT]
    if _count(raw.get("step")):
        out["step"] = raw["step"]
    if isinstance(raw.get("stepLabel"), str):
        out["stepLabel"] = raw["stepLabel"][:MAX_TEXT]
    return out


def _spot_result(frame: dict, answer: dict | None, session_id: str) -> tuple[bool, str]:
    """What the model reads after a spotlight: the dashboard's answer, told as it is. A control found
    gets the words the demo chat model was trained on (serving/demo/corpus.py), and the page it is on
    goes into the ambient line of the turn's next round; anything else is said in full."""
    what = frame.get("target") or frame.get("ref") or frame.get("label") or frame.get("selector")
    value = frame.get("value")
    asked = frame.get("route")
    if answer is None:
        act = f"set {what} to {value} and highlight it" if value is not None else f"highlight {what}"
        where = f" on the {ROUTES[asked]} page" if asked else ""
        return True, f"sent: asked the dashboard to {act}{where}; no dashboard confirmed it"
    page = answer.get("route")
    if page is not None and (latest(session_id) or {}).get("route") != page:
        remember(session_id, {"route": page})  # what the next round's ambient line says
    on = f"the {ROUTES[page]} page" if page else "the page"
    if not answer["ok"] or "found" not in answer:
        if asked and page != asked:
            return False, f"error: the dashboard could not open the {ROUTES[asked]} page"
        return False, f"error: {what} was not found on {on}"
    if value is not None and "value" not in answer:
        return False, f"error: {what} is highlighted on {on} but did not take the value {value}"
    if value is not None:
        return True, f"ok: set {what} to {value} and highlighted it"
    return True, f"ok: highlighted {what}"


_STRING = {"type": "string"}
_ROUTE = {"type": "string", "enum": list(ROUTES)}
_TOOLS = [
    Tool("get_current_app_context",
         "What the user sees in the Hearth dashboard now: the route, the wizard step, and the page's "
         "visible controls as {ref, label, kind, selector, spotlightId}.",
         {"type": "object", "properties": {}}, False, lambda args: "", act=_get_context),
    Tool("navigate_app", "Show the user another page of the Hearth dashboard.",
         {"type": "object", "properties": {"route": _ROUTE}}, False, lambda args: "", act=_navigate),
    Tool("spotlight_ui",
         "Highlight a control in the dashboard for the user, optionally with a short message. Name it by "
         "target (" + ", ".join(SPOTS) + "), or by ref, label or selector from get_current_app_context; "
         "route moves there first. With a target, value also fills that field (nothing is submitted).",
         {"type": "object", "properties": {"target": _STRING, "value": {"type": ["string", "number"]},
                                           "message": _STRING, "ref": _STRING, "label": _STRING,
                                           "selector": _STRING, "route": _ROUTE}},
         False, lambda args: "", act=_spotlight),
]


async def act(tool: Tool, args, turn) -> tuple[bool, str]:
    """Run an app tool for a turn: (ok, what the model reads)."""
    problem = check_args(args, tool.parameters)
    if problem:
        return False, f"error: {problem}"
    assert tool.act is not None
    return await tool.act(args, turn)
