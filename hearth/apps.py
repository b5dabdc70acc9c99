from django.apps import AppConfig
from django.conf import settings


class HearthConfig(AppConfig):
    """The composition root as a Django app: its management commands (`serve`)
    and the wiring of app services into the runtime."""

    name = "hearth"
    label = "hearth"

    def ready(self):
        from hearth import django_middleware  # noqa: F401  (registers its deploy checks)
        from hearth.root import RUNTIME
        from jobs import adapters

        RUNTIME.adapter_records = adapters  # /v1/adapters records mounts and lists adapters on disk through it
        if settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
            from core.db import nul_safe_text

            nul_safe_text()
