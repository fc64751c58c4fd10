"""Workspace discovery: which files may be indexed (ignore rules, limits, secrets) and reading them."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import stat
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pathspec import GitIgnoreSpec

from .config import ALWAYS_IGNORED_DIRS, DEFAULT_SECRET_CONTENT_PATTERNS, IndexConfig

log = logging.getLogger(__name__)

IGNORE_FILE_NAMES = (".gitignore", ".draftlineignore")  # later ones take precedence
_BINARY_SNIFF_BYTES = 8192


@dataclass(frozen=True)
class FileEntry:
    """A discovered candidate file (not yet read)."""

    path: str  # absolute, not symlink-resolved
    mtime: float
    size: int


# a notebook's file may be this many times max_file_bytes: a few plots take a data-science notebook past
# 1 MB, and it was skipped whole as too large for a few KB of code
NOTEBOOK_RAW_FACTOR = 50


def notebook_code(text: str) -> str | None:
    """A Jupyter notebook's code cells, in order, each followed by a blank line (how the server shows a
    notebook to the model, lsp_server.documents.in_notebook); None when ``text`` is no notebook. Its
    outputs (base64 images, printed data) and markdown stay out of the index and the prompts, and so do
    blank cells and cells of another language than the notebook's (a SQL cell of a Python notebook,
    marked as VS Code saves it: ``metadata.vscode.languageId``). nbformat 3's worksheets are read too."""
    try:
        notebook = json.loads(text)
    except ValueError:
        return None
    if not isinstance(notebook, dict):
        return None
    cells = notebook.get("cells")
    worksheets = notebook.get("worksheets")
    if cells is None and isinstance(worksheets, list):  # nbformat 3: cells in worksheets, a code cell's in "input"
        cells = [c for w in worksheets if isinstance(w, dict) and isinstance(w.get("cells"), list) for c in w["cells"]]
    if not isinstance(cells, list):
        return None
    language = notebook_language(notebook)
    out = []
    for cell in cells:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        own = _cell_language(cell)
        if own and language and own != language:
            continue
        source = cell["source"] if "source" in cell else cell.get("input", "")
        source = "".join(s for s in source if isinstance(s, str)) if isinstance(source, list) else source
        if isinstance(source, str) and source.strip():
            out.append(notebook_cell(source))
    return "".join(out)


def notebook_language(notebook: dict) -> str:
    """A notebook's language (lowercase, as editors name it) from its metadata; "" when it says none."""
    metadata = notebook.get("metadata")
    if not isinstance(metadata, dict):
        return ""
    for key, field in (("language_info", "name"), ("kernelspec", "language")):
        value = metadata.get(key)
        if isinstance(value, dict) and isinstance(value.get(field), str) and value[field].strip():
            return _editor_language(value[field])
    return ""


def _editor_language(name: str) -> str:
    """A kernel's language name as an editor's language id (VS Code's for the few that differ)."""
    name = name.strip().lower()
    return "cpp" if name.startswith("c++") else {"c#": "csharp", "f#": "fsharp", "q#": "qsharp"}.get(name, name)


def _cell_language(cell: dict) -> str:
    """A code cell's own language where it names one (VS Code: ``metadata.vscode.languageId``), else ""."""
    metadata = cell.get("metadata")
    vscode = metadata.get("vscode") if isinstance(metadata, dict) else None
    own = vscode.get("languageId") if isinstance(vscode, dict) else None
    return _editor_language(own) if isinstance(own, str) else ""


def notebook_cell(source: str) -> str:
    """One code cell as a notebook's text shows it, here and in the server's prompt: its source, then a
    blank line (lines before a cell's cursor then count the same in both, for retrieval's own-file check)."""
    return source.rstrip("\n") + "\n\n"


def is_notebook(path: str) -> bool:
    return path.lower().endswith(".ipynb")


@dataclass(frozen=True)
class SourceFile:
    """A file's text as it will be indexed."""

    path: str
    text: str
    mtime: float
    size: int
    digest: str


