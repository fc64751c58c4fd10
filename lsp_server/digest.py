"""The imports digest: compact stubs of what a file imports from the workspace, ranked by what the next lines will use.

At the first use of an imported name the name is not on screen yet; it sits in an import at the
top of the file, and text search over the lines around the cursor rarely finds its definition.
The digest shows, for each workspace name the file imports, what a programmer would glance at:
a function's signature and docstring line; a class's header, docstring line, fields and method
signatures; for a module bound as a whole, its public top-level signatures. Each imported file
becomes one stub (bodies elided with ``...``), labelled with its path like any other snippet.

Ranking (which names the next lines will use): what the cursor's position expects (a type, an
exception, a decorator), then a name not yet used in code between its import and the cursor (a first
use is pending; docstrings, comments and later imports do not count as uses), then names used near
the cursor. Within a token budget every entry first gets its signature line, best first, and then
the best grow to their longer stubs (`fit`). The stubs come first in the snippet list (the budget
keeps them first), and so last in the prompt, next to the current file (`engine.prompt.PromptBuilder`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from engine.types import Snippet
from indexer.imports import Import, language_of, parse_imports, resolve

log = logging.getLogger(__name__)

# lines that can start an import in some language here; the tree-sitter parse covers the text up to the last one
_IMPORT_LINE = re.compile(r"^[ \t]*(?:import|from|use|pub[ \t]+use|mod|#[ \t]*include|extern[ \t]+crate|package)\b|require\(",
                          re.M)
_BRACES = {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}
_DOC_QUOTE = re.compile(r"^[rRbBuU]?(\"\"\"|''')")
_COMMENT = ("//", "/*", "*", "#", "///", "--")
_TYPE_KINDS = frozenset({"class", "struct", "interface", "trait", "enum", "type"})
_KEPT_DECORATORS = ("@property", "@staticmethod", "@classmethod", "@dataclass", "@dataclasses.dataclass",
                    "@abstractmethod", "@abc.abstractmethod", "@contextmanager", "@contextlib.contextmanager")
_OPEN_SPACE = re.compile(r"([(\[{])\s+")
_SPACES = re.compile(r"\s{2,}")
_CLOSE_SPACE = re.compile(r",?\s+([)\]}])")
MAX_METHODS = 6
# built stubs kept while the index's generation holds (typing in one file keeps it for days): the oldest
# go first past this many (an import line edited a thousand times was a thousand entries, for good)
MAX_ENTRIES = 1024
MAX_FIELDS = 5
MAX_MODULE_NAMES = 10


@dataclass(frozen=True)
class Entry:
    """One digest entry: a stub of one definition (or a module's public names) and what it covers."""

    path: str  # absolute path of the defining file
    text: str
    start_line: int
    end_line: int
    name: str  # the name the current file uses
    kind: str = ""  # the definition's kind (class, function, variable, module)
    brief: str = ""  # a shorter stub (signature, constructor) for when ``text`` does not fit; "" = none


_HINT_TYPE = re.compile(r"(?:(\w+)\s*:|->|\bclass\s+\w+\s*\(|[\[|,]|\bbound\s*=|(\bis(?:instance|subclass)\([\w.]+,))\s*[\"'(]?$")
_HINT_EXC = re.compile(r"(?:\braise|\bexcept|\bthrow\s+new|\bcatch\s*\()\s*\(?\s*$")
_HINT_NEW = re.compile(r"\bnew\s+$")
_KEYWORDS = frozenset({"else", "try", "finally", "except", "default", "case", "return"})


def cursor_hint(line_before: str) -> tuple[str, str]:
    """What the cursor's position on its line expects: ("type", annotated name), ("exception", ""),
    ("decorator", "") or ("", ""). The identifier being typed is ignored, so typing a name keeps the hint."""
    rest = re.sub(r"\w*$", "", line_before)
    if _HINT_EXC.search(rest):
        return "exception", ""
    if rest.strip() == "@":
        return "decorator", ""
    if _HINT_NEW.search(rest):
        return "type", ""
    m = _HINT_TYPE.search(rest)
    if m is None or "lambda" in rest or (m.group(1) or "") in _KEYWORDS:
        return "", ""
    if rest.rstrip().endswith(",") and "[" not in rest and not m.group(2):
        return "", ""  # a comma in a call or a parameter list (not isinstance's): no expectation
    return "type", m.group(1) or ""


def import_region(text: str) -> str:
    """The head of ``text`` that holds its imports (up to the line after the last import-like line)."""
    last = None
    for last in _IMPORT_LINE.finditer(text):
        pass
    return "" if last is None else _region_to(text, last.span())


def _region_to(text: str, last: tuple[int, int]) -> str:
    """``import_region`` of ``text`` whose last import-like match spans ``last``."""
    end = text.find("\n", last[1])
    # a parenthesised import goes on: take the lines up to the next one that starts at column 0, blank
    # lines included while its parenthesis is open (gofmt groups a Go import block with blank lines)
    while end >= 0 and end + 1 < len(text):
        nxt = end + 1
        if text[nxt] == "\n" and _open_parens(text[last[0] : nxt]) > 0:
            while nxt < len(text) and text[nxt] == "\n":
                nxt += 1
            if nxt < len(text) and text[nxt] in " \t)]}":
                end = nxt - 1
                continue
            break
        if text[nxt] not in " \t)]}":
            break
        end = text.find("\n", nxt)
    return text if end < 0 else text[: end + 1]


def _open_parens(text: str) -> int:
    return text.count("(") - text.count(")")


def _extends(text: str, prev: str) -> bool:
    """Does ``text`` go on from ``prev``, a run of whole lines (so no match of a line runs across the join)?"""
    return (not prev or prev.endswith("\n")) and text.startswith(prev)


class ImportCache:
    """Parsed imports per import region (typing below the imports never re-parses them)."""

    def __init__(self, size: int = 64):
        self._seen: dict[tuple[str, str], list[Import]] = {}
        self._size = size
        # path -> (the text last asked about, the spans of its import-like lines): the next text, the head
        # of the document one line further down or up, is searched only where it goes on (a 30,000-line
        # head was searched whole, twice, on every new line: ~20 ms)
        self._spans: dict[str, tuple[str, list[tuple[int, int]]]] = {}

    def _import_spans(self, text: str, path: str) -> list[tuple[int, int]]:
        prev, spans = self._spans.get(path, ("", []))
        if _extends(text, prev):
            spans = spans + [m.span() for m in _IMPORT_LINE.finditer(text, len(prev))]
        elif text.endswith("\n") and _extends(prev, text):
            spans = [s for s in spans if s[1] <= len(text)]
        else:
            spans = [m.span() for m in _IMPORT_LINE.finditer(text)]
        self._spans.pop(path, None)
        self._spans[path] = (text, spans)
        if len(self._spans) > self._size:
            self._spans.pop(next(iter(self._spans)))
        return spans

    def imports(self, text: str, path: str) -> list[Import]:
        spans = self._import_spans(text, path)
        region = _region_to(text, spans[-1]) if spans else ""
        key = (path, region)
        got = self._seen.get(key)
        if got is None:
            got = parse_imports(region, path) if region else []
            self._seen[key] = got
            if len(self._seen) > self._size:
                self._seen.pop(next(iter(self._seen)))
        return got


def _code(line: str) -> str:
    """A line without its trailing comment (roughly: strings are not tracked)."""
    for marker in (" #", "\t#", " //"):
        i = line.find(marker)
        if i >= 0:
            line = line[:i]
    return line.rstrip()


def _depth(line: str) -> int:
    return sum(_BRACES.get(ch, 0) for ch in line)


def header(lines: Sequence[str], start: int, python: bool) -> tuple[list[str], int]:
    """The signature lines from ``lines[start]`` on (a brace body cut at its ``{``), and the index after them."""
    out: list[str] = []
    depth = 0
    i = start
    while i < len(lines) and (not lines[i].strip() or lines[i].lstrip().startswith(_COMMENT)):
        i += 1  # a leading comment belongs to the doc line, not to the signature
    while i < len(lines) and len(out) < 12:
        line = lines[i]
        code = _code(line)
        if python:
            out.append(line.rstrip())
            depth += _depth(code)
            i += 1
            if depth <= 0 and code.endswith(":") and not code.lstrip().startswith("@"):
                return out, i
            continue
        brace = _body_brace(code, depth)
        if brace >= 0:
            out.append(line[:brace].rstrip())
            return out, i + 1
        out.append(line.rstrip())
        depth += _depth(code)
        i += 1
        if depth <= 0 and code.endswith(";"):  # a declaration without a body
            return out, i
    return out, i


def _body_brace(code: str, depth: int) -> int:
    """Index of the ``{`` that opens a body at bracket depth 0, or -1."""
    for j, ch in enumerate(code):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "{" and depth <= 0:
            return j
    return -1


def doc_line(lines: Sequence[str], after: int, before: int, python: bool) -> str | None:
    """Python: the docstring's first line (closed); braces: the comment line just above the definition."""
    if python:
        for line in lines[after: after + 3]:
            s = line.strip()
            if not s:
                continue
            m = _DOC_QUOTE.match(s)
            if not m:
                return None
            quote = m.group(1)
            body = s[m.end():]
            if quote in body:
                return line.rstrip()
            indent = line[: len(line) - len(line.lstrip())]
            return f"{indent}{s}{quote}" if body else None
        return None
    j = before - 1
    if 0 <= j < len(lines) and lines[j].strip().startswith(_COMMENT):
        return lines[j].rstrip()
    return None


class Digest:
    """Builds digest entries from the index (symbols, chunks, the file table)."""

    def __init__(self, retriever: Any):
        self.retriever = retriever
        self.imports_cache = ImportCache()
        self._entries: dict[tuple[str, Import], Entry | None] = {}  # built stubs, until the index changes
        self._entries_gen: Any = None
        self._uses: dict[str, _UseScan] = {}  # path -> its scan of names used (`_rank`)

    def available(self) -> bool:
        return all(hasattr(self.retriever, a) for a in ("symbols_in", "chunk", "files"))

    def entries(self, path: str, head: str, tail: str, nearby: Sequence[str], hint: tuple[str, str] = ("", "")) -> list[Entry]:
        """Ranked entries for a cursor in ``path``: ``head`` is the document before the cursor's line,
        ``tail`` the document after it, ``hint`` what the cursor's position expects (`cursor_hint`)."""
        if not path or not self.available():
            return []
        if path not in self._uses and len(self._uses) >= 64:
            self._uses.pop(next(iter(self._uses)))
        imports = [_as_module(i, path) for i in self.imports_cache.imports(head, path)]
        imports = [i for i in imports if i.alias and i.name != "*"]
        if not imports:
            return []
        generation = getattr(self.retriever, "generation", None)
        gen = generation(path) if callable(generation) else None
        if gen is None or gen != self._entries_gen:
            self._entries.clear()  # another file changed: stubs may have changed
            self._entries_gen = gen
        files = self.retriever.files
        built: list[tuple[Import, Entry]] = []
        for imp in imports:
            key = (path, imp)
            if key not in self._entries:
                self._entries[key] = self._build(imp, path, files)
                while len(self._entries) > MAX_ENTRIES:
                    self._entries.pop(next(iter(self._entries)))
            entry = self._entries[key]
            if entry is not None:
                built.append((imp, entry))
        if not built:
            return []  # nothing the file imports is the workspace's
        out: list[Entry] = []
        seen: set[tuple[str, int]] = set()
        for entry in self._rank(built, head, nearby, hint, self._uses.setdefault(path, _UseScan())):
            if (entry.path, entry.start_line) not in seen:
                seen.add((entry.path, entry.start_line))
                out.append(entry)
        return out

    def _build(self, imp: Import, path: str, files: Any) -> Entry | None:
        try:
            targets = resolve(imp, path, files)
            if not targets or os.path.abspath(targets[0]) == os.path.abspath(path):
                return None
            return self._entry(imp, targets[0])
        except Exception:
            log.exception("digest entry for %s failed", imp)
            return None

    @staticmethod
    def _rank(built: list[tuple[Import, Entry]], head: str, nearby: Sequence[str], hint: tuple[str, str],
              uses: _UseScan | None = None) -> list[Entry]:
        """Best first: what the cursor's position expects (a type after an annotation colon, an exception
        after ``raise``, a decorator after ``@``; a type named like the annotated parameter above all),
        then names not used yet in code since their import (a first use is pending), nearest used, import order.
        (Ranking the enclosing class's bases next was tried: model2vec's first uses in the prompt fell
        from 90 % to 76 %; the bases are on screen already.)"""
        aliases = sorted({i.alias for i, _ in built}, key=len, reverse=True)
        words = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, aliases)) + r")\b")
        imported_at: dict[str, int] = {}  # a name imported twice (at the top, again in a block): the first
        for imp, _ in built:
            imported_at[imp.alias] = min(imported_at.get(imp.alias, imp.line), imp.line)
        starts = [i.line for i, _ in built]
        reach = max(starts) + STATEMENT_LINES  # the imports' lines are among the head's first (not all its lines)
        statements = _statement_lines(head.split("\n", reach)[:reach], starts)
        # used in code between its import and the cursor (not in imports, docstrings)
        used_before = (uses or _UseScan()).used(head, words, imported_at, statements)
        near = {n: k for k, n in enumerate(nearby[:64])}
        expect, subject = hint
        subject = subject.replace("_", "").lower()

        def fits(entry: Entry, alias: str) -> int:
            if not expect:
                return 0
            if expect == "type" and (entry.kind in _TYPE_KINDS or _is_type_alias(entry)):
                named = subject and (alias.lower() == subject or alias.lower().endswith(subject) or subject.endswith(alias.lower()))
                return 2 if named else 1
            if expect == "exception" and entry.kind in _TYPE_KINDS and re.search(r"(Error|Exception|Warning|Exit)\b", entry.text.split("\n", 2)[0] + " " + alias):
                return 2
            if expect == "decorator" and entry.kind in ("function", "variable"):
                return 1
            return 0

        def score(item: tuple[int, tuple[Import, Entry]]) -> tuple:
            k, (imp, entry) = item
            return (-fits(entry, imp.alias), imp.alias in used_before, near.get(imp.alias, 1 << 20), imp.name is None, k)

        return [entry for _, (_, entry) in sorted(enumerate(built), key=score)]

    def _entry(self, imp: Import, target: str) -> Entry | None:
        symbols = self.retriever.symbols_in(target)
        python = language_of(target) == "python"
        name = imp.name
        if name in (None, "default") or _is_module_file(target, name, imp.module):
            tops = [s for s in symbols if s.container is None and not s.name.startswith("_")]
            # definitions before constants, each group in file order
            tops = [s for s in tops if s.kind != "variable"] + [s for s in tops if s.kind == "variable"]
            if name == "default":  # JS default export: the definition marked so, else the file's main one
                marked = [s for s in tops if self._exported_default(s)]
                tops = (marked or tops)[:1]
            return self._module_entry(imp, target, tops[:MAX_MODULE_NAMES], python)
        found = [s for s in symbols if s.name == name and s.container is None] or [s for s in symbols if s.name == name]
        if not found:
            return None
        sym = found[0]
        lines, start = self._lines(sym)
        if lines is None:
            return None
        if sym.kind == "variable":
            return Entry(target, _one_line(lines[start]).strip(), sym.start_line, sym.start_line, imp.alias, "variable")
        head_lines, after = header(lines, start, python)
        decorators, sig = one_line(head_lines)
        if not sig:
            return None
        doc = doc_line(lines, after, start, python)
        is_type = sym.kind in _TYPE_KINDS
        fields, methods = self._members(sym, symbols, python) if is_type else ([], [])
        init = [m for m in methods if re.search(r"\b(__init__|constructor|new)\b", m)]
        full = _render(python, decorators, _cap(sig, 200), doc, fields + methods, is_type)
        brief = _render(python, decorators, _cap(sig, 200), None, init[:1], is_type)
        end = sym.end_line if is_type else sym.start_line + len(head_lines) - 1
        return Entry(target, full, sym.start_line, end, imp.alias, sym.kind, brief if brief != full else "")

    def _members(self, cls: Any, symbols: Sequence[Any], python: bool) -> tuple[list[str], list[str]]:
        """(fields, method signatures) of a class, one line each; the constructor first among the methods."""
        inside = [s for s in symbols if s.container == cls.name and s.start_line > cls.start_line and s.end_line <= cls.end_line]
        rust = cls.path.endswith(".rs")
        if rust and cls.kind in _RUST_IMPL_TYPES:  # its methods are in `impl` blocks elsewhere in the file
            inside += [s for s in symbols if s.container == cls.name and s.kind == "method" and s not in inside]
        fields: list[str] = self._rust_fields(cls) if rust and cls.kind == "struct" else []
        for f in inside:
            if f.kind == "variable" and not f.name.startswith("_") and len(fields) < MAX_FIELDS:
                lines, start = self._lines(f)
                line = _one_line(lines[start]).strip() if lines is not None else ""
                if line and line not in fields:
                    fields.append(_cap(line))
        methods = [s for s in inside if s.kind in ("method", "function")]
        methods.sort(key=lambda s: (s.name not in ("__init__", "constructor", "new"), s.name.startswith("_"), s.start_line))
        kept, names = [], set()
        for m in methods:
            if (not m.name.startswith("_") or m.name in ("__init__", "__call__")) and m.name not in names:
                kept.append(m)
                names.add(m.name)
        out: list[str] = []
        for m in sorted(kept[:MAX_METHODS], key=lambda s: s.start_line):
            mlines, mstart = self._lines(m)
            if mlines is None:
                continue
            decorators, sig = one_line(header(mlines, mstart, python)[0])
            if sig:
                # a declaration without a body (a Rust trait's, a C++ class's) has its own ";" already
                out += decorators + [_cap(sig) + (" ..." if python else ("" if sig.endswith(";") else ";"))]
        return fields, out

    def _module_entry(self, imp: Import, target: str, tops: Sequence[Any], python: bool) -> Entry | None:
        out: list[str] = []
        for sym in tops:
            lines, start = self._lines(sym)
            if lines is None:
                continue
            if sym.kind == "variable":
                out.append(_one_line(lines[start]).strip())
                continue
            _, sig = one_line(header(lines, start, python)[0])
            if sig:
                out.append(_cap(sig) + (" ..." if python else ("" if sig.endswith(";") else ";")))
        if not out:
            return None
        first = min(s.start_line for s in tops)
        return Entry(target, "\n".join(out), first, max(s.end_line for s in tops), imp.alias, "module")

    def _rust_fields(self, cls: Any) -> list[str]:
        """A Rust struct's `pub` fields, one line each (fields are not symbols)."""
        lines, start = self._lines(cls)
        if lines is None:
            return []
        out = []
        for line in lines[start + 1 : start + 1 + cls.end_line - cls.start_line]:
            if _RUST_PUB_FIELD.match(line) and len(out) < MAX_FIELDS:
                out.append(_cap(_code(line).strip()))
        return out

    def _exported_default(self, sym: Any) -> bool:
        """Is ``sym`` declared ``export default ...`` (JS/TS)?"""
        lines, start = self._lines(sym)
        return lines is not None and re.match(r"\s*export\s+default\b", lines[start]) is not None

    def _lines(self, sym: Any) -> tuple[list[str] | None, int]:
        chunk = self.retriever.chunk(sym.chunk_id) if sym.chunk_id >= 0 else None
        if chunk is None:
            return None, 0
        lines = chunk.text.split("\n")
        start = sym.start_line - chunk.start_line
        if not 0 <= start < len(lines):
            return None, 0
        return lines, start


