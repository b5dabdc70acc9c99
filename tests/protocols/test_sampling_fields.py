"""The one declaration of the sampling fields (`params.FIELDS`) against what
reads it: the engine runs each field exactly over the range declared, and the
OpenAPI `Sampling` schema and `hearth run`'s `/set` list the declared fields,
in order, with their types. (The dashboard's panel and `/api/sampling-fields`:
tests/chat/test_sampling_fields.py and tests/browser/test_dashboard_sampling.py.)"""
from __future__ import annotations

import math

import pytest

from inference.engine.types import GenerationRequest
from inference.protocols import params
from inference.protocols.errors import RequestError
from inference.protocols.options import ServerDefaults

VOCAB = 1000


def _checked(name: str, value) -> None:
    """A request setting `name` to `value`, read and checked as every route does."""
    body, defaults = {name: value}, ServerDefaults()
    request = GenerationRequest(prompt_tokens=[1], sampling=params.sampling(body, defaults, {}, VOCAB),
                                logits=params.logits_params(body, VOCAB, defaults))
    params.checked(request, VOCAB, None)


def _beyond(field: params.NumberField, end: float, way: float):
    """The closest value past `end` that the field's type can hold."""
    return int(end) + int(way) if field.kind is int else math.nextafter(end, way * math.inf)


@pytest.mark.parametrize("field", params.FIELDS, ids=params.SAMPLING)
def test_the_engine_runs_each_field_over_the_declared_range(field):
    top = VOCAB - 1 if field.maximum is None else field.maximum  # top_k: below the vocabulary
    for end, way in ((field.minimum, -1), (top, 1)):
        assert end is not None
        _checked(field.name, field.kind(end))
        with pytest.raises(RequestError) as refused:
            _checked(field.name, _beyond(field, end, way))
        assert refused.value.param == field.name


def test_the_openapi_schema_lists_the_declared_fields():
    from serving.routes.bodies import ChatCompletionRequest, MessagesRequest, ResponsesRequest, Sampling

    assert list(Sampling.model_fields) == list(params.SAMPLING)
    for field in params.FIELDS:
        documented = Sampling.model_fields[field.name]
        assert documented.annotation == (field.kind | None) and documented.default is None
        assert documented.description and documented.description.startswith(field.description)
    for body in (ChatCompletionRequest, MessagesRequest, ResponsesRequest):
        properties = body.model_json_schema()["properties"]
        assert set(params.SAMPLING) <= set(properties), body


def test_hearth_run_sets_the_declared_fields():
    import django

    django.setup()
    from chat.gensettings import MAX_TOKENS
    from hearth.management.commands import run

    assert list(run.SETTINGS.items()) == [(f.name, f.kind) for f in (*params.FIELDS, MAX_TOKENS)]
    assert all(name in run.HELP for name in run.SETTINGS)
