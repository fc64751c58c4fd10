"""Split a source file into chunks and extract its definitions, from one tree-sitter pass (line windows otherwise)."""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from tree_sitter import Node, Parser, Point, Tree

from .config import IndexConfig
from .languages import LanguageRegistry, LanguageSpec
from .models import Chunk, ChunkedFile, Symbol

log = logging.getLogger(__name__)

_NAME_LEAVES = frozenset(
    {"identifier", "field_identifier", "type_identifier", "qualified_identifier", "destructor_name",
     "operator_name", "property_identifier", "namespace_identifier", "scoped_identifier"}
)
_JS_FUNCTION_VALUES = frozenset({"arrow_function", "function_expression", "function", "generator_function"})
_C_DECLARATIONS = frozenset({"declaration", "field_declaration"})  # C/C++ prototypes (assignments of those specs)
_ATTRIBUTES = frozenset({"attribute_item"})  # Rust ``#[derive(..)]``: belongs to the item below, like a doc comment
_MAX_DESCENT = 4  # how deep to look through non-definition statements (if/try/#ifdef) for definitions
TREE_CACHE = 8  # syntax trees kept for incremental re-parsing of the files edited last


def point_at(data: bytes, offset: int) -> Point:
    """The tree-sitter (row, column) of byte ``offset`` in ``data`` (tree.edit's points)."""
    row = data.count(b"\n", 0, offset)
    return Point(row, offset - (data.rfind(b"\n", 0, offset) + 1))


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def text_edit(old: bytes, new: bytes) -> tuple[int, int, int] | None:
    """(start, old_end, new_end) byte offsets of the one span where ``old`` and ``new`` differ; None if equal."""
    if old == new:
        return None
    a, b = np.frombuffer(old, dtype=np.uint8), np.frombuffer(new, dtype=np.uint8)
    start = _common_prefix(a, b)
    room = min(len(a), len(b)) - start  # the common suffix may not overlap the prefix
    suffix = _common_prefix(a[len(a) - room :][::-1], b[len(b) - room :][::-1])
    return start, len(old) - suffix, len(new) - suffix


def _text(node: Node | None) -> str | None:
    if node is None or node.text is None:
        return None
    return node.text.decode("utf-8", "replace")


def _declarator_name(node: Node | None) -> str | None:
    """Follow C/C++ declarator chains (pointer_declarator -> function_declarator -> identifier)."""
    for _ in range(12):
        if node is None:
            return None
        if node.type in _NAME_LEAVES:
            return _text(node)
        nxt = node.child_by_field_name("declarator") or node.child_by_field_name("name")
        node = nxt
    return None


def definition_name(node: Node) -> str | None:
    name = node.child_by_field_name("name")
    if name is not None:
        return _text(name) if name.type in _NAME_LEAVES or name.type.endswith("identifier") else _declarator_name(name)
    if node.type == "type_declaration":  # Go
        for child in node.named_children:
            if child.type in ("type_spec", "type_alias"):
                return _text(child.child_by_field_name("name"))
        return None
    if node.type in ("lexical_declaration", "variable_declaration"):  # JS/TS: const f = () => {...}
        declarator = _function_declarator(node)
        return _text(declarator.child_by_field_name("name")) if declarator is not None else None
    if node.type == "impl_item":  # Rust: impl [Trait for] Type
        return _text(node.child_by_field_name("type"))
    declarator = node.child_by_field_name("declarator")
    if declarator is not None:
        return _declarator_name(declarator)
    return None


def _function_declarator(node: Node) -> Node | None:
    """JS/TS: the declarator of ``const f = () => {...}`` (one declarator, a function value), else None."""
    declarators = [c for c in node.named_children if c.type == "variable_declarator"]
    if len(declarators) != 1:
        return None
    name = declarators[0].child_by_field_name("name")
    value = declarators[0].child_by_field_name("value")
    if name is None or name.type != "identifier" or value is None or value.type not in _JS_FUNCTION_VALUES:
        return None
    return declarators[0]


def _prototype_name(node: Node) -> str | None:
    """C/C++: the name a declaration declares as a function (``T *f(int);``, ``double area() const;``), else None."""
    declarator = node.child_by_field_name("declarator")
    for _ in range(8):
        if declarator is None:
            return None
        if declarator.type == "function_declarator":
            inner = declarator.child_by_field_name("declarator")
            if inner is None or inner.type == "parenthesized_declarator":  # int (*fp)(int): a variable
                return None
            return _declarator_name(inner)
        if declarator.type not in ("pointer_declarator", "reference_declarator"):
            return None
        declarator = declarator.child_by_field_name("declarator") or next(
            (c for c in declarator.named_children if c.type.endswith("declarator")), None)
    return None


