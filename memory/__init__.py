"""Memory vaults: markdown articles in git, their search, synthesis from chat sessions, and the chat's
read-only memory tools."""
