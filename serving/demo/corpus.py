"""Synthetic chat data for the demo model, generated from templates.

Each example pairs a conversation with a reply whose *form* fits it: a
greeting answers a greeting, a list request gets a numbered list, a JSON
request gets a JSON object, arithmetic gets an equation, a question that an
offered tool answers gets a `<tool_call>`, and a tool result gets a sentence
that uses it. The model learns these forms from its own training; nothing at
serve time picks replies.
"""
from __future__ import annotations

import json
import random

NAMES = ["Ana", "Ben", "Chloe", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivan", "Jo", "Kai", "Lea", "Max", "Nia"]
CITIES = ["Paris", "Lima", "Oslo", "Rome", "Cairo", "Tokyo", "Quito", "Dublin"]
CATEGORIES = {
    "colors": ["red", "green", "blue", "yellow", "purple", "orange", "black", "white"],
    "fruits": ["apple", "banana", "cherry", "grape", "lemon", "mango", "peach", "pear"],
    "animals": ["cat", "dog", "horse", "rabbit", "tiger", "whale", "eagle", "fox"],
    "tools": ["hammer", "saw", "drill", "wrench", "ruler", "shovel", "knife", "rope"],
    "planets": ["Mercury", "Venus", "Earth", "Mars", "Jupiter", "Saturn", "Uranus", "Neptune"],
}
COUNT_WORDS = {2: "two", 3: "three", 4: "four", 5: "five"}
FACTS = [
    ("What color is the sky?", "The sky is blue."),
    ("What color is grass?", "Grass is green."),
    ("How many days are in a week?", "There are seven days in a week."),
    ("How many legs does a dog have?", "A dog has four legs."),
    ("What is the capital of France?", "The capital of France is Paris."),
    ("What do bees make?", "Bees make honey."),
    ("What is water made of?", "Water is made of hydrogen and oxygen."),
    ("Which planet is the largest?", "Jupiter is the largest planet."),
    ("What do cows drink?", "Cows drink water."),
    ("How many hours are in a day?", "There are twenty-four hours in a day."),
]
GREETINGS_IN = ["Hello", "Hi", "Hey", "Hello there", "Hi there", "Good morning", "Good evening", "Hey there"]
GREETINGS_OUT = ["Hello! How can I help you today?", "Hi! What can I do for you?",
                 "Hello! Nice to meet you. How can I help?", "Hi there! How can I help you today?"]
SYSTEM_PROMPTS = ["You are a helpful assistant.", "You are Hearth, a friendly local assistant.",
                  "Answer briefly."]


def _greeting(r: random.Random) -> tuple[str, str]:
    text = r.choice(GREETINGS_IN) + r.choice(["", "!", ".", ", how are you?", "! Who are you?"])
    if "who are you" in text.lower():
        return text, "Hello! I am Hearth, a small model running on your own machine."
    if "how are you" in text:
        return text, "I am doing well, thank you! How can I help you today?"
    return text, r.choice(GREETINGS_OUT)


def _arithmetic(r: random.Random) -> tuple[str, str]:
    a, b = r.randint(0, 20), r.randint(0, 20)
    op = r.choice(["+", "-", "*"])
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    ask = r.choice(["What is {a} {op} {b}?", "Compute {a} {op} {b}.", "{a} {op} {b} = ?", "Calculate {a} {op} {b}"])
    return ask.format(a=a, op=op, b=b), f"{a} {op} {b} = {value}."


def _listing(r: random.Random) -> tuple[str, str]:
    name, items = r.choice(list(CATEGORIES.items()))
    n = 3 if r.random() < 0.7 else r.choice(list(COUNT_WORDS))  # "three" is what people ask for
    picked = r.sample(items, n)
    ask = r.choice(["List {n} {c}.", "Name {n} {c}.", "Give me a list of {n} {c}.", "Can you list {n} {c}?"])
    reply = "\n".join(f"{i}. {item}" for i, item in enumerate(picked, 1))
    return ask.format(n=COUNT_WORDS[n], c=name), reply


def _json_object(r: random.Random) -> tuple[str, str]:
    name, age, city = r.choice(NAMES), r.randint(18, 80), r.choice(CITIES)
    if r.random() < 0.5:
        ask = r.choice(["Give me a JSON object for a person named {n} who is {a}.",
                        "Write JSON with name {n} and age {a}.", "Return a JSON object: name {n}, age {a}."])
        obj: dict = {"name": name, "age": age}
    else:
        ask = r.choice(["Give me JSON for {n}, age {a}, from {c}.", "Write a JSON object for {n} ({a}) in {c}."])
        obj = {"name": name, "age": age, "city": city}
    return ask.format(n=name, a=age, c=city), json.dumps(obj)


def _fact(r: random.Random) -> tuple[str, str]:
    return r.choice(FACTS)


def _courtesy(r: random.Random) -> tuple[str, str]:
    return r.choice([
        ("Thank you!", "You're welcome!"), ("Thanks", "You're welcome! Anything else?"),
        ("Goodbye", "Goodbye! Have a nice day."), ("Bye!", "Bye! Have a nice day."),
        ("Tell me a joke.", "Why did the cat sit on the computer? To keep an eye on the mouse!"),
        ("Can you help me?", "Of course! What do you need help with?"),
    ])


# (No echo requests: free text to repeat word for word is beyond a model
# this small, and its failed copies taught it to babble. It does learn to
# copy one whole-word token, a page or a value, into a call's arguments.)
KINDS = [_greeting, _arithmetic, _listing, _json_object, _fact, _courtesy]

# Why the reply takes its form, for the <think> channel.
THOUGHTS = {
    _greeting: "A greeting: greet back.",
    _arithmetic: "Arithmetic: write the sum.",
    _listing: "A numbered list.",
    _json_object: "A JSON object.",
    _fact: "A fact: one sentence.",
    _courtesy: "Be polite.",
}

TOOLS = {
    "get_weather": ({"city": {"type": "string"}}, "What is the weather in {city}?", "It is {result} in {city}."),
    "add": ({"a": {"type": "integer"}, "b": {"type": "integer"}}, "Use the calculator to add {a} and {b}.",
            "The sum is {result}."),
    "get_time": ({"timezone": {"type": "string"}}, "What time is it in {timezone}?", "It is {result} in {timezone}."),
    "search": ({"query": {"type": "string"}}, "Search the web for {query}.", "I found {result}."),
}
TOPICS = ["red foxes", "green tea", "river boats", "small birds", "quiet houses", "rain"]


def tool_spec(name: str) -> dict:
    props = TOOLS[name][0]
    return {"type": "function", "function": {"name": name, "description": f"{name} tool",
                                             "parameters": {"type": "object", "properties": props,
                                                            "required": list(props)}}}


def _tool_case(r: random.Random, name: str) -> tuple[str, dict, str, str]:
    """(question, arguments, tool result, final answer) for one tool."""
    args: dict[str, str | int]
    if name == "get_weather":
        args, result = {"city": r.choice(CITIES)}, r.choice(["sunny", "rainy", "cloudy", "windy"])
    elif name == "add":
        a, b = r.randint(0, 50), r.randint(0, 50)
        args = {"a": a, "b": b}
        result = str(a + b)
    elif name == "get_time":
        args, result = {"timezone": r.choice(CITIES + ["UTC"])}, f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}"
    else:
        args = {"query": r.choice(TOPICS)}
        result = f"{r.randint(2, 9)} pages about {args['query']}"
    _, ask, answer = TOOLS[name]
    return ask.format(**args), args, result, answer.format(result=result, **args)


