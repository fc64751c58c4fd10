"""Waiting in async tests for what the server does on its own time (a condition, polled; no fixed sleep)."""

from __future__ import annotations

import asyncio


async def until(predicate, timeout_s: float = 10.0) -> None:
    """Return once ``predicate()`` holds; AssertionError after ``timeout_s``."""
    for _ in range(int(timeout_s / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")
