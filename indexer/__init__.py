"""draftline workspace indexer: discovery, chunking, BM25 + dense retrieval, symbols, persistence, watching.

Knows nothing of LSP or the completion engine. Main entry point: :class:`Index`.
"""

from .config import IndexConfig
from .dense import Embedder, Model2VecEmbedder, SentenceTransformerEmbedder
from .index import Index
from .models import Chunk, IndexStats, Symbol
from .watch import Watcher, watch_index

__all__ = [
    "Chunk",
    "Embedder",
    "Index",
    "IndexConfig",
    "IndexStats",
    "Model2VecEmbedder",
    "SentenceTransformerEmbedder",
    "Symbol",
    "Watcher",
    "watch_index",
]
