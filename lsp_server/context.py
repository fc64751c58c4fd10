"""Cross-file context for one completion: definitions of the names the cursor needs, then retrieved chunks.

Text search alone misses the definition of an imported name most of the time (the indexer's
retrieval benchmark), while the symbol table finds it at rank 1 (~90 %). So the completer shows

0. the imports digest (lsp_server/digest.py): stubs of what the file imports from the workspace,
   ranked by what the next lines will use, within a token budget, and for its best two names one
   line elsewhere in the workspace that uses the name (how it is called, subclassed, annotated);

then asks the symbol table for the bodies of

1. names the current file imports (``from m import a``, ``import {a} from "./m"``) that are used
   near the cursor, nearest first, then the other imported names;
2. other identifiers near the cursor that the workspace defines, nearest first;

and fills the rest of the snippet budget with BM25 + dense chunks, leaving out what the local
window already shows (the window of the current file; distant parts of a long file stay eligible).

Everything here is derived from whole lines before the cursor's line (plus complete identifiers on
it), so while the user types within a line the snippets stay the same and the engine reuses its KV
cache for the whole prompt head.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from engine.prompt import fit_snippets, snippet_cost
from engine.types import Snippet
from indexer.imports import Import, resolve
from lsp_server.digest import Digest, cursor_hint, fit

log = logging.getLogger(__name__)

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# names that are never worth a definition lookup (they resolve to nothing useful or to everything)
_COMMON = frozenset(
    "self cls None True False def class return if else elif for while in not and or is import from as with "
    "try except finally raise pass break continue lambda yield async await global nonlocal del assert "
    "int str float bool list dict set tuple bytes object type len range print super isinstance "
    "const let var function this new null undefined true false export default".split()
)


@dataclass(frozen=True)
class Context:
    """What the completer needs from the snapshot beyond the engine request (computed on the loop)."""

    path: str = ""  # absolute path of the current file ("" when it has none)
    window_lines: tuple[int, int] = (0, -1)  # 1-based inclusive lines of the current file the window shows
    nearby: tuple[str, ...] = ()  # identifiers near the cursor, nearest first
    query: str = ""  # retrieval query
    head: str = ""  # the document before the cursor's line (its imports are parsed from here)
    tail: str = ""  # the document after the cursor's line (later uses of imported names)
    hint: tuple[str, str] = ("", "")  # what the cursor's position expects (digest.cursor_hint)
    line: str = ""  # the cursor's line up to the cursor (its last 200 characters)


def nearby_identifiers(before_lines: Sequence[str], current: str, after_line: str) -> list[str]:
    """Identifiers of the current line (complete ones only), the next line and the lines above, nearest first."""
    words: list[str] = []
    head = _IDENT.findall(current)
    if head and current and (current[-1].isalnum() or current[-1] == "_"):
        head = head[:-1]  # the identifier being typed is incomplete
    words += reversed(head)
    words += _IDENT.findall(after_line)
    for line in reversed(before_lines):
        words += reversed(_IDENT.findall(line))
    seen: set[str] = set()
    return [w for w in words if w not in _COMMON and len(w) > 2 and not (w in seen or seen.add(w))]


# The query and the nearby identifiers read at most this much of a line: a minified bundle's one line of
# 200,000 characters was a 100,000-word query (~1 s of BM25 term splitting) and ~40 ms of identifiers a keystroke
LINE_CHARS = 1000


def _line_head(line: str) -> str:
    """A line's first LINE_CHARS characters, without a word cut at the end."""
    return line if len(line) <= LINE_CHARS else re.sub(r"\w+$", "", line[:LINE_CHARS])


def _line_tail(line: str) -> str:
    """A line's last LINE_CHARS characters, without a word cut at the start (the one at the end is kept)."""
    return line if len(line) <= LINE_CHARS else re.sub(r"^\w+", "", line[-LINE_CHARS:])


def _lines_above(before: str, line_start: int, n: int) -> list[str]:
    """The ``n`` lines that end at ``line_start`` (found from there: the document above may be 30,000 lines)."""
    out: list[str] = []
    end = line_start - 1  # the "\n" that ends the line above
    while end >= 0 and len(out) < n:
        start = before.rfind("\n", 0, end) + 1
        out.append(_line_head(before[start:end]))
        end = start - 1
    return out[::-1]


