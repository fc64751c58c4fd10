"""LSP documents to completion snapshots and back to items: offsets, windows, paths, ranges."""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from indexer.files import notebook_cell
from lsprotocol import types as t
from lsprotocol.types import Position
from pygls.workspace import TextDocument, Workspace
from pygls.workspace.position_codec import PositionCodec, ServerTextPosition

log = logging.getLogger(__name__)


ACCEPT_COMMAND = "draftline.didAcceptCompletionItem"  # run by the client after an accept


# LSP ends a line only at \n, \r\n or \r; str.splitlines, which pygls' TextDocument.lines uses, also at
# these (a form feed is Emacs' page break ^L): every position after one was a line off, and an
# incremental edit landed in the wrong place.
_OTHER_BREAKS = re.compile("[\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
_LSP_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def lsp_lines(source: str) -> list[str]:
    """``source``'s lines as LSP counts them, each with its line break."""
    if _OTHER_BREAKS.search(source) is None:
        return source.splitlines(True)  # the same lines, and faster
    return _LSP_LINE.findall(source)


# LSP language ids of common file extensions (for text read from disk: the CLI, the benches); an
# editor sends its own id
_LANGUAGE_IDS = {
    "py": "python", "pyi": "python", "js": "javascript", "mjs": "javascript", "cjs": "javascript",
    "jsx": "javascriptreact", "ts": "typescript", "mts": "typescript", "tsx": "typescriptreact",
    "rs": "rust", "go": "go", "c": "c", "h": "c", "cc": "cpp", "cpp": "cpp", "cxx": "cpp", "hpp": "cpp",
    "hh": "cpp", "cu": "cuda-cpp", "m": "objective-c", "mm": "objective-cpp", "java": "java", "kt": "kotlin",
    "kts": "kotlin", "swift": "swift", "scala": "scala", "cs": "csharp", "dart": "dart", "zig": "zig",
    "php": "php", "rb": "ruby", "sh": "shellscript", "bash": "shellscript", "zsh": "shellscript",
    "pl": "perl", "r": "r", "lua": "lua", "sql": "sql", "hs": "haskell", "el": "emacs-lisp",
    "lisp": "lisp", "scm": "scheme", "rkt": "racket", "clj": "clojure", "ex": "elixir", "exs": "elixir",
    "jl": "julia", "nim": "nim", "toml": "toml", "yaml": "yaml", "yml": "yaml", "css": "css", "scss": "scss",
    "less": "less", "proto": "proto", "sol": "solidity", "groovy": "groovy", "ps1": "powershell",
    "json": "json", "jsonc": "jsonc", "md": "markdown", "markdown": "markdown", "mdx": "mdx", "rst": "restructuredtext",
    "tex": "latex", "adoc": "asciidoc", "txt": "plaintext", "html": "html", "htm": "html", "xml": "xml",
    "vue": "vue", "svelte": "svelte",
}


def language_id(path: str | Path) -> str:
    """The LSP language id of a file by its name ("" where unknown, as an editor without one sends)."""
    p = Path(path)
    if p.name in ("Makefile", "makefile", "GNUmakefile"):
        return "makefile"
    if p.name == "Dockerfile":
        return "dockerfile"
    return _LANGUAGE_IDS.get(p.suffix.lstrip(".").lower(), "")


_SERIALS = itertools.count(1)


class LspTextDocument(TextDocument):
    """pygls' document with LSP's lines (positions, edits and snapshots all go through ``lines``), and a
    serial number per opening."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.serial = next(_SERIALS)

    _lines: tuple[str, tuple[str, ...]] | None = None  # (the source they were split from, the lines)
    # a line whose offset in that source is known, (line, offset): an offset near it is found by summing
    # the lines in between, not all the lines above (30,000 of them, a keystroke, in a large file)
    _anchor: tuple[int, int] = (0, 0)

    def apply_change(self, change: t.TextDocumentContentChangeEvent) -> None:
        # a range whose start is after its end (a client's bug) made pygls keep the text between them
        # twice, silently: it is read the other way round, with a log line
        rng = getattr(change, "range", None)
        if rng is not None and (rng.start.line, rng.start.character) > (rng.end.line, rng.end.character):
            log.warning("%s: an edit's range ends before it starts (%s); applied as %s-%s", self.uri, rng,
                        rng.end, rng.start)
            change = t.TextDocumentContentChangePartial(range=t.Range(start=rng.end, end=rng.start), text=change.text,
                                                       range_length=getattr(change, "range_length", None))
        super().apply_change(change)

    @property
    def lines(self) -> Sequence[str]:
        # read several times per keystroke (the edit, the snapshot, offsets): split once per text
        source = self.source
        if self._lines is None or self._lines[0] is not source:
            self._lines = (source, tuple(lsp_lines(source)))
            self._anchor = (0, 0)
        return self._lines[1]

    def line_offset(self, row: int) -> int:
        """The offset in ``source`` of line ``row``'s start (past the last line: the end)."""
        lines = self.lines
        row = max(0, min(row, len(lines)))
        line, offset = self._anchor
        if row >= line:
            offset += sum(map(len, lines[line:row]))
        else:
            offset -= sum(map(len, lines[row:line]))
        self._anchor = (row, offset)
        return offset

    def offset_at_server_position(self, server_position: ServerTextPosition) -> int:
        # pygls sums the lengths of every line above the position, in Python
        return self.line_offset(server_position.line) + server_position.character

    def _apply_incremental_change(self, change: t.TextDocumentContentChangePartial) -> None:
        # pygls rewrites the document line by line in Python and the next read of ``lines`` split it all
        # again: ~25 ms a keystroke in a 30,000-line file. The same text here is one splice of the
        # source; the lines are those around the edit split again, the others kept.
        lines = self.lines
        if not lines:
            super()._apply_incremental_change(change)
            return
        rng = self.position_codec.range_from_client_units(lines, change.range)
        start = self.offset_at_server_position(rng.start)
        end = self.offset_at_server_position(rng.end)
        source = self.source
        new_source = source[:start] + change.text + source[end:]  # what pygls' line walk writes, also for start > end
        # the lines from the one before the edit's to the one after it: their outer line ends stay where
        # they were, so a "\r" and a "\n" that the edit brings together (or apart) are split right
        first = max(0, min(rng.start.line, rng.end.line) - 1)
        last = min(len(lines), max(rng.start.line, rng.end.line) + 2)  # exclusive
        lo = self.line_offset(first)
        hi = lo + sum(map(len, lines[first:last]))
        middle = new_source[lo: hi + len(new_source) - len(source)]
        self._source = new_source
        self._lines = (new_source, lines[:first] + tuple(lsp_lines(middle)) + lines[last:])
        self._anchor = (first, lo)


class AsciiFastCodec(PositionCodec):
    """pygls' position codec, converting in C rather than character by character in Python: pygls walks
    a line in Python for each conversion, and a 2 MB line (a minified bundle) held the event loop
    ~0.5-0.8 s a keystroke, ASCII or not (one "é" in it was enough). An ASCII line counts one unit a
    character in every encoding; any other is measured by encoding it (UTF-8: a byte a unit; UTF-16:
    two). Results equal pygls' own, its rounding of a position inside a character to the character's
    end included (a property test checks), but for a position past the line's end: that is the line's
    end, before its line break (LSP). pygls counts the line break as a unit of the line, so an edit one
    past the end went in after the "\n" (or between "\r" and "\n"), and one further out on a last line
    without a newline went in before its last character: the server's copy of the buffer then
    differed from the editor's."""

    _WIDTH = {"utf-8": ("utf-8", 1), "utf-16": ("utf-16-le", 2)}

    @property
    def _kind(self) -> str:
        return str(getattr(self.encoding, "value", self.encoding))  # a PositionEncodingKind or its string

    def _units(self, string: str) -> int:
        if string.isascii():
            return len(string)
        codec = self._WIDTH.get(self._kind)
        if codec is None:
            return len(string) if self._kind == "utf-32" else super().client_num_units(string)
        return len(string.encode(codec[0], "surrogatepass")) // codec[1]

    def client_num_units(self, string: str) -> int:
        return self._units(string)

    def position_from_client_units(self, lines: Sequence[str], position: t.Position) -> ServerTextPosition:
        codec = self._WIDTH.get(self._kind)
        if not lines or position.line >= len(lines) or (
                codec is None and self._kind != "utf-32" and not lines[position.line].isascii()):
            return super().position_from_client_units(lines, position)
        line = lines[position.line].rstrip("\r\n")  # its line break (one at most) is no position
        wanted = max(0, min(position.character, self._units(line)))
        if line.isascii() or codec is None:  # one unit a character
            return ServerTextPosition(line=position.line, character=min(wanted, len(line)))
        name, width = codec
        data = line.encode(name, "surrogatepass")[: wanted * width]
        head = data.decode(name, "ignore")
        index = len(head) + (len(head.encode(name, "surrogatepass")) < len(data))  # inside a character: after it
        return ServerTextPosition(line=position.line, character=min(index, len(line)))

    def position_to_client_units(self, lines: Sequence[str], position: Any) -> t.Position:
        if 0 <= position.line < len(lines):
            return t.Position(line=position.line, character=self._units(lines[position.line][: position.character]))
        return super().position_to_client_units(lines, position)


class LspWorkspace(Workspace):
    def _create_text_document(self, doc_uri, source=None, version=None, language_id=None) -> TextDocument:
        codec = AsciiFastCodec(self._position_codec.encoding)
        return LspTextDocument(doc_uri, source=source, version=version, language_id=language_id,
                               sync_kind=self._sync_kind, position_codec=codec)


def use_lsp_lines(workspace: Workspace) -> None:
    """Make ``workspace`` (the one pygls creates on initialize) create LspTextDocuments."""
    if type(workspace) is Workspace:
        workspace.__class__ = LspWorkspace  # adds no state: only how documents are created


@dataclass(frozen=True)
class Snapshot:
    """The document around the cursor, as it was when the request arrived."""

    uri: str
    version: int
    language: str
    path: str  # workspace-relative when the file is inside a root, else absolute (or the uri)
    before: str  # whole text before the cursor
    after: str  # whole text after the cursor
    file_uri: str = ""  # the file the text belongs to where that is not ``uri``: a notebook cell's notebook
    serial: int = 0  # which opening of the document (LspTextDocument.serial): a reopened file restarts its versions

    @property
    def file(self) -> str | None:
        """The file system path of the text's file (None for an unsaved or non-file document)."""
        return uri_to_path(self.file_uri or self.uri)


def snapshot(doc: TextDocument, line: int, character: int, roots: Sequence[Path]) -> Snapshot | None:
    """The snapshot at a client position, or None when the position is outside the document."""
    lines = doc.lines
    if line < 0 or character < 0 or line > len(lines):
        return None
    if line == len(lines) and lines and not lines[-1].endswith(("\n", "\r")):
        return None  # one past the last line: only the empty line after a final line break exists
    if line == len(lines):
        character = 0  # that empty line's (or an empty document's) end: past it means it (LSP)
    line_text = lines[line].rstrip("\r\n") if line < len(lines) else ""
    # Past the end of a line means its end (LSP). Clamped here, in the client's units (UTF-16 by
    # default): pygls clamps such a position to one unit short of a last line without a newline.
    character = min(character, doc.position_codec.client_num_units(line_text))
    offset = doc.offset_at_position(Position(line=line, character=character))
    source = doc.source
    return Snapshot(
        uri=doc.uri,
        version=doc.version or 0,
        language=doc.language_id or "",
        path=relative_path(doc.uri, roots),
        before=source[:offset],
        after=source[offset:],
        serial=getattr(doc, "serial", 0),
    )


_DRIVE = re.compile(r"^/[A-Za-z]:")


def uri_to_path(uri: str) -> str | None:
    """The file system path a ``file:`` URI names; None for another scheme (or no path).

    Editors spell one file differently (upper or lower-case hex, ``+``/``&``/``:`` encoded or not,
    ``file:/x``, ``file:///x``, RFC 8089's ``file://localhost/x``): each decodes to the same path.
    pygls' to_fs_path read ``localhost`` as a UNC host (``//localhost/x``: a file no folder holds, its
    absolute path shown to the model, its buffer kept out of the index) and raised on an unclosed ``[``.
    A query or fragment is no part of the path; bytes that are not UTF-8 read as U+FFFD (the index skips
    such names: "bad_name")."""
    if uri[:5].lower() != "file:":
        return None
    try:
        _, host, path, _, _ = urlsplit(uri)
    except ValueError:  # e.g. "file://[x/y.py": no valid host
        return None
    host = unquote(host)
    path = unquote(path)
    if host and host.lower() != "localhost":
        path = f"//{host}{path}"  # a UNC share, as pygls reads it
    elif _DRIVE.match(path):
        path = path[1].lower() + path[2:]  # file:///C:/x -> c:/x, as pygls
    if os.sep != "/":
        path = path.replace("/", os.sep)
    return path or None


def in_roots(fs: str, roots: Sequence[Path]) -> str | None:
    """``fs`` spelled under the innermost root holding it (None where none does), the spelling the index
    keys files by: a root given by a symlink's path (a folder opened as ``~/link``) and a file named by
    its real path, or a root given resolved (a client's getcwd(), eglot's file-truename) and a file
    opened by the link's path, are one file. Tried by name first, then with links resolved."""
    if not roots:
        return None
    path = os.path.abspath(fs)  # "a/../b" and "a//b" as the index keys them
    by_length = sorted((os.path.abspath(r) for r in roots), key=len, reverse=True)
    for root in by_length:
        if path == root or path.startswith(root.rstrip(os.sep) + os.sep):
            return path
    real = os.path.realpath(path)
    for root in by_length:
        real_root = os.path.realpath(root)
        if real == real_root:
            return root
        if real.startswith(real_root.rstrip(os.sep) + os.sep):
            return os.path.join(root, real[len(real_root.rstrip(os.sep)) + 1:])
    return None


def relative_path(uri: str, roots: Sequence[Path]) -> str:
    fs = uri_to_path(uri)
    return display_path(fs, roots) if fs is not None else uri


def display_path(fs: str, roots: Sequence[Path]) -> str:
    """A file path relative to the innermost workspace root containing it (by name, else with symlinks
    resolved: see in_roots), else as given."""
    inside = in_roots(fs, roots)
    if inside is not None:
        for root in sorted((os.path.abspath(r) for r in roots), key=len, reverse=True):
            try:
                return Path(inside).relative_to(root).as_posix()
            except ValueError:
                continue
    return Path(fs).as_posix()


def prefix_window(before: str, budget: int, quantum: int) -> str:
    """The last ``budget`` characters before the cursor, starting at a line boundary.

    The start moves in ``quantum`` steps, so consecutive keystrokes keep the same window start
    (and the engine keeps its prompt cache) until the text outgrows the step.
    """
    if len(before) <= budget:
        return before
    start = len(before) - budget
    if quantum > 0:
        rounded = -(-start // quantum) * quantum
        start = rounded if rounded < len(before) else start  # a budget under one quantum: no rounding past the cursor
    newline = before.find("\n", start)
    # from the next line, unless none starts before the cursor (a very long line above the cursor's
    # first column would leave nothing): then mid-line
    return before[newline + 1 :] if -1 < newline < len(before) - 1 else before[start:]


def suffix_window(after: str, budget: int) -> str:
    if len(after) <= budget:
        return after
    cut = after.rfind("\n", 0, budget)
    return after[: cut + 1] if cut >= 0 else after[:budget]  # a suffix opening with a newline keeps it


def in_notebook(snap: Snapshot, workspace: Workspace, roots: Sequence[Path]) -> Snapshot:
    """A notebook cell's snapshot with the notebook's other code cells of its language around it, in
    order (the model sees the notebook as one file, named by the notebook's path); other snapshots as
    they are. Only ``before``/``after`` grow: the cell's own positions and version still say where the
    cursor is. The cells read as the index reads the notebook's file (indexer.files.notebook_code): each
    followed by one blank line, blank cells left out, so the cursor's line is the same in both."""
    notebook = workspace.get_notebook_document(cell_uri=snap.uri)
    if notebook is None:
        return snap
    me = unquote(snap.uri)
    before: list[str] = []
    after: list[str] = []
    seen = False
    for cell in notebook.cells:
        if unquote(cell.document) == me:
            seen = True
            continue
        doc = workspace.text_documents.get(unquote(cell.document))
        if cell.kind != t.NotebookCellKind.Code or doc is None or (doc.language_id or "") != snap.language:
            continue
        if doc.source.strip():  # an empty cell shows nothing (and the index skips it)
            (after if seen else before).append(doc.source)
    if not seen:
        return snap
    head = "".join(notebook_cell(source) for source in before)
    rest = snap.after
    if after:
        # the cell, one blank line, the next cells (the last without its trailing line breaks)
        others = "".join(notebook_cell(source) for source in after).rstrip("\n")
        joined = notebook_cell(snap.before + snap.after) + others
        # (a cursor further down the cell's trailing blank lines than one keeps them)
        rest = joined[len(snap.before):] if joined.startswith(snap.before) else snap.after + "\n\n" + others
    return replace(snap, path=relative_path(notebook.uri, roots), before=head + snap.before, after=rest,
                   file_uri=notebook.uri)


def notebook_json(notebook: t.NotebookDocument, workspace: Workspace) -> str:
    """An open notebook's cells as notebook JSON (nbformat's ``cells``: kind, source, and a code cell's
    language as VS Code saves it), the form the index reads a notebook file in
    (indexer.files.notebook_code); the notebook's language is that of most of its code cells, so a SQL
    or R cell of a Python notebook stays out of the index as it does from the saved file."""
    cells = []
    languages: list[str] = []
    for cell in notebook.cells:
        doc = workspace.text_documents.get(unquote(cell.document))
        if cell.kind != t.NotebookCellKind.Code:
            cells.append({"cell_type": "markdown", "source": doc.source if doc is not None else ""})
            continue
        language = (doc.language_id or "") if doc is not None else ""
        languages.append(language)
        cells.append({"cell_type": "code", "source": doc.source if doc is not None else "",
                      "metadata": {"vscode": {"languageId": language}}})
    main = Counter(languages).most_common(1)[0][0] if languages else ""  # ties: the first cell's
    return json.dumps({"metadata": {"language_info": {"name": main}}, "cells": cells})


def cursor(snap: Snapshot, line: int, doc: TextDocument) -> t.Position:
    """The client position of a snapshot's cursor (a position past its line's end, clamped)."""
    before = snap.before
    last = before[max(before.rfind("\n"), before.rfind("\r")) + 1 :]  # LSP's line ends (a bare \r too)
    return t.Position(line=line, character=doc.position_codec.client_num_units(last))


def with_selection(snap: Snapshot, doc: TextDocument, rng, text: str, position: t.Position | None = None) -> Snapshot | None:
    """The snapshot as if the completion-popup item ``text`` replaced ``rng`` (LSP 3.18 rule); None for
    a range that is not on the cursor's line around the cursor (LSP requires it to contain it)."""
    if rng.start.line != rng.end.line:
        return None
    if position is not None and (rng.start.line != position.line or rng.start.character > position.character
                                 or rng.end.character < position.character):
        return None
    # copies: pygls clamps a position it converts in place, and the client's range goes back in the item
    start = doc.offset_at_position(t.Position(line=rng.start.line, character=rng.start.character))
    cut = len(snap.before) - start
    if cut < 0:
        return None
    # the item replaces the whole range, which may reach past the cursor (`pri|nt` with `print`): what
    # follows is the text after the range's end (a range past the line's end: up to the line's end)
    line_text = doc.lines[rng.end.line].rstrip("\r\n") if rng.end.line < len(doc.lines) else ""
    end_char = min(rng.end.character, doc.position_codec.client_num_units(line_text))
    end = doc.offset_at_position(t.Position(line=rng.end.line, character=end_char))
    after = doc.source[end:] if end >= len(snap.before) else snap.after
    return replace(snap, before=snap.before[:start] + text, after=after)


def inline_item(snap: Snapshot, position: t.Position, text: str, selected: t.SelectedCompletionInfo | None):
    rng = selected.range if selected else t.Range(start=position, end=position)
    insert = (selected.text if selected else "") + text
    arguments = [{"uri": snap.uri, "chars": len(insert)}]
    command = t.Command(title="draftline accepted", command=ACCEPT_COMMAND, arguments=arguments)
    return t.InlineCompletionItem(insert_text=insert, range=rng, command=command)


def _word_before(before: str) -> str:
    """The run of word characters (Python's ``\\w``: letters and digits of any script, ``_``) ending ``before``."""
    start = len(before)
    while start and (before[start - 1].isalnum() or before[start - 1] == "_"):
        start -= 1
    return before[start:]


def completion_item(doc, snap: Snapshot, position: t.Position, text: str) -> t.CompletionItem:
    """One item whose edit replaces the word being typed with word + completion (so it filters)."""
    position = cursor(snap, position.line, doc)  # past the line's end: its end
    # the identifier before the cursor, non-ASCII letters too: eglot filters the item by the symbol at
    # point (`grö`), and a word cut at the last ASCII letter (`ße...`) matched nothing
    word = _word_before(snap.before)
    start = t.Position(line=position.line, character=position.character - doc.position_codec.client_num_units(word))
    label = ((word + text).strip().splitlines() or [""])[0][:80] or text.strip()[:80]  # a CRLF line too
    edit = t.TextEdit(range=t.Range(start=start, end=position), new_text=word + text)
    # clients run an item's command once they inserted it (VS Code, Neovim 0.11's vim.lsp.completion):
    # acceptances count there as they do for inline items
    command = t.Command(title="draftline accepted", command=ACCEPT_COMMAND,
                        arguments=[{"uri": snap.uri, "chars": len(text)}])
    return t.CompletionItem(label=label, kind=t.CompletionItemKind.Text, text_edit=edit, filter_text=word + text,
                            detail="draftline", sort_text="0", command=command)