def _call_text(name: str, args: dict) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


# The dashboard's app-aware tools (chat/appctx.py), as the chat offers them:
# the turn's system prompt opens with `[user is on: Page]`, and the three
# tools come first in the list. Only what the compact template renders is
# needed here: the names and the property names (tests check they match
# the chat's own specs, which this layer cannot import).
APP_TOOLS = {
    "get_current_app_context": [],
    "navigate_app": ["route"],
    "spotlight_ui": ["target", "value", "message", "ref", "label", "selector", "route"],
}
APP_PAGES = {"chat": "Chat", "status": "Status", "models": "Models", "memory": "Memory", "jobs": "Jobs",
             "finetune": "Fine-tune", "quantize": "Quantize", "dataset": "Dataset", "adapters": "Adapters",
             "settings": "Settings"}
# Fields the assistant may fill, with how a user names them and values they ask for.
APP_FIELDS = [
    ("quantize", "quantize-bits", ["{v} bits", "bits to {v}"], ["2", "3", "4", "5", "6", "8"]),
    ("quantize", "quantize-group", ["group size {v}", "the group size to {v}"], ["32", "64", "128"]),
    ("finetune", "finetune-rank", ["rank {v}", "the LoRA rank to {v}"], ["4", "8", "16", "32"]),
    ("finetune", "finetune-iters", ["{v} iterations", "the iterations to {v}"], ["100", "200", "500", "1000"]),
]
# Controls the assistant points at: (route, target, how a user asks for it).
APP_SPOTS = [
    ("quantize", "quantize-bits", "Where do I set the bits?"),
    ("quantize", "quantize-source", "Where do I pick the model to quantize?"),
    ("finetune", "finetune-rank", "Where is the LoRA rank?"),
    ("finetune", "finetune-data", "Where do I choose the training data?"),
    ("dataset", "dataset-template", "Where do I pick a dataset template?"),
    ("models", "models-search", "Where can I download a model?"),
    ("models", "models-search", "How do I search for models?"),
    ("settings", "settings-keys", "Where do I add an API key?"),
    ("chat", "chat-input", "Where do I type my message?"),
]


