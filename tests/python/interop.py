"""What the interop checks (test_sdk_*.py) share: the failure they raise, and the runner that
turns a check's outcome into an exit status (0 pass, 1 FAIL line on stderr, 2 SDK missing).

No SDK import here: the checks run under two SDK generations (requirements.txt and
requirements-legacy.txt), whose result types spell their fields differently.
"""

from __future__ import annotations

import asyncio
import os
import sys
import traceback
from typing import Any, Awaitable, Callable

URL = os.environ.get("WHARF_URL", "http://127.0.0.1:8080/mcp")
TIMEOUT_S = float(os.environ.get("WHARF_TIMEOUT", "20"))


class CheckFailed(Exception):
    """A check on what the server answered did not hold."""


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise CheckFailed(msg)


def step(msg: str) -> None:
    print(f"ok   {msg}", flush=True)


def find_check_failure(exc: BaseException) -> CheckFailed | None:
    """anyio task groups wrap errors raised inside `async with client` in ExceptionGroups."""
    if isinstance(exc, CheckFailed):
        return exc
    for inner in getattr(exc, "exceptions", ()) or ():
        if (found := find_check_failure(inner)) is not None:
            return found
    return None


def leaf(exc: BaseException) -> BaseException:
    while getattr(exc, "exceptions", None):
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    return exc


def main(banner: str, run: Callable[[], Awaitable[Any]], passed: str, requirements: str = "requirements.txt") -> int:
    """Runs `run` under one overall deadline and reports as the module docstring says."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        print(f"FAIL: the `mcp` package is not installed (pip install -r {requirements})", file=sys.stderr)
        return 2
    print(f"{banner} -> {URL}", flush=True)
    try:
        asyncio.run(asyncio.wait_for(run(), timeout=TIMEOUT_S * 4))
    except BaseException as e:  # CheckFailed, connection errors, SDK errors, validation errors, groups...
        if isinstance(e, KeyboardInterrupt):
            raise
        if (failed := find_check_failure(e)) is not None:
            print(f"FAIL: {failed}", file=sys.stderr)
            return 1
        traceback.print_exc()
        cause = leaf(e)
        print(f"FAIL: {type(cause).__name__}: {cause}", file=sys.stderr)
        return 1
    print(f"PASS: {passed}", flush=True)
    return 0
