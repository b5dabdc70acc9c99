"""Memory vaults and chat sessions (see the memory issue)."""