# One token each in the demo's vocabulary: split into BPE pieces
# (`get`, `_`, `current`, …) the model wrote mixtures such as `get_app`.
# The route ids too, so "take me to quantize" holds the very token the call writes.
WHOLE_WORDS = tuple(APP_TOOLS) + tuple(sorted({target for _, target, _, _ in APP_FIELDS} |
                                              {target for _, target, _ in APP_SPOTS})) + tuple(APP_PAGES) + tuple(
    sorted({v for *_, values in APP_FIELDS for v in values}, key=lambda v: (-len(v), v)))


def app_tool_specs() -> list[dict]:
    return [{"type": "function", "function": {"name": name, "description": f"{name} tool", "parameters": {
        "type": "object", "properties": {p: {"type": "string"} for p in props}}}} for name, props in APP_TOOLS.items()]


def _page_name(r: random.Random, route: str) -> str:
    """How a user names a page: mostly as the route itself (one token, so
    the call copies it), now and then as the dashboard titles it."""
    return route if r.random() < 0.75 else APP_PAGES[route]


def _app_case(r: random.Random) -> tuple[str, str, dict, str, str]:
    """(question, tool, arguments, tool result, final answer) for one app request."""
    roll = r.random()
    if roll < 0.4:
        route = r.choice(sorted(APP_PAGES))
        ask = r.choice(["Take me to the {p} page.", "Take me to {p}.", "Open {p}.", "Go to {p}.",
                        "Show me the {p} page.", "Open the {p} page, please.", "I want to see {p}."])
        # The answer names the page by its id, a word the turn already holds
        # (titles would need a mapping the model mixed up: "Models" for quantize).
        return (ask.format(p=_page_name(r, route)), "navigate_app", {"route": route},
                f"ok: the user now sees the {APP_PAGES[route]} page", f"Here is the {route} page.")
    if roll < 0.8:
        route, target, forms, values = r.choice(APP_FIELDS)
        value = r.choice(values)
        field = r.choice(forms).format(v=value)
        ask = r.choice(["Take me to {p} and fill in {f}.", "Go to {p} and set {f}.", "Set {f}.",
                        "Open {p} and fill in {f}."])
        return (ask.format(p=_page_name(r, route), f=field), "spotlight_ui",
                {"target": target, "value": value, "route": route},
                f"ok: set {target} to {value} and highlighted it", f"Done: it is set to {value} and highlighted.")
    route, target, ask = r.choice(APP_SPOTS)
    return (ask, "spotlight_ui", {"target": target, "route": route}, f"ok: highlighted {target}",
            "It is highlighted on the page.")


