"""What a source file imports (tree-sitter, every grammar the chunker knows) and which workspace files that names.

`parse_imports` reads the import statements of Python, JavaScript/TypeScript, Go, Rust, Java and
C/C++ into `Import` records: the module as written, the name taken from it (``None`` when the
module itself is bound, as in ``import m`` or a Go package), and the name bound in the file.
`resolve` turns one record into workspace files by looking the indexed paths up in a `FileTable`; only a
re-exporting file (a JS/TS barrel, a Rust `pub use`) is read, through the table (an unsaved buffer the index
holds first, else the disk). Modules outside the workspace (the standard library, node_modules, crates) resolve to
nothing, which is what the callers want.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tree_sitter import Node, Parser

from .languages import LanguageRegistry

_REGISTRY = LanguageRegistry()
_PARSERS: dict[str, Parser | None] = {}

_JS_EXTS = (".ts", ".tsx", ".js", ".jsx", ".mjs", ".cjs", ".mts", ".cts")


class FileTable:
    """The workspace's file paths by file name and by directory name (what resolution looks up), and the
    text of the files resolution reads (re-exports): ``overlay(path)`` gives an unsaved buffer's, else
    the disk's, kept while the file's mtime and size stay."""

    MAX_READ = 256_000  # a larger file is not read for its re-exports
    MAX_TEXTS = 256

    def __init__(self, paths: Sequence[str] = (), overlay: Callable[[str], str | None] | None = None):
        self._named: dict[str, set[str]] = {}
        self._dirs: dict[str, set[str]] = {}
        self._overlay = overlay
        self._texts: dict[str, tuple[tuple[int, int], str]] = {}  # path -> ((mtime_ns, size), text)
        self._texts_lock = threading.Lock()  # the index's worker and the completer's context both resolve
        for p in paths:
            self.add(p)

    def text(self, path: str) -> str | None:
        if self._overlay is not None and (text := self._overlay(path)) is not None:
            return text
        try:
            st = os.stat(path)
            if st.st_size > self.MAX_READ:
                return None
            key = (st.st_mtime_ns, st.st_size)
            with self._texts_lock:
                hit = self._texts.get(path)
            if hit is not None and hit[0] == key:
                return hit[1]
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            return None
        with self._texts_lock:
            self._texts[path] = (key, text)
            if len(self._texts) > self.MAX_TEXTS:
                self._texts.pop(next(iter(self._texts)))
        return text

    def add(self, path: str) -> None:
        self._named.setdefault(os.path.basename(path), set()).add(path)
        self._dirs.setdefault(os.path.basename(os.path.dirname(path)), set()).add(path)

    def remove(self, path: str) -> None:
        for table, key in ((self._named, os.path.basename(path)), (self._dirs, os.path.basename(os.path.dirname(path)))):
            paths = table.get(key)
            if paths is not None:
                paths.discard(path)
                if not paths:  # a name no file has now: kept, a week of renamed files kept every old name
                    del table[key]

    def named(self, base: str) -> list[str]:
        return list(self._named.get(base, ()))

    def in_dir(self, dirname: str) -> list[str]:
        return list(self._dirs.get(dirname, ()))

    def __contains__(self, path: str) -> bool:
        return path in self._named.get(os.path.basename(path), ())


@dataclass(frozen=True)
class Import:
    """One imported binding."""

    module: str  # as written: "..pkg.mod", "./m", "github.com/x/util", "crate::a::b", "com.x", "util.h"
    name: str | None  # the name as the module defines it; None: the module itself is bound
    alias: str  # the name this file uses ("" for a wildcard or a C include)
    line: int  # 1-based line of the statement


def language_of(path: str) -> str | None:
    spec = _REGISTRY.spec_for(path)
    return spec.name if spec else None


def _parser(language: str, path: str) -> Parser | None:
    if language not in _PARSERS:
        spec = _REGISTRY.spec_for(path)
        lang = _REGISTRY.language(spec) if spec else None
        _PARSERS[language] = Parser(lang) if lang is not None else None
    return _PARSERS[language]


def _text(node: Node | None) -> str:
    return node.text.decode("utf-8", "replace") if node is not None and node.text is not None else ""


def _root(text: str, path: str) -> Node | None:
    """The syntax tree of ``text`` in the grammar ``path``'s extension picks; None when there is none."""
    language = language_of(path)
    parser = _parser(language, path) if language else None
    return parser.parse(text.encode("utf-8", "replace")).root_node if parser is not None else None


