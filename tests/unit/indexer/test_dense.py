import numpy as np
import pytest

from indexer.dense import Embedder, make_embedder, normalise
from indexer.vectors import VectorMatrix

from .conftest import write


def test_vector_matrix_topk_remove_and_slot_reuse():
    rng = np.random.default_rng(0)
    vecs = normalise(rng.normal(size=(50, 16)))
    m = VectorMatrix(16, capacity=4)
    m.add(list(range(50)), vecs)
    hits = m.search(vecs[7], 3)
    assert hits[0].chunk_id == 7 and hits[0].score == pytest.approx(1.0, abs=1e-5)
    assert [h.chunk_id for h in m.search(vecs[7], 3, exclude={7})][0] != 7
    m.remove([7])
    assert 7 not in [h.chunk_id for h in m.search(vecs[7], 50)]
    m.add([100], vecs[7:8])
    assert len(m) == 50 and m.search(vecs[7], 1)[0].chunk_id == 100
    brute = np.argsort(-(vecs @ vecs[3]))[:10]
    assert [h.chunk_id for h in m.search(vecs[3], 10)][:5] == [int(i) if i != 7 else 100 for i in brute[:5]]


def test_bfloat16_scan_with_exact_rescoring_matches_float32_search(monkeypatch):
    """Past BF16_MIN_ROWS the scan runs on a bfloat16 mirror; the hits and scores must be the
    float32 ones, also after removals, re-adds (dirty rows patched) and growth (mirror rebuilt)."""
    pytest.importorskip("torch")
    import indexer.vectors as vectors

    rng = np.random.default_rng(1)
    vecs = normalise(rng.normal(size=(3000, 32))).astype(np.float32)
    m = VectorMatrix(32, capacity=1024)
    m.add(list(range(2000)), vecs[:2000])
    queries = normalise(rng.normal(size=(20, 32))).astype(np.float32)

    def both(q, k=10, exclude=None):
        monkeypatch.setattr(vectors, "BF16_MIN_ROWS", 10**9)
        exact = m.search(q, k, exclude)
        monkeypatch.setattr(vectors, "BF16_MIN_ROWS", 100)
        fast = m.search(q, k, exclude)
        return exact, fast

    def check():
        for q in queries:
            exact, fast = both(q, exclude={1, 2, 3})
            assert [h.chunk_id for h in fast] == [h.chunk_id for h in exact]
            assert [h.score for h in fast] == pytest.approx([h.score for h in exact], abs=1e-6)

    check()
    assert m._bf16 is not None  # the mirror was used
    m.remove(list(range(0, 2000, 3)))  # freed slots are masked in the mirror too
    m.add([5000 + i for i in range(300)], vecs[2000:2300])  # reuses freed slots: dirty rows
    check()
    m.add([9000 + i for i in range(700)], vecs[2300:3000])  # grows past capacity: rebuilt
    check()
    for cid in (9000, 5000, 4):  # a stored vector is its own best hit through the mirror
        hit = m.search(m.get(cid), 1)[0]
        assert hit.chunk_id == cid and hit.score == pytest.approx(1.0, abs=1e-5)


def test_make_embedder_none_and_unknown(tmp_path):
    assert make_embedder("none", tmp_path) is None
    with pytest.raises(ValueError):
        make_embedder(str(tmp_path / "missing"), tmp_path)


def test_model2vec_embedder_is_real_and_normalised(model2vec_embedder):
    emb = model2vec_embedder
    assert isinstance(emb, Embedder) and emb.dim == 256
    vecs = emb.embed(["def read_json_file(path): return json.load(open(path))",
                      "load a JSON document from a file on disk",
                      "class TcpServer: listen on a network socket"])
    assert vecs.shape == (3, 256) and vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert vecs[0] @ vecs[1] > vecs[0] @ vecs[2]
    assert emb.embed([]).shape == (0, 256)


def test_index_with_model2vec_dense_search(workspace, make_index, model2vec_embedder):
    write(workspace, "net.py", "def open_socket_connection(host, port):\n    return socket.create_connection((host, port))\n")
    write(workspace, "img.py", "def resize_image(img, width, height):\n    return img.resize((width, height))\n")
    index = make_index(workspace, embedder=model2vec_embedder)
    index.build()
    assert index.search("connect to a network server", 1, mode="dense")[0].path.endswith("net.py")
    assert index.search("scale a picture", 1, mode="dense")[0].path.endswith("img.py")