def ambient_line(route: str, step: int | None = None, count: int = 3) -> str:
    """The line the chat puts first in a dashboard turn's system prompt (chat/appctx.ambient)."""
    return f"[user is on: {APP_PAGES[route]}" + (f" · step {step}/{count}]" if step else "]")


def _app_sample(r: random.Random) -> tuple[list[dict], str, dict]:
    """A dashboard chat turn: the ambient line, the app tools, and an app
    request, or a plain question that wants no tool (most dashboard turns)."""
    here = r.choice(sorted(APP_PAGES))
    line = ambient_line(here)
    if here in ("quantize", "finetune", "dataset") and r.random() < 0.5:
        line = ambient_line(here, r.randint(1, 3))
    tools = app_tool_specs()
    messages: list[dict] = [{"role": "system", "content": line}]
    kwargs = {"tools": tools}
    roll = r.random()
    if roll < 0.3:  # a plain question: answered as without tools
        user, reply = r.choice(KINDS)(r)
        messages.append({"role": "user", "content": user})
        return messages, reply, kwargs
    question, name, args, result, answer = _app_case(r)
    messages.append({"role": "user", "content": question})
    if roll < 0.8:
        return messages, _call_text(name, args), kwargs
    call = {"id": "call_1", "type": "function", "function": {"name": name, "arguments": args}}
    if name == "navigate_app":  # the next round's line says where the user is now
        messages[0] = {"role": "system", "content": ambient_line(args["route"])}
    messages += [{"role": "assistant", "content": "", "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": "call_1", "content": result}]
    return messages, answer, kwargs


def sample(r: random.Random) -> tuple[list[dict], str, dict]:
    """One training example: the conversation so far, the reply to learn
    (what follows the template's generation prompt), and the template's
    keyword arguments (tools, enable_thinking)."""
    if r.random() < 0.35:
        return _app_sample(r)
    messages: list[dict] = []
    if r.random() < 0.25:
        messages.append({"role": "system", "content": r.choice(SYSTEM_PROMPTS)})
    roll = r.random()
    if roll < 0.3:  # tools on offer
        offered = r.sample(sorted(TOOLS), r.randint(1, 3))
        kwargs = {"tools": [tool_spec(n) for n in offered]}
        name = r.choice(offered)
        question, args, result, answer = _tool_case(r, name)
        messages.append({"role": "user", "content": question})
        if r.random() < 0.7:
            return messages, _call_text(name, args), kwargs
        call = {"id": "call_1", "type": "function", "function": {"name": name, "arguments": args}}
        messages += [{"role": "assistant", "content": "", "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": "call_1", "content": result}]
        return messages, answer, kwargs
    if roll < 0.4 and r.random() < 0.5:  # an earlier exchange for context
        user, reply = r.choice(KINDS)(r)
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    kind = r.choice(KINDS)
    user, reply = kind(r)
    messages.append({"role": "user", "content": user})
    if roll > 0.85:  # thinking on: the prompt opens <think>, the reply closes it
        return messages, f"{THOUGHTS[kind]}\n</think>\n\n{reply}", {"enable_thinking": True}
    return messages, reply, {}


def samples(seed: int, count: int) -> list[tuple[list[dict], str, dict]]:
    r = random.Random(seed)
    return [sample(r) for _ in range(count)]
