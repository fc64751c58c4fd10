"""Notebooks as a demanding Jupyter user drives them (VS Code's notebook sync): cells added, moved,
removed and retyped, empty and other-language cells, the notebook's file on disk and in the index.
What the model sees is read off the fake engine's answer (``fake_<len(prefix)>_<last word>``) and the
status' prompt size (prefix + suffix characters of the one engine run)."""

from __future__ import annotations

import json
from pathlib import Path

from lsprotocol import types as t
from pytest_lsp import LanguageClient

from tests.e2e.lsp_harness import end_of, fake_text, initialize, inline_params, items, status, wait_for
from tests.e2e.test_workspace import index_options

NB = "file:///draftline-e2e/probe.ipynb"
C, M = t.NotebookCellKind.Code, t.NotebookCellKind.Markup
UNSAVED = "def freshly_typed_cell(value):\n    return value * 3\n"


def cell_uri(n: int) -> str:
    return f"vscode-notebook-cell:/draftline-e2e/probe.ipynb#W{n}sZmlsZQ%3D%3D"  # quoted, as VS Code sends


def open_notebook(client: LanguageClient, cells, uri: str = NB, cell=cell_uri) -> None:
    nb_cells = [t.NotebookCell(kind=kind, document=cell(i)) for i, (kind, _, _) in enumerate(cells)]
    docs = [t.TextDocumentItem(uri=cell(i), language_id=lang, version=1, text=text)
            for i, (_, lang, text) in enumerate(cells)]
    notebook = t.NotebookDocument(uri=uri, notebook_type="jupyter-notebook", version=1, cells=nb_cells)
    client.notebook_document_did_open(t.DidOpenNotebookDocumentParams(notebook_document=notebook,
                                                                      cell_text_documents=docs))


def change(client: LanguageClient, version: int, cells: t.NotebookDocumentCellChanges, uri: str = NB) -> None:
    client.notebook_document_did_change(t.DidChangeNotebookDocumentParams(
        notebook_document=t.VersionedNotebookDocumentIdentifier(uri=uri, version=version),
        change=t.NotebookDocumentChangeEvent(cells=cells)))


def structure(start: int, delete: int, cells=(), opened=(), closed=()) -> t.NotebookDocumentCellChanges:
    return t.NotebookDocumentCellChanges(structure=t.NotebookDocumentCellChangeStructure(
        array=t.NotebookCellArrayChange(start=start, delete_count=delete,
                                        cells=[t.NotebookCell(kind=C, document=u) for u in cells] or None),
        did_open=list(opened) or None, did_close=[t.TextDocumentIdentifier(uri=u) for u in closed] or None))


def type_in(client: LanguageClient, nb_version: int, cell: str, cell_version: int, at: t.Position, text: str,
            uri: str = NB) -> None:
    edit = t.TextDocumentContentChangePartial(range=t.Range(start=at, end=at), text=text)
    change(client, nb_version, t.NotebookDocumentCellChanges(text_content=[t.NotebookDocumentCellContentChanges(
        document=t.VersionedTextDocumentIdentifier(uri=cell, version=cell_version), changes=[edit])]), uri)


async def complete(client: LanguageClient, at: t.Position, uri: str) -> list[str]:
    return [i.insert_text for i in items(await client.text_document_inline_completion_async(inline_params(at, uri)))]


def ipynb(*cells: dict, metadata: dict | None = None) -> str:
    return json.dumps({"cells": list(cells), "metadata": metadata or {}, "nbformat": 4, "nbformat_minor": 5})


async def indexed(client: LanguageClient) -> dict:
    return (await wait_for(client, lambda s: s["index"]["state"] == "ready" and s["index"]["pending"] == 0))["index"]


# -- what the model sees ---------------------------------------------------------------------------

async def test_an_empty_cell_adds_no_blank_lines_to_the_prompt(client: LanguageClient):
    # A new empty cell (VS Code keeps one at the end, and one is left behind after a cut) showed as
    # two more blank lines between its neighbours, and the index (which skips it) counted the lines
    # after it two fewer than the prompt did.
    await initialize(client, notebooks=True)
    open_notebook(client, [(C, "python", "import os\n"), (C, "python", ""), (C, "python", "  \n"),
                           (C, "python", "x = os.")])
    assert await complete(client, end_of("x = os."), cell_uri(3)) == [fake_text("import os\n\nx = os.")]
    assert await complete(client, t.Position(0, 0), cell_uri(1)) == [fake_text("import os\n\n")]  # in the empty cell


async def test_the_cells_after_the_cursor_are_one_blank_line_apart(client: LanguageClient):
    # Before the cursor two cells are one blank line apart; after it a cell ending in a line break got
    # two (its own line break kept, then two more).
    await initialize(client, notebooks=True)
    open_notebook(client, [(C, "python", "x = 1\n"), (C, "python", "print(x)\n")])
    assert await complete(client, t.Position(0, 5), cell_uri(0)) == [fake_text("x = 1")]
    current = await status(client)
    assert current["prompt_cache"]["runs"] == 1
    assert current["prompt_cache"]["prompt_tokens_mean"] == len("x = 1") + len("\n\nprint(x)")


