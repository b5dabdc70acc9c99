from django.contrib import admin

from jobs.models import Adapter, Job


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ("id", "kind", "status", "progress", "created_at", "ended_at")
    list_filter = ("kind", "status")
    search_fields = ("id", "message", "error")
    readonly_fields = ("id", "created_at", "started_at", "ended_at", "log_path", "worker_pid", "child_pid")


@admin.register(Adapter)
class AdapterAdmin(admin.ModelAdmin):
    list_display = ("name", "method", "rank", "scale", "base_model", "job", "created_at", "last_mounted_at")
    list_filter = ("method",)
    search_fields = ("name", "path", "base_model")
    readonly_fields = ("created_at", "last_mounted_at")
