"""SQLite (WAL) persistence of files, chunks, token strings, vectors and symbols; one transaction per batch of whole files."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from .models import Chunk, Symbol

log = logging.getLogger(__name__)

SCHEMA_VERSION = "2"

# Chunk positions and chunk contents live in separate tables so that an edit which only moves
# chunks (lines inserted above them) rewrites a few small rows, not every chunk's text.
_TABLES = ("files", "chunks", "chunk_text", "vectors", "symbols")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS files(
    path TEXT PRIMARY KEY, mtime REAL NOT NULL, size INTEGER NOT NULL, digest TEXT NOT NULL, language TEXT);
CREATE TABLE IF NOT EXISTS chunks(
    id INTEGER PRIMARY KEY AUTOINCREMENT, path TEXT NOT NULL, start_line INTEGER NOT NULL,
    end_line INTEGER NOT NULL, kind TEXT NOT NULL, name TEXT);
CREATE INDEX IF NOT EXISTS chunks_path ON chunks(path);
CREATE TABLE IF NOT EXISTS chunk_text(id INTEGER PRIMARY KEY, header TEXT NOT NULL, text TEXT NOT NULL,
    tokens TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS vectors(chunk_id INTEGER PRIMARY KEY, vec BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS symbols(
    name TEXT NOT NULL, kind TEXT NOT NULL, path TEXT NOT NULL, start_line INTEGER NOT NULL,
    end_line INTEGER NOT NULL, container TEXT, chunk_id INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS symbols_name ON symbols(name);
CREATE INDEX IF NOT EXISTS symbols_path ON symbols(path);
"""


