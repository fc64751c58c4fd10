import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from indexer import Index, IndexConfig

from .conftest import write
from .fakes import FakeEmbedder

REPO = Path(__file__).resolve().parents[3]

CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {repo!r})
    from indexer import Index, IndexConfig
    from tests.unit.indexer.fakes import FakeEmbedder
    index = Index([{ws!r}], IndexConfig(cache_dir={cache!r}, embed_batch=8), embedder=FakeEmbedder(delay_s=0.05))
    index.build(progress=lambda done, total, msg: print(done, total, flush=True))
    print("DONE", flush=True)
""")


def snapshot(index: Index, ws: Path):
    chunks = sorted((os.path.relpath(c.path, ws), c.start_line, c.end_line, c.text)
                    for cid in list(index._chunks) for c in [index.chunk(cid)])
    symbols = sorted((s.name, s.kind, os.path.relpath(s.path, ws), s.start_line)
                     for name in list(index._symbols) for s in index.definitions(name))
    return chunks, symbols


def test_sigkill_mid_build_leaves_a_consistent_index(workspace, tmp_path):
    for i in range(200):
        write(workspace, f"pkg/mod_{i:03d}.py", f"def function_{i}(x):\n    return x + {i}\n\n\nclass Thing{i}:\n    pass\n")
    cache = tmp_path / "killed-cache"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(repo=str(REPO), ws=str(workspace), cache=str(cache))],
        stdout=subprocess.PIPE, text=True, cwd=str(REPO),
    )
    killed_at = None
    try:
        for line in child.stdout:
            parts = line.split()
            if parts and parts[0] == "DONE":
                break
            if len(parts) == 2 and 40 <= int(parts[0]) < int(parts[1]):
                killed_at = int(parts[0])
                os.kill(child.pid, signal.SIGKILL)
                break
    finally:
        child.wait(timeout=60)
    assert killed_at is not None, "child finished before it could be killed"

    resumed_embedder = FakeEmbedder()
    resumed = Index([workspace], IndexConfig(cache_dir=cache), embedder=resumed_embedder)
    partially, kept_chunks = resumed.stats().files, resumed.stats().chunks
    assert 0 < partially < 200  # the killed run kept whole files only
    resumed.build()
    fresh_embedder = FakeEmbedder()
    fresh = Index([workspace], IndexConfig(cache_dir=tmp_path / "fresh-cache"), embedder=fresh_embedder)
    fresh.build()
    try:
        # the files done before the kill were not redone: only the other files' chunks were embedded
        assert fresh_embedder.texts == fresh.stats().chunks == 400  # two chunks a file: the function, the class
        assert kept_chunks == 2 * partially
        assert resumed_embedder.texts == 400 - kept_chunks
        assert snapshot(resumed, workspace) == snapshot(fresh, workspace)
        assert resumed.stats().files == fresh.stats().files == 200
        assert resumed.stats().vectors == resumed.stats().chunks
        assert [c.path for c in resumed.search("function_150", 1, mode="bm25")] == \
               [c.path for c in fresh.search("function_150", 1, mode="bm25")]
    finally:
        resumed.close()
        fresh.close()
