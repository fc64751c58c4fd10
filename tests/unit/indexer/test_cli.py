import io
import json

import pytest

from indexer import IndexConfig
from indexer.cli import index_command, search_command

from .conftest import write


@pytest.fixture
def cfg(tmp_path):
    return IndexConfig(cache_dir=tmp_path / "cli-cache", embedder="none")


def test_index_command_json_summary(workspace, cfg):
    write(workspace, "a.py", "def alpha():\n    pass\n")
    write(workspace, "big.bin", b"\x00" * 10)
    out = io.StringIO()
    summary = index_command(workspace, json=True, config=cfg, out=out)
    data = json.loads(out.getvalue())
    assert data == summary
    assert data["files"] == 1 and data["chunks"] == 1 and data["chars"] > 0
    assert data["skipped"] == {"binary": 1} and data["seconds"] >= 0


def test_search_command_json_and_queries_file(workspace, tmp_path, cfg):
    write(workspace, "pkg/a.py", "def alpha():\n    pass\n")
    write(workspace, "pkg/b.py", "def beta():\n    pass\n")
    out = io.StringIO()
    search_command(workspace, "alpha", k=5, mode="bm25", json=True, config=cfg, out=out)
    (line,) = out.getvalue().splitlines()
    assert json.loads(line) == {"results": [{"path": "pkg/a.py", "start_line": 1, "end_line": 2,
                                             "score": json.loads(line)["results"][0]["score"]}]}
    queries = tmp_path / "q.jsonl"
    queries.write_text(json.dumps("alpha") + "\n" + json.dumps("beta") + "\n")
    out = io.StringIO()
    search_command(workspace, queries_file=queries, k=1, mode="bm25", json=True, config=cfg, out=out)
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [r["results"][0]["path"] for r in lines] == ["pkg/a.py", "pkg/b.py"]
    with pytest.raises(ValueError):
        search_command(workspace, config=cfg)


def test_bench_retrieval_on_tiny_package(workspace, model2vec_embedder):
    from indexer.bench import bench_retrieval

    write(workspace, "pkg/__init__.py", "")
    write(workspace, "pkg/shapes.py", "def circle_area(r):\n    return 3.14159 * r * r\n\n\nclass Square:\n    pass\n")
    write(workspace, "pkg/main.py", "from .shapes import circle_area, Square\n\n\ndef total(rs):\n"
                                    "    s = Square()\n    return sum(circle_area(r) for r in rs)\n")
    result = bench_retrieval(workspace)
    assert result["tasks"] == 2
    assert set(result["modes"]) == {"bm25", "dense", "hybrid", "definitions"}
    assert result["modes"]["definitions"]["recall@1"] == 1.0
    assert set(result["modes"]["bm25"]) == {"recall@1", "recall@5", "recall@10"}


def test_bench_index_reports_how_many_samples_each_percentile_has(workspace, model2vec_embedder):
    from indexer.bench import bench_index

    for i in range(6):
        write(workspace, f"pkg/m{i}.py", "".join(f"def f{i}_{j}(x):\n    return x + {j}\n\n\n" for j in range(60)))
    result = bench_index(workspace, updates=4, queries=7)
    assert result["samples"] == {"updates": 4, "buffer_edits": 20, "queries": 7}
    assert result["updates_searchable"] == "4/4"
    assert result["update_p99_ms"] >= result["update_p50_ms"] > 0
