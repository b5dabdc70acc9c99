from django.apps import AppConfig


def _finetune_ended(job) -> None:
    """A finished fine-tune's adapter is recorded, so it is listed and mountable; one that ended
    otherwise keeps its last whole checkpoint, marked partial, or leaves nothing (jobs/leftovers.py)."""
    if job.status == "done" and job.output_path:
        from jobs.adapters import register

        register(job.output_path, job=job)
    elif job.status != "done":
        from jobs.leftovers import settle

        settle(job)


def _quantize_ended(job) -> None:
    if job.status == "done":
        from hub.library import mark_changed

        mark_changed()  # its output is a new model in the cache


class JobsConfig(AppConfig):
    name = "jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from jobs.api_bodies import DatasetRequest, FinetuneRequest, QuantizeRequest
        from jobs.registry import JobKind, register

        register(JobKind("quantize", "jobs.kinds.quantize", QuantizeRequest, _quantize_ended))
        register(JobKind("finetune", "jobs.kinds.finetune", FinetuneRequest, _finetune_ended))
        register(JobKind("dataset", "jobs.kinds.dataset", DatasetRequest))
