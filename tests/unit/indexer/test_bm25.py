import json
from pathlib import Path

from rank_bm25 import BM25Okapi

from indexer.bm25 import Bm25Index, chunk_tokens
from indexer.chunker import Chunker
from indexer.config import IndexConfig


def _corpus():
    """Real chunks from the json package of the running Python (small, present everywhere)."""
    chunker = Chunker(IndexConfig())
    docs = []
    for path in sorted(Path(json.__file__).parent.glob("*.py")):
        for c in chunker.chunk(str(path), path.read_text(encoding="utf-8")).chunks:
            docs.append((str(path), chunk_tokens(c.indexed_text)))
    return docs


QUERIES = [
    "decode a JSON document from a string",
    "encode float infinity allow_nan",
    "scanner make_scanner parse_object",
    "indent separators sort_keys dumps",
    "JSONDecodeError lineno colno",
    "py_scanstring unicode escape surrogate",
    "object_hook object_pairs_hook",
    "iterencode markers circular reference",
]


def test_rankings_agree_with_rank_bm25_reference():
    docs = _corpus()
    assert len(docs) > 30
    index = Bm25Index(df_cutoff=0.0)
    for i, (path, tokens) in enumerate(docs):
        index.add(i, path, tokens)
    index.commit()
    reference = BM25Okapi([t.split() for _, t in docs], k1=1.2, b=0.75)
    overlaps = []
    for q in QUERIES:
        ours = [h.chunk_id for h in index.search(q, 5)]
        qtok = list(dict.fromkeys(chunk_tokens(q).split()))
        scores = reference.get_scores(qtok)
        ref = sorted(range(len(docs)), key=lambda i: -scores[i])[:5]
        overlaps.append(len(set(ours) & set(ref)) / 5)
        assert ours[0] in ref[:3], q
    assert sum(overlaps) / len(overlaps) >= 0.8, overlaps


def test_incremental_add_remove_without_rebuild():
    index = Bm25Index()
    index.add(1, "/a.py", chunk_tokens("def alpha_handler(): pass"))
    index.add(2, "/b.py", chunk_tokens("def beta_handler(): pass"))
    index.commit()
    assert [h.chunk_id for h in index.search("alpha", 5)] == [1]
    index.remove_path("/a.py")
    index.add(3, "/a.py", chunk_tokens("def gamma(): pass"))
    index.commit()
    assert index.search("alpha", 5) == []
    assert [h.chunk_id for h in index.search("gamma handler", 5)][0] == 3
    assert [h.chunk_id for h in index.search("handler", 5, exclude_path="/b.py")] == []
    assert index.num_docs == 2


def test_common_tokens_are_dropped_from_queries():
    index = Bm25Index(df_cutoff=0.05)
    for i in range(300):
        index.add(i, f"/f{i}.py", chunk_tokens(f"def common_name(self): value_{i} = rare{i}"))
    index.commit()
    hits = index.search("self common_name rare7", 3)
    assert hits[0].chunk_id == 7
    assert index.search("self", 3)  # all-common query still answers


def test_containing_finds_a_whole_identifier_and_leaves_a_path_out():
    index = Bm25Index()
    index.add(1, "/a.py", chunk_tokens("class MIMEText(MIMENonMultipart):\n    pass"))
    index.add(2, "/b.py", chunk_tokens("x = MIMENonMultipart('audio')"))
    index.add(3, "/c.py", chunk_tokens("mime = non_multipart = 1  # the parts alone are not the name"))
    index.commit()
    assert sorted(index.containing("MIMENonMultipart", 5)) == [1, 2]
    assert index.containing("MIMENonMultipart", 5, exclude_path="/a.py") == [2]
    assert index.containing("Missing", 5) == [] and index.containing("", 5) == []
