"""`GET /api/sampling-fields`, in this process: the numbers a chat's
`set_sampling` takes, read from the one declaration (`params.FIELDS`, then
`gensettings.MAX_TOKENS`) with their types and ranges. The dashboard's panel
is drawn from it (tests/browser/test_dashboard_sampling.py)."""
from __future__ import annotations

from chat import gensettings
from inference.protocols import params


def test_the_route_lists_every_declared_number_in_order(client):
    answer = client.get("/api/sampling-fields")
    assert answer.status_code == 200
    fields = answer.json()["fields"]
    declared = (*params.FIELDS, gensettings.MAX_TOKENS)
    assert [f["name"] for f in fields] == [f.name for f in declared]
    for shown, field in zip(fields, declared, strict=True):
        assert shown == {"name": field.name, "type": "integer" if field.kind is int else "number",
                         "minimum": field.minimum, "maximum": field.maximum, "description": field.description}

