"""A small MCP server for the tests (the official SDK's MCPServer): stdio by
default, `streamable-http PORT` for the HTTP transport. Tools: `add`, and
`fail`, which raises, and `env_value`, which reads its environment."""
from __future__ import annotations

import os
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("calc")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def fail(reason: str) -> str:
    """Always fails, with the reason given."""
    raise ValueError(reason)


@server.tool()
def env_value(name: str) -> str:
    """The value of an environment variable in the server's process."""
    return os.environ.get(name, "")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "streamable-http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