_RUST_IMPL_TYPES = ("struct", "enum", "union", "type")
_RUST_PUB_FIELD = re.compile(r"\s*pub(\([^)]*\))?\s+\w+\s*:")


def _one_line(line: str) -> str:
    """A definition's first line with what it leaves open elided and closed: ``X = {`` -> ``X = {...}``."""
    line = _code(line)
    stack: list[str] = []
    pairs = {"(": ")", "[": "]", "{": "}"}
    for ch in line:
        if ch in pairs:
            stack.append(pairs[ch])
        elif stack and ch == stack[-1]:
            stack.pop()
    return line + ("..." + "".join(reversed(stack)) if stack else "")


def one_line(sig_lines: Sequence[str]) -> tuple[list[str], str]:
    """(decorators worth showing, the signature on one line): ``def f(\n    a,\n) -> X:`` -> ``def f(a) -> X:``."""
    decorators: list[str] = []
    parts: list[str] = []
    depth = 0
    in_decorator = False
    for ln in sig_lines:
        code = _code(ln).strip()
        if not code:
            continue
        if depth <= 0 and code.startswith("@"):
            in_decorator = True
            decorators.append(code)
        elif not in_decorator:
            parts.append(code)
        depth += _depth(code)
        if depth <= 0:
            in_decorator = False
    text = _SPACES.sub(" ", " ".join(parts))
    text = _CLOSE_SPACE.sub(r"\1", _OPEN_SPACE.sub(r"\1", text))
    return [d for d in decorators if d.startswith(_KEPT_DECORATORS) and _depth(d) == 0], text


