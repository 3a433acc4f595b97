#!/usr/bin/env python3
"""Interop check of the initialization-based era: the last 1.x release of the official Python
MCP SDK (mcp==1.30.0, which speaks only `initialize`-based versions) against `wharf serve`.

    WHARF_URL=http://127.0.0.1:8080/mcp python test_sdk_legacy.py

The server must run the default profile (the import service), with `--anonymous` or with
the API key given as WHARF_TOKEN. The check
initializes a session (ClientSession over streamablehttp_client), lists the tools, loads a
dataset, generates a report with progress, replaces the dataset (the server asks the user to
confirm through an `elicitation/create` request on the call's stream, answered by
`elicitation_callback`), and closes the client, which DELETEs the session: a request on it
afterwards must get 404.

Exit status 0 on success; 1 with a FAIL line on stderr otherwise (2 if the SDK is missing).
"""

from __future__ import annotations

import os
import sys
import uuid
from datetime import timedelta
from typing import Any

from interop import TIMEOUT_S, URL, check, main, step

# A bearer token for servers with API keys (the deployment test runs this behind nginx).
AUTH = {"Authorization": f"Bearer {os.environ['WHARF_TOKEN']}"} if os.environ.get("WHARF_TOKEN") else {}


def structured(result: Any, what: str) -> dict[str, Any]:
    check(not result.isError, f"{what}: isError=true, content={result.content!r}")
    check(isinstance(result.structuredContent, dict), f"{what}: no structuredContent")
    return result.structuredContent


async def run() -> None:
    import httpx
    from mcp import ClientSession, types
    from mcp.client.streamable_http import streamablehttp_client

    asked: list[Any] = []

    async def on_elicit(context: Any, params: Any) -> Any:
        asked.append(params)
        return types.ElicitResult(action="accept", content={"replace": True})

    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    dataset = f"legacy_{uuid.uuid4().hex[:12]}"
    columns = [{"name": "id", "type": "integer"}]
    async with streamablehttp_client(URL, headers=AUTH, timeout=TIMEOUT_S) as (read, write, session_id):
        async with ClientSession(
            read, write, read_timeout_seconds=timedelta(seconds=TIMEOUT_S), elicitation_callback=on_elicit
        ) as session:
            init = await session.initialize()
            check(init.protocolVersion == "2025-11-25", f"negotiated {init.protocolVersion!r}")
            sid = session_id()
            check(bool(sid), "initialize issued no Mcp-Session-Id")
            step(f"initialize: {init.serverInfo.name} {init.serverInfo.version}, session {sid[:8]}…")

            names = {t.name for t in (await session.list_tools()).tools}
            check({"import_begin", "import_commit", "report_generate"} <= names, f"tools/list: {sorted(names)}")
            step(f"tools/list: {len(names)} tools")

            first = structured(await session.call_tool("import_begin", {"dataset": dataset, "columns": columns, "idempotency_key": uuid.uuid4().hex}), "import_begin")
            rows = [{"id": i} for i in range(450)]
            await session.call_tool(
                "import_append_rows", {"import": first["import"], "rows": rows, "idempotency_key": uuid.uuid4().hex}
            )
            structured(await session.call_tool("import_commit", {"import": first["import"], "idempotency_key": "commit"}), "import_commit (append)")
            check(not asked, "appending to a dataset asked the user something")

            report = structured(
                await session.call_tool(
                    "report_generate",
                    {"dataset": dataset, "chunk_rows": 100, "pause_ms": 30, "idempotency_key": f"report-{uuid.uuid4()}"},
                    progress_callback=on_progress
                ),
                "report_generate",
            )
            check(report.get("scannedRows") == 450, f"report_generate result: {report!r}")
            check(len(progress) >= 5 and progress == sorted(progress), f"progress notifications: {progress!r}")
            step(f"report_generate: {len(progress)} progress notifications {progress!r}")

            second = structured(await session.call_tool("import_begin", {"dataset": dataset, "idempotency_key": uuid.uuid4().hex}), "import_begin")
            await session.call_tool(
                "import_append_rows",
                {"import": second["import"], "rows": [{"id": 10}, {"id": 11}], "idempotency_key": uuid.uuid4().hex},
            )
            done = structured(
                await session.call_tool("import_commit", {"import": second["import"], "mode": "replace", "idempotency_key": "commit"}),
                "import_commit (replace)",
            )
            check(len(asked) == 1, f"expected exactly one elicitation, got {len(asked)}")
            message = getattr(asked[0], "message", "")
            check("450 rows" in message and "2 rows" in message, f"the question does not say what is replaced: {message!r}")
            check(done.get("totalRows") == 2, f"import_commit result: {done!r}")
            step(f"import_commit mode=replace asked {message!r} through elicitation_callback")

    # Leaving the client DELETEs the session: it is gone for every request after. The server
    # answers the DELETE once the end is published on the bus, which every replica drops its
    # copy of the session on, well before this new connection's request reaches one.
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
        r = await http.post(
            URL,
            headers={
                "content-type": "application/json",
                "accept": "application/json, text/event-stream",
                "mcp-session-id": sid,
                "mcp-protocol-version": "2025-11-25",
                **AUTH,
            },
            json={"jsonrpc": "2.0", "id": 99, "method": "ping"},
        )
        check(r.status_code == 404, f"a ping on the closed session got HTTP {r.status_code}: {r.text}")
        step("the client's DELETE ended the session (ping afterwards: 404)")



if __name__ == "__main__":
    sys.exit(
        main(
            "Python MCP SDK 1.x client (legacy session)",
            run,
            "a 1.x Python client initializes, calls with progress, answers an elicitation, and ends its session",
            requirements="requirements-legacy.txt",
        )
    )
