"""Django's own middlewares run their hooks on the event loop
(hearth/django_middleware.py): a request makes no hop to the sync thread for
them, but for the one that saves a modified session; and what they do is
unchanged (the signed-in session, the CSRF check, the security headers),
and `check --deploy` reports them as it does Django's own."""
from __future__ import annotations

import re

import pytest

KEY = "test-key-django-middleware-0123"


@pytest.fixture
def hops(monkeypatch):
    """The middleware hooks run through sync_to_async (a hop to the sync thread), by name."""
    from asgiref.sync import SyncToAsync

    sent: list[str] = []
    real = SyncToAsync.__call__

    def counted(self, *args, **kwargs):
        name = getattr(self.func, "__qualname__", "")
        if "Middleware." in name:
            sent.append(name)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(SyncToAsync, "__call__", counted)
    return sent


def test_only_saving_a_session_leaves_the_event_loop(served, hops):
    app = served("--api-key", KEY)
    models = app.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    assert models.status_code == 200 and models.headers["X-Content-Type-Options"] == "nosniff"
    form = app.get("/signin?next=/")  # a Django view: the CSRF check's process_view runs on it too
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


def test_deploy_checks_see_the_middlewares_as_djangos_own():
    import django

    django.setup()
    from django.core import checks
    from django.test.utils import override_settings

    def reported() -> set[str]:
        return {m.id for m in checks.run_checks(include_deployment_checks=True, tags=[checks.Tags.security])
                if not m.is_silenced()}

    found = reported()
    assert {"security.W004", "security.W008", "security.W012", "security.W016"} <= found  # as with Django's
    assert not found & {"security.W001", "security.W003", "security.W010"}  # never "missing"
    with override_settings(SECURE_HSTS_SECONDS=3600, SESSION_COOKIE_SECURE=True):
        assert not reported() & {"security.W004", "security.W012"}


def test_a_requests_sync_thread_is_lent_from_a_pool(served):
    """Django ends each request with `response.close()` in the request's sync thread: a pooled thread, not
    one started (and another to join it) for every request."""
    import threading
    import time

    from django.core.signals import request_finished

    from hearth.request_threads import POOL

    app = served("--api-key", KEY)
    names: list[str] = []

    def finished(**_):
        names.append(threading.current_thread().name)

    request_finished.connect(finished, weak=False)
    try:
        app.get("/health")
        started = POOL.started
        for _ in range(10):
            assert app.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        deadline = time.monotonic() + 10
        while len(names) < 11 and time.monotonic() < deadline:  # the last close may come after its answer
            time.sleep(0.01)
    finally:
        request_finished.disconnect(finished)
    assert len(names) == 11 and all(n.startswith("hearth-request") for n in names), names
    # A request's thread goes back once its `close()` is done, and the next request may arrive just before:
    # on a loaded machine more than one is in use, but not one a request (11 names).
    assert len(set(names)) <= 6 and POOL.started - started <= 5, names


def test_a_task_outliving_its_request_context_still_reaches_a_sync_thread():
    import asyncio
    import threading

    from asgiref.sync import sync_to_async

    from hearth.request_threads import RequestContext

    async def main():
        async with RequestContext():
            inside = await sync_to_async(lambda: threading.current_thread().name)()

            async def later():
                await asyncio.sleep(0.05)
                return await sync_to_async(lambda: threading.current_thread().name)()

            outliving = asyncio.ensure_future(later())
        async with RequestContext():
            again = await sync_to_async(lambda: threading.current_thread().name)()
        return inside, again, await outliving

    inside, again, after = asyncio.run(main())
    assert inside.startswith("hearth-request") and again.startswith("hearth-request")
    assert after and not after.startswith("hearth-request"), "a thread of its own, as asgiref gives it"


def test_a_closed_pool_ends_its_idle_threads_and_keeps_none_given_back():
    """At server exit (run_daphne) the pool's idle threads end, so `exit_now` names only threads still busy."""
    import threading
    import time

    from hearth.request_threads import _Pool

    pool = _Pool()
    idle, busy = pool.take(), pool.take()
    release = threading.Event()
    names = [idle.submit(lambda: threading.current_thread()).result()]
    running = busy.submit(lambda: (release.wait(10), threading.current_thread())[1])
    pool.give_back(idle)
    deadline = time.monotonic() + 10
    while not pool._idle and time.monotonic() < deadline:  # back once its no-op has run
        time.sleep(0.01)
    pool.close()
    pool.give_back(busy)  # given back after the close, with a call still running: shut down once it is done
    release.set()
    names.append(running.result())
    for thread in names:
        thread.join(10)
    assert not any(t.is_alive() for t in names) and pool._idle == []