def parse_imports(text: str, path: str) -> list[Import]:
    """The imports of ``text`` (a file at ``path``, whose extension picks the grammar); [] when unknown."""
    root = _root(text, path)
    reader = _READERS.get(language_of(path) or "")
    out: list[Import] = []
    if root is None or reader is None:
        return out
    for node in root.children:  # imports are top-level statements in every language here
        reader(node, out)
    return out


# ---- per-language readers ---------------------------------------------------
def _py(node: Node, out: list[Import]) -> None:
    line = node.start_point[0] + 1
    if node.type == "import_statement":  # import a.b [as c]
        for child in node.children_by_field_name("name"):
            if child.type == "aliased_import":
                module = _text(child.child_by_field_name("name"))
                out.append(Import(module, None, _text(child.child_by_field_name("alias")), line))
            else:
                module = _text(child)  # `import a.b` binds `a`; the module used is a.b
                out.append(Import(module, None, module.split(".")[0], line))
    elif node.type == "import_from_statement":  # from m import a [as b], (c, d), *
        module = _text(node.child_by_field_name("module_name"))
        names = node.children_by_field_name("name")
        if not names and any(c.type == "wildcard_import" for c in node.children):
            out.append(Import(module, "*", "", line))
        for child in names:
            if child.type == "aliased_import":
                name = _text(child.child_by_field_name("name"))
                out.append(Import(module, name, _text(child.child_by_field_name("alias")), line))
            else:
                name = _text(child)
                out.append(Import(module, name, name, line))
    elif node.type in ("if_statement", "try_statement", "block", "else_clause", "except_clause"):
        for child in node.children:  # try: from x import y / if TYPE_CHECKING: ...
            _py(child, out)


def _js(node: Node, out: list[Import]) -> None:
    line = node.start_point[0] + 1
    if node.type == "export_statement" and node.child_by_field_name("source") is None:
        return
    if node.type not in ("import_statement", "export_statement"):
        if node.type in ("lexical_declaration", "variable_declaration"):  # const x = require('./m')
            for decl in node.children:
                value = decl.child_by_field_name("value") if decl.type == "variable_declarator" else None
                if value is not None and value.type == "call_expression" and _text(value.child_by_field_name("function")) == "require":
                    args = value.child_by_field_name("arguments")
                    strings = [c for c in args.children if c.type == "string"] if args is not None else []
                    target = decl.child_by_field_name("name")
                    source = _text(strings[0]).strip("'\"`") if strings else ""
                    if source and target is not None and target.type == "identifier":
                        out.append(Import(source, None, _text(target), line))
                    elif source and target is not None and target.type == "object_pattern":
                        for part in target.named_children:  # const { a, b: c } = require('./m')
                            if part.type == "shorthand_property_identifier_pattern":
                                out.append(Import(source, _text(part), _text(part), line))
                            elif part.type == "pair_pattern":
                                key, value = part.child_by_field_name("key"), part.child_by_field_name("value")
                                if key is not None and value is not None and value.type == "identifier":
                                    out.append(Import(source, _text(key).strip("'\"`"), _text(value), line))
        return
    source = _text(node.child_by_field_name("source")).strip("'\"`")
    if not source:
        return
    for clause in node.children:
        if clause.type != "import_clause":
            continue
        for part in clause.children:
            if part.type == "identifier":  # default import
                out.append(Import(source, "default", _text(part), line))
            elif part.type == "namespace_import":
                ids = [c for c in part.children if c.type == "identifier"]
                if ids:
                    out.append(Import(source, None, _text(ids[-1]), line))
            elif part.type == "named_imports":
                for spec in part.children:
                    if spec.type == "import_specifier":
                        name = _text(spec.child_by_field_name("name"))
                        alias = _text(spec.child_by_field_name("alias")) or name
                        out.append(Import(source, name, alias, line))


def _go(node: Node, out: list[Import]) -> None:
    if node.type != "import_declaration":
        return
    specs = [c for c in node.children if c.type == "import_spec"]
    for lst in (c for c in node.children if c.type == "import_spec_list"):
        specs += [c for c in lst.children if c.type == "import_spec"]
    for spec in specs:
        module = _text(spec.child_by_field_name("path")).strip('"`')
        alias = _text(spec.child_by_field_name("name")) or module.rstrip("/").split("/")[-1]
        if alias not in ("_", "."):
            out.append(Import(module, None, alias, spec.start_point[0] + 1))


