"""Django settings for Hearth. Everything tunable comes from the environment."""
from __future__ import annotations

import secrets
import socket
from pathlib import Path

from core import home
from core.env import env_bool, env_float, env_path, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
# HEARTH_HOME as core.home lays it out and core.paths confines requests to it (resolved).
HEARTH_HOME = home.root()
HEARTH_HOME.mkdir(parents=True, exist_ok=True)
# The one folder the dashboard chat's coding tools (read, bash, edit, write) may touch.
CHAT_WORKSPACE = env_path("HEARTH_CHAT_WORKSPACE", home.workspace())


def _secret_key() -> str:
    # A per-install key kept under HEARTH_HOME, so sessions survive restarts
    # without anyone having to configure one.
    configured = env_str("HEARTH_SECRET_KEY", "")
    if configured:
        return configured
    path = home.secret_key()
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = env_bool("HEARTH_DEBUG", False)
# Structured output: 0 turns grammar compilation off (requests then take the degrade path).
HEARTH_GRAMMAR = env_bool("HEARTH_GRAMMAR", True)
# Seconds between SSE `: keep-alive` comments while a tool-call body is withheld.
HEARTH_SSE_KEEPALIVE = env_float("HEARTH_SSE_KEEPALIVE", 5.0, minimum=0.001)
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "ninja",  # its docs pages then load Swagger UI from its own static files, never a CDN
    "huey.contrib.djhuey",
    "serving",
    "jobs",
    "hub",
    "chat",
    "memory",
    "hearth.apps.HearthConfig",  # last: the composition root (the serve command, the runtime's wiring)
]

MIDDLEWARE = [
    "hearth.middleware.RuntimeMiddleware",
    "hearth.middleware.TraceMiddleware",
    "hearth.django_middleware.SecurityMiddleware",
    "hearth.middleware.RequestMetricsMiddleware",
    "hearth.middleware.JsonErrorMiddleware",
    "hearth.middleware.CrossOriginGuardMiddleware",
    "hearth.middleware.CorsMiddleware",
    "hearth.middleware.SecureCookiesOverTlsMiddleware",
    "hearth.django_middleware.SessionMiddleware",
    "hearth.middleware.ApiKeyMiddleware",
    "hearth.middleware.ReplayMiddleware",
    "hearth.middleware.RouterMiddleware",
    "hearth.django_middleware.CommonMiddleware",
    "hearth.django_middleware.CsrfViewMiddleware",
    "hearth.django_middleware.AuthenticationMiddleware",
    "hearth.django_middleware.MessageMiddleware",
]
# Django's deploy checks look its middlewares up by their own dotted paths and would call the ones above
# missing (W001 security, W003 CSRF, W010/W013 session cookies); hearth/django_middleware.py's
# `deploy_checks` runs the checks that depend on them with Django's paths instead.
SILENCED_SYSTEM_CHECKS = ["security.W001", "security.W003", "security.W010", "security.W013"]

# The dashboard's sign-in session: never readable by scripts, never sent by
# another site's requests (Secure is added on HTTPS requests, see
# SecureCookiesOverTlsMiddleware).
# Behind a reverse proxy every visitor's connection comes from the proxy, so
# loopback means nothing: `hearth serve` then wants a key, the chat socket
# trusts no peer address, and the proxy's X-Forwarded-Proto says whether
# the visitor used HTTPS (Secure cookies, the CSRF origin check).
HEARTH_BEHIND_PROXY = env_bool("HEARTH_BEHIND_PROXY", False)
if HEARTH_BEHIND_PROXY:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# MCP servers with a `command` run on this machine (chat/mcp.py); an operator can
# forbid them, leaving only servers reached by URL.
HEARTH_MCP_COMMANDS = env_bool("HEARTH_MCP_COMMANDS", True)
SESSION_COOKIE_NAME = "hearth_session"  # not Django's default: other local Django apps share localhost cookies
CSRF_COOKIE_NAME = "hearth_csrftoken"
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Strict"
SESSION_COOKIE_AGE = 30 * 24 * 3600
CSRF_COOKIE_SAMESITE = "Strict"

ROOT_URLCONF = "config.urls"
APPEND_SLASH = False

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

ASGI_APPLICATION = "hearth.asgi.application"
# One machine: no channel layer (each chat socket talks to its own consumer
# only). On Redis, channels-redis, so the web nodes share one (set below).

# The database: SQLite in HEARTH_HOME, or PostgreSQL when DATABASE_URL is set
# (several web nodes and workers on one database; docs/serving/postgresql.md).
DATABASE_URL = env_str("DATABASE_URL", "")
POSTGRES_SCHEMES = ("postgres", "postgresql", "pgsql")


def _postgres(url: str) -> dict:
    """DATABASE_URL through dj-database-url, PostgreSQL only: the client (psycopg 3)
    is an optional extra, so a missing one fails here, at start, by name."""
    from django.core.exceptions import ImproperlyConfigured

    scheme = url.split("://", 1)[0].split("+", 1)[0].lower() if "://" in url else ""
    if scheme not in POSTGRES_SCHEMES:
        raise ImproperlyConfigured(f"DATABASE_URL must be a postgresql:// URL (got {scheme or 'no'} scheme); "
                                   "unset it to keep the SQLite database in HEARTH_HOME")
    try:
        import dj_database_url
        import psycopg  # noqa: F401
    except ImportError:
        raise ImproperlyConfigured("DATABASE_URL is set but the PostgreSQL client is not installed: "
                                   "pip install 'hearth[postgres]' (in a checkout: pip install -e '.[postgres]')"
                                   ) from None
    # A connection per request (CONN_MAX_AGE 0): Django's advice under ASGI, where each
    # request's sync code runs in a thread lent to it (hearth/request_threads.py); the
    # connection is closed when the request ends, not kept with the thread for the next.
    return dict(dj_database_url.parse(url, conn_max_age=0))


