from django.contrib import admin

from chat.models import ChatEntry, ChatSession, ToolApproval


class EntryInline(admin.TabularInline):
    model = ChatEntry
    fields = ("role", "content", "parent", "created_at")
    readonly_fields = ("created_at",)
    extra = 0
    show_change_link = True


@admin.register(ChatSession)
class ChatSessionAdmin(admin.ModelAdmin):
    list_display = ("title", "id", "thinking", "adapter", "created_at", "updated_at")
    list_filter = ("thinking",)
    search_fields = ("title", "id", "system_prompt")
    inlines = [EntryInline]


@admin.register(ChatEntry)
class ChatEntryAdmin(admin.ModelAdmin):
    list_display = ("id", "session", "role", "short", "created_at")
    list_filter = ("role",)
    search_fields = ("content", "reasoning", "session__title")

    @admin.display(description="content")
    def short(self, obj):
        return obj.content[:80]


@admin.register(ToolApproval)
class ToolApprovalAdmin(admin.ModelAdmin):
    list_display = ("tool", "session", "created_at")
    list_filter = ("tool",)
    search_fields = ("tool", "session__title", "session__id")
