"""The imports digest: stubs of what a file imports from the workspace, ranked, within a token budget."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engine.fake import FakeEngine
from indexer import Index
from indexer.config import IndexConfig
from lsp_server.completer import Completer, build_request, context_for
from lsp_server.config import CompletionConfig
from lsp_server.context import ContextFinder, build_context
from lsp_server.digest import Digest, cursor_hint, fit, import_region, one_line
from lsp_server.documents import Snapshot, display_path
from lsp_server.index_handle import IndexHandle

SHAPES = '''"""Shapes."""
import math

UNIT = 1.0  # the default side


def area_of(shape: "Shape", scale: float = 1.0,
            rounding: int | None = None) -> float:
    """Area of any shape, scaled."""
    return shape.area() * scale


class Shape:
    """A plane figure."""

    sides: int = 0
    name: str = "shape"

    def __init__(self, name: str,
                 sides: int) -> None:
        self.name = name
        self.sides = sides

    @property
    def area(self) -> float:
        raise NotImplementedError

    def _private(self):
        pass


class ShapeError(ValueError):
    """Bad shape."""
'''
UTIL = '''def helper(x):
    return x


def other(y):
    return y
'''
MAIN = '''from geo.shapes import Shape, area_of, UNIT, ShapeError
from geo import util
import json


def total(shapes):
    return sum(s for s in shapes)


def make(config: '''


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    (root / "geo").mkdir(parents=True)
    (root / "geo" / "__init__.py").write_text("")
    (root / "geo" / "shapes.py").write_text(SHAPES)
    (root / "geo" / "util.py").write_text(UTIL)
    (root / "app.py").write_text(MAIN + "Shape):\n    return area_of(config) * UNIT\n")
    index = Index([root], IndexConfig(cache_dir=str(tmp_path / "cache")), embedder=None)
    index.build()
    yield root, index
    index.close()


def entries(index, root, before, after="\n", hint=None):
    path = str(root / "app.py")
    head = before[: before.rfind("\n") + 1]
    line = before[len(head):]
    return Digest(index).entries(path, head, after.split("\n", 1)[1] if "\n" in after else "", [],
                                 hint if hint is not None else cursor_hint(line))


def test_stubs_show_signatures_docs_fields_and_methods(ws):
    root, index = ws
    got = {e.name: e for e in entries(index, root, MAIN)}
    assert got["area_of"].text == (
        'def area_of(shape: "Shape", scale: float = 1.0, rounding: int | None = None) -> float:\n'
        '    """Area of any shape, scaled."""')
    shape = got["Shape"].text.split("\n")
    assert shape[:4] == ["class Shape:", '    """A plane figure."""', "    sides: int = 0", '    name: str = "shape"']
    assert "    def __init__(self, name: str, sides: int) -> None: ..." in shape
    assert "    @property" in shape and "    def area(self) -> float: ..." in shape
    assert not any("_private" in ln for ln in shape)  # private members are left out
    assert got["Shape"].brief == "class Shape:\n    def __init__(self, name: str, sides: int) -> None: ..."
    assert got["UNIT"].text == "UNIT = 1.0"  # a constant: its line, without the comment
    assert got["util"].kind == "module" and got["util"].text == "def helper(x): ...\ndef other(y): ..."
    assert "json" not in got  # the standard library is not the workspace's
    assert got["Shape"].path == str(root / "geo" / "shapes.py") and got["Shape"].start_line == 13


def test_ranking_follows_what_the_cursor_expects(ws):
    root, index = ws
    # after `config: ` a type is expected: classes first
    assert [e.name for e in entries(index, root, MAIN)][:2] in (["Shape", "ShapeError"], ["ShapeError", "Shape"])
    # after `raise ` an exception class first
    assert entries(index, root, MAIN.replace("def make(config: ", "    raise "))[0].name == "ShapeError"
    # no expectation: names not used since the imports come first, in import order
    body = MAIN.replace("def make(config: ", "x = util.helper(1)\ny = ")
    order = [e.name for e in entries(index, root, body)]
    assert order.index("util") == len(order) - 1  # already used above: last


def test_fit_shows_every_signature_line_first_then_grows_the_best(ws):
    root, index = ws
    ranked = entries(index, root, MAIN)
    count = lambda text: len(text.split())  # noqa: E731 (a stand-in tokenizer)
    full = sum(count(e.text) + 1 for e in ranked) + 10
    snippets, shown = fit(ranked, full, count, lambda p: Path(p).name)
    assert sorted(e.text for e in shown) == sorted(e.text for e in ranked)  # room for all: every stub whole
    assert [s.path for s in snippets] == ["shapes.py", "util.py"]  # one stub per file, files in rank order
    assert snippets[0].text.endswith("\n")
    # room for the signature lines and a little more: every name shown, the best grown to its brief stub
    first = {e.name: e.text.split("\n")[0] for e in ranked}
    lines = {n: t + " ..." if t.endswith(":") else t for n, t in first.items()}
    header = count("shapes.py") + 3 + count("util.py") + 3
    short = sum(count(t) + 1 for t in lines.values()) + header
    best = ranked[0]
    grow = count(best.brief) - count(lines[best.name])
    snippets, shown = fit(ranked, short + grow, count, lambda p: Path(p).name)
    got = {e.name: e.text for e in shown}
    assert set(got) == {e.name for e in ranked}
    assert got[best.name] == best.brief  # the best grew (its whole stub did not fit)
    assert all(got[e.name] == lines[e.name] for e in ranked[1:])  # the others: one line each
    assert got["ShapeError"] == "class ShapeError(ValueError): ..."
    # room for one line: the best one
    snippets, shown = fit(ranked, count(lines[best.name]) + 1 + count("shapes.py") + 3, count, lambda p: Path(p).name)
    assert [e.text for e in shown] == [lines[best.name]]
    assert fit(ranked, 0, count, str) == ((), [])


def test_cursor_hint():
    assert cursor_hint("def f(config: ") == ("type", "config")
    assert cursor_hint("def f(config: Con") == ("type", "config")  # typing the name keeps the hint
    assert cursor_hint("def f(a) -> ") == ("type", "")
    assert cursor_hint("    raise ") == ("exception", "")
    assert cursor_hint("@") == ("decorator", "")
    assert cursor_hint("    x = ") == ("", "")
    assert cursor_hint("f(a, ") == ("", "")
    assert cursor_hint("lambda x: ") == ("", "")
    assert cursor_hint('def f(console: "') == ("type", "console")  # a forward reference in quotes
    assert cursor_hint("    if isinstance(param, ") == ("type", "")  # isinstance's second argument is a type
    assert cursor_hint("    issubclass(cls, (") == ("type", "")
    assert cursor_hint('T = TypeVar("T", bound=') == ("type", "")


def test_type_aliases_count_as_types_and_other_constants_do_not():
    from lsp_server.digest import Entry, _is_type_alias

    def alias(text):
        return _is_type_alias(Entry("/w/t.py", text, 1, 1, text.split()[0], "variable"))

    for text in ('StyleType = Union[str, "Style"]', 'T = TypeVar("T")', "X: TypeAlias = int", "Pair = tuple[int, int]",
                 "Handler = Callable[[int], None]", 'UserId = NewType("UserId", int)', "Num = Int | Float"):
        assert alias(text), text
    for text in ("DEFAULTS = dict(a=1)", "MAX = 10", 'NAME = "x"', "log = logging.getLogger(__name__)",
                 "FLAGS = Flag.A | Flag.B"):
        assert not alias(text), text


def test_a_type_alias_ranks_with_the_classes_after_an_annotation(ws):
    root, index = ws
    (root / "geo" / "shapes.py").write_text(SHAPES + '\nShapeLike = Union[Shape, str]\n')
    (root / "app.py").write_text(MAIN.replace("UNIT, ShapeError", "UNIT, ShapeLike"))
    index.build()
    order = [e.name for e in entries(index, root, MAIN.replace("UNIT, ShapeError", "UNIT, ShapeLike"))]
    assert order.index("ShapeLike") < order.index("area_of") and order.index("ShapeLike") < order.index("UNIT")


def test_used_before_means_used_in_code_after_its_own_import(ws):
    from lsp_server.digest import _code_lines

    src = ["x = UNIT", "def f():", '    """Filled with ``UNIT``.', "    UNIT again", '    """',
           '    a = "UNIT"  # UNIT', "    b = 'UNIT' + UNIT", "    # UNIT", "    return Shape"]
    assert [(k, c.strip()) for k, c in _code_lines(src) if "UNIT" in c or "Shape" in c] == [
        (0, "x = UNIT"), (6, 'b = "" + UNIT'), (8, "return Shape")]
    root, index = ws
    # a name only mentioned in a docstring is still pending, so it ranks before one used in code
    doc = MAIN.replace("def make(config: ", 'def g():\n    """Returns a ``UNIT``."""\n    return area_of(1)\n\n\nx = ')
    order = [e.name for e in entries(index, root, doc)]
    assert order.index("UNIT") < order.index("area_of")  # imported after area_of, but area_of is used
    # a name used above a later import (a nested one, in a block) counts as used
    nested = MAIN.replace("def make(config: ", "y = UNIT\n\nif True:\n    from geo.shapes import Shape\n\nz = ")
    order = [e.name for e in entries(index, root, nested)]
    assert order.index("UNIT") == len(order) - 1
    # a word written before a name's import is not a use of that import
    late = MAIN.replace(", ShapeError", "").replace("def make(config: ", "v = ShapeError\n\nif True:\n"
                                                   "    from geo.shapes import ShapeError\n\nz = area_of(1)\nw = ")
    order = [e.name for e in entries(index, root, late)]
    assert order.index("ShapeError") < order.index("area_of")


def test_signature_on_one_line_and_decorators_kept_only_when_they_inform():
    decorators, sig = one_line(["@lru_cache(", "    maxsize=50)", "@property", "def f(", "    a,  # first", "    b,", ") -> int:"])
    assert (decorators, sig) == (["@property"], "def f(a, b) -> int:")


def test_import_region_covers_parenthesised_imports():
    text = "import a\nfrom b import (\n    c,\n    d,\n)\n\nx = 1\n"
    assert import_region(text) == "import a\nfrom b import (\n    c,\n    d,\n)\n"
    assert import_region("x = 1\n") == ""


def test_import_region_goes_on_across_blank_lines_in_an_open_import_block():
    """gofmt groups a Go import block with blank lines: the names after one were left out (no digest)."""
    go = 'package main\n\nimport (\n\t"fmt"\n\n\tb "x/billing"\n)\n\nfunc main() {\n\tb.Charge()\n}\n'
    assert import_region(go) == 'package main\n\nimport (\n\t"fmt"\n\n\tb "x/billing"\n)\n'
    # a closed one still ends at its last line: blank lines and an indented body after it are not imports
    py = "import os\nfrom a import (\n    x,\n)\n\n    \ndef f():\n    import json\n\n    return 1\n"
    assert import_region(py) == "import os\nfrom a import (\n    x,\n)\n\n    \ndef f():\n    import json\n"


def test_completer_puts_the_digest_first_and_keeps_it_while_typing(ws):
    root, index = ws
    seen = []

    class Recording(FakeEngine):
        def complete(self, request, cancel):
            seen.append(request.snippets)
            return super().complete(request, cancel)

    cfg = CompletionConfig()
    completer = Completer(Recording(text="x"), cfg, index, [root])
    for typed in ("", "S", "Sh", "Sha"):
        before = MAIN + typed
        snap = Snapshot(uri=(root / "app.py").as_uri(), version=1, language="python", path="app.py",
                        before=before, after="):\n    pass\n")
        request = build_request(snap, cfg)
        completer.complete(request, threading.Event(), context_for(snap, request, cfg))
    first = seen[0]
    stub = next(s for s in first if "\nclass Shape:\n" in s.text)  # the file's stub, its entries in file order
    assert stub.path == display_path(str(root / "geo" / "shapes.py"), [root])
    usages = first[: first.index(stub)]  # before it, at most one line using each of the best two names
    assert 1 <= len(usages) <= 2 and all("\n" not in u.text and u.start_line == u.end_line for u in usages)
    assert all(s == first for s in seen)  # typing within the line: the same snippets (a reused prompt head)
    off = Completer(Recording(text="x"), CompletionConfig(digest_share=0.0), index, [root])
    snap = Snapshot(uri=(root / "app.py").as_uri(), version=1, language="python", path="app.py", before=MAIN, after="\n")
    request = build_request(snap, off.cfg)
    off.complete(request, threading.Event(), context_for(snap, request, off.cfg))
    assert not any("    \"\"\"A plane figure.\"\"\"\n    sides: int" in s.text for s in seen[-1])  # digest off


def test_a_broken_index_gives_no_digest_and_no_error(ws):
    root, index = ws
    asked: list[str] = []

    class Broken:
        files = index.files  # the imports resolve: it is symbols_in that fails

        def symbols_in(self, path):
            asked.append(path)
            raise RuntimeError("boom")

        def chunk(self, cid):
            return None

        def search(self, query, k, exclude=None):
            return []

    finder = ContextFinder(Broken(), [root], display_path)
    ctx = build_context(MAIN, "\n", MAIN, str(root / "app.py"), "python", 8)
    assert finder.snippets(ctx, 2, 2, 30, digest_tokens=500) == ()
    assert str(root / "geo" / "shapes.py") in asked


def test_a_stub_follows_an_edit_of_the_imported_file_once_the_index_applied_it(ws):
    root, index = ws
    handle = IndexHandle()
    handle.index, handle.state = index, "ready"
    digest = Digest(handle)
    app, util = str(root / "app.py"), str(root / "geo" / "util.py")

    def stubs():
        return [e.text for e in digest.entries(app, "from geo.util import helper\n\n", "", [])]

    assert stubs() == ["def helper(x): ..."]
    with index._write_lock:  # the index's worker waits here with the edit: a completion comes first
        handle.touch(util, UTIL.replace("def helper(x):", "def helper(x, *, strict: bool = False) -> int:"))
        assert stubs() == ["def helper(x): ..."]  # what the index holds still
    assert index.flush(10)
    assert stubs() == ["def helper(x, *, strict: bool = False) -> int: ..."]  # not the stub built meanwhile


def test_the_generation_waits_for_edits_elsewhere_not_for_the_file_being_typed(ws):
    root, index = ws
    handle = IndexHandle()
    handle.index, handle.state = index, "ready"
    app, util = str(root / "app.py"), str(root / "geo" / "util.py")
    with index._write_lock:  # nothing is applied until the end of the block
        g0 = handle.generation(app)
        handle.touch(app, MAIN + "Sha")
        assert handle.generation(app) == g0  # typing in app.py: its snippets and stubs stay as they were
        handle.touch(util, UTIL + "\nX = 1\n")
        pending = handle.generation(app)
        assert pending != g0
    assert index.flush(10)
    assert handle.generation(app) not in (g0, pending)  # util.py's edit applied: the value moved again


def test_a_file_importing_nothing_of_the_workspace_gets_no_digest(ws):
    root, index = ws
    assert entries(index, root, "import os\nimport json\n\nx = ") == []


def workspace_entries(tmp_path, files: dict[str, str], current: str, head: str, line: str):
    """The digest entries for a cursor after ``head`` + ``line`` in ``current``, in a workspace of ``files``."""
    root = tmp_path / "ws"
    for rel, text in {current: "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    index = Index([root], IndexConfig(cache_dir=str(tmp_path / "cache")), embedder=None)
    try:
        index.build()
        return Digest(index).entries(str(root / current), head, "", [], cursor_hint(line))
    finally:
        index.close()


def test_a_js_default_import_shows_the_default_export_not_the_first_definition(tmp_path):
    got = workspace_entries(tmp_path, {"models/inventory.ts":
                                       "export class InventoryLedger {\n  count(): number { return 0; }\n}\n\n"
                                       "export default function createLedger(owner: string): InventoryLedger {\n"
                                       "  return new InventoryLedger();\n}\n"},
                            "app.ts", 'import makeLedger from "./models/inventory";\n\n', "const l = ")
    assert [e.text for e in got] == ["export default function createLedger(owner: string): InventoryLedger;"], got


def test_a_rust_trait_methods_declaration_keeps_one_semicolon(tmp_path):
    got = workspace_entries(tmp_path, {"src/store.rs": "pub trait Compactor {\n    fn compact(&mut self, level: u32) -> usize;\n"
                                                       "    fn name(&self) -> &str {\n        \"c\"\n    }\n}\n",
                                       "src/main.rs": "mod store;\n"},
                            "src/main.rs", "mod store;\nuse crate::store::Compactor;\n\n", "let c: ")
    assert got and ";;" not in got[0].text and "fn compact(&mut self, level: u32) -> usize;" in got[0].text, got


def test_a_rust_structs_stub_has_its_pub_fields_and_its_impl_methods(tmp_path):
    """A struct's methods live in `impl` blocks outside its lines, and its fields are not symbols: the stub
    was `pub struct SegmentWriter {}`, empty."""
    (entry,) = workspace_entries(
        tmp_path, {"src/main.rs": "mod seg;\n", "src/seg.rs": "pub struct SegmentWriter {\n    pub path: String,\n    count: usize,\n}\n\nimpl SegmentWriter {\n"
                                 "    pub fn new(path: &str) -> Self {\n        SegmentWriter { path: path.to_string(), count: 0 }\n"
                                 "    }\n\n    pub fn write(&mut self, data: &[u8]) -> usize {\n        data.len()\n    }\n}\n"},
        "src/main.rs", "mod seg;\nuse crate::seg::SegmentWriter;\n\nfn main() {\n", "    let w = ")
    assert entry.text.split("\n") == ["pub struct SegmentWriter {", "    pub path: String,",
                                      "    pub fn new(path: &str) -> Self;",
                                      "    pub fn write(&mut self, data: &[u8]) -> usize;", "}"], entry.text


def test_a_java_class_import_shows_the_class_not_a_module_stub(tmp_path):
    """Parcel.java is named after its class: the import was taken for a module, and the stub was the bare
    `public final class Parcel;`, without its fields and methods."""
    got = workspace_entries(
        tmp_path, {"src/main/java/com/acme/model/Parcel.java":
                   "package com.acme.model;\n\npublic final class Parcel {\n    public final String id;\n\n"
                   "    public Parcel(String id) {\n        this.id = id;\n    }\n\n"
                   "    public double weightKg() {\n        return 1.0;\n    }\n}\n"},
        "src/main/java/com/acme/App.java", "package com.acme;\n\nimport com.acme.model.Parcel;\n\npublic class App {\n",
        "    Parcel p = ")
    assert got and got[0].kind == "class", got
    assert "public double weightKg();" in got[0].text and "public Parcel(String id);" in got[0].text, got[0].text


def test_a_c_include_gives_the_headers_declarations(tmp_path):
    """`#include "netq/ring.h"` binds no name (the header's are used bare), so the digest left every
    include out: now the header is a module entry of its declarations."""
    (entry,) = workspace_entries(
        tmp_path, {"include/netq/ring.h": "#ifndef RING_H\n#define RING_H\n#include <stddef.h>\n\ntypedef struct ring {\n"
                                          "    size_t head;\n} ring_t;\n\nring_t *ring_create(size_t capacity);\n"
                                          "void ring_destroy(ring_t *r);\n\n#endif\n"},
        "src/main.c", '#include <stdio.h>\n#include "netq/ring.h"\n\nint main(void) {\n', "    ring_t *r = ")
    assert entry.kind == "module" and entry.name == "ring"
    assert "ring_t *ring_create(size_t capacity);" in entry.text and "void ring_destroy(ring_t *r);" in entry.text