async def test_cells_added_moved_turned_markdown_and_removed_reach_the_prompt_in_order(client: LanguageClient):
    await initialize(client, notebooks=True)
    open_notebook(client, [(C, "python", "import os\n"), (C, "python", "x = os.")])
    at = end_of("x = os.")
    assert await complete(client, at, cell_uri(1)) == [fake_text("import os\n\nx = os.")]
    new = t.TextDocumentItem(uri=cell_uri(7), language_id="python", version=1, text="import sys\n")
    change(client, 2, structure(1, 0, [cell_uri(7)], opened=[new]))  # a cell inserted between them
    assert await complete(client, at, cell_uri(1)) == [fake_text("import os\n\nimport sys\n\nx = os.")]
    change(client, 3, structure(0, 3, [cell_uri(1), cell_uri(0), cell_uri(7)]))  # the cell moved to the top
    assert await complete(client, at, cell_uri(1)) == [fake_text("x = os.")]
    change(client, 4, structure(0, 3, [cell_uri(0), cell_uri(7), cell_uri(1)]))  # and back
    assert await complete(client, at, cell_uri(1)) == [fake_text("import os\n\nimport sys\n\nx = os.")]
    change(client, 5, t.NotebookDocumentCellChanges(data=[t.NotebookCell(kind=M, document=cell_uri(0))]))
    assert await complete(client, at, cell_uri(1)) == [fake_text("import sys\n\nx = os.")]  # now markdown
    change(client, 6, structure(1, 1, closed=[cell_uri(7)]))  # deleted: nothing for it, and out of the others
    assert await complete(client, end_of("import sys\n"), cell_uri(7)) == []
    assert await complete(client, at, cell_uri(1)) == [fake_text("x = os.")]
    # a change for a notebook that was never opened is dropped without an error (the fixture checks)
    type_in(client, 2, cell_uri(9), 2, t.Position(0, 0), "x", uri="file:///draftline-e2e/never-opened.ipynb")
    assert await complete(client, at, cell_uri(1)) == [fake_text("x = os.")]


async def test_fallback_completion_in_a_crlf_cell_replaces_the_word(client: LanguageClient):
    options = {"draftline": {"model": {"target": "fake"}, "completion": {"debounce_ms": 0, "fallback": "always"}}}
    await initialize(client, init_options=options, notebooks=True)
    open_notebook(client, [(C, "python", "import os\r\n"), (C, "python", "y = 2\r\nx = os.pa")])
    result = await client.text_document_completion_async(t.CompletionParams(
        text_document=t.TextDocumentIdentifier(uri=cell_uri(1)), position=t.Position(1, 9)))
    assert [i.text_edit.range for i in result.items] == [t.Range(start=t.Position(1, 7), end=t.Position(1, 9))]
    assert result.items[0].text_edit.new_text == "pa" + fake_text("import os\n\ny = 2\nx = os.pa")


# -- the notebook in the index ---------------------------------------------------------------------

async def test_an_edit_keeps_the_open_notebooks_cells_indexed_when_every_change_reindexes(
        client: LanguageClient, tmp_path: Path):
    # index.overlay_delay_ms = 0 (README: re-index on every change): a notebook edit passed no text, so
    # the index went back to the file on disk and the unsaved cells left it until the notebook closed.
    root = tmp_path / "ws"
    root.mkdir()
    notebook = root / "analysis.ipynb"
    notebook.write_text(ipynb({"cell_type": "code", "source": "import math\n", "outputs": []}))
    options = index_options(tmp_path)
    options["draftline"]["index"]["overlay_delay_ms"] = 0
    await initialize(client, init_options=options, roots=(root,), notebooks=True)
    disk = await indexed(client)
    assert disk["chars"] == len("import math")
    cell = lambda i: f"vscode-notebook-cell:{notebook}#cell{i}"  # noqa: E731
    open_notebook(client, [(C, "python", "import math\n"), (C, "python", UNSAVED)], uri=notebook.as_uri(), cell=cell)
    grown = disk["chars"] + len(UNSAVED.strip())
    await wait_for(client, lambda s: s["index"]["chars"] == grown and s["index"]["pending"] == 0)
    type_in(client, 2, cell(0), 2, t.Position(1, 0), "import os\n", uri=notebook.as_uri())
    await wait_for(client, lambda s: s["index"]["chars"] == grown + len("\nimport os") and s["index"]["pending"] == 0)