def build_context(before: str, after: str, prefix_window: str, path: str, language: str, query_lines: int) -> Context:
    """The context of a cursor: ``before``/``after`` are the whole document around it."""
    cursor_line = before.count("\n") + 1  # 1-based
    window_first = cursor_line - prefix_window.count("\n")
    after_lines = after.count("\n")
    line_start = before.rfind("\n") + 1
    typed = before[line_start:]
    current = _line_tail(typed)
    lines_above = _lines_above(before, line_start, query_lines)
    next_end = after.find("\n")
    next_line = _line_head(after[: next_end if next_end >= 0 else LINE_CHARS + 1])
    # the lines above (stable while typing within a line); the current line only when there are none
    query = "\n".join((lines_above or [current]) + [next_line]).strip()
    return Context(
        path=os.path.abspath(path) if path else "",
        window_lines=(window_first, cursor_line + after_lines),
        nearby=tuple(nearby_identifiers(lines_above, current, next_line)),
        query=query,
        head=before[:line_start],
        tail=after[next_end + 1:] if next_end >= 0 else "",
        hint=cursor_hint(typed[-200:]),
        line=typed[-200:],
    )


def _shown(snippet: Snippet, block: Sequence[Snippet]) -> bool:
    """Does ``block`` show ``snippet``'s lines (the same file, overlapping lines: a digest entry may be
    drawn a little differently on another line, with its signatures or with its body)?"""
    return any(s.path == snippet.path and s.start_line <= snippet.end_line and snippet.start_line <= s.end_line
               for s in block)


def _module_matches(module: str, path: str) -> bool:
    """Does ``path`` look like the file ``module`` names (``pkg.mod``, ``.mod``, ``./mod``)?"""
    stem = module.replace("\\", "/").rstrip("/").split("/")[-1].split(".")[-1] or module.strip(".")
    p = Path(path)
    return p.stem == stem or (p.stem in ("__init__", "index") and p.parent.name == stem)


# A new line keeps the previous line's snippets when they already show every definition the new line's
# digest and symbol lookup ask for, and were chosen at most this many lines away. The snippets open the
# prompt: any change re-prefills all after it, the local window included (~1 s on a 2-core AVX2 CPU).
# Choosing them afresh on each line, a retrieved chunk coming or going re-prefilled 33 of 72 new lines
# in email/ (mean reuse 251 of 421 prompt tokens)
STICKY_LINES = 30
# Usage lines: for the digest's best USAGE_NAMES names, one line from another file that uses the name,
# shown next to the current file (ContextFinder._usages). `draftline bench context` on email, _pytest,
# click and rich (the digest arm, 128 tasks, commit 5d57a0c against the first with usage lines): exact
# 20 -> 28, edit similarity 0.45 -> 0.52 at the cut. One or three names, tried once, did no better.
USAGE_NAMES = 2
USAGE_CHUNKS = 12  # chunks holding the name, searched for its lines
USAGE_CHARS = 160
# (exports name what a file defines: `module.exports = { f };` is no use of f; nor is a line that requires it)
_NOT_USES = ("#", "//", "/*", "* ", "import ", "from ", "use ", "pub use ", "require(", "module.exports", "exports.",
             "export {", "export *", "export default ")
_QUALIFIER = re.compile(r"[\w.]*\.$")


