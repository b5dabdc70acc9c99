from django.contrib import admin

from hub.models import DecodeMeasurement, Download


@admin.register(Download)
class DownloadAdmin(admin.ModelAdmin):
    list_display = ("repo_id", "revision", "state", "files_done", "files_total", "received_bytes", "total_bytes",
                    "started_at", "finished_at")
    list_filter = ("state",)
    search_fields = ("repo_id", "commit", "error")
    readonly_fields = ("started_at", "finished_at", "owner_pid")


@admin.register(DecodeMeasurement)
class DecodeMeasurementAdmin(admin.ModelAdmin):
    list_display = ("repo_id", "decode_tps", "tokens", "lane", "measured_at")
    search_fields = ("repo_id", "snapshot")
