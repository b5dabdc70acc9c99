"""The dashboard chat over /ws/chat: turns, tools, approvals, MCP and the app-aware assistant."""