class ContextFinder:
    """Chooses the snippets of one request from the index; never raises."""

    def __init__(self, retriever: Any, roots: Sequence[Path], display: Any):
        self.retriever = retriever
        self.roots = roots
        self.display = display  # (abs path, roots) -> the path shown to the model
        self.digest = Digest(retriever)
        self._last: dict[str, tuple[Any, tuple[Snippet, ...]]] = {}  # path -> (key, snippets)
        # path -> (snippets, the key's budgets and index generation, the line they were chosen on): the block
        # that later lines keep while it shows every definition they point at (see STICKY_LINES)
        self._kept: dict[str, tuple[tuple[Snippet, ...], Any, int]] = {}

    def snippets(self, ctx: Context, k_chunks: int, k_defs: int, def_lines: int, digest_tokens: int = 0,
                 count: Callable[[str], int] | None = None, snippet_tokens: int = 0) -> tuple[Snippet, ...]:
        """The imports digest (within ``digest_tokens``, counted by ``count``), definitions, then chunks.
        ``snippet_tokens``: the prompt's room for them (engine.prompt.fit_snippets), 0 when unknown."""
        # Line-stable: nothing typed on the cursor's line is in the key, so the snippets (the start of the
        # prompt) stay put while a line is typed and every keystroke reuses the KV. With the identifiers
        # and the hint of the typed line in it, each finished name could swap a snippet and re-prefill the
        # whole prompt (~1 s on a 2-core AVX2 CPU; bench lsp's typing p99). The line's first request
        # chooses them, with what was on the line then.
        key = (ctx.query, hash(ctx.head), hash(ctx.tail), ctx.window_lines[0], k_chunks, k_defs, def_lines,
               digest_tokens, snippet_tokens, self._generation(ctx.path))
        last = self._last.get(ctx.path)
        if last is not None and last[0] == key:
            return last[1]  # same lines around the cursor: same snippets (and a reused prompt cache)
        fresh, targeted = self._choose(ctx, k_chunks, k_defs, def_lines, digest_tokens, count)
        line = ctx.head.count("\n")
        kept = self._kept.get(ctx.path)
        result = fresh
        if kept is not None and kept[1] == key[4:] and abs(line - kept[2]) <= STICKY_LINES:
            wanted, shown = fresh[:targeted], kept[0]
            if snippet_tokens > 0:  # only what the prompt shows counts, on both sides
                fits = fit_snippets(fresh, snippet_tokens, count or _approx_tokens)
                wanted = [s for s in wanted if s in fits]
                shown = fit_snippets(shown, snippet_tokens, count or _approx_tokens)
            if all(_shown(s, shown) for s in wanted):
                result = kept[0]  # the block shows every definition the new line points at: keep it and its KV
        if result is fresh:
            self._kept[ctx.path] = (result, key[4:], line)
        self._last[ctx.path] = (key, result)
        for memo in (self._last, self._kept):
            if len(memo) > 64:
                memo.pop(next(iter(memo)))
        return result

    def _choose(self, ctx: Context, k_chunks: int, k_defs: int, def_lines: int, digest_tokens: int,
                count: Callable[[str], int] | None) -> tuple[tuple[Snippet, ...], int]:
        """The snippets for ``ctx`` and how many of them come first as definitions (the digest's and the
        symbol table's: what the next lines are expected to use) rather than from retrieval."""
        out: list[Snippet] = []
        taken: list[tuple[str, int, int]] = []
        imports = self.digest.imports_cache.imports(ctx.head, ctx.path) if ctx.path else []
        if digest_tokens > 0:
            try:
                entries = self.digest.entries(ctx.path, ctx.head, ctx.tail, ctx.nearby, ctx.hint)
            except Exception:
                log.exception("imports digest failed")
                entries = []
            counter = count or _approx_tokens
            # usage lines first (the prompt shows them last, next to the current file); at most a third of
            # the digest's budget, taken from what follows (definitions, chunks), not from the stubs
            room = digest_tokens // 3
            for u in self._usages(ctx, entries[:USAGE_NAMES]):
                cost = snippet_cost(u, counter)
                if cost <= room:
                    out.append(u)
                    room -= cost
            stubs, shown = fit(entries, digest_tokens, counter, lambda p: self.display(p, self.roots))
            out += stubs
            taken += [(os.path.abspath(e.path), e.start_line, e.end_line) for e in shown]
        if k_defs > 0:
            for sym, chunk in self._definitions(ctx, imports, k_defs):
                lines = chunk.text.split("\n")
                text = "\n".join(lines[:def_lines])
                out.append(Snippet(self.display(chunk.path, self.roots), text, chunk.start_line,
                                   min(chunk.end_line, chunk.start_line + len(lines[:def_lines]) - 1)))
                taken.append((os.path.abspath(chunk.path), chunk.start_line, chunk.end_line))
        targeted = len(out)
        if k_chunks > 0 and ctx.query:
            try:
                found = self.retriever.search(ctx.query, k_chunks + len(taken) + 4)
            except Exception:
                log.exception("retrieval failed")
                found = []
            added = 0
            for c in found:
                if added >= k_chunks:
                    break
                where = os.path.abspath(c.path)
                if self._in_window(ctx, where, c.start_line, c.end_line) or any(
                    p == where and s <= c.end_line and c.start_line <= e for p, s, e in taken
                ):
                    continue
                out.append(Snippet(self.display(c.path, self.roots), c.text, c.start_line, c.end_line))
                taken.append((where, c.start_line, c.end_line))
                added += 1
        return tuple(out), targeted

    def _usages(self, ctx: Context, entries: Sequence[Any]) -> list[Snippet]:
        """For each entry, one line elsewhere in the workspace that uses its name (not its definition, an
        import or a comment), the one most like the cursor's line: the same character before the name
        (``(`` of a base class or a call, ``[`` of a type, a space after ``raise``), then the same words
        before it, then the shortest. The current file is left out (its lines are the local window's)."""
        mentions = getattr(self.retriever, "mentions", None)
        if mentions is None or not ctx.path:
            return []
        here = ctx.line.lstrip()  # "raise " keeps its space: the character before the name
        here_words = set(_IDENT.findall(here))
        out: list[Snippet] = []
        for e in entries:
            if e.kind == "module" or not e.name:
                continue
            use = re.compile(r"(?<!\w)" + re.escape(e.name) + r"\b")
            definition = re.compile(r"(?:async\s+)?(?:def|class|struct|interface|trait|enum|type|fn|function)\s+"
                                    + re.escape(e.name) + r"\b")
            try:
                chunks = mentions(e.name, USAGE_CHUNKS, ctx.path)
            except Exception:
                log.exception("usage lookup failed")
                return out
            best: tuple[float, Snippet] | None = None
            own = os.path.abspath(e.path)
            for c in chunks:
                in_own = os.path.abspath(c.path) == own
                for k, line in enumerate(c.text.split("\n")):
                    code = line.strip()
                    if in_own and e.start_line <= c.start_line + k <= e.end_line:
                        continue  # the definition itself (``UNSET = Sentinel()``)
                    if not code or code.startswith(_NOT_USES) or "require(" in code or definition.match(code):
                        continue
                    m = use.search(code)
                    if m is None:
                        continue
                    before = _QUALIFIER.sub("", code[: m.start()])  # ``raise errors.`` -> ``raise ``
                    words = set(_IDENT.findall(before))
                    score = (2.0 * (before[-1:] == here[-1:])
                             + len(words & here_words) / (len(words | here_words) or 1) - len(code) / 400)
                    if best is None or score > best[0]:
                        best = (score, Snippet(self.display(c.path, self.roots), code[:USAGE_CHARS],
                                               c.start_line + k, c.start_line + k))
            if best is not None:
                out.append(best[1])
        return out

    def _generation(self, path: str) -> Any:
        """Changes when the index may have changed other than by typing in ``path`` (so the memo never
        outlives an edit elsewhere); without such a counter, nothing is memoised."""
        gen = getattr(self.retriever, "generation", None)
        return gen(path) if callable(gen) else object()

    @staticmethod
    def _in_window(ctx: Context, path: str, start: int, end: int) -> bool:
        first, last = ctx.window_lines
        return path == ctx.path and start <= last and first <= end

    def _definitions(self, ctx: Context, imports: Sequence[Import], k: int) -> list[tuple[Any, Any]]:
        lookup = getattr(self.retriever, "definitions", None)
        chunk_of = getattr(self.retriever, "chunk", None)
        if lookup is None or chunk_of is None:
            return []
        bound = [i for i in imports if i.alias and i.name not in (None, "*", "default")]
        modules = {i.alias: i for i in bound}
        near = set(ctx.nearby)
        # imported and used near the cursor, nearest first; then identifiers near the cursor; then other imports
        order = [n for n in ctx.nearby if n in modules] + [n for n in ctx.nearby if n not in modules]
        order += [i.alias for i in bound if i.alias not in near]
        files = getattr(self.retriever, "files", None)
        picked: list[tuple[Any, Any]] = []
        seen_chunks: set[int] = set()
        for alias in order:
            if len(picked) >= k:
                break
            imp = modules.get(alias)
            name = imp.name if imp is not None else alias
            try:
                symbols = lookup(name)
            except Exception:
                log.exception("definition lookup failed")
                return picked
            if not symbols:
                continue
            target = ""
            if imp is not None and files is not None and ctx.path:
                try:
                    found = resolve(imp, ctx.path, files)
                except Exception:
                    found = []
                target = os.path.abspath(found[0]) if found else ""
            best = sorted(symbols, key=lambda s: (
                not (target and os.path.abspath(s.path) == target),  # the file the import resolves to
                not (imp is not None and _module_matches(imp.module, s.path)),  # else the file it names
                s.container is not None,  # a top-level definition before a same-named method
                os.path.abspath(s.path) == ctx.path,
                len(str(s.path)),
            ))[0]
            if os.path.abspath(best.path) == ctx.path and self._in_window(ctx, ctx.path, best.start_line, best.end_line):
                continue  # already on screen
            if best.chunk_id in seen_chunks:
                continue
            chunk = chunk_of(best.chunk_id) if best.chunk_id >= 0 else None
            if chunk is None:
                continue
            seen_chunks.add(best.chunk_id)
            picked.append((best, chunk))
        return picked


def _approx_tokens(text: str) -> int:
    return len(text) // 3 + 1
