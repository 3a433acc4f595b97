#!/usr/bin/env python3
"""Interop check of multi-round requests: the official Python MCP SDK (mcp==2.3.0) answers
Wharf's elicitation through `elicitation_callback` and receives the final result.

    WHARF_URL=http://127.0.0.1:8080/mcp python test_sdk_mrtr.py

The server must run the default profile (the import service) with `--anonymous`. The check
loads a dataset, then commits a second import with mode "replace": the server asks the user
to confirm (an `input_required` result with one form elicitation), the SDK calls the
callback, retries with the answer and the echoed `requestState`, and gets the commit result.

Exit status 0 on success; 1 with a FAIL line on stderr otherwise (2 if the SDK is missing).
"""

from __future__ import annotations

import sys
import uuid
from typing import Any

from interop import TIMEOUT_S, URL, check, main, step

MODE = "2026-07-28"


def structured(result: Any, what: str) -> dict[str, Any]:
    check(not result.is_error, f"{what}: isError=true, content={result.content!r}")
    check(isinstance(result.structured_content, dict), f"{what}: no structuredContent")
    return result.structured_content


async def run() -> None:
    import mcp_types as types
    from mcp import Client

    asked: list[Any] = []

    async def on_elicit(context: Any, params: Any) -> Any:
        asked.append(params)
        return types.ElicitResult(action="accept", content={"replace": True})

    dataset = f"sdk_{uuid.uuid4().hex[:12]}"
    columns = [{"name": "id", "type": "integer"}]
    async with Client(URL, mode=MODE, read_timeout_seconds=TIMEOUT_S, elicitation_callback=on_elicit) as client:
        first = structured(await client.call_tool("import_begin", {"dataset": dataset, "columns": columns, "idempotency_key": uuid.uuid4().hex}), "import_begin")
        await client.call_tool(
            "import_append_rows",
            {"import": first["import"], "rows": [{"id": i} for i in range(3)], "idempotency_key": uuid.uuid4().hex},
        )
        structured(await client.call_tool("import_commit", {"import": first["import"], "idempotency_key": "commit"}), "import_commit (append)")
        check(not asked, "appending to a dataset asked the user something")
        step("dataset loaded with 3 rows, no question asked")

        second = structured(await client.call_tool("import_begin", {"dataset": dataset, "idempotency_key": uuid.uuid4().hex}), "import_begin")
        await client.call_tool(
            "import_append_rows",
            {"import": second["import"], "rows": [{"id": 10}, {"id": 11}], "idempotency_key": uuid.uuid4().hex},
        )
        done = structured(
            await client.call_tool("import_commit", {"import": second["import"], "mode": "replace", "idempotency_key": "commit"}),
            "import_commit (replace)",
        )
        check(len(asked) == 1, f"expected exactly one elicitation, got {len(asked)}")
        message = getattr(asked[0], "message", "")
        check("3 rows" in message and "2 rows" in message, f"the question does not say what is replaced: {message!r}")
        check(done.get("totalRows") == 2 and done.get("committedRows") == 2, f"import_commit result: {done!r}")
        step(f"import_commit mode=replace asked {message!r} through elicitation_callback; result {done!r}")



if __name__ == "__main__":
    sys.exit(main("Python MCP SDK client (MRTR)", run, "Python SDK answers an elicitation and gets the final result"))