@dataclass
class WalkResult:
    files: list[FileEntry] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)


REDACTED = "<redacted>"
# How far before a slice of text a secret can begin and still reach into it: a private key's body
# follows its BEGIN line (an 8192-bit RSA key in PEM is ~6.4 KB). Callers scan that much more.
SECRET_REACH = 8192
_SECRETS = tuple(re.compile(p) for p in DEFAULT_SECRET_CONTENT_PATTERNS)
_LINE_CORE = re.compile(r"\S(?:[^\n]*\S)?")  # a line from its first to its last visible character


def secret_spans(text: str) -> list[tuple[int, int]]:
    """The secret values the default content patterns find in ``text``: sorted, disjoint (start, end).

    A pattern's value is its ``value`` group where it has one, else its whole match.
    """
    found = sorted(m.span("value") if "value" in p.groupindex else m.span() for p in _SECRETS for m in p.finditer(text))
    spans: list[tuple[int, int]] = []
    for start, end in found:
        if start == end:
            continue
        if spans and start <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(end, spans[-1][1]))
        else:
            spans.append((start, end))
    return spans


def redact_slices(text: str, slices: Sequence[tuple[int, int]]) -> list[str]:
    """``text[a:b]`` for each slice, with the secret values found in the whole ``text`` replaced.

    Each line of a value (its part inside the slice) becomes ``<redacted>``: line breaks stay, so a
    redacted text has the line count of the original. Secrets are found in all of ``text``, so a value
    that starts before a slice or crosses its end is redacted in it too.
    """
    spans = secret_spans(text)
    out = []
    for a, b in slices:
        parts, pos = [], a
        for start, end in spans:
            start, end = max(start, a), min(end, b)
            if start >= end:
                continue
            parts += [text[pos:start], _LINE_CORE.sub(REDACTED, text[start:end])]
            pos = end
        parts.append(text[pos:b])
        out.append("".join(parts))
    return out


def redact(text: str) -> str:
    """``text`` with every secret value the index would refuse a file for replaced by ``<redacted>``."""
    return redact_slices(text, [(0, len(text))])[0]


# skips a tree has by the thousand (build artifacts, copies): logged per file at DEBUG, counted at INFO
# in the build's summary line
BULK_SKIPS = frozenset({"binary", "not_utf8", "duplicate_dir", "duplicate_file", "symlink_inside", "not_regular"})
# why a skip reason is what it is, where its name alone does not say
SKIP_DETAILS = {"bad_name": "the name is not valid UTF-8: the index cannot store its path"}


