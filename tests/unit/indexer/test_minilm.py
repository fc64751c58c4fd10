import numpy as np

from indexer.dense import SentenceTransformerEmbedder, make_embedder, minilm_model_dir


def test_minilm_from_the_wheel_loads_offline():
    emb = make_embedder("minilm", minilm_model_dir())
    assert isinstance(emb, SentenceTransformerEmbedder) and emb.dim == 384 and emb.name == "st:all-MiniLM-L6-v2"
    vecs = emb.embed(["open a socket to the server", "connect to a network host", "bake a chocolate cake"])
    assert vecs.shape == (3, 384) and np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert vecs[0] @ vecs[1] > vecs[0] @ vecs[2]
    # any sentence-transformers directory works by path too
    assert make_embedder(str(minilm_model_dir()), minilm_model_dir()).dim == 384
