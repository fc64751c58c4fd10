"""The server as editors see it: capabilities, inline and fallback completion, errors, loading."""

from __future__ import annotations

import pytest
from lsprotocol import types as t
from pygls.exceptions import JsonRpcException
from pytest_lsp import LanguageClient

from tests.e2e.lsp_harness import (URI, end_of, fake_text, initialize, inline_params, insert, items, open_doc, options, send_raw,
                                    status, wait_for)

DOC = "def add(a, b):\n    return a"


@pytest.mark.parametrize("profile", ["visual-studio-code", "neovim"])
async def test_inline_capability_advertised_and_answered(client: LanguageClient, profile: str):
    result = await initialize(client, profile)
    assert result.capabilities.inline_completion_provider is not None
    sync = result.capabilities.text_document_sync
    assert sync.change == t.TextDocumentSyncKind.Incremental and sync.save
    open_doc(client, DOC)
    pos = end_of(DOC)
    found = items(await client.text_document_inline_completion_async(inline_params(pos)))
    assert [i.insert_text for i in found] == [fake_text(DOC)]
    assert found[0].range == t.Range(start=pos, end=pos)
    assert found[0].command is not None
    fallback = await client.text_document_completion_async(
        t.CompletionParams(text_document=t.TextDocumentIdentifier(uri=URI), position=pos)
    )
    assert not fallback.items  # inline-capable clients get ghost text only (no double generation)


async def test_completion_fallback_replaces_the_word(client: LanguageClient):
    await initialize(client, "neovim", inline=False)
    open_doc(client, DOC)
    pos = end_of(DOC)
    result = await client.text_document_completion_async(
        t.CompletionParams(text_document=t.TextDocumentIdentifier(uri=URI), position=pos)
    )
    (item,) = result.items
    assert item.text_edit.new_text == "a" + fake_text(DOC)
    assert item.text_edit.range == t.Range(start=t.Position(line=1, character=pos.character - 1), end=pos)


@pytest.mark.parametrize(
    "params",
    [
        {"textDocument": {"uri": URI}, "position": {"line": 0, "character": 0}},  # no context
        {"textDocument": {"uri": URI}, "position": {"line": 0, "character": 0}, "context": {"triggerKind": 7}},
        {"textDocument": {"uri": URI}, "position": {"line": "x", "character": 0}, "context": {"triggerKind": 1}},
    ],
)
async def test_malformed_params_get_invalid_params_error(client: LanguageClient, params: dict):
    await initialize(client)
    with pytest.raises(JsonRpcException) as err:
        await send_raw(client, t.TEXT_DOCUMENT_INLINE_COMPLETION, params)
    assert err.value.code == -32602
    assert (await status(client))["engine"]["state"] == "ready"  # still alive


async def test_unknown_document_and_bad_position_answer_empty(client: LanguageClient):
    await initialize(client)
    unknown = "file:///draftline-e2e/never-opened.py"
    assert items(await client.text_document_inline_completion_async(inline_params(t.Position(line=0, character=0), unknown))) == []
    open_doc(client, DOC)
    assert items(await client.text_document_inline_completion_async(inline_params(t.Position(line=99, character=3)))) == []
    assert items(await client.text_document_inline_completion_async(inline_params(end_of(DOC)))) != []


async def test_model_that_fails_to_load_shows_a_message_and_answers_empty(client: LanguageClient):
    await initialize(client, init_options=options(options={"fail_load": True}), wait="failed")
    assert any(m.type == t.MessageType.Error and "failed to load" in m.message for m in client.messages)
    open_doc(client, DOC)
    assert items(await client.text_document_inline_completion_async(inline_params(end_of(DOC)))) == []
    current = await status(client)
    assert current["engine"]["state"] == "failed" and current["requests"] == 1


async def test_configuration_change_reloads_the_model(client: LanguageClient):
    await initialize(client, init_options=options(options={"text": "first"}))
    open_doc(client, DOC)
    first = items(await client.text_document_inline_completion_async(inline_params(end_of(DOC))))
    client.workspace_did_change_configuration(t.DidChangeConfigurationParams(settings=options(options={"text": "second"})))
    await wait_for(client, lambda s: s["engine"]["state"] == "ready")
    second = items(await client.text_document_inline_completion_async(inline_params(end_of(DOC))))
    assert [i.insert_text for i in first + second] == ["first", "second"]


async def test_selected_completion_info_is_extended_over_the_same_range(client: LanguageClient):
    await initialize(client)
    text = "x = os.pa"
    open_doc(client, text)
    selected = t.SelectedCompletionInfo(
        range=t.Range(start=t.Position(line=0, character=7), end=t.Position(line=0, character=9)), text="path"
    )
    params = inline_params(end_of(text))
    params.context.selected_completion_info = selected
    (item,) = items(await client.text_document_inline_completion_async(params))
    assert item.range == selected.range
    assert item.insert_text == "path" + fake_text("x = os.path")


