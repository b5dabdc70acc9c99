"""Synthetic chat data for the demo model, generated from templates.

Each conversation pairs a user turn with a reply whose *form* fits it: a
greeting answers a greeting, a list request gets a numbered list, a JSON
request gets a JSON object, arithmetic gets an equation. The model learns
these forms from its own training; nothing at serve time picks replies.
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
WORDS = ["the", "blue", "cat", "sleeps", "on", "a", "warm", "mat", "green", "tree", "grows", "near",
         "river", "small", "bird", "sings", "every", "morning", "quiet", "house", "light", "rain"]
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


def _echo(r: random.Random) -> tuple[str, str]:
    phrase = " ".join(r.choice(WORDS) for _ in range(r.randint(2, 5)))
    ask = r.choice(["Repeat after me: {p}", "Say: {p}", "Echo this: {p}", "Please repeat: {p}"])
    return ask.format(p=phrase), phrase


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


KINDS = [_greeting, _arithmetic, _echo, _listing, _json_object, _fact, _courtesy]


def conversation(r: random.Random) -> list[dict]:
    """One short chat: an optional system turn, then one or two exchanges."""
    messages: list[dict] = []
    if r.random() < 0.3:
        messages.append({"role": "system", "content": r.choice(SYSTEM_PROMPTS)})
    for _ in range(1 if r.random() < 0.8 else 2):
        user, reply = r.choice(KINDS)(r)
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    return messages


def conversations(seed: int, count: int) -> list[list[dict]]:
    r = random.Random(seed)
    return [conversation(r) for _ in range(count)]
