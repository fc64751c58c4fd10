"""Helpers for the e2e tests: initialize with a client profile, open/edit documents, poll status."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from lsprotocol import types as t
from pytest_lsp import LanguageClient, client_capabilities

URI = "file:///draftline-e2e/demo.py"
DEADLINE_S = 30.0


def capabilities(profile: str, inline: bool = True) -> t.ClientCapabilities:
    caps = client_capabilities(profile)
    if inline:  # no recorded profile declares it yet (reference/eval-and-clients.md §2.6)
        caps.text_document.inline_completion = t.InlineCompletionClientCapabilities()
    return caps


def options(**model: Any) -> dict[str, Any]:
    completion = model.pop("completion", {"debounce_ms": 0})
    return {"draftline": {"model": {"target": "fake", **model}, "completion": completion}}


async def initialize(
    client: LanguageClient, profile: str = "visual-studio-code", *, inline: bool = True,
    init_options: dict[str, Any] | None = None, roots: tuple[Path, ...] = (), wait: str = "ready",
    notebooks: bool = False,
) -> t.InitializeResult:
    folders = [t.WorkspaceFolder(uri=root.as_uri(), name=root.name) for root in roots] or None
    caps = capabilities(profile, inline)
    if notebooks:  # as VS Code declares them
        caps.notebook_document = t.NotebookDocumentClientCapabilities(
            synchronization=t.NotebookDocumentSyncClientCapabilities(execution_summary_support=True))
    params = t.InitializeParams(
        capabilities=caps,
        initialization_options=init_options if init_options is not None else options(),
        workspace_folders=folders,
    )
    client.registrations = []  # type: ignore[attr-defined]

    @client.feature(t.CLIENT_REGISTER_CAPABILITY)
    def register_capability(params: t.RegistrationParams) -> None:  # real editors accept these
        client.registrations.extend(params.registrations)  # type: ignore[attr-defined]

    result = await client.initialize_session(params)
    if wait:
        await wait_for(client, lambda s: s["engine"]["state"] == wait)
    return result


def to_plain(obj: Any) -> Any:
    """pygls turns results of custom requests into namedtuples; turn them back into dicts."""
    if hasattr(obj, "_asdict"):
        return {k: to_plain(v) for k, v in obj._asdict().items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj


async def status(client: LanguageClient) -> dict[str, Any]:
    return to_plain(await client.protocol.send_request_async("draftline/status", None))


async def wait_for(client: LanguageClient, predicate, deadline_s: float = DEADLINE_S) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while True:
        current = await status(client)
        if predicate(current):
            return current
        if loop.time() > end:
            raise AssertionError(f"status never matched: {current}")
        await asyncio.sleep(0.02)


def open_doc(client: LanguageClient, text: str, uri: str = URI, version: int = 1) -> None:
    item = t.TextDocumentItem(uri=uri, language_id="python", version=version, text=text)
    client.text_document_did_open(t.DidOpenTextDocumentParams(text_document=item))


def end_of(text: str) -> t.Position:
    lines = text.split("\n")
    return t.Position(line=len(lines) - 1, character=len(lines[-1]))


def insert(client: LanguageClient, at: t.Position, new_text: str, version: int, uri: str = URI) -> None:
    change = t.TextDocumentContentChangePartial(range=t.Range(start=at, end=at), text=new_text)
    doc = t.VersionedTextDocumentIdentifier(uri=uri, version=version)
    client.text_document_did_change(t.DidChangeTextDocumentParams(text_document=doc, content_changes=[change]))


def inline_params(position: t.Position, uri: str = URI) -> t.InlineCompletionParams:
    ctx = t.InlineCompletionContext(trigger_kind=t.InlineCompletionTriggerKind.Automatic)
    return t.InlineCompletionParams(text_document=t.TextDocumentIdentifier(uri=uri), position=position, context=ctx)


def fake_text(prefix: str) -> str:
    """What engine.fake.FakeEngine answers (single-line) for a prefix: it encodes the version."""
    words = prefix.split()
    return f"fake_{len(prefix)}_{(words[-1] if words else '')[-16:]}"


def items(result: Any) -> list[t.InlineCompletionItem]:
    if result is None:
        return []
    return list(result.items if isinstance(result, t.InlineCompletionList) else result)


async def send_raw(client: LanguageClient, method: str, params: Any) -> Any:
    """A request with hand-written (possibly invalid) params, bypassing the typed serializer."""
    from concurrent.futures import Future
    from uuid import uuid4

    msg_id = str(uuid4())
    future: Future = Future()
    client.protocol._request_futures[msg_id] = future
    client.protocol._send_data({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
    return await asyncio.wait_for(asyncio.wrap_future(future), DEADLINE_S)
