"""Scheduling as the client sees it: storms of edits, $/cancelRequest, type-through, metrics."""

from __future__ import annotations

import asyncio
import collections
import random

from lsprotocol import types as t
from pygls.exceptions import JsonRpcRequestCancelled
from pytest_lsp import LanguageClient

from tests.e2e.lsp_harness import (DEADLINE_S, end_of, fake_text, initialize, inline_params, insert, items, open_doc,
                         options, status, wait_for)

WORDS = ["alpha", "beta", "gamma", "delta", "x1", "y_2", "zeta", "omega", "pi", "rho"]  # none starts with "f"


def count_responses(client: LanguageClient) -> collections.Counter:
    """Count every response the client receives, by request id."""
    seen: collections.Counter = collections.Counter()
    original = client.protocol._handle_response

    def counting(msg_id, result=None, error=None):
        seen[msg_id] += 1
        return original(msg_id, result, error)

    client.protocol._handle_response = counting
    return seen


async def test_keystroke_storm_answers_each_request_once_and_never_stale(client: LanguageClient):
    await initialize(client, init_options=options(options={"step_s": 0.0005}, completion={"debounce_ms": 2}))
    seen = count_responses(client)
    rng = random.Random(7)
    text, version = "x = start", 1
    open_doc(client, text)
    asked: dict[str, tuple[asyncio.Future, str]] = {}
    for i in range(300):
        piece = rng.choice([" ", ""]) + rng.choice(WORDS)
        version += 1
        insert(client, end_of(text), piece, version)
        text += piece
        msg_id = f"storm-{i}"
        fut = asyncio.ensure_future(
            client.protocol.send_request_async(t.TEXT_DOCUMENT_INLINE_COMPLETION, inline_params(end_of(text)), msg_id=msg_id)
        )
        asked[msg_id] = (fut, fake_text(text))
        if i % 7 == 3:
            await asyncio.sleep(0)  # let the request go out first
            client.cancel_request(t.CancelParams(id=msg_id))
        if i % 3 == 0:
            await asyncio.sleep(rng.choice([0, 0.001, 0.005, 0.02]))  # let some generations start/finish
    answered = cancelled = 0
    for msg_id, (fut, expected) in asked.items():
        try:
            result = await asyncio.wait_for(fut, DEADLINE_S)
        except JsonRpcRequestCancelled:
            cancelled += 1
            continue
        texts = [i.insert_text for i in items(result)]
        assert texts in ([], [expected]), f"{msg_id}: stale answer {texts} (expected {expected!r})"
        answered += bool(texts)
    assert all(seen[m] == 1 for m in asked), "a request was answered more or less than once"
    final = items(await client.text_document_inline_completion_async(inline_params(end_of(text))))
    assert [i.insert_text for i in final] == [fake_text(text)]  # alive and answering afterwards
    current = await status(client)
    assert current["generations"]["max_in_flight"] <= 1
    assert len(asked) + 1 - cancelled <= current["requests"] <= len(asked) + 1
    assert cancelled > 0 and answered > 0
    print("storm:", {"answered": answered, "cancelled": cancelled}, current["generations"], current["superseded"])


async def test_cancel_request_stops_the_generation(client: LanguageClient):
    # left alone the generation would run 96 s (96 tokens, max_tokens, at 1 s each); cancelled, it
    # stops at its next step: within ~1 s, far inside the 10 s allowed
    await initialize(client, init_options=options(options={"step_s": 1.0, "text": "x" * 96}))
    text = "value = some_long_identifier_name"
    open_doc(client, text)
    fut = asyncio.ensure_future(
        client.protocol.send_request_async(t.TEXT_DOCUMENT_INLINE_COMPLETION, inline_params(end_of(text)), msg_id="slow")
    )
    await wait_for(client, lambda s: s["generations"]["in_flight"] == 1)
    client.cancel_request(t.CancelParams(id="slow"))
    try:
        await asyncio.wait_for(fut, 10)
        raise AssertionError("a cancelled request was answered with a result")
    except JsonRpcRequestCancelled:
        pass
    current = await wait_for(client, lambda s: s["generations"]["in_flight"] == 0, deadline_s=10)
    # stopped mid-flight (counted on the engine thread: the cancelled handler is not there to count it)
    assert current["cancellations"] == 1 and current["engine_cancelled"] == 1


async def test_edit_cancels_the_running_generation(client: LanguageClient):
    await initialize(client, init_options=options(options={"step_s": 0.2}))
    text = "value = some_long_identifier_name"
    open_doc(client, text)
    fut = asyncio.ensure_future(client.text_document_inline_completion_async(inline_params(end_of(text))))
    await wait_for(client, lambda s: s["generations"]["in_flight"] == 1)
    insert(client, end_of(text), "_x", 2)
    assert items(await asyncio.wait_for(fut, DEADLINE_S)) == []  # computed for an older version
    current = await wait_for(client, lambda s: s["generations"]["in_flight"] == 0)
    assert current["engine_cancelled"] == 1  # stopped by the edit, not run to its end


async def test_type_through_answers_the_rest_of_the_shown_suggestion(client: LanguageClient):
    await initialize(client)
    text = "x = foo"
    open_doc(client, text)
    first = items(await client.text_document_inline_completion_async(inline_params(end_of(text))))
    assert [i.insert_text for i in first] == ["fake_7_foo"]
    insert(client, end_of(text), "fak", 2)
    text += "fak"
    rest = items(await client.text_document_inline_completion_async(inline_params(end_of(text))))
    assert [i.insert_text for i in rest] == ["e_7_foo"]
    assert (await status(client))["type_through"] == 1


async def test_copilot_notifications_measure_acceptance(client: LanguageClient):
    await initialize(client)
    open_doc(client, "x = foo")
    (item,) = items(await client.text_document_inline_completion_async(inline_params(end_of("x = foo"))))
    payload = {"item": {"insertText": item.insert_text}}
    client.protocol.notify("textDocument/didShowCompletion", payload)
    client.protocol.notify("textDocument/didPartiallyAcceptCompletion", {**payload, "acceptedLength": 4})
    await client.workspace_execute_command_async(
        t.ExecuteCommandParams(command=item.command.command, arguments=item.command.arguments)
    )
    current = await wait_for(client, lambda s: s["accepted"] == 1)
    assert (current["shown"], current["partially_accepted"], current["accepted_chars"]) == (1, 1, 4)
    assert current["acceptance_rate"] == 1.0
    assert current["latency_ms"]["count"] == 1 and current["latency_ms"]["p99"] >= current["latency_ms"]["p50"]
    assert current["memory"]["rss_mb"] > 0 and "index" in current
