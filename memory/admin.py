from django.contrib import admin

from memory.models import MemoryVault, SynthesisRun


class SynthesisRunInline(admin.TabularInline):
    model = SynthesisRun
    extra = 0
    fields = ("job", "dry", "since", "until", "session_count", "created_at")
    readonly_fields = fields
    can_delete = False
    show_change_link = True


@admin.register(MemoryVault)
class MemoryVaultAdmin(admin.ModelAdmin):
    list_display = ("name", "root", "is_default", "created_at", "last_synthesized_at")
    list_filter = ("is_default",)
    search_fields = ("name", "root")
    readonly_fields = ("created_at",)
    inlines = [SynthesisRunInline]


@admin.register(SynthesisRun)
class SynthesisRunAdmin(admin.ModelAdmin):
    list_display = ("job", "vault", "dry", "job_status", "session_count", "since", "until", "created_at")
    list_filter = ("vault", "dry", "job__status")
    search_fields = ("job__id", "vault__name", "commits_json")
    readonly_fields = ("created_at",)
    list_select_related = ("job", "vault")

    @admin.display(description="status", ordering="job__status")
    def job_status(self, run: SynthesisRun) -> str:
        return run.job.status
