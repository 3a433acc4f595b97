#!/usr/bin/env python3
"""A server of the initialization-based era only: the Python SDK's last 1.x FastMCP
(mcp==1.30.0) over Streamable HTTP, for the tests of a dual-era client's fallback.

    python legacy_server.py PORT     # serves http://127.0.0.1:PORT/mcp

`echo(text)` returns its text; `greet()` asks the user's name the way this era does, with an
`elicitation/create` request on the call's own stream, and greets them.
"""

import sys

from mcp.server.fastmcp import Context, FastMCP
from pydantic import BaseModel

server = FastMCP("legacy-only", host="127.0.0.1", port=int(sys.argv[1]))


class Name(BaseModel):
    name: str


@server.tool()
def echo(text: str) -> str:
    """Returns the text."""
    return text


@server.tool()
async def greet(ctx: Context) -> str:
    """Asks the user's name, then greets them."""
    answer = await ctx.elicit(message="What is your name?", schema=Name)
    if answer.action == "accept":
        return f"Hello, {answer.data.name}!"
    return f"No name given ({answer.action})."


if __name__ == "__main__":
    server.run(transport="streamable-http")