if DATABASE_URL:
    DATABASES = {"default": _postgres(DATABASE_URL)}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": home.database(),
            "OPTIONS": {
                # WAL lets the server, the job worker and the admin read while one writes.
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                # Every write transaction takes the lock at its start, so a check-then-insert in
                # `transaction.atomic()` cannot interleave with another process's (the code that relies
                # on it takes an advisory lock on PostgreSQL instead: core.db.serialize).
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
            },
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# The admin's and the API docs' files, like the dashboard's, are served by
# WhiteNoise beside Django (hearth/static.py), from copies it makes under
# HEARTH_HOME, no collectstatic step. STATIC_ROOT is only where `hearth
# django collectstatic` gathers them for a reverse proxy that serves them itself.
STATIC_ROOT = home.static()

# Body size is capped before Django reads a body (core/http_guard.py at the
# connection, hearth/asgi.py for other servers), at HEARTH_MAX_BODY_BYTES;
# Django's own 2.5 MB default would refuse ordinary long conversations.
DATA_UPLOAD_MAX_MEMORY_SIZE = None

_ROUTER_MODEL = env_str("HEARTH_ROUTER_MODEL", "")  # set by a router for a model's process
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # A router's model processes share its stderr: each line says which model wrote it.
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s " + (
        f"[{_ROUTER_MODEL.replace('%', '%%')}] " if _ROUTER_MODEL else "") + "%(name)s: %(message)s"}},
    # A 503 says "not now" (a model loading or training, a drain, a full slot): the API logs it at INFO once;
    # Django's own line for every 5xx would add an ERROR for what is not a fault.
    "filters": {"no_503": {"()": "django.utils.log.CallbackFilter",
                           "callback": lambda record: getattr(record, "status_code", None) != 503},
                # A tokenizer warns once that a text is longer than its model_max_length; Hearth measures every
                # prompt against the context itself and refuses one too long in its caller's protocol.
                "no_length_warning": {"()": "django.utils.log.CallbackFilter",
                                      "callback": lambda record: "Token indices sequence length is longer"
                                      not in record.getMessage()}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("HEARTH_LOG_LEVEL", "INFO")},
    "loggers": {
        "django.server": {"level": "WARNING"},
        "django.request": {"filters": ["no_503"]},
        "daphne": {"level": "WARNING"},
        # httpx logs each request it sends at INFO: a router's forwarded requests, the hub's, a command's
        # own calls to the server. The log says what Hearth did, not each request under it.
        "httpx": {"level": "WARNING"},
        "httpx2": {"level": "WARNING"},  # the same, as huggingface_hub and the SDKs name it here
        # Huey's banner and its line before and after each task: the job worker logs its start, its slots and
        # each job's end itself (hearth.jobs). Its warnings and a task's traceback still show.
        "huey": {"level": "WARNING"},
        "transformers.tokenization_utils_base": {"filters": ["no_length_warning"]},
    },
}

# The job queue: SQLite in its own file (the worker and the server both open
# it), or Redis when HEARTH_REDIS_URL is set (with the channel layer, job
# events, worker presence and stored Responses: docs/serving/redis.md). Tasks
# always run in a worker process; `immediate` would run them inside the request.
HEARTH_REDIS_URL = env_str("HEARTH_REDIS_URL", "")
# On Redis, workers on several hosts: the name this one goes by (pids are compared only on the same
# name) and the seconds between its heartbeats (three missed ones and its running jobs are zombies).
HEARTH_WORKER_HOST = env_str("HEARTH_WORKER_HOST", "") or socket.gethostname()
HEARTH_WORKER_HEARTBEAT_S = env_float("HEARTH_WORKER_HEARTBEAT_S", 5.0, minimum=0.1)
HEARTH_JOB_STAGE_DELAY = env_float("HEARTH_JOB_STAGE_DELAY", 0.0, minimum=0.0)  # debugging: pause after each stage
HUEY = {
    "name": "hearth-jobs",
    "immediate": False,
    "consumer": {"workers": 2, "worker_type": "thread", "periodic": False, "check_worker_health": True},
}


def _redis_installed() -> None:
    """The Redis client and channels-redis are an optional extra: without
    them Hearth on Redis fails here, at start, rather than at the first job."""
    from django.core.exceptions import ImproperlyConfigured

    try:
        import channels_redis  # noqa: F401
        import redis  # noqa: F401
    except ImportError:
        raise ImproperlyConfigured("HEARTH_REDIS_URL is set but the Redis client is not installed: "
                                   "pip install 'hearth[redis]' (in a checkout: pip install -e '.[redis]')") from None


if HEARTH_REDIS_URL:
    _redis_installed()
    HUEY.update({"huey_class": "huey.RedisHuey", "url": HEARTH_REDIS_URL})
    # Each socket's consumer waits on its channel with a blocking pop of up to 5 s; redis-py 8's
    # 5 s default socket timeout would cut that wait and close the socket (django/channels_redis#422).
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {
        "hosts": [{"address": HEARTH_REDIS_URL, "socket_timeout": 30}], "prefix": "hearth:channels:"}}}
else:
    HUEY.update({"huey_class": "huey.SqliteHuey", "filename": str(home.job_queue())})