def _assigned_names(node: Node) -> list[tuple[str, str, Node]]:
    """(name, kind, the node whose lines it spans) defined by a module- or class-level assignment statement."""
    out: list[tuple[str, str, Node]] = []
    if node.type == "expression_statement":  # Python
        for child in node.named_children:
            if child.type == "assignment":
                left = child.child_by_field_name("left")
                if left is not None and left.type == "identifier":
                    out.append((_text(left) or "", "variable", node))
    elif node.type in ("lexical_declaration", "variable_declaration"):  # JS/TS
        for child in node.named_children:
            if child.type == "variable_declarator":
                name = child.child_by_field_name("name")
                value = child.child_by_field_name("value")
                if name is not None and name.type == "identifier":
                    is_fn = value is not None and value.type in ("arrow_function", "function_expression", "function")
                    out.append((_text(name) or "", "function" if is_fn else "variable", node))
    elif node.type in ("const_declaration", "var_declaration"):  # Go
        specs = [c for c in node.named_children if c.type in ("const_spec", "var_spec")]
        for spec in node.named_children:
            if spec.type == "var_spec_list":  # var ( ... )
                specs += [c for c in spec.named_children if c.type == "var_spec"]
        for spec in specs:
            # each name spans its own spec's lines (``Zero Cents = 0``), not the whole ``const (...)`` group
            where = node if len(specs) == 1 else spec
            for name in spec.children_by_field_name("name"):
                out.append((_text(name) or "", "constant" if node.type == "const_declaration" else "variable", where))
    elif node.type in ("public_field_definition", "field_definition"):  # TS/JS class fields (not private ones)
        name = node.child_by_field_name("name") or node.child_by_field_name("property")
        private = any(c.type == "accessibility_modifier" and _text(c) == "private" for c in node.children)
        if name is not None and name.type == "property_identifier" and not private:
            value = node.child_by_field_name("value")
            is_fn = value is not None and value.type in _JS_FUNCTION_VALUES
            out.append((_text(name) or "", "method" if is_fn else "variable", node))
    elif node.type == "field_declaration" and any(c.type == "variable_declarator" for c in node.named_children):
        modifiers = next((c for c in node.named_children if c.type == "modifiers"), None)  # Java fields
        if modifiers is None or "private" not in (_text(modifiers) or "").split():
            for declarator in node.children_by_field_name("declarator"):
                out.append((_text(declarator.child_by_field_name("name")) or "", "variable", node))
    elif node.type in _C_DECLARATIONS:  # C/C++ prototypes: a header's API
        name = _prototype_name(node)
        if name:
            out.append((name, "function", node))
    return [(n, k, w) for n, k, w in out if n]


@dataclass
class _Span:
    start: int  # 0-based rows, inclusive
    end: int


