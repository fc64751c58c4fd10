"""Fixtures for the indexer tests: tmp workspaces, a fake embedder, one shared real model2vec embedder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from indexer import Index, IndexConfig  # noqa: E402

from .fakes import FakeEmbedder  # noqa: E402


def write(root: Path, rel: str, text: str | bytes) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def workspace(tmp_path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
def fake_embedder() -> FakeEmbedder:
    return FakeEmbedder()


@pytest.fixture
def make_index(tmp_path, fake_embedder):
    """Factory: make_index(ws, **config) -> Index with the fake embedder and a tmp cache dir."""
    made: list[Index] = []

    def factory(ws: Path, embedder=fake_embedder, cache: Path | None = None, **config) -> Index:
        cfg = IndexConfig(cache_dir=cache or tmp_path / "cache", **config)
        index = Index([ws], cfg, embedder=embedder)
        made.append(index)
        return index

    yield factory
    for index in made:
        try:
            index.close()
        except Exception:
            pass


@pytest.fixture(scope="session")
def model2vec_embedder():
    """The real default embedder, distilled once into the user's model cache (10-40 s the first time)."""
    from indexer.dense import Model2VecEmbedder

    return Model2VecEmbedder(IndexConfig().resolved_model_cache_dir(), dims=256)
