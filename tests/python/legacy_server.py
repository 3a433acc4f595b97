#!/usr/bin/env python3
"""A server of the initialization-based era only: the Python SDK's last 1.x FastMCP
(mcp==1.30.0) over Streamable HTTP, for the tests of a dual-era client's fallback.

    python legacy_server.py PORT              # serves http://127.0.0.1:PORT/mcp
    python legacy_server.py PORT resumable    # the same, with streams a client may resume

`echo(text)` returns its text; `greet()` asks the user's name the way this era does, with an
`elicitation/create` request on the call's own stream, and greets them. A resumable server
keeps its events in memory, and each of its streams opens with an event that carries an id
and empty data (2025-11-25 transports: the server SHOULD send one to prime resumption).
"""

import sys

from mcp.server.fastmcp import Context, FastMCP
from mcp.server.streamable_http import EventMessage, EventStore
from pydantic import BaseModel


class MemoryEvents(EventStore):
    """Every event of the process, in order; an event's id is its place in the list. Stream
    ids repeat across sessions (a request's id), so a replay may carry another session's
    events: enough for the priming events the tests meet, not for resuming."""

    def __init__(self):
        self.events = []

    async def store_event(self, stream_id, message):
        self.events.append((stream_id, message))
        return str(len(self.events))

    async def replay_events_after(self, last_event_id, send_callback):
        if not last_event_id.isdigit() or not 0 < int(last_event_id) <= len(self.events):
            return None
        last = int(last_event_id)
        stream_id = self.events[last - 1][0]
        for n, (stream, message) in enumerate(self.events[last:], start=last + 1):
            if stream == stream_id and message is not None:
                await send_callback(EventMessage(message, str(n)))
        return stream_id


resumable = sys.argv[2:] == ["resumable"]
server = FastMCP(
    "legacy-only",
    host="127.0.0.1",
    port=int(sys.argv[1]),
    event_store=MemoryEvents() if resumable else None,
)


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
