#!/usr/bin/env python3
"""Interop check: the official Python MCP SDK (mcp==2.3.0) against a running Wharf server.

Speaks the stateless 2026-07-28 revision via `mcp.Client(url, mode="2026-07-28")`.

    pip install -r requirements.txt          # Python >= 3.10
    WHARF_URL=http://127.0.0.1:8080/mcp [WHARF_TOKEN=...] python test_sdk_client.py

The server must expose:
  * `echo`        -> returns its `text` argument as a single text content
  * `slow_count`  -> sends progress i/steps (i = 1..steps) on an SSE response, then returns "counted {steps}"

Exit status 0 on success; 1 with a FAIL line on stderr otherwise (2 if the SDK is missing).
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from interop import TIMEOUT_S, URL, CheckFailed, check, main, step

TOKEN = os.environ.get("WHARF_TOKEN") or None
MODE = "2026-07-28"


def text_of(result: Any, what: str) -> str:
    """The single text content of a CallToolResult."""
    check(not result.is_error, f"{what}: isError=true, content={result.content!r}")
    check(len(result.content) == 1, f"{what}: expected exactly 1 content block, got {result.content!r}")
    block = result.content[0]
    check(getattr(block, "type", None) == "text", f"{what}: expected a text content block, got {block!r}")
    return block.text


def make_client(mode: str) -> tuple[Any, Any]:
    """(Client, http client to close or None)."""
    from mcp import Client

    if TOKEN is None:
        return Client(URL, mode=mode, read_timeout_seconds=TIMEOUT_S), None
    # The URL form builds its own HTTP client; to add a bearer token, hand the SDK's
    # streamable-HTTP transport a pre-configured one (the caller owns its lifetime).
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    http = create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"})
    return Client(streamable_http_client(URL, http_client=http), mode=mode, read_timeout_seconds=TIMEOUT_S), http


async def check_pinned_mode() -> None:
    import mcp_types as types
    from mcp_types import methods
    from pydantic import ValidationError

    client, http = make_client(MODE)
    try:
        async with client:
            # mode="2026-07-28" adopts the version without touching the wire (it synthesizes a
            # DiscoverResult locally), so discover explicitly: send server/discover, validate the
            # raw result against the 2026-07-28 wire schema (the SDK's own DiscoverResult model
            # defaults resultType/ttlMs/cacheScope, so it alone would not catch their absence),
            # then adopt it so server_info / capabilities come from the server.
            raw = await client.session.send_discover(MODE)
            try:
                methods.validate_server_result("server/discover", MODE, raw)
            except ValidationError as e:
                raise CheckFailed(f"server/discover: result does not match the {MODE} schema: {e}") from None
            discovered = types.DiscoverResult.model_validate(raw)
            check(
                MODE in discovered.supported_versions,
                f"server/discover: supportedVersions {discovered.supported_versions!r} lacks {MODE}",
            )
            check(discovered.capabilities.tools is not None, "server/discover: capabilities.tools is absent")
            client.session.adopt(discovered)
            check(client.protocol_version == MODE, f"negotiated {client.protocol_version!r}, wanted {MODE}")
            step(
                f"server/discover: supportedVersions={discovered.supported_versions} "
                f"serverInfo={client.server_info!r} ttlMs={discovered.ttl_ms} cacheScope={discovered.cache_scope}"
            )

            # tools/list, following nextCursor (Client.list_tools fetches one page per call).
            names: list[str] = []
            cursor: str | None = None
            for _ in range(100):
                page = await client.list_tools(cursor=cursor, cache_mode="bypass")
                names += [t.name for t in page.tools]
                cursor = page.next_cursor
                if cursor is None:
                    break
            else:
                raise CheckFailed("tools/list: more than 100 pages; nextCursor never ends")
            for want in ("echo", "slow_count"):
                check(want in names, f"tools/list: no tool named {want!r} (got {names!r})")
            step(f"tools/list: {len(names)} tools, including echo and slow_count")

            # tools/call echo
            result = await client.call_tool("echo", {"text": "hi"})
            got = text_of(result, "tools/call echo")
            check(got == "hi", f"tools/call echo: text is {got!r}, wanted 'hi'")
            step("tools/call echo {'text': 'hi'} -> 'hi'")

            # tools/call slow_count with progress
            progress: list[tuple[float, float | None, str | None, bool]] = []
            returned = False

            async def on_progress(value: float, total: float | None, message: str | None) -> None:
                progress.append((value, total, message, returned))

            result = await client.call_tool("slow_count", {"steps": 3}, progress_callback=on_progress)
            returned = True
            # The SDK runs each progress callback as its own task; let any still-queued one run so
            # that a notification sent after the result would be seen (and flagged) below.
            await asyncio.sleep(0.05)
            got = text_of(result, "tools/call slow_count")
            check(got == "counted 3", f"tools/call slow_count: text is {got!r}, wanted 'counted 3'")
            values = [p[0] for p in progress]
            check(
                not any(p[3] for p in progress),
                f"tools/call slow_count: progress delivered after the result (values {values!r})",
            )
            check(
                len(progress) >= 2,
                "tools/call slow_count: expected >= 2 progress notifications before the result, "
                f"got {values!r} (progress must go out as SSE events on the tools/call response, "
                "with progressToken echoed from params._meta.progressToken)",
            )
            check(
                all(a < b for a, b in zip(values, values[1:])),
                f"tools/call slow_count: progress values not strictly increasing: {values!r}",
            )
            step(
                f"tools/call slow_count {{'steps': 3}} -> 'counted 3' with progress {values!r} "
                f"(total={progress[-1][1]!r})"
            )
    finally:
        if http is not None:
            await http.aclose()


async def check_auto_mode() -> None:
    """The SDK's default mode="auto" probes server/discover and must settle on 2026-07-28,
    not fall back to the legacy initialize handshake (it does so silently if the discover
    result fails to parse or the probe errors)."""
    client, http = make_client("auto")
    try:
        async with client:
            check(
                client.protocol_version == MODE and client.session.discover_result is not None,
                f"mode='auto': negotiated {client.protocol_version!r} "
                f"({'discover' if client.session.discover_result is not None else 'initialize fallback'}), "
                f"wanted {MODE} via server/discover",
            )
            result = await client.call_tool("echo", {"text": "auto"})
            check(text_of(result, "mode=auto tools/call echo") == "auto", "mode=auto: echo did not echo")
            step("mode='auto' negotiates 2026-07-28 via server/discover; echo works")
    finally:
        if http is not None:
            await http.aclose()


async def run() -> None:
    await check_pinned_mode()
    await check_auto_mode()



if __name__ == "__main__":
    sys.exit(
        main(
            f"Python MCP SDK client (mode={MODE}, token={'yes' if TOKEN else 'no'})",
            run,
            "Python SDK client interop",
        )
    )
