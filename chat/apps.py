from django.apps import AppConfig


class ChatConfig(AppConfig):
    name = "chat"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from chat import mcp, tools

        tools.register_provider(mcp.provider)  # configured MCP servers' tools (chat/mcp.py)
