"""Client positions to the text before and after the cursor (UTF-16 columns, line ends, past the end)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pygls.workspace import TextDocument

from lsp_server.documents import lsp_lines, snapshot

URI = "file:///ws/demo.py"


def split(text: str, line: int, character: int) -> tuple[str, str]:
    snap = snapshot(TextDocument(URI, text), line, character, ())
    assert snap is not None
    return snap.before, snap.after


def test_a_position_past_the_end_of_the_last_line_is_its_end():
    assert split("abc", 0, 5) == ("abc", "")  # no newline at the end: pygls alone gives "ab"
    assert split("abc", 0, 3) == ("abc", "")
    assert split("x = 1\nabc", 1, 99) == ("x = 1\nabc", "")
    assert split("abc\ndef\n", 0, 7) == ("abc", "\ndef\n")  # a line with its newline: its end too


def test_crlf_line_ends_stay_after_the_cursor():
    text = "def f():\r\n    return 1\r\nx"
    assert split(text, 0, 8) == ("def f():", "\r\n    return 1\r\nx")
    assert split(text, 0, 9) == ("def f():", "\r\n    return 1\r\nx")  # past the end: never between \r and \n
    assert split(text, 1, 10) == ("def f():\r\n    return", " 1\r\nx")
    assert split(text, 1, 40) == ("def f():\r\n    return 1", "\r\nx")


def test_columns_count_utf16_units_past_a_character_outside_the_bmp():
    text = 's = "😋" + name\nnext'  # the emoji is two UTF-16 units
    assert split(text, 0, 7) == ('s = "😋', '" + name\nnext')
    assert split(text, 0, 8) == ('s = "😋"', " + name\nnext")
    assert split(text, 0, 15) == ('s = "😋" + name', "\nnext")  # the line's end, in UTF-16 units
    assert split(text, 0, 99) == ('s = "😋" + name', "\nnext")
    assert split('x = "😋"', 0, 99) == ('x = "😋"', "")  # past the end of a last line holding one


def test_positions_outside_the_document_have_no_snapshot_and_past_a_line_s_end_its_end():
    doc = TextDocument(URI, "abc\n")
    assert snapshot(doc, 2, 0, ()) is None and snapshot(doc, 0, -1, ()) is None
    assert snapshot(doc, 1, 0, ()).before == "abc\n"  # the empty line after the last newline
    assert snapshot(doc, 1, 1, ()).before == "abc\n"  # past that line's end: its end, as on any line
    assert snapshot(TextDocument(URI, ""), 0, 5, ()).before == ""  # an empty document: its one empty line
    assert snapshot(TextDocument(URI, "abc"), 1, 0, ()) is None  # no line break: no line after it


def test_a_popup_item_replaces_its_whole_range_even_past_the_cursor():
    from lsprotocol import types as t

    from lsp_server.documents import with_selection

    doc = TextDocument(URI, "x = print(1)\n")  # the cursor after "pri"
    snap = snapshot(doc, 0, 7, ())
    assert (snap.before, snap.after) == ("x = pri", "nt(1)\n")
    rng = t.Range(start=t.Position(line=0, character=4), end=t.Position(line=0, character=9))  # the word "print"
    chosen = with_selection(snap, doc, rng, "print")
    assert (chosen.before, chosen.after) == ("x = print", "(1)\n")  # not "printnt(1)"
    at_cursor = t.Range(start=t.Position(line=0, character=4), end=t.Position(line=0, character=7))
    assert with_selection(snap, doc, at_cursor, "print").after == "nt(1)\n"


def test_windows_at_their_edges():
    from lsp_server.documents import prefix_window, suffix_window

    text = "a" * 50 + "\n" + "b" * 30
    assert prefix_window(text, budget=40, quantum=128) != ""  # a budget under one quantum still has a window
    assert text.endswith(prefix_window(text, budget=40, quantum=128))
    assert suffix_window("\n" + "x" * 50, 10) == "\n"  # a suffix opening with a newline: cut at it


def test_lines_end_only_where_lsp_ends_them():
    from lsp_server.documents import LspTextDocument, lsp_lines

    assert lsp_lines("a\x0cb\nc\x85d\u2028e") == ["a\x0cb\n", "c\x85d\u2028e"]
    assert lsp_lines("a\rb\r\nc\n") == ["a\r", "b\r\n", "c\n"] == "a\rb\r\nc\n".splitlines(True)
    assert lsp_lines("") == [] and lsp_lines("\n\x0c") == ["\n", "\x0c"]
    text = ";;; a.el\n\x0c\n(defun f ()\n  (foo))\n"
    snap = snapshot(LspTextDocument(URI, text), 3, 2, ())
    assert snap is not None and snap.after == "(foo))\n"


def test_the_servers_workspace_applies_edits_after_a_form_feed_where_the_client_made_them():
    from lsprotocol import types as t
    from pygls.workspace import Workspace

    from lsp_server.documents import use_lsp_lines

    workspace = Workspace(None)
    use_lsp_lines(workspace)
    workspace.put_text_document(t.TextDocumentItem(uri=URI, language_id="emacs-lisp", version=1,
                                                   text=";;; a.el\n\x0c\n(defun f ()\n  (foo))\n"))
    change = t.TextDocumentContentChangePartial(range=t.Range(start=t.Position(3, 2), end=t.Position(3, 2)), text="X")
    workspace.update_text_document(t.VersionedTextDocumentIdentifier(uri=URI, version=2), change)
    assert workspace.get_text_document(URI).source == ";;; a.el\n\x0c\n(defun f ()\n  X(foo))\n"


def test_language_ids_of_files_read_from_disk():
    from lsp_server.documents import language_id

    assert [language_id(p) for p in ("a.py", "b/c.TSX", "x.rs", "Makefile", "init.el", "README")] == [
        "python", "typescriptreact", "rust", "makefile", "emacs-lisp", ""]
    # prose and data: `draftline complete` on a README.md post-processed it as code, JSON as plain text
    assert [language_id(p) for p in ("README.md", "package.json", "notes.txt")] == ["markdown", "json", "plaintext"]


def test_a_cells_snapshot_names_its_notebooks_file_for_the_context():
    from lsprotocol import types as t
    from pygls.workspace import Workspace

    from lsp_server.completer import build_request, context_for
    from lsp_server.config import CompletionConfig
    from lsp_server.documents import in_notebook, use_lsp_lines

    root = Path("/ws").resolve()
    notebook_uri = (root / "nb" / "analysis.ipynb").as_uri()
    cells = [("c0", "python", "import helpers\n"), ("c1", "python", "helpers.")]
    workspace = Workspace(root.as_uri())
    use_lsp_lines(workspace)
    workspace.put_notebook_document(t.DidOpenNotebookDocumentParams(
        notebook_document=t.NotebookDocument(uri=notebook_uri, notebook_type="jupyter-notebook", version=1, cells=[
            t.NotebookCell(kind=t.NotebookCellKind.Code, document=f"vscode-notebook-cell:{name}") for name, _, _ in cells]),
        cell_text_documents=[t.TextDocumentItem(uri=f"vscode-notebook-cell:{name}", language_id=lang, version=1, text=text)
                             for name, lang, text in cells]))
    doc = workspace.get_text_document("vscode-notebook-cell:c1")
    snap = in_notebook(snapshot(doc, 0, 8, [root]), workspace, [root])
    assert snap.uri == "vscode-notebook-cell:c1" and snap.before == "import helpers\n\nhelpers."
    assert snap.path == "nb/analysis.ipynb" and snap.file == str(root / "nb" / "analysis.ipynb")
    cfg = CompletionConfig()
    request = build_request(snap, cfg, [root])
    assert request.repo == "ws" and request.path == "nb/analysis.ipynb"
    assert context_for(snap, request, cfg).path == str(root / "nb" / "analysis.ipynb")  # imports, own-file chunks


def test_a_documents_lines_are_split_once_per_text(monkeypatch):
    from lsprotocol import types as t

    from lsp_server import documents
    from lsp_server.documents import LspTextDocument

    calls = []
    split = documents.lsp_lines
    monkeypatch.setattr(documents, "lsp_lines", lambda source: calls.append(1) or split(source))
    doc = LspTextDocument(URI, "a = 1\nb = 2\n", sync_kind=t.TextDocumentSyncKind.Incremental)
    for _ in range(3):
        assert snapshot(doc, 1, 3, ()) is not None  # lines, then an offset: each reads them
    assert len(calls) == 1
    doc.apply_change(t.TextDocumentContentChangePartial(range=t.Range(start=t.Position(1, 5), end=t.Position(1, 5)),
                                                        text="0"))
    assert doc.source == "a = 1\nb = 20\n" and doc.lines == ("a = 1\n", "b = 20\n") and len(calls) == 2


def test_positions_past_the_end_and_selection_ranges():
    from lsprotocol import types as t

    from lsp_server.documents import LspTextDocument, completion_item, with_selection

    doc = LspTextDocument(URI, "def add(a, b):\n    return ab")
    assert snapshot(doc, 2, 0, ()) is None  # no line break ends line 1: there is no line 2
    assert snapshot(LspTextDocument(URI, "x = 1\n"), 1, 0, ()) is not None  # the empty line after one
    snap = snapshot(doc, 1, 40, ())
    item = completion_item(doc, snap, t.Position(line=1, character=40), "_total")
    assert item.text_edit.range == t.Range(start=t.Position(line=1, character=11), end=t.Position(line=1, character=13))
    # the popup's selected item: its range must hold the cursor, on the cursor's line
    at = t.Position(line=1, character=13)
    snap = snapshot(doc, 1, 13, ())
    inside = t.Range(start=t.Position(line=1, character=11), end=t.Position(line=1, character=50))
    chosen = with_selection(snap, doc, inside, "abs", at)
    assert chosen is not None and chosen.before.endswith("return abs") and chosen.after == ""
    assert inside.end.character == 50  # the client's range is not clamped in place (it goes back in the item)
    for rng in (t.Range(start=t.Position(line=0, character=0), end=t.Position(line=0, character=3)),  # another line
                t.Range(start=t.Position(line=1, character=4), end=t.Position(line=1, character=8))):  # before it
        assert with_selection(snap, doc, rng, "x", at) is None


def test_a_reopened_document_is_not_the_one_a_snapshot_was_taken_of():
    from lsprotocol import types as t
    from pygls.workspace import Workspace

    from lsp_server.server import build_server

    ls = build_server()
    ls.protocol._workspace = workspace = Workspace(None)
    from lsp_server.documents import use_lsp_lines

    use_lsp_lines(workspace)
    item = t.TextDocumentItem(uri=URI, language_id="python", version=1, text="old = 1\n")
    workspace.put_text_document(item)
    snap = snapshot(ls.draftline.document(URI), 0, 3, ())
    assert ls.draftline.is_current(snap)
    workspace.remove_text_document(URI)  # closed and opened again: editors start over at version 1
    workspace.put_text_document(t.TextDocumentItem(uri=URI, language_id="python", version=1, text="new = 2\n"))
    assert not ls.draftline.is_current(snap)
    assert ls.draftline.is_current(snapshot(ls.draftline.document(URI), 0, 3, ()))
    ls.draftline.close()


def test_the_cursor_of_a_snapshot_counts_lsp_line_ends():
    from lsprotocol import types as t

    from lsp_server.documents import LspTextDocument, cursor

    doc = LspTextDocument(URI, "a = 1\rb = 2")  # a bare \r ends a line too
    snap = snapshot(doc, 1, 3, ())
    assert snap.before == "a = 1\rb =" and cursor(snap, 1, doc) == t.Position(line=1, character=3)


def test_the_fast_codec_converts_positions_as_pygls_does():
    import random

    from lsprotocol import types as t
    from pygls.workspace.position_codec import PositionCodec

    from lsp_server.documents import AsciiFastCodec

    rng = random.Random(7)
    pieces = ["a", "b", " ", "\t", "(", "é", "中", "😀", "\r\n", "\n", "\r"]
    kinds = t.PositionEncodingKind
    for encoding in ("utf-8", "utf-16", "utf-32", kinds.Utf8, kinds.Utf16, kinds.Utf32):  # pygls passes the enum
        fast, slow = AsciiFastCodec(encoding), PositionCodec(encoding)
        for _ in range(1500):
            text = "".join(rng.choice(pieces[:5] if rng.random() < 0.5 else pieces) for _ in range(rng.randrange(0, 30)))
            lines = lsp_lines(text)
            line, character = rng.randrange(-1, len(lines) + 2), rng.randrange(0, 40)
            if line < 0:
                continue
            a, b = t.Position(line=line, character=character), t.Position(line=line, character=character)
            content = lines[line].rstrip("\r\n") if line < len(lines) else ""
            got = fast.position_from_client_units(lines, a)
            if line < len(lines) and character > slow.client_num_units(content):
                # past the line's end: its end, before the line break (pygls' differs: the codec's docstring)
                assert (got.line, got.character) == (line, len(content)), (text, line, character)
                continue
            assert got == slow.position_from_client_units(lines, b), (text, line, character)
            assert fast.position_to_client_units(lines, got) == slow.position_to_client_units(lines, got)
            segment = lines[line] if line < len(lines) else text
            assert fast.client_num_units(segment) == slow.client_num_units(segment)


@pytest.mark.parametrize(("text", "start", "end", "new", "expected"), [
    ("abc\nxyz\n", (0, 4), (0, 4), "Q", "abcQ\nxyz\n"),  # one past the end: the end, not the next line
    ("abc\r\nxyz\r\n", (0, 4), (0, 4), "Q", "abcQ\r\nxyz\r\n"),  # not between \r and \n
    ("abc", (0, 4), (0, 4), "d", "abcd"),  # a last line without a newline
    ("abc", (0, 99), (0, 99), "d", "abcd"),
    ("abc\nxyz\n", (0, 1), (0, 4), "Z", "aZ\nxyz\n"),  # a range ending past the end keeps the line break
    ("abc\r\nxyz\r\n", (0, 3), (0, 4), "", "abc\r\nxyz\r\n"),
    ("é😀\nx\n", (0, 4), (0, 4), "Q", "é😀Q\nx\n"),
    ("abc\rxyz", (0, 9), (0, 9), "Q", "abcQ\rxyz"),  # a bare \r ends a line too
    ("abcdef\n", (0, 4), (0, 1), "Z", "aZef\n"),  # a range ending before it starts (pygls kept "bcd" twice)
    ("abc\nxyz\n", (1, 1), (0, 2), "", "abyz\n"),
])
def test_an_edit_past_a_line_end_applies_at_the_line_end(text, start, end, new, expected):
    """LSP: a character past the line's length means its length. Found by a raw JSON-RPC probe: the
    server's buffer drifted from the editor's (every later line shifted in a CRLF file)."""
    from lsprotocol import types as t

    from lsp_server.documents import LspWorkspace

    ws = LspWorkspace(None, position_encoding=t.PositionEncodingKind.Utf16)
    ws.put_text_document(t.TextDocumentItem(uri=URI, language_id="python", version=1, text=text))
    rng = t.Range(start=t.Position(line=start[0], character=start[1]), end=t.Position(line=end[0], character=end[1]))
    ws.update_text_document(t.VersionedTextDocumentIdentifier(uri=URI, version=2),
                            t.TextDocumentContentChangePartial(range=rng, text=new))
    assert ws.get_text_document(URI).source == expected


def test_a_long_line_with_a_non_ascii_character_is_not_walked_in_python(monkeypatch):
    """A 2 MB line with one "é" cost ~0.9 s a keystroke in pygls' per-character loop (the encoding pygls
    passes is the PositionEncodingKind enum, which the shortcut did not recognise): every encoding is
    converted without it now."""
    from lsprotocol import types as t
    from pygls.workspace.position_codec import PositionCodec

    from lsp_server.documents import AsciiFastCodec

    def walked(*args, **kwargs):
        raise AssertionError("pygls' per-character conversion ran")

    monkeypatch.setattr(PositionCodec, "position_from_client_units", walked)
    monkeypatch.setattr(PositionCodec, "position_to_client_units", walked)
    monkeypatch.setattr(PositionCodec, "client_num_units", walked)
    lines = ["é" + "x" * 2_000 + "😀y\n", "z\n"]
    for kind, units in ((t.PositionEncodingKind.Utf8, 2), (t.PositionEncodingKind.Utf16, 1),
                        (t.PositionEncodingKind.Utf32, 1)):
        codec = AsciiFastCodec(kind)
        at = codec.position_from_client_units(lines, t.Position(line=0, character=units + 5))
        assert at.character == 6
        assert codec.position_to_client_units(lines, at) == t.Position(line=0, character=units + 5)
        assert codec.client_num_units(lines[0]) > 2_000


def test_a_completion_items_label_is_its_first_line_in_a_crlf_document():
    from lsprotocol import types as t

    from lsp_server.documents import completion_item

    doc = TextDocument(URI, "def f():\r\n    \r\n")
    snap = snapshot(doc, 1, 4, ())
    item = completion_item(doc, snap, t.Position(line=1, character=4), "y = 1\r\n    return y")
    assert item.label == "y = 1" and item.text_edit.new_text == "y = 1\r\n    return y"