def is_corrupt(exc: sqlite3.DatabaseError) -> bool:
    """A store file that is no database or a damaged one; not one that is locked or read-only."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return type(exc) is sqlite3.DatabaseError
    return code & 0xFF in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def is_unwritable(exc: BaseException) -> bool:
    """The store's file cannot be created or written (a cache directory that cannot be made, a
    read-only file or disk, a full disk); not a locked or corrupt one."""
    if isinstance(exc, OSError):
        return True
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_IOERR,
                                                 sqlite3.SQLITE_FULL, sqlite3.SQLITE_PERM)


@dataclass(frozen=True)
class FileState:
    mtime: float
    size: int
    digest: str


@dataclass(frozen=True)
class FileRecord:
    """Everything persisted for one file in one update."""

    path: str
    mtime: float
    size: int
    digest: str
    language: str | None
    chunks: list[Chunk]
    tokens: list[str]  # one whitespace-joined token string per chunk
    symbols: list[Symbol]  # chunk_index refers into chunks
    vectors: np.ndarray | None  # (len(chunks), dim) or None
    # per chunk: the id of this file's stored chunk with the same text to keep (its position is
    # updated, its text, tokens and vector stay), or -1 for a new row. None: replace every chunk.
    reuse: list[int] | None = None


@dataclass(frozen=True)
class StoredChunk:
    chunk: Chunk
    tokens: str
    vector: np.ndarray | None


class Store:
    """The on-disk index. Thread-safe (one connection behind a lock).

    Where its file cannot be created or written (the cache directory cannot be made, a read-only or
    full disk) it goes on in memory for this process (``persistent`` False), with one warning: the
    index still serves, it is just not saved.
    """

    def __init__(self, directory: Path, embedder_name: str, dim: int, content: str | None = None):
        """``content``: a fingerprint of the settings that decide what is read and how it is chunked;
        a store written under another one is cleared (None: not checked)."""
        self.directory = Path(directory)
        self.path = self.directory / "index.sqlite3"
        self.persistent = True
        self._lock = threading.Lock()
        self._settings = (embedder_name, dim, content)
        # the state of each file as this store read it at the start or wrote it since (what the index holds
        # in memory): rows another process wrote, changed or deleted meanwhile (a second server on the same
        # workspace) do not decide what this index's build reads again
        self._known: dict[str, FileState] = {}
        self._last_chunk_id = 0  # the highest chunk id read or written: an empty database in memory goes on above it
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            try:
                self._open(embedder_name, dim, content)
            except sqlite3.DatabaseError as exc:
                if not is_corrupt(exc):
                    raise
                self.reset(exc)
        except (OSError, sqlite3.DatabaseError) as exc:
            if not is_unwritable(exc):
                raise
            self._to_memory(exc, keep=False)

    def _to_memory(self, exc: BaseException, keep: bool) -> None:
        """Go on in an in-memory database, with what the file holds when ``keep`` (a write that failed
        part way through: the file stays as its last transaction left it)."""
        log.warning("index store %s cannot be written (%s): this session's index is kept in memory only "
                    "(not saved; the next start indexes again)", self.path, exc)
        old = getattr(self, "_db", None)
        memory = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        copied = False
        if old is not None:
            with contextlib.suppress(Exception):
                if old.in_transaction:
                    old.execute("ROLLBACK")
            if keep:
                with contextlib.suppress(sqlite3.Error):
                    old.backup(memory)
                    copied = True
            with contextlib.suppress(Exception):
                old.close()
        self.persistent = False
        self._db = memory
        if not keep:
            self._open(*self._settings)
        elif not copied:  # nothing to go on from: empty tables, and every file counts as not indexed here
            memory.executescript("CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);" + _SCHEMA)
            memory.execute("INSERT INTO sqlite_sequence(name, seq) VALUES('chunks', ?)", (self._last_chunk_id,))
            self._known.clear()

    def reset(self, exc: BaseException) -> None:
        """Replace a corrupt store file (overwritten, truncated) by an empty store: everything in it can
        be read and embedded again, and without it every start would fail to open the index."""
        log.warning("index store %s is unreadable (%s); deleting it and indexing from scratch", self.path, exc)
        with contextlib.suppress(Exception):
            self._db.close()
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        self._open(*self._settings)

    def _open(self, embedder_name: str, dim: int, content: str | None) -> None:
        if self.persistent:
            self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        stored_content = self._meta("content")
        if self._meta("schema") not in (None, SCHEMA_VERSION):
            log.warning("index schema changed; clearing %s", self.path)
            self._drop_tables()
        elif content is not None and stored_content != content:
            # build() re-reads only files whose mtime/size changed, so rows made under other secret,
            # limit or chunk settings would stay (a secret now excluded would stay searchable).
            # A store from before fingerprints (None) is cleared too: what made it is unknown.
            if stored_content is not None:
                log.warning("index content settings changed; clearing %s", self.path)
            self._drop_tables()
        self._db.executescript(_SCHEMA)
        self._dim = dim
        self._check_meta(embedder_name, dim, content)

    def read_all(self) -> tuple[dict[str, "FileState"], list["StoredChunk"], list[Symbol]]:
        """Everything the index loads at start, read before any of it is used: a corrupt store found
        here is reset (empty) instead of failing the start or leaving half of it loaded."""
        try:
            states = self.file_states(known_only=False)
            loaded = states, list(self.iter_chunks()), self.symbols()
        except sqlite3.DatabaseError as exc:
            if not is_corrupt(exc):
                raise
            self.reset(exc)
            return {}, [], []
        with self._lock:
            self._known = dict(states)
            self._last_chunk_id = max((s.chunk.id for s in loaded[1]), default=0)
        return loaded

    def _drop_tables(self) -> None:
        self._db.executescript("".join(f"DROP TABLE IF EXISTS {t};" for t in _TABLES))

    def _meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def _check_meta(self, embedder_name: str, dim: int, content: str | None) -> None:
        with self._lock:
            space = f"{embedder_name}:{dim}"
            if self._meta("vector_space") != space:
                if self._meta("vector_space") is not None:
                    log.info("embedder changed to %s; stored vectors dropped", space)
                self._db.execute("DELETE FROM vectors")
            self._db.execute("INSERT OR REPLACE INTO meta VALUES('schema', ?)", (SCHEMA_VERSION,))
            self._db.execute("INSERT OR REPLACE INTO meta VALUES('vector_space', ?)", (space,))
            if content is not None:
                self._db.execute("INSERT OR REPLACE INTO meta VALUES('content', ?)", (content,))

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ---- reads ------------------------------------------------------------
    def file_states(self, known_only: bool = True) -> dict[str, FileState]:
        """The stored files' states; ``known_only``: only those this store read or wrote (above)."""
        with self._lock:
            if known_only:  # what this index holds, whatever another process wrote to the file since
                return dict(self._known)
            rows = self._db.execute("SELECT path, mtime, size, digest FROM files").fetchall()
        return {p: FileState(m, s, d) for p, m, s, d in rows}

    def iter_chunks(self) -> Iterator[StoredChunk]:
        with self._lock:
            rows = self._db.execute(
                "SELECT c.id, c.path, c.start_line, c.end_line, c.kind, c.name, t.header, t.text, t.tokens, v.vec "
                "FROM chunks c JOIN chunk_text t ON t.id = c.id LEFT JOIN vectors v ON v.chunk_id = c.id "
                "ORDER BY c.id"
            ).fetchall()
        for cid, path, s, e, kind, name, header, text, tokens, blob in rows:
            vec = np.frombuffer(blob, dtype=np.float32) if blob is not None else None
            if vec is not None and vec.shape[0] != self._dim:
                vec = None
            yield StoredChunk(Chunk(path, s, e, text, kind, name, 0.0, header, cid), tokens, vec)

    def symbols(self) -> list[Symbol]:
        with self._lock:
            rows = self._db.execute(
                "SELECT name, kind, path, start_line, end_line, container, chunk_id FROM symbols"
            ).fetchall()
        return [Symbol(n, k, p, s, e, c, -1, cid) for n, k, p, s, e, c, cid in rows]

    # ---- writes -----------------------------------------------------------
    def write_files(self, records: list[FileRecord], removals: Sequence[str] = ()) -> list[list[int]]:
        """Delete the ``removals`` then replace each record's file, all in one transaction (a crash or
        an error leaves the whole batch old). Returns the records' chunk ids."""
        if not records and not removals:
            return []

        def write(cur: sqlite3.Cursor) -> list[list[int]]:
            for path in removals:
                self._delete_path(cur, path)
            return [self._write_file(cur, rec) for rec in records]

        all_ids = self._transaction(write)
        with self._lock:
            for path in removals:
                self._known.pop(path, None)
            for rec in records:
                self._known[rec.path] = FileState(rec.mtime, rec.size, rec.digest)
        return all_ids

    def _transaction(self, work) -> Any:
        """``work(cursor)`` in one write transaction; once more in memory where the file cannot be
        written (a full disk: every file of a build failed one by one, and the index lacked them)."""
        with self._lock:
            try:
                return self._run_transaction(work)
            except (OSError, sqlite3.DatabaseError) as exc:
                if not self.persistent or not is_unwritable(exc):
                    raise
                self._to_memory(exc, keep=True)
                return self._run_transaction(work)

    def _run_transaction(self, work) -> Any:
        cur = self._db.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            result = work(cur)
            cur.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:  # SQLite ends some on its own (a full disk): ROLLBACK would fail then
                with contextlib.suppress(sqlite3.Error):
                    cur.execute("ROLLBACK")
            raise
        return result

    def _write_file(self, cur: sqlite3.Cursor, rec: FileRecord) -> list[int]:
        old: dict[int, tuple] = {}
        if rec.reuse is not None:
            old = {row[0]: row[1:] for row in cur.execute(
                "SELECT id, start_line, end_line, kind, name FROM chunks WHERE path=?", (rec.path,))}
        keep = {cid for cid in (rec.reuse or ()) if cid in old}
        gone = [(cid,) for cid in old if cid not in keep]
        if rec.reuse is None:
            self._delete_path(cur, rec.path)
        else:
            cur.executemany("DELETE FROM vectors WHERE chunk_id=?", gone)
            cur.executemany("DELETE FROM chunk_text WHERE id=?", gone)
            cur.executemany("DELETE FROM chunks WHERE id=?", gone)
            cur.execute("DELETE FROM symbols WHERE path=?", (rec.path,))
        ids: list[int] = []
        moved = []
        for i, (chunk, tokens) in enumerate(zip(rec.chunks, rec.tokens)):
            cid = rec.reuse[i] if rec.reuse is not None else -1
            if cid in keep:
                position = (chunk.start_line, chunk.end_line, chunk.kind, chunk.name)
                if old[cid] != position:
                    moved.append((*position, cid))
                ids.append(cid)
                continue
            cur.execute(
                "INSERT INTO chunks(path, start_line, end_line, kind, name) VALUES(?,?,?,?,?)",
                (rec.path, chunk.start_line, chunk.end_line, chunk.kind, chunk.name),
            )
            cid = int(cur.lastrowid)
            self._last_chunk_id = max(self._last_chunk_id, cid)
            cur.execute("INSERT INTO chunk_text VALUES(?,?,?,?)", (cid, chunk.header, chunk.text, tokens))
            if rec.vectors is not None:
                vec = np.ascontiguousarray(rec.vectors[i], dtype=np.float32)
                cur.execute("INSERT INTO vectors VALUES(?, ?)", (cid, vec.tobytes()))
            ids.append(cid)
        if moved:
            cur.executemany("UPDATE chunks SET start_line=?, end_line=?, kind=?, name=? WHERE id=?", moved)
        cur.executemany(
            "INSERT INTO symbols VALUES(?,?,?,?,?,?,?)",
            [
                (s.name, s.kind, rec.path, s.start_line, s.end_line, s.container,
                 ids[s.chunk_index] if 0 <= s.chunk_index < len(ids) else -1)
                for s in rec.symbols
            ],
        )
        cur.execute(
            "INSERT OR REPLACE INTO files VALUES(?,?,?,?,?)",
            (rec.path, rec.mtime, rec.size, rec.digest, rec.language),
        )
        return ids

    @staticmethod
    def _delete_path(cur: sqlite3.Cursor, path: str) -> None:
        cur.execute("DELETE FROM vectors WHERE chunk_id IN (SELECT id FROM chunks WHERE path=?)", (path,))
        cur.execute("DELETE FROM chunk_text WHERE id IN (SELECT id FROM chunks WHERE path=?)", (path,))
        cur.execute("DELETE FROM chunks WHERE path=?", (path,))
        cur.execute("DELETE FROM symbols WHERE path=?", (path,))
        cur.execute("DELETE FROM files WHERE path=?", (path,))

    def delete_files(self, paths: list[str]) -> None:
        self.write_files([], paths)

    def set_file_state(self, path: str, mtime: float, size: int) -> None:
        self._transaction(lambda cur: cur.execute("UPDATE files SET mtime=?, size=? WHERE path=?", (mtime, size, path)))
        with self._lock:
            if (known := self._known.get(path)) is not None:
                self._known[path] = FileState(mtime, size, known.digest)

    def put_vectors(self, chunk_ids: list[int], vectors: np.ndarray) -> None:
        rows = [(cid, np.ascontiguousarray(v, dtype=np.float32).tobytes()) for cid, v in zip(chunk_ids, vectors)]
        self._transaction(lambda cur: cur.executemany("INSERT OR REPLACE INTO vectors VALUES(?, ?)", rows))
