"""What one serving process holds: its engines and everything requests
need to know about how it serves.

The composition root (`hearth/root.py`) builds one `Runtime`, `hearth
serve` fills it, and it is handed to every request (`request.runtime`, set by
a middleware) and every chat socket (`scope["runtime"]`). Nothing below the
composition root keeps or imports a process-wide instance. A runtime holds
engines by model id, so a router can hold several; today `hearth serve`
loads one, the default. Without an engine (a management command, the
admin) generation routes answer 503 in their protocol's shape.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from inference.engine.errors import EngineError
from inference.engine.speech import Sessions
from inference.protocols.options import Options
from inference.protocols.response_store import AnyResponseStore, ResponseStore
from serving.streams.store import Streams
from serving.traces import Phases

if TYPE_CHECKING:  # only named here: every process that loads Django imports this module (the CLI too)
    from inference.engine.engine import Engine
    from inference.engine.speech import Transcriber
    from serving.router.manager import Manager


class EngineUnavailable(EngineError):
    status = 503
    type = "engine_unavailable"
    code = "no_model_loaded"


class Runtime:
    def __init__(self):
        self.engines: dict[str, Engine] = {}  # model id -> engine
        self.default_model: str | None = None
        # Single-model mode: other names and labels of the served model (--alias, --tags), for /v1/models.
        self.aliases: tuple[str, ...] = ()
        self.tags: tuple[str, ...] = ()
        # Router mode (`hearth serve` without a MODEL): the models' processes;
        # this process then holds no engine and forwards /v1 requests.
        self.router: Manager | None = None
        self.options = Options()
        self.started_at = int(time.time())
        self.draining = False
        self.drained_on_request = False  # POST /admin/drain set `draining`: the SIGTERM after it is the first
        self.inflight = 0  # HTTP requests still being answered
        self.embeddings_enabled = False  # the served model answers /v1/embeddings
        self.responses: AnyResponseStore = ResponseStore()  # stored Responses turns (`hearth serve --response-ttl`)
        # Resumable streams (X-Conversation-Id; the dashboard's chat turns): in memory until
        # `hearth serve` opens them on disk (`--stream-ttl`, `--stream-max-bytes`, `--streams-max-bytes`).
        self.streams = Streams(None)
        self.local_url: str | None = None  # how this process reaches its own HTTP API (jobs that call the model)
        self.allowed_hosts: frozenset | None = None  # Host names requests may use; None: any
        # Access control, set by `hearth serve`: accepted API keys (empty: none
        # required), origins allowed cross-origin (CORS), and whether the operator
        # chose to serve off loopback with no key.
        self.api_keys: frozenset = frozenset()
        # Keys whose requests may state their holder (X-Hearth-Holder, hearth/access.py): the router's,
        # in its model processes, and the cluster's hop key on a web node.
        self.hop_keys: frozenset = frozenset()
        self.cors_origins: frozenset = frozenset()
        self.insecure_no_auth = False
        self.warning: str | None = None  # shown in /stats (serving off loopback with no key)
        # Adapter records on disk and in the database (jobs.adapters), wired by the composition root.
        self.adapter_records = None
        # Speech to text beside the chat model (`hearth serve --whisper-model`); None: not offered here.
        self.transcriber: Transcriber | None = None
        # The Whisper model the models' processes have, in router mode (the default model's answers /v1/audio/*).
        self.whisper_model: str | None = None
        self.audio_sessions = Sessions()  # live transcription sessions (/v1/audio/sessions)
        # A demo model training in the background (`hearth serve --build-demo`): its state, for
        # /health, /stats and the dashboard; None when none is.
        self.demo_build: dict | None = None
        self.speech_build: dict | None = None  # the demo speech model's, the same way (after the chat model's)
        self.phases = Phases()  # the recent generations' phases, for /stats (serving/traces.py)

    # -- engines ---------------------------------------------------------
    def add_engine(self, engine: Engine, default: bool = True) -> None:
        model_id = engine.loaded.model_id if engine.loaded is not None else engine.model_ref
        self.engines[model_id] = engine
        if default or self.default_model is None:
            self.default_model = model_id

    @property
    def engine(self) -> Engine | None:
        """The default engine, or None."""
        return self.engines.get(self.default_model) if self.default_model else None

    @engine.setter
    def engine(self, engine: Engine | None) -> None:
        """Serve `engine` as the only engine (None: none)."""
        self.engines.clear()
        self.default_model = None
        if engine is not None:
            self.add_engine(engine)

    def require_engine(self, model: str | None = None) -> Engine:
        """The engine for `model` (today: the default one, whatever `model` names)."""
        engine = self.engine
        if engine is None or engine.loaded is None:
            raise EngineUnavailable("no model is loaded in this process; start it with `hearth serve`")
        return engine

    def served_model(self) -> str | None:
        """The model a request that names none gets: the router's default, or the engine's."""
        if self.router is not None:
            return self.router.default
        engine = self.engine
        return engine.loaded.model_id if engine is not None and engine.loaded is not None else None

    def loaded_models(self) -> list[str]:
        """The models this process serves now: the router's loaded (or loading) ones, or the engine's."""
        if self.router is not None:
            return [s.id for s in list(self.router.slots.values()) if s.status in ("loaded", "loading")]
        return [e.loaded.model_id for e in list(self.engines.values()) if e.loaded is not None]

    def model_status(self, model_id: str) -> dict | None:
        """Router mode: a model's status object (`{"value": "loaded", …}`), or None."""
        if self.router is None:
            return None
        slot = self.router.slots.get(model_id)
        return slot.status_object() if slot is not None else None

    async def switch_model(self, name: str) -> dict:
        """Router mode: load `name` and make it the default model (`/api`'s shape)."""
        from core.api import ApiError
        from serving.router.slots import RouterError

        router = self.router
        assert router is not None, "switch_model is for router mode"
        try:
            slot = await router.load(name)  # a model that fails to load does not become the default
            router.set_default(slot.id)
        except RouterError as exc:
            raise ApiError(exc.message, exc.status) from None
        return {"ok": True, "model": slot.id, "status": slot.status_object()}

    def job_model(self, name: str | None) -> str | None:
        """The id of the model a job that calls this server will use: `name`
        (an id or alias; router mode) or the default, recorded in the job so
        it names its model. Raises core.api.ApiError for a model that is not here."""
        from core.api import ApiError

        if self.router is not None:
            from serving.router.slots import RouterError

            try:
                return self.router.resolve(name).id
            except RouterError as exc:
                raise ApiError(exc.message, exc.status) from None
        served = self.served_model()
        if name and served and name != served:
            raise ApiError(f"model {name!r} is not served here: this server serves {served} only (start "
                           f"`hearth serve` without a model to use any model in the library)")
        return served

    def embedding_engine(self) -> Engine | None:
        """The engine that answers embeddings, if any."""
        engine = self.engine
        return engine if self.embeddings_enabled and engine is not None and engine.loaded is not None else None