class Chunker:
    """Produces a ChunkedFile for a path + text. Holds per-language parsers; use from one thread."""

    def __init__(self, config: IndexConfig, registry: LanguageRegistry | None = None):
        self.config = config
        self.registry = registry or LanguageRegistry()
        self._parsers: dict[str, Parser] = {}
        self._trees: OrderedDict[str, tuple[str, bytes, Tree]] = OrderedDict()  # path -> (language, source, tree)

    def _parser(self, spec: LanguageSpec) -> Parser | None:
        parser = self._parsers.get(spec.name)
        if parser is None:
            language = self.registry.language(spec)
            if language is None:
                return None
            parser = Parser(language)
            self._parsers[spec.name] = parser
        return parser

    def chunk(self, path: str, text: str, display_path: str | None = None) -> ChunkedFile:
        display = display_path or path
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        lines = [ln[:-1] if ln.endswith("\r") else ln for ln in lines]
        if not lines:
            return ChunkedFile([], [], None)
        spec = self.registry.spec_for(path)
        parser = self._parser(spec) if spec is not None else None
        if spec is None or parser is None:
            chunks = self._windows(path, display, lines, 0, len(lines) - 1, "window", None, [])
            return ChunkedFile(chunks, [], None)
        tree = self._parse(parser, spec.name, path, text.encode("utf-8", "surrogatepass"))
        builder = _FileBuilder(self, spec, path, display, lines)
        builder.scope(tree.root_node, 0, len(lines) - 1, [], 0)
        return builder.finish()

    def _parse(self, parser: Parser, language: str, path: str, data: bytes) -> Tree:
        """Parse ``data``; re-parse incrementally from the previous tree when ``path`` was parsed lately.

        Editing one place of a 300 KB file then costs ~1-10 ms of parsing instead of ~25-55 ms.
        """
        cached = self._trees.pop(path, None)
        tree = None
        if cached is not None and cached[0] == language:
            _, old, old_tree = cached
            edit = text_edit(old, data)
            if edit is None:
                tree = old_tree
            else:
                start, old_end, new_end = edit
                old_tree.edit(start, old_end, new_end, point_at(old, start), point_at(old, old_end), point_at(data, new_end))
                tree = parser.parse(data, old_tree)
        if tree is None:
            tree = parser.parse(data)
        self._trees[path] = (language, data, tree)
        while len(self._trees) > TREE_CACHE:
            self._trees.popitem(last=False)
        return tree

    def forget(self, path: str) -> None:
        """Drop the cached syntax tree of ``path`` (removed files)."""
        self._trees.pop(path, None)

    def split_range(self, lines: list[str], s: int, e: int, max_lines: int) -> list[tuple[int, int]]:
        """Cut rows s..e into pieces of at most ``max_lines`` lines and ``max_chunk_chars`` characters."""
        limit = self.config.max_chunk_chars
        pieces = []
        start, chars = s, 0
        for row in range(s, e + 1):
            n = len(lines[row]) + 1
            if row > start and (row - start >= max_lines or chars + n > limit):
                pieces.append((start, row - 1))
                start, chars = row, 0
            chars += n
        pieces.append((start, e))
        return pieces

    def _windows(self, path, display, lines, lo, hi, kind, name, ctx) -> list[Chunk]:
        out = []
        for start, end in self.split_range(lines, lo, hi, max(1, self.config.window_lines)):
            if any(ch.isalnum() for ln in lines[start : end + 1] for ch in ln):
                s, e = start, end  # trim blank lines at both ends
                while not lines[s].strip():
                    s += 1
                while not lines[e].strip():
                    e -= 1
                out.append(self._make(path, display, lines, s, e, kind, name, ctx))
        return out

    def _make(self, path, display, lines, s, e, kind, name, ctx, extra_header: str = "") -> Chunk:
        text = "\n".join(lines[s : e + 1])
        if len(text) > self.config.max_chunk_chars:
            text = text[: self.config.max_chunk_chars]
        header = display
        if ctx:
            header += " :: " + ".".join(ctx)
        if name and kind not in ("module", "window"):
            header += f" :: {kind} {name}"
        if extra_header:
            header += " :: " + extra_header
        return Chunk(path=path, start_line=s + 1, end_line=e + 1, text=text, kind=kind, name=name, header=header)


