"""Incremental BM25 index over pre-tokenized chunks, backed by an in-memory tantivy index.

Chunks are tokenized with :func:`indexer.tokens.code_tokens` and handed to tantivy as
whitespace-separated text with a whitespace-only analyzer, so queries and documents go
through exactly the same tokenizer. A file's chunks are replaced with one
delete-by-term plus adds and a commit; there is never a rebuild. The tantivy index is
rebuilt from the SQLite store at start (token strings are stored there), so it is
never the source of truth.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass

import tantivy

from .tokens import code_tokens

log = logging.getLogger(__name__)

_ANALYZER = "draftline_ws"


@dataclass(frozen=True)
class SparseHit:
    chunk_id: int
    score: float


def chunk_tokens(text: str) -> str:
    """The whitespace-joined token string stored and indexed for one chunk."""
    return " ".join(code_tokens(text))


class Bm25Index:
    """Thread-safe add/remove/search of chunk token strings, keyed by chunk id and grouped by path."""

    def __init__(self, df_cutoff: float = 0.05, max_query_tokens: int = 256, heap_bytes: int = 64_000_000):
        builder = tantivy.SchemaBuilder()
        builder.add_integer_field("id", stored=True, indexed=True, fast=True)
        builder.add_text_field("path", stored=False, tokenizer_name="raw", index_option="basic")
        builder.add_text_field("body", stored=False, tokenizer_name=_ANALYZER, index_option="freq")
        self._schema = builder.build()
        self._index = tantivy.Index(self._schema)
        self._index.register_tokenizer(_ANALYZER, tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.whitespace()).build())
        self._index.config_reader(reload_policy="manual")  # "commit" makes reload() wait up to ~100 ms
        self._writer = self._index.writer(heap_size=heap_bytes, num_threads=1)
        self._lock = threading.Lock()
        self._searcher = self._index.searcher()
        self._dirty = False
        self.df_cutoff = df_cutoff
        self.max_query_tokens = max_query_tokens

    # ---- writes (call commit() after a batch) ----------------------------
    def add(self, chunk_id: int, path: str, tokens: str) -> None:
        doc = tantivy.Document()
        doc.add_integer("id", chunk_id)
        doc.add_text("path", path)
        doc.add_text("body", tokens)
        with self._lock:
            self._writer.add_document(doc)
            self._dirty = True

    def remove_path(self, path: str) -> None:
        with self._lock:
            self._writer.delete_documents_by_term("path", path)
            self._dirty = True

    def remove_ids(self, chunk_ids) -> None:
        """Remove single chunks (the ones of an edited file whose text changed)."""
        with self._lock:
            for cid in chunk_ids:
                self._writer.delete_documents_by_term("id", int(cid))
                self._dirty = True

    def commit(self) -> None:
        with self._lock:
            if not self._dirty:
                return
            self._writer.commit()
            self._index.reload()
            self._searcher = self._index.searcher()
            self._dirty = False

    def close(self) -> None:
        with self._lock:
            self._writer.wait_merging_threads()

    @property
    def num_docs(self) -> int:
        return self._searcher.num_docs

    # ---- queries --------------------------------------------------------
    def query_terms(self, text: str) -> Counter:
        """Distinct query tokens (the last ``max_query_tokens``), minus those too common to help."""
        tokens = code_tokens(text)
        counts: Counter = Counter()
        for tok in reversed(tokens):
            if tok in counts or len(counts) < self.max_query_tokens:
                counts[tok] += 1
        return counts

    def containing(self, word: str, k: int, exclude_path: str | None = None) -> list[int]:
        """Ids of up to ``k`` chunks that hold the identifier ``word`` (as a whole token), fewest tokens
        around it first (BM25 of the one term)."""
        term = word.lower()
        if k <= 0 or not term or len(term) > 200:
            return []
        searcher = self._searcher
        q = tantivy.Query.term_query(self._schema, "body", term, index_option="freq")
        if exclude_path is not None:
            q = tantivy.Query.boolean_query([
                (tantivy.Occur.Must, q),
                (tantivy.Occur.MustNot, tantivy.Query.term_query(self._schema, "path", exclude_path)),
            ])
        hits = searcher.search(q, limit=k, count=False).hits
        if not hits:
            return []
        ids = searcher.fast_field_values("id", [addr for _, addr in hits])
        return [int(cid) for cid in ids if cid is not None]

    def search(self, text: str, k: int, exclude_path: str | None = None) -> list[SparseHit]:
        counts = self.query_terms(text)
        if not counts or k <= 0:
            return []
        searcher = self._searcher
        n = searcher.num_docs
        if n == 0:
            return []
        terms = list(counts.items())
        if self.df_cutoff > 0 and n >= 200:
            limit = self.df_cutoff * n
            dfs = {t: searcher.doc_freq("body", t) for t, _ in terms}
            kept = [(t, c) for t, c in terms if 0 < dfs[t] <= limit]
            if not kept:  # everything is common: keep the rarest few
                kept = sorted((tc for tc in terms if dfs[tc[0]] > 0), key=lambda tc: dfs[tc[0]])[:8]
            terms = kept
        if not terms:
            return []
        subqueries = []
        for term, count in terms:
            q = tantivy.Query.term_query(self._schema, "body", term, index_option="freq")
            if count > 1:
                q = tantivy.Query.boost_query(q, float(count))
            subqueries.append((tantivy.Occur.Should, q))
        if exclude_path is not None:
            subqueries.append((tantivy.Occur.MustNot, tantivy.Query.term_query(self._schema, "path", exclude_path)))
        query = tantivy.Query.boolean_query(subqueries)
        result = searcher.search(query, limit=k, count=False)
        hits = result.hits
        if not hits:
            return []
        ids = searcher.fast_field_values("id", [addr for _, addr in hits])
        return [SparseHit(int(cid), float(score)) for (score, _), cid in zip(hits, ids) if cid is not None]
