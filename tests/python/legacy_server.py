#!/usr/bin/env python3
"""A server of the initialization-based era only: the Python SDK's last 1.x FastMCP
(mcp==1.30.0) over Streamable HTTP, for the tests of a dual-era client's fallback.

    python legacy_server.py PORT     # serves http://127.0.0.1:PORT/mcp
"""

import sys

from mcp.server.fastmcp import FastMCP

server = FastMCP("legacy-only", host="127.0.0.1", port=int(sys.argv[1]))


@server.tool()
def echo(text: str) -> str:
    """Returns the text."""
    return text


if __name__ == "__main__":
    server.run(transport="streamable-http")
