#!/usr/bin/env python3
"""A server of the 2026-07-28 era made with the official Python SDK: mcp 2.3.0's MCPServer
(FastMCP's successor) over Streamable HTTP, stateless, for the tests of `wharf check`.

    python sdk_server.py PORT     # serves http://127.0.0.1:PORT/mcp

One tool, `echo(text)`, which returns its text. When the call carries
`_meta.progressToken` it first reports progress once, so the SDK answers that call as
`text/event-stream` (otherwise it answers `application/json`), which shows a client's
progress handling. A request whose `MCP-Protocol-Version` header names an
initialize-era revision (or has none) goes to the SDK's legacy transport, which serves
`initialize`.
"""

import sys

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("sdk-check", version="0.1.0", log_level="WARNING")


@server.tool()
async def echo(text: str, ctx: Context) -> str:
    """Returns the text."""
    await ctx.report_progress(1, 1)  # a no-op without a progress token
    return text


if __name__ == "__main__":
    server.run(
        transport="streamable-http",
        host="127.0.0.1",
        port=int(sys.argv[1]),
        stateless_http=True,
    )