def _rust_use(node: Node | None, prefix: str, line: int, out: list[Import]) -> None:
    if node is None:
        return
    t = node.type
    if t in ("scoped_identifier", "identifier", "crate", "self", "super"):
        full = f"{prefix}::{_text(node)}" if prefix else _text(node)
        module, _, name = full.rpartition("::")
        if name == "self":
            module, _, name = module.rpartition("::")
            out.append(Import(full.rsplit("::", 1)[0], None, name, line))
        elif name:
            out.append(Import(module, name, name, line))
    elif t == "use_as_clause":
        full = f"{prefix}::{_text(node.child_by_field_name('path'))}" if prefix else _text(node.child_by_field_name("path"))
        module, _, name = full.rpartition("::")
        out.append(Import(module, name, _text(node.child_by_field_name("alias")), line))
    elif t == "scoped_use_list":
        path = _text(node.child_by_field_name("path"))
        inner = f"{prefix}::{path}" if prefix and path else (path or prefix)
        _rust_use(node.child_by_field_name("list"), inner, line, out)
    elif t == "use_list":
        for child in node.children:
            _rust_use(child, prefix, line, out)
    elif t == "use_wildcard":
        path = _text(node).removesuffix("::*").removesuffix("*")
        out.append(Import(f"{prefix}::{path}" if prefix and path else (path or prefix), "*", "", line))


def _rust(node: Node, out: list[Import]) -> None:
    if node.type == "use_declaration":
        _rust_use(node.child_by_field_name("argument"), "", node.start_point[0] + 1, out)
    elif node.type == "mod_item" and node.child_by_field_name("body") is None:  # mod foo;
        name = _text(node.child_by_field_name("name"))
        out.append(Import(f"self::{name}", None, name, node.start_point[0] + 1))


def _java(node: Node, out: list[Import]) -> None:
    if node.type != "import_declaration":
        return
    line = node.start_point[0] + 1
    target = next((c for c in node.children if c.type in ("scoped_identifier", "identifier")), None)
    full = _text(target)
    if any(c.type == "asterisk" for c in node.children):
        out.append(Import(full, "*", "", line))
    elif any(c.type == "static" for c in node.children):  # import static a.B.m: m from class B
        module, _, name = full.rpartition(".")
        out.append(Import(module, name, name, line))
    elif full:
        module, _, name = full.rpartition(".")
        out.append(Import(module, name, name, line))


def _c(node: Node, out: list[Import]) -> None:
    if node.type == "preproc_include":
        path = node.child_by_field_name("path")
        if path is not None and path.type == "string_literal":  # <system> headers are not the workspace's
            out.append(Import(_text(path).strip('"'), "*", "", node.start_point[0] + 1))
    elif node.type in ("preproc_ifdef", "preproc_if", "preproc_else", "linkage_specification", "declaration_list"):
        for child in node.children:
            _c(child, out)


_READERS: dict[str, Callable[[Node, list[Import]], None]] = {
    "python": _py, "javascript": _js, "typescript": _js, "tsx": _js,
    "go": _go, "rust": _rust, "java": _java, "c": _c, "cpp": _c,
}


# ---- resolution -------------------------------------------------------------
def _best(found: Sequence[str], near: str) -> list[str]:
    """Matching files, the one sharing the longest directory prefix with the importing file first."""
    def shared(p: str) -> int:
        return len(os.path.commonpath([p, near])) if os.path.isabs(p) == os.path.isabs(near) else 0
    return sorted(dict.fromkeys(found), key=lambda p: (-shared(p), len(p), p))


def _with_suffix(files: FileTable, rel: str) -> list[str]:
    """Indexed files whose path ends with the relative path ``rel`` (at a directory boundary)."""
    base = rel.rsplit("/", 1)[-1]
    tail = "/" + rel
    return [p for p in files.named(base) if p.replace(os.sep, "/").endswith(tail)]


def resolve(imp: Import, path: str, files: FileTable) -> list[str]:
    """Workspace files ``imp`` (imported by the file at ``path``) names, best first; [] for outside modules."""
    language = language_of(path)
    here = os.path.dirname(os.path.abspath(path))
    if language == "python":
        return _resolve_python(imp, here, files)
    if language in ("javascript", "typescript", "tsx"):
        if not imp.module.startswith("."):
            return []  # a package from node_modules
        found = _resolve_js_file(imp.module, here, files)
        if found and imp.name not in (None, "*", "default"):
            return [_follow_js(imp.name, found[0], files, 0)[0]]
        return found
    if language == "go":
        parts = imp.module.strip("/").split("/")
        for n in range(len(parts), 0, -1):  # the longest tail of the import path that is a workspace directory
            tail = "/" + "/".join(parts[-n:]) + "/"
            found = [p for p in files.in_dir(parts[-1]) if tail in p.replace(os.sep, "/")]
            if found:
                return _best(found, path)
        return []
    if language == "rust":
        found = _resolve_rust(imp, os.path.abspath(path), files)
        if found and imp.name not in (None, "*"):
            return [_follow_rust(imp.name, found[0], files, 0)[0]]
        return found
    if language == "java":
        rel = imp.module.replace(".", "/")
        if imp.name and imp.name != "*":
            found = _with_suffix(files, f"{rel}/{imp.name}.java")
            if not found:  # import static a.B.m: the class file is a/B.java
                found = _with_suffix(files, rel + ".java")
            return _best(found, path)
        return []
    if language in ("c", "cpp"):
        local = os.path.normpath(os.path.join(here, imp.module))
        if local in files:
            return [local]
        return _best(_with_suffix(files, imp.module.lstrip("./")), path)
    return []



