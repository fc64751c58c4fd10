"""Cross-file context: imported names, identifiers near the cursor, definitions first, a stable memo, scope."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from engine.fake import FakeEngine
from engine.prompt import snippet_cost
from engine.types import CompletionRequest
from lsp_server.completer import Completer, build_request, context_for
from lsp_server.index_handle import IndexHandle
from lsp_server.config import CompletionConfig
from lsp_server.context import ContextFinder, build_context, nearby_identifiers
from lsp_server.documents import Snapshot, display_path
from lsp_server.postprocess import scope_min_indent


@dataclass
class Sym:
    name: str
    path: str
    start_line: int
    end_line: int
    chunk_id: int
    container: str | None = None
    kind: str = "function"


@dataclass
class Ch:
    path: str
    start_line: int
    end_line: int
    text: str
    score: float = 0.0


class SymbolIndex:
    """A retriever with a symbol table; counts the calls so the memo can be checked."""

    def __init__(self):
        self.chunks = {
            1: Ch("/w/pkg/util.py", 10, 12, "def parse_config(path):\n    '''Read a TOML file.'''\n    ...\n"),
            2: Ch("/w/other/util2.py", 1, 2, "def parse_config():\n    pass\n"),
            3: Ch("/w/pkg/model.py", 5, 9, "class Model:\n    def fit(self):\n        pass\n"),
            4: Ch("/w/pkg/model.py", 20, 21, "    def parse_config(self):\n        pass\n"),
        }
        self.symbols = {
            "parse_config": [Sym("parse_config", "/w/other/util2.py", 1, 2, 2),
                             Sym("parse_config", "/w/pkg/model.py", 20, 21, 4, container="Other"),
                             Sym("parse_config", "/w/pkg/util.py", 10, 12, 1)],
            "Model": [Sym("Model", "/w/pkg/model.py", 5, 9, 3, kind="class")],
        }
        self.searches = 0
        self.gen = 0

    def search(self, query, k, exclude=None):
        self.searches += 1
        return [Ch("/w/pkg/model.py", 5, 9, "class Model:\n"), Ch("/w/pkg/notes.py", 1, 3, "# notes\n")]

    def definitions(self, name):
        return self.symbols.get(name, [])

    def chunk(self, chunk_id):
        return self.chunks.get(chunk_id)

    def generation(self, path):
        return self.gen


def test_nearby_identifiers_nearest_first_without_the_one_being_typed():
    words = nearby_identifiers(["alpha = beta(gamma)", "delta = 1"], "    value = compute(x) + par", "omega")
    assert words[:3] == ["compute", "value", "omega"]  # "par" is still being typed
    assert words.index("delta") < words.index("gamma")  # nearer lines first
    assert "par" not in words and "self" not in words


def test_definitions_come_first_from_the_imported_module_then_retrieval_minus_duplicates():
    index = SymbolIndex()
    before = "from pkg.util import parse_config\nfrom pkg.model import Model\n\ncfg = parse_config(p)\nm = "
    ctx = build_context(before, "\n", before, "/w/pkg/app.py", "python", 8)
    snippets = ContextFinder(index, [], display_path).snippets(ctx, k_chunks=4, k_defs=3, def_lines=30)
    paths = [(s.path, s.start_line) for s in snippets]
    # parse_config (used nearest the cursor) from pkg/util.py (the module it is imported from), then Model;
    # the retrieved Model chunk duplicates a definition and is dropped
    assert paths == [("/w/pkg/util.py", 10), ("/w/pkg/model.py", 5), ("/w/pkg/notes.py", 1)]


def test_definition_lines_are_capped():
    index = SymbolIndex()
    before = "from pkg.util import parse_config\nparse_config(x)\n"
    ctx = build_context(before, "", before, "/w/app.py", "python", 8)
    (first, *_) = ContextFinder(index, [], display_path).snippets(ctx, k_chunks=0, k_defs=1, def_lines=1)
    assert first.text == "def parse_config(path):" and first.end_line == first.start_line


def test_snippets_stay_the_same_while_typing_within_a_line():
    index = SymbolIndex()
    finder = ContextFinder(index, [], display_path)
    base = "from pkg.util import parse_config\nparse_config(x)\ny = "
    first = finder.snippets(build_context(base, "", base, "/w/a.py", "python", 8), 2, 2, 30)
    # finished names and a type annotation on the line change `nearby` and the hint, not the snippets
    for typed in ("m", "mo", "mod", "mode", "mode.", "mode.run(", "mode.run(parse_config", "mode.run(parse_config, x: "):
        text = base + typed
        assert finder.snippets(build_context(text, "", text, "/w/a.py", "python", 8), 2, 2, 30) == first
    assert index.searches == 1  # memoised: no search per keystroke
    index.gen += 1  # another file changed in the index
    finder.snippets(build_context(base, "", base, "/w/a.py", "python", 8), 2, 2, 30)
    assert index.searches == 2


class DriftingIndex(SymbolIndex):
    """Retrieval that finds another chunk for every query, as BM25/dense do from line to line."""

    def search(self, query, k, exclude=None):
        self.searches += 1
        n = len(query) % 50 + 1
        return [Ch("/w/pkg/notes.py", n, n, f"# note {n}\n")]


def test_a_new_line_keeps_the_block_while_it_shows_every_definition_the_line_points_at():
    finder = ContextFinder(DriftingIndex(), [], display_path)
    base = "from pkg.util import parse_config\nparse_config(x)\n"

    def at(text: str, **kw):
        return finder.snippets(build_context(text, "", text, "/w/a.py", "python", 8), 2, 2, 30, **kw)

    first = at(base + "a = 1\n")
    assert [s.path for s in first] == ["/w/pkg/util.py", "/w/pkg/notes.py"]
    # the next line's retrieval finds another note; parse_config is still the only definition wanted
    assert at(base + "a = 1\nbb = 22\n") is first
    # a line that uses Model wants its definition, which the block lacks: chosen afresh
    with_model = at(base + "a = 1\nbb = 22\nm = Model()\n")
    assert with_model is not first and "/w/pkg/model.py" in [s.path for s in with_model]
    # far below where it was chosen, the block is chosen afresh even when it would still do
    far = base + "a = 1\nbb = 22\nm = Model()\n" + "z = 0\n" * 40
    assert at(far) is not with_model
    # a definition the prompt has no room for (snippet_tokens, counted by `count`) is not asked for
    other = ContextFinder(DriftingIndex(), [], display_path)
    small = snippet_cost(first[0], len) + 1  # room for parse_config's definition only

    def on_b(text: str):
        return other.snippets(build_context(text, "", text, "/w/b.py", "python", 8), 2, 2, 30, count=len,
                              snippet_tokens=small)

    kept = on_b(base + "a = 1\n")
    assert on_b(base + "a = 1\nm = Model()\n") is kept


def test_index_handle_generation_ignores_the_file_being_typed():
    handle = IndexHandle()
    g0 = handle.generation("/w/a.py")
    handle.touch("/w/a.py", "x")
    assert handle.generation("/w/a.py") == g0
    handle.touch("/w/b.py", None)
    assert handle.generation("/w/a.py") != g0


def test_completer_sends_definitions_to_the_engine():
    seen: list[CompletionRequest] = []

    class Recording(FakeEngine):
        def complete(self, request, cancel):
            seen.append(request)
            return super().complete(request, cancel)

    s = Snapshot(uri="file:///w/pkg/app.py", version=1, language="python", path="pkg/app.py",
                 before="from pkg.util import parse_config\n\nconfig = parse_config(", after=")\n")
    cfg = CompletionConfig()
    request = build_request(s, cfg)
    Completer(Recording(text="p"), cfg, SymbolIndex()).complete(request, threading.Event(), context_for(s, request, cfg))
    assert seen[0].snippets[0].text.startswith("def parse_config(path):")


def test_scope_min_indent_and_the_request_limits():
    assert scope_min_indent("def f():\n    x = 1\n    ") == 4
    assert scope_min_indent("def f():") == 1  # after a block opener: anything deeper than the opener
    assert scope_min_indent("x = 1\n") == 0  # top level: never a scope end
    multi = build_request(Snapshot("file:///a.py", 1, "python", "a.py", "def f():\n    ", "\n"), CompletionConfig())
    single = build_request(Snapshot("file:///a.py", 1, "python", "a.py", "x = f(", ")\n"), CompletionConfig())
    assert multi.mode == "multi-line" and multi.limits.min_indent == 4
    assert single.mode == "single-line" and single.limits.min_indent == -1


def test_with_the_real_index_the_imported_definition_reaches_the_prompt(tmp_path):
    import indexer

    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "__init__.py").write_text("")
    (ws / "pkg" / "geometry.py").write_text(
        "import math\n\n\ndef rotate_point(x, y, angle):\n    '''Rotate (x, y) about the origin.'''\n"
        "    c, s = math.cos(angle), math.sin(angle)\n    return x * c - y * s, x * s + y * c\n")
    app = ws / "pkg" / "app.py"
    app.write_text("from pkg.geometry import rotate_point\n\n\ndef spin(points):\n    return [rotate_point(")
    index = indexer.Index([ws], indexer.IndexConfig(cache_dir=tmp_path / "cache"), embedder=None)
    try:
        index.build()
        handle = IndexHandle()
        handle.index, handle.state = index, "ready"
        text = app.read_text()
        s = Snapshot(uri=app.as_uri(), version=1, language="python", path="pkg/app.py", before=text, after="")
        cfg = CompletionConfig()
        request = build_request(s, cfg)
        done = Completer(FakeEngine(text="p"), cfg, handle, [ws]).complete(
            request, threading.Event(), context_for(s, request, cfg))
        assert done.chunks and done.chunks[0].path == "pkg/geometry.py"
        assert done.chunks[0].text.startswith("def rotate_point(x, y, angle):")
    finally:
        index.close()


def digest_snippets(index, ws, file, language):
    """``snippets(before, after)``: the snippets one ContextFinder chooses for a cursor in ``file`` (the
    digest's budget only: its usage lines and stubs)."""
    handle = IndexHandle()
    handle.index, handle.state = index, "ready"
    cfg = CompletionConfig()
    finder = ContextFinder(handle, [ws], display_path)

    def snippets(before, after=""):
        s = Snapshot(uri=file.as_uri(), version=1, language=language, path=file.relative_to(ws).as_posix(),
                     before=before, after=after)
        return finder.snippets(context_for(s, build_request(s, cfg), cfg), 0, 0, 12, 120, None, 200)

    return snippets


def test_the_digest_brings_a_usage_line_of_its_best_name_from_another_file(tmp_path):
    """For the name the digest ranks first, a line elsewhere that uses it (not its definition, an import
    or a comment, nor a line of the current file), the one shaped like the cursor's line; it opens the
    snippet list, so the prompt shows it next to the current file."""
    import indexer

    ws = tmp_path / "ws"
    (ws / "mime").mkdir(parents=True)
    (ws / "mime" / "__init__.py").write_text("")
    (ws / "mime" / "base.py").write_text(
        "class MIMEBase:\n    '''A MIME part.'''\n\n    def __init__(self, maintype, subtype):\n        self.t = maintype\n")
    (ws / "mime" / "text.py").write_text(
        "from mime.base import MIMEBase\n\n# MIMEBase is the parent of every part\n\n\n"
        "def make(kind):\n    return MIMEBase('text', kind)\n\n\nclass MIMEText(MIMEBase):\n    pass\n")
    audio = ws / "mime" / "audio.py"
    text = "from mime.base import MIMEBase\n\n\nclass MIMEAudio("
    audio.write_text(text + "MIMEBase):\n    pass\n\n\nclass Later(MIMEBase):\n    pass\n")
    index = indexer.Index([ws], indexer.IndexConfig(cache_dir=tmp_path / "cache"), embedder=None)
    try:
        index.build()
        snippets = digest_snippets(index, ws, audio, "python")
        usage = snippets(text)[0]
        assert (usage.path, usage.text, usage.start_line) == ("mime/text.py", "class MIMEText(MIMEBase):", 10)
        call = snippets("from mime.base import MIMEBase\n\n\ndef make_audio():\n    return ")[0]
        assert (call.path, call.text) == ("mime/text.py", "return MIMEBase('text', kind)")
    finally:
        index.close()


def test_an_export_statement_is_not_taken_for_a_usage_line(tmp_path):
    """`module.exports = { formatLabel };` names the definition; it was picked as a use of it (and the
    same line came again as a retrieved chunk)."""
    import indexer

    ws = tmp_path / "ws"
    (ws / "util").mkdir(parents=True)
    (ws / "util" / "format.js").write_text(
        "function formatLabel(n) {\n  return `${n} items`;\n}\n\nmodule.exports = { formatLabel };\n")
    (ws / "report.js").write_text(
        "const { formatLabel } = require('./util/format');\n\nconsole.log(formatLabel(3));\n")
    app = ws / "app.js"
    text = "const { formatLabel } = require('./util/format');\n\nconst label = "
    app.write_text(text + "\n")
    index = indexer.Index([ws], indexer.IndexConfig(cache_dir=tmp_path / "cache"), embedder=None)
    try:
        index.build()
        usage = digest_snippets(index, ws, app, "javascript")(text, "\n")[0]
        assert (usage.path, usage.text) == ("report.js", "console.log(formatLabel(3));"), usage
        (ws / "report.js").unlink()  # no use left but the export statement and the require line: none shown
        index.remove(ws / "report.js")
        assert index.flush(timeout=30)
        shown = digest_snippets(index, ws, app, "javascript")(text, "\n")
        assert not any("module.exports" in s.text for s in shown), shown
    finally:
        index.close()
