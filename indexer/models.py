"""Value types shared across the indexer: Chunk, Symbol, ChunkedFile, IndexStats."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Chunk:
    """A contiguous piece of one file. Lines are 1-based and inclusive.

    ``header`` is the context line indexed with the text (relative path,
    enclosing class, definition name); ``text`` is the verbatim source.
    """

    path: str
    start_line: int
    end_line: int
    text: str
    kind: str  # function, method, class, module, window, ...
    name: str | None = None
    score: float = 0.0
    header: str = ""
    id: int = -1  # store id; -1 until persisted

    @property
    def indexed_text(self) -> str:
        return f"{self.header}\n{self.text}" if self.header else self.text


@dataclass(frozen=True)
class Symbol:
    """A definition found by the tree-sitter pass (function, class, method, module-level name)."""

    name: str
    kind: str
    path: str
    start_line: int
    end_line: int
    container: str | None = None  # enclosing class/impl/namespace, dotted
    chunk_index: int = -1  # index into the file's chunk list
    chunk_id: int = -1  # store id of that chunk


@dataclass(frozen=True)
class ChunkedFile:
    chunks: list[Chunk]
    symbols: list[Symbol]
    language: str | None


@dataclass(frozen=True)
class IndexStats:
    """Status numbers for the LSP status request and the CLI summary."""

    files: int
    chunks: int
    chars: int
    symbols: int
    vectors: int
    skipped: dict[str, int] = field(default_factory=dict)
    last_index_seconds: float = 0.0
    pending: int = 0
    embedder: str = ""
    cache_dir: str = ""