def _resolve_python(imp: Import, here: str, files: FileTable) -> list[str]:
    module = imp.module
    level = len(module) - len(module.lstrip("."))
    parts = [p for p in module.lstrip(".").split(".") if p]
    candidates: list[str] = []
    if level:
        base = here
        for _ in range(level - 1):
            base = os.path.dirname(base)
        anchor = os.path.join(base, *parts)
        # `from . import x` names the package itself (anchor is its directory): no anchor + ".py"
        tries = ([anchor + ".py"] if parts else []) + [os.path.join(anchor, "__init__.py")]
        if imp.name and imp.name != "*":  # `from . import sib`: a submodule first
            tries.insert(0, os.path.join(anchor, imp.name + ".py"))
            tries.insert(1, os.path.join(anchor, imp.name, "__init__.py"))
        for t in tries:
            if t in files:
                candidates.append(t)
                if imp.name is None or t.endswith(imp.name + ".py") or t.endswith(os.path.join(imp.name, "__init__.py")):
                    break
        return candidates[:1] if candidates else []
    if not parts:
        return []
    rel = "/".join(parts)
    # (suffix, preference among files under one import root): a submodule named by `from m import x`
    # before m itself, and, as Python's finder does, a package directory before a same-named m.py
    forms = [(rel + "/__init__.py", 2), (rel + ".py", 3)]
    if imp.name and imp.name != "*":
        forms[:0] = [(f"{rel}/{imp.name}/__init__.py", 0), (f"{rel}/{imp.name}.py", 1)]
    ranked = []
    for suffix, order in forms:
        for p in _with_suffix(files, suffix):
            root = p[: len(p) - len(suffix) - 1]  # the directory the import is relative to
            # the nearest root first: one that holds the importing file (the script's directory or a
            # source root above it), deepest first, then by shared prefix; not the first *.py anywhere
            inside = here == root or here.startswith(root.rstrip(os.sep) + os.sep)
            shared = len(os.path.commonpath([root, here])) if os.path.isabs(root) == os.path.isabs(here) else 0
            ranked.append(((not inside, -shared, order, len(p), p), p))
    return list(dict.fromkeys(p for _, p in sorted(ranked)))


def _rust_crate_root(path: str, files: FileTable) -> bool:
    """Whether the file is a crate root (or a mod.rs), whose submodules live beside it, not below it."""
    here, name = os.path.split(path)
    if name in ("mod.rs", "lib.rs", "main.rs", "build.rs"):
        return True
    parent, dirname = os.path.split(here)
    if dirname == "bin" and os.path.basename(parent) == "src":  # src/bin/tool.rs
        return True
    # tests/x.rs, examples/x.rs, benches/x.rs are crates of their own, unless that directory is the
    # module directory of a tests.rs (or tests/mod.rs) beside it
    return dirname in ("tests", "examples", "benches") and \
        here + ".rs" not in files and os.path.join(here, "mod.rs") not in files


def _resolve_rust(imp: Import, path: str, files: FileTable) -> list[str]:
    here = os.path.dirname(path)
    parts = [p for p in imp.module.split("::") if p]
    if not parts:
        return []
    if parts[0] in ("std", "core", "alloc"):
        return []
    if parts[0] == "crate":
        parts = parts[1:]
        found = (_with_suffix(files, "src/" + "/".join(parts) + ".rs") if parts else []) or \
                (_with_suffix(files, "src/" + "/".join(parts) + "/mod.rs") if parts else []) or \
                (_with_suffix(files, "src/lib.rs") + _with_suffix(files, "src/main.rs") if not parts else [])
        return _best(found, os.path.join(here, "x"))
    # the module's own directory: where `mod x;` and `self::x` look, and `super` is its parent
    base = here if _rust_crate_root(path, files) else os.path.join(here, os.path.splitext(os.path.basename(path))[0])
    while parts and parts[0] in ("self", "super"):
        if parts.pop(0) == "super":
            base = os.path.dirname(base)
    if not parts:
        return []
    anchor = os.path.join(base, *parts)
    for t in (anchor + ".rs", os.path.join(anchor, "mod.rs")):
        if t in files:
            return [t]
    return []