def _utf8_name(name: str) -> bool:
    """False for a name that is not UTF-8 on disk (a Latin-1 name from a zip, say): Python holds its
    bytes as surrogates, which SQLite cannot store."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown(path: str) -> str:
    """``path`` for a log line: as it is, or its repr where it holds undecodable bytes (a stream
    encoding it would fail, and the bytes are what identifies it)."""
    return path if _utf8_name(path) else repr(path)


def content_digest(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


class FileFilter:
    """Decides whether a path under one of the roots may be indexed.

    Nested ``.gitignore`` and ``.draftlineignore`` files, ``.git/info/exclude``,
    ``IndexConfig.extra_ignore`` and the secrets rules are all applied here so the
    walker, ``Index.touch`` and the watcher agree. Ignore files are read lazily and
    cached; call :meth:`invalidate` when one changes.
    """

    def __init__(self, roots: list[Path], config: IndexConfig, extra_excluded_dirs: tuple[Path, ...] = ()):
        self.roots = [Path(os.path.abspath(r)) for r in roots]
        self.config = config
        self._real_roots = tuple(os.path.realpath(r) for r in self.roots)
        self._excluded_dirs = tuple(os.path.abspath(d).rstrip(os.sep) + os.sep for d in extra_excluded_dirs)
        # by directory; strings, not Paths, as in the other checks every entry goes through: a new
        # Path per ancestor costs O(depth) each, which a tree 1,000 levels deep made minutes
        self._dir_specs: dict[str, list[GitIgnoreSpec]] = {}
        self._root_specs: dict[Path, list[GitIgnoreSpec]] = {}
        self._secret_names = GitIgnoreSpec.from_lines(config.secret_name_patterns)
        # one compiled pattern each: every search then starts with a fast literal scan, which one
        # alternation of all of them would not get (measured 13x slower on large files)
        self._secret_content = tuple(re.compile(p) for p in config.secret_content_patterns)

    # ---- ignore rules -------------------------------------------------
    def invalidate(self, directory: Path | None = None) -> None:
        """Forget the cached rules of ``directory`` and of every directory below it (all: None).

        Below it too: a directory removed or moved away takes its subdirectories' ignore files along,
        and a new one moved in under its name must not be judged by them."""
        if directory is None:
            self._dir_specs.clear()
            self._root_specs.clear()
            return
        directory = os.path.abspath(directory)
        prefix = directory.rstrip(os.sep) + os.sep
        for cached in list(self._dir_specs):
            if cached == directory or cached.startswith(prefix):
                self._dir_specs.pop(cached, None)

    def exclude_root(self, path: Path | str) -> Path | None:
        """The root whose ``.git/info/exclude`` ``path`` is (its rules apply to that whole root), or None."""
        p = Path(os.path.abspath(path))
        if p.name == "exclude" and p.parent.name == "info" and p.parent.parent.name == ".git":
            root = p.parent.parent.parent
            if root in self.roots:
                return root
        return None

    def invalidate_root(self, root: Path) -> None:
        """Forget the root-wide rules (``.git/info/exclude``, extra patterns) cached for ``root``."""
        self._root_specs.pop(root, None)

    def root_of(self, path: Path) -> Path | None:
        best = None
        for root in self.roots:
            if path == root or root in path.parents:
                if best is None or len(root.parts) > len(best.parts):
                    best = root
        return best

    def _read_spec(self, file: Path) -> GitIgnoreSpec | None:
        try:
            with open(file, encoding="utf-8", errors="replace") as fh:
                return GitIgnoreSpec.from_lines(fh.read().splitlines())
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("cannot read ignore file %s: %s", file, exc)
            return None

    def _specs_for_root(self, root: Path) -> list[GitIgnoreSpec]:
        specs = self._root_specs.get(root)
        if specs is None:
            specs = []
            exclude = self._read_spec(root / ".git" / "info" / "exclude")
            if exclude is not None:
                specs.append(exclude)
            if self.config.extra_ignore:
                specs.append(GitIgnoreSpec.from_lines(self.config.extra_ignore))
            self._root_specs[root] = specs
        return specs

    def _specs_for_dir(self, directory: str) -> list[GitIgnoreSpec]:
        specs = self._dir_specs.get(directory)
        if specs is None:
            specs = [s for s in (self._read_spec(Path(directory, n)) for n in IGNORE_FILE_NAMES) if s is not None]
            self._dir_specs[directory] = specs
        return specs

    def _ignored_by_rules(self, root: Path, path: Path, is_dir: bool) -> bool:
        """Git semantics: the last matching pattern wins, deeper files override shallower ones."""
        suffix = "/" if is_dir else ""
        result: bool | None = None
        rel_root = path.relative_to(root).as_posix() + suffix
        for spec in self._specs_for_root(root):
            r = spec.check_file(rel_root).include
            if r is not None:
                result = r
        directory = str(root)
        rel_parts = path.relative_to(root).parts
        for depth in range(len(rel_parts)):
            specs = self._specs_for_dir(directory)
            if specs:
                rel = "/".join(rel_parts[depth:]) + suffix
                for spec in specs:
                    r = spec.check_file(rel).include
                    if r is not None:
                        result = r
            directory = os.path.join(directory, rel_parts[depth])
        return bool(result)

    def _is_excluded_dir(self, path: Path) -> bool:
        return (str(path) + os.sep).startswith(self._excluded_dirs)

    def entry_reason(self, root: Path, path: Path, is_dir: bool) -> str | None:
        """Reason to skip one walk entry whose ancestors were already accepted, or None."""
        if not _utf8_name(path.name):
            return "bad_name"
        if is_dir and path.name in ALWAYS_IGNORED_DIRS:
            return "ignored"
        if self._is_excluded_dir(path):
            return "ignored"
        if self._ignored_by_rules(root, path, is_dir):
            return "ignored"
        if not is_dir and self.config.exclude_secrets and self._secret_names.match_file(path.name):
            return "secret_name"
        return None

    def path_reason(self, path: Path) -> str | None:
        """Full check for a single path (ancestors included): why it is skipped, or None."""
        path = Path(os.path.abspath(path))
        root = self.root_of(path)
        if root is None or path == root:
            return "outside_roots"
        reason = self.link_reason(root, path)
        if reason:
            return reason
        rel = path.relative_to(root).parts
        current = root
        for part in rel[:-1]:
            current = current / part
            reason = self.entry_reason(root, current, True)
            if reason:
                return reason
        return self.entry_reason(root, path, False)

    def _outside_roots(self, real: str) -> bool:
        """Does a resolved path lie outside every (resolved) root, where a link may not lead?"""
        if self.config.symlinks_outside_roots:
            return False
        return not self._inside_roots(real)

    def _inside_roots(self, real: str) -> bool:
        return any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in self._real_roots)

    def _link_reason(self, real: str) -> str | None:
        """Why a link to ``real`` is not followed (links are, in general). One into the workspace: what it
        leads to is indexed under its own path, which is the path the watcher reports changes of (a
        linked copy went stale on the next edit of its target and stayed after its deletion, and
        retrieval showed the file twice). One out of it: see link_reason."""
        if self._inside_roots(real):
            return "symlink_inside"
        return "symlink_outside" if self._outside_roots(real) else None

    def link_reason(self, root: Path, path: Path) -> str | None:
        """Why a path reached through a symlink (itself, or a directory between its root and it) is
        skipped: links are not followed, or this one leads out of the workspace (a cloned repository's
        link to ~/.aws/credentials would otherwise be read into the index and the prompts); None else."""
        real = os.path.realpath(path)
        if real == os.path.join(os.path.realpath(root), *path.relative_to(root).parts):
            return None  # no link on the way
        if not self.config.follow_symlinks:
            return "symlink"
        return self._link_reason(real)

    def content_is_secret(self, text: str) -> bool:
        return bool(self.config.exclude_secrets and any(p.search(text) for p in self._secret_content))

    # ---- walking ------------------------------------------------------
    def walk(self) -> WalkResult:
        result = WalkResult()
        seen_dirs: set[tuple[int, int]] = set()
        seen_files: set[str] = set()
        for root in self.roots:
            try:
                st = os.stat(root)
            except OSError as exc:
                log.warning("workspace root %s unreadable: %s", root, exc)
                result.skipped["unreadable"] += 1
                continue
            seen_dirs.add((st.st_dev, st.st_ino))
            self._walk_dir(root, root, result, seen_dirs, seen_files)
        return result

    def _skip(self, result: WalkResult, path: Path, reason: str, detail: object = "") -> None:
        result.skipped[reason] += 1
        level = logging.DEBUG if reason == "ignored" or reason in BULK_SKIPS else logging.INFO
        log.log(level, "skip %s (%s) %s", shown(str(path)), reason, detail or SKIP_DETAILS.get(reason, ""))

    def _entries(self, directory: Path, result: WalkResult):
        try:
            with os.scandir(directory) as it:
                return iter(sorted(it, key=lambda e: e.name))
        except OSError as exc:
            self._skip(result, directory, "unreadable", exc)
            return iter(())

    def _walk_dir(self, root, directory, result, seen_dirs, seen_files) -> None:
        # a stack of the open directories' remaining entries, not recursion: a tree deeper than
        # Python's recursion limit (~1,000 levels) would otherwise fail the whole walk
        stack = [self._entries(directory, result)]
        while stack:
            entry = next(stack[-1], None)
            if entry is None:
                stack.pop()
                continue
            path = Path(entry.path)
            try:
                is_link = entry.is_symlink()
                if is_link and not self.config.follow_symlinks:
                    self._skip(result, path, "symlink")
                    continue
                st = os.stat(path)  # follows symlinks
                if is_link and (reason := self._link_reason(os.path.realpath(path))):
                    self._skip(result, path, reason)
                    continue
            except FileNotFoundError:
                self._skip(result, path, "broken_symlink" if os.path.islink(path) else "vanished")
                continue
            except OSError as exc:
                reason = "symlink_loop" if exc.errno == errno.ELOOP else "unreadable"
                self._skip(result, path, reason, exc)
                continue
            is_dir = stat.S_ISDIR(st.st_mode)
            reason = self.entry_reason(root, path, is_dir)
            if reason:
                self._skip(result, path, reason)
                continue
            if is_dir:
                key = (st.st_dev, st.st_ino)
                if key in seen_dirs:
                    self._skip(result, path, "symlink_loop" if is_link else "duplicate_dir")
                    continue
                seen_dirs.add(key)
                stack.append(self._entries(path, result))
            elif stat.S_ISREG(st.st_mode):
                if st.st_size > self.raw_limit(path):
                    self._skip(result, path, "too_large", st.st_size)
                    continue
                if is_link:
                    real = os.path.realpath(path)
                    if real in seen_files:
                        self._skip(result, path, "duplicate_file")
                        continue
                    seen_files.add(real)
                result.files.append(FileEntry(str(path), st.st_mtime, st.st_size))
            else:
                self._skip(result, path, "not_regular")

    def raw_limit(self, path: str | Path) -> int:
        """The most bytes a file may have on disk: max_file_bytes, and for a notebook NOTEBOOK_RAW_FACTOR
        times that (its plots' base64 and printed outputs are no code: its code cells must fit max_file_bytes)."""
        return self.config.max_file_bytes * (NOTEBOOK_RAW_FACTOR if is_notebook(str(path)) else 1)

    # ---- reading ------------------------------------------------------
    def read(self, path: str, overlay: str | None = None) -> tuple[SourceFile | None, str | None]:
        """Read one file (or its unsaved overlay text); returns (file, None) or (None, reason)."""
        if overlay is not None and is_notebook(path):  # an editor showing the notebook's JSON as text
            overlay = notebook_code(overlay)
            if overlay is None:
                return None, "bad_notebook"
        if overlay is not None:
            if self.content_is_secret(overlay):
                return None, "secret_content"
            return SourceFile(path, overlay, -1.0, len(overlay.encode("utf-8", "replace")), content_digest(overlay)), None
        try:
            st = os.stat(path)
            if not stat.S_ISREG(st.st_mode):
                return None, "not_regular"
            limit = self.raw_limit(path)
            if st.st_size > limit:
                return None, "too_large"
            with open(path, "rb") as fh:
                data = fh.read(limit + 1)
        except FileNotFoundError:
            return None, "vanished"
        except OSError as exc:
            return None, "symlink_loop" if exc.errno == errno.ELOOP else "unreadable"
        if len(data) > limit:
            return None, "too_large"
        if b"\0" in data[:_BINARY_SNIFF_BYTES]:
            return None, "binary"
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return None, "not_utf8"
        if text.startswith("\ufeff"):
            text = text[1:]
        if is_notebook(path):
            text = notebook_code(text)
            if text is None:
                return None, "bad_notebook"
            if len(text.encode("utf-8", "replace")) > self.config.max_file_bytes:
                return None, "too_large"
        if self.content_is_secret(text):
            return None, "secret_content"
        return SourceFile(path, text, st.st_mtime, st.st_size, content_digest(text)), None
