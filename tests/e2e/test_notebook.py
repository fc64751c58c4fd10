"""Notebooks (Jupyter in VS Code): cells arrive through notebookDocument/*, and a cell's completion sees
the notebook's other code cells of its language, in order."""

from __future__ import annotations

import asyncio

from lsprotocol import types as t
from pytest_lsp import LanguageClient

from tests.e2e.lsp_harness import DEADLINE_S, end_of, fake_text, initialize, inline_params, items, options, wait_for

NB = "file:///draftline-e2e/analysis.ipynb"


def cell_uri(n: int) -> str:
    return f"vscode-notebook-cell:/draftline-e2e/analysis.ipynb#W{n}sZmlsZQ%3D%3D"  # quoted, as VS Code sends


CELLS = [  # (kind, language, text)
    (t.NotebookCellKind.Code, "python", "import math\n"),
    (t.NotebookCellKind.Markup, "markdown", "# Areas (of circles\n"),
    (t.NotebookCellKind.Code, "sql", "SELECT 1"),
    (t.NotebookCellKind.Code, "python", "def area(r):\n    return math"),
    (t.NotebookCellKind.Code, "python", "print(area(2))\n"),
]


def open_notebook(client: LanguageClient) -> None:
    cells = [t.NotebookCell(kind=kind, document=cell_uri(i)) for i, (kind, _, _) in enumerate(CELLS)]
    docs = [t.TextDocumentItem(uri=cell_uri(i), language_id=lang, version=1, text=text)
            for i, (_, lang, text) in enumerate(CELLS)]
    notebook = t.NotebookDocument(uri=NB, notebook_type="jupyter-notebook", version=1, cells=cells)
    client.notebook_document_did_open(t.DidOpenNotebookDocumentParams(notebook_document=notebook,
                                                                      cell_text_documents=docs))


def edit_first_cell(client: LanguageClient) -> None:
    change = t.NotebookDocumentChangeEvent(cells=t.NotebookDocumentCellChanges(text_content=[
        t.NotebookDocumentCellContentChanges(
            document=t.VersionedTextDocumentIdentifier(uri=cell_uri(0), version=2),
            changes=[t.TextDocumentContentChangePartial(range=t.Range(start=t.Position(0, 11), end=t.Position(0, 11)),
                                                        text=", cmath")])]))
    client.notebook_document_did_change(t.DidChangeNotebookDocumentParams(
        notebook_document=t.VersionedNotebookDocumentIdentifier(uri=NB, version=2), change=change))


async def test_a_cell_completes_with_the_notebooks_earlier_code_cells_before_it(client: LanguageClient):
    result = await initialize(client, notebooks=True)
    assert result.capabilities.notebook_document_sync is not None  # VS Code syncs notebooks only then
    open_notebook(client)
    at = end_of(CELLS[3][2])
    found = items(await client.text_document_inline_completion_async(inline_params(at, cell_uri(3))))
    # the Python cells before it, not the markdown or SQL ones
    assert [i.insert_text for i in found] == [fake_text("import math\n\n" + CELLS[3][2])]

    # an edit of the first cell reaches the next completion in cell 3
    edit_first_cell(client)
    found = items(await client.text_document_inline_completion_async(inline_params(at, cell_uri(3))))
    assert [i.insert_text for i in found] == [fake_text("import math, cmath\n\n" + CELLS[3][2])]

    # a cell outside any notebook, and a closed notebook's cells, as before: unknown -> empty
    client.notebook_document_did_close(t.DidCloseNotebookDocumentParams(
        notebook_document=t.NotebookDocumentIdentifier(uri=NB),
        cell_text_documents=[t.TextDocumentIdentifier(uri=cell_uri(i)) for i in range(len(CELLS))]))
    assert items(await client.text_document_inline_completion_async(inline_params(at, cell_uri(3)))) == []


async def test_an_edit_in_another_cell_stops_the_cells_running_generation(client: LanguageClient):
    await initialize(client, init_options=options(options={"step_s": 0.2}), notebooks=True)
    open_notebook(client)
    at = end_of(CELLS[3][2])
    fut = asyncio.ensure_future(client.text_document_inline_completion_async(inline_params(at, cell_uri(3))))
    await wait_for(client, lambda s: s["generations"]["in_flight"] == 1)
    edit_first_cell(client)  # the context the generation was computed for is gone
    assert items(await asyncio.wait_for(fut, DEADLINE_S)) == []
    current = await wait_for(client, lambda s: s["generations"]["in_flight"] == 0)
    assert current["engine_cancelled"] == 1  # stopped by the edit, not run to its end


async def test_an_open_notebooks_unsaved_cells_are_indexed_until_it_closes(client: LanguageClient, tmp_path):
    import json

    from tests.e2e.test_workspace import index_options

    root = tmp_path / "ws"
    root.mkdir()
    on_disk = "import math\n"
    notebook = root / "analysis.ipynb"
    notebook.write_text(json.dumps({"cells": [{"cell_type": "code", "source": on_disk, "outputs": []}],
                                    "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    options = index_options(tmp_path)
    options["draftline"]["index"]["overlay_delay_ms"] = 50
    await initialize(client, init_options=options, roots=(root,), notebooks=True)
    disk = (await wait_for(client, lambda s: s["index"]["state"] == "ready" and s["index"]["pending"] == 0))["index"]
    assert disk["files"] == 1 and disk["chars"] == len(on_disk.strip())  # its code cell, not its JSON

    unsaved = "def freshly_typed_cell(value):\n    return value * 3\n"
    uri = lambda i: f"vscode-notebook-cell:{root / 'analysis.ipynb'}#cell{i}"  # noqa: E731
    cells = [t.NotebookCell(kind=t.NotebookCellKind.Code, document=uri(i)) for i in range(2)]
    docs = [t.TextDocumentItem(uri=uri(0), language_id="python", version=1, text=on_disk),
            t.TextDocumentItem(uri=uri(1), language_id="python", version=1, text=unsaved)]
    client.notebook_document_did_open(t.DidOpenNotebookDocumentParams(cell_text_documents=docs,
        notebook_document=t.NotebookDocument(uri=notebook.as_uri(), notebook_type="jupyter-notebook", version=1,
                                             cells=cells)))
    grown = len(unsaved.strip())
    await wait_for(client, lambda s: s["index"]["chars"] >= disk["chars"] + grown and s["index"]["pending"] == 0)

    client.notebook_document_did_close(t.DidCloseNotebookDocumentParams(
        notebook_document=t.NotebookDocumentIdentifier(uri=notebook.as_uri()),
        cell_text_documents=[t.TextDocumentIdentifier(uri=uri(i)) for i in range(2)]))
    await wait_for(client, lambda s: s["index"]["chars"] == disk["chars"] and s["index"]["pending"] == 0)