async def test_a_secret_in_the_open_buffer_never_reaches_the_model(client: LanguageClient):
    """The fake engine echoes the last word of what it is given: the key's, redacted; the item is placed
    at the cursor of the real text."""
    await initialize(client)
    doc = "import boto3\nkey_id = 'AKIACANARY0123456789"
    open_doc(client, doc)
    pos = end_of(doc)
    found = items(await client.text_document_inline_completion_async(inline_params(pos)))
    seen = doc.replace("AKIACANARY0123456789", "<redacted>")
    assert [i.insert_text for i in found] == [fake_text(seen)]
    assert "CANARY" not in found[0].insert_text and found[0].range == t.Range(start=pos, end=pos)


async def test_a_form_feed_ends_no_line(client: LanguageClient):
    """LSP ends lines at \\n, \\r\\n, \\r only: an edit after a form feed (Emacs' page break) lands where the
    client put it, and the answer is for that text (Python's splitlines made the form feed a line)."""
    await initialize(client)
    text = "x = 1\n\x0c\ndef f():\n    return a"
    open_doc(client, text)
    insert(client, t.Position(line=3, character=12), "b", version=2)  # after "return a"
    found = items(await client.text_document_inline_completion_async(inline_params(t.Position(line=3, character=13))))
    assert [i.insert_text for i in found] == [fake_text(text + "b")]


async def test_a_clients_slip_in_a_notification_is_logged_not_shown(client: LanguageClient):
    """A change to a document the client never opened (pygls: KeyError): the server goes on, and the
    editor gets no "Error in server" pop-up for it."""
    await initialize(client)
    never = "file:///draftline-e2e/never-opened.py"
    insert(client, t.Position(line=0, character=0), "x", version=2, uri=never)
    open_doc(client, DOC)
    assert items(await client.text_document_inline_completion_async(inline_params(end_of(DOC)))) != []
    assert not [m for m in client.messages if m.type == t.MessageType.Error], client.messages


async def test_no_automatic_suggestion_inside_or_before_a_word(client: LanguageClient):
    """`Pen|ding()`: an editor's automatic request while the cursor sits inside (or right before) a word
    gets nothing (an insertion there is rarely wanted); the user invoking it, another cursor on the line,
    or `completion.inside_words` get the engine's answer."""
    await initialize(client)
    doc = "def f():\n    return Pending(x)"
    open_doc(client, doc)
    mid = t.Position(line=1, character=14)  # return Pen|ding(x)
    assert items(await client.text_document_inline_completion_async(inline_params(mid))) == []
    assert items(await client.text_document_inline_completion_async(inline_params(t.Position(line=1, character=11)))) == []
    asked = inline_params(mid)
    asked.context.trigger_kind = t.InlineCompletionTriggerKind.Invoked
    assert [i.insert_text for i in items(await client.text_document_inline_completion_async(asked))] == [
        fake_text("def f():\n    return Pen")]
    before_bracket = t.Position(line=1, character=20)  # return Pending(x|)
    # the fake answer (`fake_29_Pending(x`) is cut before its own `(`: the line's `)` would close that one
    # and leave `Pending(` open (postprocess.drop_unclosed_openers)
    assert [i.insert_text for i in items(await client.text_document_inline_completion_async(
        inline_params(before_bracket)))] == [fake_text("def f():\n    return Pending(x").split("(")[0]]
    client.workspace_did_change_configuration(t.DidChangeConfigurationParams(
        settings=options(completion={"debounce_ms": 0, "inside_words": True})))
    await wait_for(client, lambda s: s["engine"]["state"] == "ready")
    assert [i.insert_text for i in items(await client.text_document_inline_completion_async(inline_params(mid)))] == [
        fake_text("def f():\n    return Pen")]


async def test_an_invoked_popup_request_is_answered_inside_a_word(client: LanguageClient):
    """A client without inline completion: Ctrl+Space (Invoked) inside a word gets the item; a trigger
    character's request there does not."""
    await initialize(client, "neovim", inline=False)
    doc = "def f():\n    return Pending(x)"
    open_doc(client, doc)
    mid = t.Position(line=1, character=14)

    async def ask(kind):
        return (await client.text_document_completion_async(t.CompletionParams(
            text_document=t.TextDocumentIdentifier(uri=URI), position=mid,
            context=t.CompletionContext(trigger_kind=kind, trigger_character="n" if kind == 2 else None)))).items

    assert not await ask(t.CompletionTriggerKind.TriggerCharacter)
    (item,) = await ask(t.CompletionTriggerKind.Invoked)
    assert item.text_edit.new_text == "Pen" + fake_text("def f():\n    return Pen")


async def test_settings_the_server_ignores_are_shown_once_not_only_logged(client: LanguageClient):
    """An unknown key or a value of the wrong type was a log line nobody saw: the setting silently did nothing."""
    settings = options()
    settings["draftline"]["completion"] = {"debounce_ms": 0, "max_linez": 3}
    await initialize(client, init_options=settings)
    warnings = [m.message for m in client.messages if m.type == t.MessageType.Warning]
    assert len(warnings) == 1 and "max_linez" in warnings[0], client.messages
    client.workspace_did_change_configuration(t.DidChangeConfigurationParams(settings=settings))
    assert (await status(client))["engine"]["state"] == "ready"  # the change was handled: no second warning
    assert len([m for m in client.messages if m.type == t.MessageType.Warning]) == 1
