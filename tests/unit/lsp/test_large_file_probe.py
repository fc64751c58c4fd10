"""A keystroke in a large file (30,000 lines, or one 200,000-character line) costs the server about what
it costs in a small one: the edit, the snapshot, the context and the digest read the text around the
cursor (or only what changed since the last keystroke), not the whole document each time. The tests
count the work done (characters split or searched, lines read), never time."""

from __future__ import annotations

import logging
import random
import threading
import tracemalloc

import pytest
from lsprotocol import types as t
from pygls.workspace import TextDocument

from engine.fake import FakeEngine
from indexer.imports import Import
from lsp_server import context, digest, documents
from lsp_server.completer import Completer, build_request, context_for
from lsp_server.config import CompletionConfig
from lsp_server.digest import Digest, Entry, ImportCache
from lsp_server.documents import AsciiFastCodec, LspTextDocument, lsp_lines, snapshot

URI = "file:///w/big.py"
INC = t.TextDocumentSyncKind.Incremental


def big_source(lines: int = 30_000) -> str:
    head = ["from pkg.helpers import rotate, scale\n", "import os\n", "\n"]
    body = [f"def f_{i}(a):\n    return rotate(a, {i})\n\n" for i in range(lines // 3)]
    return "".join(head + body)


def edit(doc: TextDocument, line: int, character: int, text: str, end: tuple[int, int] | None = None) -> None:
    stop = t.Position(*end) if end else t.Position(line, character)
    doc.apply_change(t.TextDocumentContentChangePartial(range=t.Range(start=t.Position(line, character), end=stop),
                                                        text=text))


def test_a_keystroke_in_a_large_document_splits_only_the_lines_around_it(monkeypatch):
    source = big_source()
    doc = LspTextDocument(URI, source, sync_kind=INC, position_codec=AsciiFastCodec("utf-16"))
    assert len(doc.lines) > 30_000  # split once, on opening
    split = []
    real = documents.lsp_lines
    monkeypatch.setattr(documents, "lsp_lines", lambda text: split.append(len(text)) or real(text))
    # pygls sums the length of every line above a position in Python: never needed here
    monkeypatch.setattr(TextDocument, "offset_at_server_position", lambda *a: pytest.fail("walked every line"))
    line = 15_000
    for k, ch in enumerate("x = rotate(1)\n"):
        edit(doc, line, k if ch != "\n" else 13, ch)
        assert snapshot(doc, line + (ch == "\n"), 0 if ch == "\n" else k + 1, ()) is not None
    assert sum(split) < 2_000  # a few lines each time, not the 900,000 characters
    lines = source.splitlines(True)
    assert doc.source == "".join(lines[:line] + ["x = rotate(1)\n"] + lines[line:])
    assert tuple(doc.lines) == tuple(real(doc.source))
    assert doc.offset_at_position(t.Position(line + 1, 0)) == sum(map(len, lines[:line])) + 14


@pytest.mark.parametrize("encoding", ["utf-16", "utf-8", "utf-32"])
def test_edits_spliced_into_the_source_equal_pygls_line_walk(encoding, caplog):
    caplog.set_level(logging.ERROR)  # the reversed ranges' warnings
    rnd = random.Random(7)
    pieces = ["a", "b", "\n", "\r", "\r\n", "\x0c", "é", "😋", " ", "\u2028"]

    def text(n: int) -> str:
        return "".join(rnd.choice(pieces) for _ in range(n))

    for _ in range(400):
        source = text(rnd.randint(0, 25))
        ours = LspTextDocument(URI, source, sync_kind=INC, position_codec=AsciiFastCodec(encoding))
        walked = LspTextDocument(URI, source, sync_kind=INC, position_codec=AsciiFastCodec(encoding))
        for _ in range(4):
            n = len(ours.lines)
            a = (rnd.randint(0, n + 1), rnd.randint(0, 8))
            b = (rnd.randint(0, n + 1), rnd.randint(0, 8))
            new = text(rnd.randint(0, 4))
            edit(ours, *a, new, end=b)
            lo, hi = sorted([a, b])
            TextDocument._apply_incremental_change(walked, t.TextDocumentContentChangePartial(
                range=t.Range(start=t.Position(*lo), end=t.Position(*hi)), text=new))
            assert ours.source == walked.source
            assert tuple(ours.lines) == tuple(lsp_lines(ours.source))
            for row in range(len(ours.lines) + 2):
                assert ours.line_offset(row) == sum(map(len, ours.lines[:row]))


def test_the_context_reads_the_lines_near_the_cursor_not_the_whole_file():
    before = "".join(f"v{i} = {i}\n" for i in range(30_000)) + "x = "
    tracemalloc.start()
    try:
        ctx = context.build_context(before, "1\nrest\n", before[-6000:], "/w/a.py", "python", 8)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # the head is copied once (~290 kB); splitting it into 30,000 lines for the last eight was ~2.3 MB
    assert peak < 2 * len(before) + 200_000
    assert ctx.query.startswith("v29992 = 29992\n") and ctx.query.endswith("v29999 = 29999\n1")
    assert ctx.nearby[:2] == ("v29999", "v29998") and ctx.tail == "rest\n"


def test_a_minified_line_gives_a_bounded_query_and_identifiers(monkeypatch):
    read = []
    real = context._IDENT

    class Counting:
        def findall(self, text):
            read.append(len(text))
            return real.findall(text)

    monkeypatch.setattr(context, "_IDENT", Counting())
    line = "var x=" + "alpha+beta_gamma+" * 12_000  # ~200,000 characters
    cut = len(line) // 2
    before, after = "import a\n" + line[:cut], line[cut:] + "\nnext()\n"
    ctx = context.build_context(before, after, before[-6000:], "/w/a.js", "javascript", 8)
    assert sum(read) <= 3_020  # three lines of at most 1,000 characters, not 200,000
    assert len(ctx.query) <= 2_020
    assert ctx.line == before[-200:] and ctx.tail == "next()\n"
    assert set(ctx.nearby) <= {"alpha", "beta_gamma"}  # whole words only, none cut at the window's edge


def test_the_import_region_is_searched_only_where_the_head_grew(monkeypatch):
    searched = []
    real = digest._IMPORT_LINE

    class Counting:
        def finditer(self, text, pos=0):
            searched.append(len(text) - pos)
            return real.finditer(text, pos)

    monkeypatch.setattr(digest, "_IMPORT_LINE", Counting())
    cache = ImportCache()
    head = big_source()
    first = cache.imports(head, "/w/big.py")
    searched.clear()
    grown = head + "x = rotate(1)\n"
    assert cache.imports(grown, "/w/big.py") == first
    assert cache.imports(grown + "import json\n", "/w/big.py")[-1].module == "json"  # a late import counts
    assert cache.imports(head, "/w/big.py") == first  # back up a line: no search at all
    assert sum(searched) < 100


def test_names_used_since_their_import_are_read_only_in_the_new_lines(monkeypatch):
    read = []
    real = digest._code
    monkeypatch.setattr(digest, "_code", lambda line: read.append(1) or real(line))
    imports = [Import("pkg.helpers", "rotate", "rotate", 1), Import("pkg.helpers", "scale", "scale", 1)]
    built = [(i, Entry("/w/pkg/helpers.py", f"def {i.name}(): ...", 1, 2, i.alias, "function")) for i in imports]
    uses = getattr(digest, "_UseScan", lambda: None)()  # (a scan that outlives a call: since the fix)
    head = big_source()
    rank = lambda text: [e.name for e in Digest._rank(built, text, (), ("", ""), *[uses][:bool(uses)])]  # noqa: E731
    assert rank(head) == ["scale", "rotate"]  # rotate is used: scale's first use is pending
    read.clear()
    assert rank(head + "y = scale(2)\n") == ["rotate", "scale"]
    assert rank(head + "y = scale(2)\n" + '"""\nrotate\n') == ["rotate", "scale"]  # in a docstring
    assert rank(head) == ["scale", "rotate"]  # back up: from the last mark before the cursor's line
    assert len(read) < 1_600  # from the last mark (every 512 lines), not 30,000 lines a new line


def test_the_use_scan_agrees_with_a_fresh_one_after_any_edit():
    rnd = random.Random(3)
    words = __import__("re").compile(r"(?<![\w.])(rotate|scale)\b")
    at = {"rotate": 1, "scale": 3}
    pieces = ["rotate(1)\n", "scale\n", '"""\n', "# scale\n", "x\n", "'''rotate'''\n", '"""a"""\n'] * 2
    lines = [rnd.choice(pieces) for _ in range(3000)]
    kept = digest._UseScan()
    for _ in range(60):
        k = rnd.randrange(len(lines))
        lines[k] = rnd.choice(pieces)
        head = "".join(lines[: rnd.randrange(len(lines))])
        assert kept.used(head, words, at, {0}) == digest._UseScan().used(head, words, at, {0})


@pytest.mark.parametrize("where", ["middle", "end", "long line"])
def test_completions_in_a_large_file_are_right_and_the_prompt_bounded(where):
    if where == "long line":
        source = "from pkg import a\nvar s='😋';" + "q+=1;" * 40_000 + "\nend()\n"
        line, character = 1, 11 + 5 * 20_000  # UTF-16 units: the emoji counts two
    else:
        source = big_source()
        line = 15_001 if where == "middle" else len(source.splitlines())
        source += "" if where == "middle" else "\n"
        character = 0
    doc = LspTextDocument(URI, source, sync_kind=INC, position_codec=AsciiFastCodec("utf-16"))
    for k, ch in enumerate("zeta = rot"):
        edit(doc, line, character + k, ch)
    snap = snapshot(doc, line, character + 10, ())
    assert snap.before.endswith("zeta = rot") and snap.before + snap.after == doc.source
    if where == "long line":
        assert snap.before.endswith("q+=1;" * 19_999 + "zeta = rot") and snap.after.startswith("q+=1;")
    cfg = CompletionConfig()
    request = build_request(snap, cfg)
    assert len(request.prefix) <= cfg.prefix_chars and len(request.suffix) <= cfg.suffix_chars
    done = Completer(FakeEngine(), cfg).complete(request, threading.Event(), context_for(snap, request, cfg))
    assert done.text == f"fake_{len(request.prefix)}_rot"
    assert documents.cursor(snap, line, doc) == t.Position(line, character + 10)