# ---- re-exports ---------------------------------------------------------------
# ``import { X } from "./models"`` names models/index.ts, which only re-exports X (``export { X } from "./x"``,
# ``export * from "./x"``); ``use crate::storage::Writer`` names storage/mod.rs (``pub use segment::Writer;``).
# The definition is in the file re-exported: resolution follows such re-exports (a few levels), reading the
# re-exporting file through the FileTable (an unsaved buffer the index holds, else the disk).
_MAX_HOPS = 4
def _resolve_js_file(module: str, here: str, files: FileTable) -> list[str]:
    base = os.path.normpath(os.path.join(here, module))
    want = [base + e for e in ("",) + _JS_EXTS] + [os.path.join(base, "index" + e) for e in _JS_EXTS]
    return [w for w in want if w in files][:1]


def _js_reexports(root: Node) -> list[tuple[str, str, str]]:
    """(source, name in the source, name exported) of a JS/TS file's ``export ... from`` statements;
    ``export * from`` gives ("*", "*")."""
    out: list[tuple[str, str, str]] = []
    for node in root.children:
        source = node.child_by_field_name("source") if node.type == "export_statement" else None
        if source is None:
            continue
        module = _text(source).strip("'\"`")
        for part in node.children:
            if part.type == "*":
                out.append((module, "*", "*"))
            elif part.type == "export_clause":
                for spec in part.children:
                    if spec.type == "export_specifier":
                        name = _text(spec.child_by_field_name("name"))
                        out.append((module, name, _text(spec.child_by_field_name("alias")) or name))
    return out


def _declares_js(text: str, name: str) -> bool:
    return re.search(r"(?m)^[ \t]*(?:export\s+)?(?:default\s+)?(?:declare\s+)?(?:abstract\s+)?(?:async\s+)?"
                     r"(?:class|function\*?|const|let|var|interface|type|enum|namespace)\s+" + re.escape(name) + r"\b",
                     text) is not None


def _follow_js(name: str, target: str, files: FileTable, hops: int) -> tuple[str, bool]:
    """The file that defines ``name`` imported from ``target`` (through its re-exports), and whether that is
    known (a re-export names it, or the file declares it); ``target`` itself when nothing better is found."""
    text = files.text(target) if hops < _MAX_HOPS else None
    if text is None:
        return target, False
    if _declares_js(text, name):
        return target, True
    root = _root(text, target)
    exports = _js_reexports(root) if root is not None else []
    here = os.path.dirname(os.path.abspath(target))
    for source, original, exported in exports:
        if exported == name and source.startswith("."):
            found = _resolve_js_file(source, here, files)
            if found:
                return (_follow_js(original, found[0], files, hops + 1)[0] if original != "default" else found[0]), True
    for source, original, _ in exports:
        if original == "*" and source.startswith("."):
            found = _resolve_js_file(source, here, files)
            if found:
                got, sure = _follow_js(name, found[0], files, hops + 1)
                if sure:
                    return got, True
    return target, False


def _follow_rust(name: str, target: str, files: FileTable, hops: int) -> tuple[str, bool]:
    """The file that defines ``name`` imported from the module file ``target`` (through its ``pub use``), and
    whether that is known; ``target`` itself when nothing better is found."""
    text = files.text(target) if hops < _MAX_HOPS else None
    if text is None:
        return target, False
    if re.search(r"\b(?:struct|enum|union|trait|fn|type|const|static|mod|macro_rules!)\s+" + re.escape(name) + r"\b", text):
        return target, True
    root = _root(text, target)
    uses: list[Import] = []
    for node in root.children if root is not None else ():
        if node.type == "use_declaration" and any(c.type == "visibility_modifier" for c in node.children):
            _rust_use(node.child_by_field_name("argument"), "", node.start_point[0] + 1, uses)
    for imp in sorted(uses, key=lambda i: i.name == "*"):  # a named re-export before a wildcard
        if imp.alias == name or imp.name == "*":
            found = _resolve_rust(imp, os.path.abspath(target), files)
            if not found or found[0] == target:
                continue
            if imp.name == "*":
                got, sure = _follow_rust(name, found[0], files, hops + 1)
                if sure:
                    return got, True
            else:
                return (_follow_rust(imp.name, found[0], files, hops + 1)[0] if imp.name else found[0]), True
    return target, False