async def test_a_saved_notebooks_cells_of_another_language_stay_out_of_the_index(client: LanguageClient,
                                                                                 tmp_path: Path):
    # VS Code saves a SQL (or R, bash...) cell of a Python notebook with metadata.vscode.languageId: it
    # was indexed (and chunked) as Python, unlike the prompt, which shows a cell only its language's cells.
    root = tmp_path / "ws"
    root.mkdir()
    (root / "analysis.ipynb").write_text(ipynb(
        {"cell_type": "code", "source": "import math\n", "outputs": [], "metadata": {}},
        {"cell_type": "code", "source": ["SELECT name\n", "FROM users\n"], "outputs": [],
         "metadata": {"vscode": {"languageId": "sql"}}},
        {"cell_type": "code", "source": "print(math.pi)\n", "metadata": {"vscode": {"languageId": "python"}},
         "outputs": [{"output_type": "display_data", "data": {"image/png": "iVBORw0KGgo" * 50}}]},
        {"cell_type": "markdown", "source": "# notes\n", "metadata": {}},
        metadata={"kernelspec": {"language": "python", "name": "python3"}, "language_info": {"name": "python"}}))
    await initialize(client, init_options=index_options(tmp_path), roots=(root,), notebooks=True)
    assert (await indexed(client))["chars"] == len("import math\n\nprint(math.pi)")


async def test_an_open_notebooks_cells_of_another_language_stay_out_of_the_index(client: LanguageClient,
                                                                                 tmp_path: Path):
    root = tmp_path / "ws"
    root.mkdir()
    notebook = root / "analysis.ipynb"
    notebook.write_text(ipynb({"cell_type": "code", "source": "import math\n", "outputs": []}))
    options = index_options(tmp_path)
    options["draftline"]["index"]["overlay_delay_ms"] = 50
    await initialize(client, init_options=options, roots=(root,), notebooks=True)
    disk = await indexed(client)
    cell = lambda i: f"vscode-notebook-cell:{notebook}#cell{i}"  # noqa: E731
    open_notebook(client, [(C, "python", "import math\n"), (C, "sql", "SELECT name FROM users\n"),
                           (C, "python", UNSAVED)], uri=notebook.as_uri(), cell=cell)
    current = await wait_for(client, lambda s: s["index"]["chars"] != disk["chars"] and s["index"]["pending"] == 0)
    assert current["index"]["chars"] == disk["chars"] + len(UNSAVED.strip())


async def test_an_nbformat_3_notebook_is_indexed_and_a_broken_one_is_skipped(client: LanguageClient, tmp_path: Path):
    # nbformat 3 (cells in worksheets, a code cell's source in "input": Jupyter still opens them) was
    # skipped as bad_notebook
    root = tmp_path / "ws"
    root.mkdir()
    (root / "v3.ipynb").write_text(json.dumps({"nbformat": 3, "nbformat_minor": 0, "metadata": {"name": "v3"},
        "worksheets": [{"metadata": {}, "cells": [
            {"cell_type": "markdown", "source": ["# title"], "metadata": {}},
            {"cell_type": "code", "input": ["import math\n", "print(math.pi)"], "language": "python",
             "outputs": [{"output_type": "stream", "stream": "stdout", "text": ["3.14159\n"]}]}]}]}))
    (root / "broken.ipynb").write_text('{"cells": [')
    await initialize(client, init_options=index_options(tmp_path), roots=(root,), notebooks=True)
    current = await indexed(client)
    assert current["skipped"] == {"bad_notebook": 1}
    assert current["files"] == 1 and current["chars"] == len("import math\nprint(math.pi)")


def test_a_cells_line_in_the_prompt_is_its_line_in_the_indexed_notebook():
    # retrieval leaves out the notebook's own chunks that the prompt shows, by line numbers: the prompt's
    # lines (documents.in_notebook) and the index's (files.notebook_code of documents.notebook_json)
    # must agree, empty and other-language cells around
    from pygls.workspace import Workspace

    from indexer.files import notebook_code
    from lsp_server.documents import in_notebook, notebook_json, snapshot, use_lsp_lines

    texts = [(C, "python", "import os\n"), (C, "python", ""), (C, "sql", "SELECT 1\nFROM t\n"),
             (M, "markdown", "# x\n"), (C, "python", "x = 1\r\ny = os.\n"), (C, "python", "\n"), (C, "python", "z = 3")]
    workspace = Workspace(None)
    use_lsp_lines(workspace)
    workspace.put_notebook_document(t.DidOpenNotebookDocumentParams(
        notebook_document=t.NotebookDocument(uri=NB, notebook_type="jupyter-notebook", version=1, cells=[
            t.NotebookCell(kind=kind, document=cell_uri(i)) for i, (kind, _, _) in enumerate(texts)]),
        cell_text_documents=[t.TextDocumentItem(uri=cell_uri(i), language_id=lang, version=1, text=text)
                             for i, (_, lang, text) in enumerate(texts)]))
    doc = workspace.get_text_document(cell_uri(4))
    snap = in_notebook(snapshot(doc, 1, 7, []), workspace, [])
    whole = notebook_code(notebook_json(workspace.get_notebook_document(notebook_uri=NB), workspace))
    assert whole == "import os\n\nx = 1\r\ny = os.\n\nz = 3\n\n"
    assert (snap.before + snap.after).split("\n") == whole.rstrip("\n").split("\n")
