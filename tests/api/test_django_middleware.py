"""Django's own middlewares run their hooks on the event loop
(hearth/django_middleware.py): a request makes no hop to the sync thread for
them, but for the one that saves a modified session; and what they do is
unchanged (the signed-in session, the CSRF check, the security headers)."""
from __future__ import annotations

import re

import pytest

KEY = "test-key-django-middleware-0123"


@pytest.fixture
def hops(monkeypatch):
    """The middleware hooks sent to the sync thread, by name."""
    import django

    django.setup()
    from hearth import django_middleware

    sent: list[str] = []
    real = django_middleware.sync_to_async

    def counted(fn, **kwargs):
        sent.append(fn.__qualname__)
        return real(fn, **kwargs)

    monkeypatch.setattr(django_middleware, "sync_to_async", counted)
    return sent


def test_only_saving_a_session_leaves_the_event_loop(served, hops):
    app = served("--api-key", KEY)
    models = app.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    assert models.status_code == 200 and models.headers["X-Content-Type-Options"] == "nosniff"
    form = app.get("/signin?next=/")
    assert form.status_code == 200 and hops == []

    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
    assert app.post("/signin", data={"key": KEY, "next": "/"}).status_code == 403  # no CSRF token
    done = app.post("/signin", data={"key": KEY, "next": "/", "csrfmiddlewaretoken": token})
    assert done.status_code == 302 and "hearth_session" in done.cookies
    assert hops == ["SessionMiddleware.process_response"]  # the sign-in saved the session

    hops.clear()
    assert app.get("/auth").json() == {"keyRequired": True, "signedIn": True}
    assert app.get("/api/jobs").status_code == 200  # the session cookie signs the dashboard's API calls in
    assert hops == []
    assert app.post("/signout").status_code == 302
    assert app.get("/auth").json() == {"keyRequired": True, "signedIn": False}