class _FileBuilder:
    """Accumulates the chunks and symbols of one file while walking its syntax tree."""

    def __init__(self, chunker: Chunker, spec: LanguageSpec, path: str, display: str, lines: list[str]):
        self.c = chunker
        self.spec = spec
        self.path = path
        self.display = display
        self.lines = lines
        self.chunks: list[Chunk] = []
        self.symbols: list[Symbol] = []
        self._pending_assign: list[tuple[Symbol, int]] = []  # symbol, row
        self._ctx_name: str | None = None  # dotted enclosing scope while collecting assignments
        self._container_kind = "class"  # kind of the container whose body is being walked
        self._container_symbol_index = -1  # first chunk of that container (its header)

    def _collect(self, node: Node, depth: int, out: list[tuple[Node, Node]]) -> None:
        """Find (definition, outer) pairs directly in this scope, looking through wrappers and statements."""
        spec = self.spec
        for child in node.named_children:
            t = child.type
            if t in spec.definitions or self._function_value(child):
                out.append((child, child))
            elif t in spec.wrappers:
                inner = child.child_by_field_name("definition") or child.child_by_field_name("declaration")
                if inner is None:
                    inner = next((c for c in child.named_children if c.type in spec.definitions), None)
                if inner is not None and (inner.type in spec.definitions or self._function_value(inner)):
                    out.append((inner, child))
                elif depth < _MAX_DESCENT:
                    self._collect(child, depth + 1, out)
            elif t in spec.assignments:
                self._assignments(child)
                if t in _C_DECLARATIONS and depth < _MAX_DESCENT and child.end_point.row > child.start_point.row:
                    self._collect(child, depth + 1, out)  # struct s { ... } x;: the struct is a definition
            elif (
                depth < _MAX_DESCENT
                and child.end_point.row > child.start_point.row
                and not any(w in t for w in ("function", "lambda", "arrow", "closure", "string", "comment"))
            ):
                self._collect(child, depth + 1, out)

    def _function_value(self, node: Node) -> bool:
        """A multi-line ``const f = () => {...}`` (JS/TS): a function definition, chunked whole under its name.
        (A one-line one stays in the module's chunk, with its symbol.)"""
        return (node.type in ("lexical_declaration", "variable_declaration") and node.type in self.spec.assignments
                and node.end_point.row > node.start_point.row and _function_declarator(node) is not None)

    def _kind(self, node: Node) -> str:
        return self.spec.definitions.get(node.type) or "function"  # else a function-valued declaration

    def _assignments(self, node: Node) -> None:
        for name, kind, where in _assigned_names(node):
            if kind == "function" and self._ctx_name and self._container_kind in ("class", "struct", "interface"):
                kind = "method"  # a C++ member function declared in its class
            sym = Symbol(name, kind, self.path, where.start_point.row + 1, where.end_point.row + 1, self._ctx_name)
            self._pending_assign.append((sym, where.start_point.row))

    def _leading_comment_start(self, outer: Node) -> int:
        """The first row of the comments (and Rust attributes) right above ``outer``."""
        row = outer.start_point.row
        prev = outer.prev_named_sibling
        while prev is not None and ("comment" in prev.type or prev.type in _ATTRIBUTES):
            end = prev.end_point.row
            if end > prev.start_point.row and prev.end_point.column == 0:
                end -= 1  # a Rust line comment ends at the start of the next line
            if end not in (row - 1, row):
                break
            row = min(row, prev.start_point.row)
            prev = prev.prev_named_sibling
        return row

    def scope(self, node: Node, lo: int, hi: int, ctx: list[str], depth: int) -> None:
        found: list[tuple[Node, Node]] = []
        saved = self._ctx_name
        self._ctx_name = ".".join(ctx) or None
        self._collect(node, 0, found)
        self._ctx_name = saved
        kind = "module" if not ctx else self._container_kind
        name = ctx[-1] if ctx else None
        first_gap_index = len(self.chunks)
        pairs: list[tuple[Node, _Span]] = []
        for definition, outer in found:
            s = max(lo, self._leading_comment_start(outer))
            e = min(hi, outer.end_point.row)
            if e < s or (pairs and s <= pairs[-1][1].end):  # overlapping (two defs on one line): stays in the gap
                continue
            pairs.append((definition, _Span(s, e)))
        # gaps first so a container's header chunk is its first chunk
        cursor = lo
        for span in [p[1] for p in pairs] + [_Span(hi + 1, hi + 1)]:
            if span.start > cursor:
                self.chunks.extend(
                    self.c._windows(self.path, self.display, self.lines, cursor, span.start - 1, kind, name, ctx[:-1])
                )
            cursor = span.end + 1
        if ctx and len(self.chunks) > first_gap_index:
            self._container_symbol_index = first_gap_index
        for definition, span in pairs:
            self._definition(definition, span, ctx, depth)

    def _definition(self, node: Node, span: _Span, ctx: list[str], depth: int) -> None:
        kind = self._kind(node)
        name = definition_name(node)
        if kind == "function" and ctx and self._container_kind in ("class", "interface", "impl", "trait"):
            kind = "method"
        container = ".".join(ctx) or None
        if node.type in self.spec.containers and depth < 8:
            saved = (self._container_kind, self._container_symbol_index)
            self._container_kind = kind
            self._container_symbol_index = -1
            body = node.child_by_field_name("body") or node
            scope_node = body if body.start_point.row >= span.start else node
            self.scope(scope_node, span.start, span.end, ctx + [name or "<anonymous>"], depth + 1)
            if name:
                idx = self._container_symbol_index
                self.symbols.append(Symbol(name, kind, self.path, span.start + 1, span.end + 1, container, idx))
            self._container_kind, self._container_symbol_index = saved
            return
        first = len(self.chunks)
        max_lines = max(1, self.c.config.max_chunk_lines)
        signature = self.lines[node.start_point.row].strip() if node.start_point.row < len(self.lines) else ""
        for start, end in self.c.split_range(self.lines, span.start, span.end, max_lines):
            extra = "" if start == span.start else f"(continued) {signature[:200]}"
            self.chunks.append(self.c._make(self.path, self.display, self.lines, start, end, kind, name, ctx, extra))
        if name:
            self.symbols.append(Symbol(name, kind, self.path, span.start + 1, span.end + 1, container, first))

    def finish(self) -> ChunkedFile:
        if self._pending_assign:
            starts = [(c.start_line - 1, c.end_line - 1, i) for i, c in enumerate(self.chunks)]
            for sym, row in self._pending_assign:
                idx = next((i for s, e, i in starts if s <= row <= e), -1)
                self.symbols.append(Symbol(sym.name, sym.kind, sym.path, sym.start_line, sym.end_line, sym.container, idx))
        order = sorted(range(len(self.chunks)), key=lambda i: (self.chunks[i].start_line, i))
        remap = {old: new for new, old in enumerate(order)}
        chunks = [self.chunks[i] for i in order]
        symbols = [
            Symbol(s.name, s.kind, s.path, s.start_line, s.end_line, s.container, remap.get(s.chunk_index, -1))
            for s in self.symbols
        ]
        return ChunkedFile(chunks, symbols, self.spec.name)
