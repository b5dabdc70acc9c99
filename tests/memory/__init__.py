"""Memory vaults through /api/memory and the chat tools."""
