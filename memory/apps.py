from django.apps import AppConfig


def _synthesis_ended(job) -> None:
    from memory.synthesize import finished

    finished(job)


class MemoryConfig(AppConfig):
    name = "memory"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from jobs.registry import JobKind, register
        from memory.api import SynthesizeRequest

        register(JobKind("synthesis", "memory.synthesis.pipeline", SynthesizeRequest, _synthesis_ended))
        from memory import tools

        tools.register_chat_tools()