def _render(python: bool, decorators: list[str], sig: str, doc: str | None, members: list[str], is_type: bool) -> str:
    if python:
        out = decorators + [sig]
        if doc is not None:
            out.append("    " + _short(doc.strip()))
        out += ["    " + m for m in members]
        if len(out) == len(decorators) + 1:
            out[-1] += " ..."
        return "\n".join(out)
    out = ([_short(doc.strip())] if doc is not None else []) + decorators
    if is_type:
        out += [sig + " {"] + ["    " + m for m in members] + ["}"]
    else:
        out.append(sig if sig.endswith(";") else sig + " { ... }")
    return "\n".join(out)


def _cap(line: str, limit: int = 110) -> str:
    """A signature cut at ``limit`` characters, at a parameter boundary where one is near."""
    if len(line) <= limit:
        return line
    cut = line.rfind(",", 0, limit)
    return (line[:cut] if cut > limit // 2 else line[:limit]) + ", ...)" + (":" if line.endswith(":") else "")


def _short(line: str, limit: int = 100) -> str:
    """A doc line cut at ``limit`` characters (a docstring's quotes closed again)."""
    if len(line) <= limit:
        return line
    m = _DOC_QUOTE.match(line)
    return line[:limit].rstrip() + "..." + (m.group(1) if m else "")


_TYPE_ALIAS = re.compile(
    r"^\s*(?:type\s+)?\w+\s*(?::\s*(?:typing\.)?TypeAlias\b|=\s*(?:typing\.|t\.)?(?:"
    r"(?:Union|Optional|Callable|Literal|Type|Tuple|List|Dict|Set|FrozenSet|Iterable|Iterator|Sequence|Mapping|"
    r"MutableMapping|Generator|AsyncIterator|AsyncGenerator|Awaitable|Coroutine|Annotated|tuple|list|dict|set|type)\["
    r"|(?:TypeVar|NewType|ParamSpec)\(|[\"']?[A-Z]\w*(?:\[[^=]*\])?[\"']?\s*\|\s*[\"']?[A-Z]))")


def _is_type_alias(entry: Entry) -> bool:
    """A module-level variable that names a type (``StyleType = Union[str, Style]``, ``T = TypeVar("T")``,
    ``X: TypeAlias = ...``): what an annotation's cursor expects as much as a class."""
    return entry.kind == "variable" and bool(_TYPE_ALIAS.match(entry.text))


_TRIPLE = re.compile(r'"""|\'\'\'')
_ONE_LINE_STRING = re.compile(r'""".*?"""|\'\'\'.*?\'\'\'|"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')


def _code_lines(lines: Sequence[str]):
    """(index, code) for each line, with triple-quoted strings (docstrings), one-line strings and
    trailing comments taken out; roughly, as ``_code`` does (a ``#`` inside a string ends the code)."""
    closing = ""
    for k, line in enumerate(lines):
        code, closing = _code_of(line, closing)
        if code is not None:
            yield k, code


def _code_of(line: str, closing: str) -> tuple[str | None, str]:
    """One line's code for ``_code_lines`` (None: none), and the triple quote still open after it
    (``closing``: the one open before it)."""
    if closing:
        end = line.find(closing)
        if end < 0:
            return None, closing
        line, closing = line[end + 3:], ""
    line = _ONE_LINE_STRING.sub('""', line)
    m = _TRIPLE.search(line)
    if m:
        line, closing = line[: m.start()], m.group(0)
    code = _code(line)
    return (None if code.lstrip().startswith(("#", "//")) else code), closing


STATEMENT_LINES = 256  # lines an import statement may span (read after its first)
USE_MARK_LINES = 512  # _UseScan keeps its state every this many lines


class _UseScan:
    """Which imported names the code of a head uses after their imports (`Digest._rank`), read line by
    line from the last point the previous head shares: the head grows a line at a time as the user types,
    and reading all of a 30,000-line head on each new line took ~170 ms."""

    def __init__(self) -> None:
        self._key: Any = None
        self._text = ""
        # (offset of a line start in _text, its line index, the triple quote open there, the names used above it)
        self._marks: list[tuple[int, int, str, frozenset[str]]] = [(0, 0, "", frozenset())]

    def used(self, head: str, words: re.Pattern[str], imported_at: dict[str, int], statements: set[int]) -> set[str]:
        key = (words.pattern, tuple(sorted(imported_at.items())), frozenset(statements))
        if key != self._key:
            self._key, self._text, self._marks = key, "", [(0, 0, "", frozenset())]
        lo, hi = 0, len(self._marks) - 1  # the last mark up to which the heads agree (agreeing is monotone)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            at = self._marks[mid][0]
            if at <= len(head) and head.startswith(self._text[:at]):
                lo = mid
            else:
                hi = mid - 1
        marks = self._marks[: lo + 1]
        offset, first, closing, above = marks[-1]
        used = set(above)
        lines = head[offset:].split("\n")
        for j, line in enumerate(lines):
            k = first + j
            if j and (j % USE_MARK_LINES == 0 or j == len(lines) - 1):
                marks.append((offset, k, closing, frozenset(used)))
            code, closing = _code_of(line, closing)
            if code is not None and k not in statements:
                used.update(a for a in words.findall(code) if imported_at[a] <= k)
            offset += len(line) + 1
        self._text, self._marks = head, marks
        return used


def _statement_lines(lines: Sequence[str], starts: Sequence[int]) -> set[int]:
    """0-based indices of the lines that the statements starting at ``starts`` (1-based) occupy:
    a parenthesised or backslash-continued import goes on to its closing line."""
    out: set[int] = set()
    for start in sorted(set(starts)):
        depth, k = 0, start - 1
        while 0 <= k < len(lines):
            out.add(k)
            code = _code(lines[k])
            depth += _depth(code)
            if depth <= 0 and not code.rstrip().endswith("\\"):
                break
            k += 1
    return out


def _as_module(imp: Import, path: str) -> Import:
    """A C/C++ ``#include "x.h"`` as a module import: it binds no name (the header's are used bare), so it
    was left out of the digest; as the module ``x`` its stub is the header's declarations."""
    if imp.name == "*" and not imp.alias and language_of(path) in ("c", "cpp"):
        stem = os.path.splitext(os.path.basename(imp.module))[0]
        if stem.isidentifier():
            return dataclasses.replace(imp, name=None, alias=stem)
    return imp


def _is_module_file(target: str, name: str | None, module: str = "") -> bool:
    """Is ``target`` the module ``name`` itself (``from pkg import mod``), not a module defining ``name``
    (``from .mod import mod``)?"""
    stem, ext = os.path.splitext(os.path.basename(target))
    if ext == ".java":  # a Java file is named after its class: `import a.b.Parcel;` names the class, not a module
        return False
    if module.replace("/", ".").rstrip(".").split(".")[-1] == name:
        return False
    return bool(name) and (stem == name or (stem in ("__init__", "index", "mod") and os.path.basename(os.path.dirname(target)) == name))


def _short_form(entry: Entry, python: bool) -> str:
    """The entry's signature line alone (decorators dropped): ``class Command: ...``, ``def echo(...) -> None: ...``."""
    first = next((line for line in entry.text.split("\n") if line.strip() and not line.lstrip().startswith("@")), "")
    if python and first.rstrip().endswith(":"):
        first = first.rstrip() + " ..."
    return first


def fit(entries: Sequence[Entry], budget_tokens: int, count: Callable[[str], int],
        display: Callable[[str], str]) -> tuple[tuple[Snippet, ...], list[Entry]]:
    """Entries as one stub snippet per file (files in rank order) within ``budget_tokens``, and the
    entries shown. Two passes: first each entry's signature line, best first, while they fit (a name
    the next line may use is shown at all); then, best first, each grows to its longest stub that the
    rest of the budget allows (constructor; docstring line, fields and methods).

    Measured with `draftline bench context --no-model` on email, _pytest, click and rich (needed
    definition in the prompt): 100 / 100 / 96 / 98 %. Two variants tried once and not kept: longest
    stubs first, signature lines only as a fallback (100 / 95 / 89 / 92 %); signature lines for half the
    budget (100 / 98 / 93 / 85 %)."""
    forms: list[list[str]] = []
    for e in entries:
        python = e.path.endswith((".py", ".pyi"))
        levels = [t for t in (_short_form(e, python), e.brief, e.text) if t]
        forms.append(sorted(dict.fromkeys(levels), key=len))
    costs = [[count(t) + 1 for t in f] for f in forms]  # each form counted once, for both passes
    heads: dict[str, int] = {}  # path -> the cost of its label
    level: dict[int, int] = {}  # entry index -> its form shown
    paths: set[str] = set()
    used = 0

    def head(e: Entry) -> int:
        if e.path in paths:
            return 0
        if e.path not in heads:
            heads[e.path] = count(display(e.path)) + 3
        return heads[e.path]

    for k, e in enumerate(entries):  # pass 1: the short forms
        if not forms[k]:
            continue
        cost = costs[k][0] + head(e)
        if used + cost <= budget_tokens:
            level[k], used = 0, used + cost
            paths.add(e.path)
    for k, e in enumerate(entries):  # pass 2: the best grow, or enter now if the short pass had no room left
        now = level.get(k)
        base = costs[k][now] if now is not None else 0
        extra_head = 0 if now is not None else head(e)
        for j in range(len(forms[k]) - 1, (now if now is not None else -1), -1):
            cost = costs[k][j] - base + extra_head
            if used + cost <= budget_tokens:
                level[k], used = j, used + cost
                paths.add(e.path)
                break
    chosen: dict[str, list[Entry]] = {}
    for k, e in enumerate(entries):
        if k in level:
            chosen.setdefault(e.path, []).append(dataclasses.replace(e, text=forms[k][level[k]]))
    order = list(dict.fromkeys(e.path for k, e in enumerate(entries) if k in level))
    out: list[Snippet] = []
    for path in order:
        group = sorted(chosen[path], key=lambda e: e.start_line)
        text = "\n".join(e.text for e in group) + "\n"
        out.append(Snippet(display(path), text, min(e.start_line for e in group), max(e.end_line for e in group)))
    return tuple(out), [e for path in order for e in chosen[path]]
