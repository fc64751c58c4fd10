"""bench context: first-use tasks cut from a workspace, checked through the product path on the tiny pair."""

from __future__ import annotations

import argparse

import pytest

from lsp_server.bench.context import _first_use, _run, make_tasks
from tests.unit.lsp.test_digest import MAIN, SHAPES, UTIL  # noqa: F401 (the same small workspace)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One cache root for the module's indexes; each test's index is keyed by its own workspace path."""
    return tmp_path_factory.mktemp("cache")


def _isolate(monkeypatch, cache):
    """The indexes in ``cache``; the dense embedder from the user's model cache, where the indexer tests
    distil it once (a cache of the module's own distilled it again: ~20 s of every run)."""
    from indexer.config import IndexConfig

    models = IndexConfig().resolved_model_cache_dir()  # read before DRAFTLINE_CACHE_DIR moves the default
    monkeypatch.setenv("DRAFTLINE_CACHE_DIR", str(cache))
    config_home = cache / "config"
    (config_home / "draftline").mkdir(parents=True, exist_ok=True)
    (config_home / "draftline" / "config.toml").write_text(f"[index.options]\nmodel_cache_dir = {str(models)!r}\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config_home))


def workspace(root):
    (root / "geo").mkdir(parents=True)
    (root / "geo" / "__init__.py").write_text("")
    (root / "geo" / "shapes.py").write_text(SHAPES)
    (root / "geo" / "util.py").write_text(UTIL)
    (root / "app.py").write_text(
        "from geo.shapes import Shape, area_of\nimport json\n\n\n"
        "def make(n):\n    s = Shape('sq', n)\n    return area_of(s, 2.0)\n"
    )
    return root


def test_first_use_skips_imports_strings_and_comments():
    text = "from m import f\n# f here\nx = 'f'\ny = f(1)\n"
    assert text[_first_use(text, "/w/a.py", "f", 1):].startswith("f(1)")
    assert _first_use(text, "/w/a.py", "g", 1) is None


def test_tasks_and_report_through_the_product_path(tmp_path, monkeypatch, cache):
    _isolate(monkeypatch, cache)
    root = workspace(tmp_path / "ws")
    args = argparse.Namespace(workspace=root, tasks=10, seed=0, arms="none,retrieval,digest", no_model=False,
                              target="tiny", json=True)
    report = _run(args)
    assert report["tasks"] == 2  # Shape and area_of in app.py, cut where each is first used
    none, digest = report["arms"]["none"], report["arms"]["digest"]
    assert none["in_prompt"] == 0.0 and none["context_tokens_mean"] == 0.0
    assert digest["in_prompt"] == 1.0 and digest["context_tokens_mean"] > 0
    assert digest["missed"] == [] and "missed" not in none
    assert len(report["arms"]["retrieval"]["missed"]) == round((1 - report["arms"]["retrieval"]["in_prompt"]) * 2)
    assert {"exact", "edit_similarity", "name_first"} <= digest.keys()


def test_make_tasks_expects_the_rest_of_the_line(tmp_path):
    from indexer import Index
    from indexer.config import IndexConfig

    root = workspace(tmp_path / "ws")
    with Index([root], IndexConfig(cache_dir=str(tmp_path / "c")), embedder=None) as index:
        index.build()
        tasks = make_tasks(index, root, 10, 0)
    got = {t.name: (t.expected, t.signature) for t in tasks}
    assert got["Shape"] == ("Shape('sq', n)", "class Shape:")
    assert got["area_of"] == ("area_of(s, 2.0)", 'def area_of(shape: "Shape", scale: float = 1.0,')


def test_a_task_is_the_first_use_after_the_names_own_import_and_each_name_counts_once(tmp_path):
    from indexer import Index
    from indexer.config import IndexConfig

    root = workspace(tmp_path / "ws")
    (root / "app.py").write_text(
        "from geo.shapes import Shape\n\n\ndef make(n):\n    return Shape('sq', n)\n\n\n"
        "if __name__ == '__main__':\n    from geo.shapes import Shape, area_of\n\n    print(Shape('x', 1), area_of(None))\n"
    )
    with Index([root], IndexConfig(cache_dir=str(tmp_path / "c")), embedder=None) as index:
        index.build()
        tasks = make_tasks(index, root, 10, 0)
    got = {t.name: t.expected for t in tasks}
    assert len(tasks) == 2 and got == {"Shape": "Shape('sq', n)", "area_of": "area_of(None))"}


def test_a_norepo_arm_runs_the_same_arm_without_the_repository_name(tmp_path, monkeypatch, cache):
    _isolate(monkeypatch, cache)
    root = workspace(tmp_path / "ws")
    args = argparse.Namespace(workspace=root, tasks=10, seed=0, arms="none,none-norepo", no_model=False,
                              target="tiny", json=True, loss=True)
    report = _run(args)
    with_name, without = report["arms"]["none"], report["arms"]["none-norepo"]
    assert with_name["repo"] == "ws" and without["repo"] == ""
    assert with_name["answer_loss"] > 0 and without["answer_loss"] > 0
    # the tiny pair's template has no repository header: the same prompts, the same answers
    assert report["repo_name_effect"]["none"] == {"answers_changed": 0, "exact_gained": 0, "exact_lost": 0}
    assert with_name["answer_loss"] == without["answer_loss"]


def test_new_lines_replays_consecutive_lines_with_kept_and_fresh_snippets(tmp_path, monkeypatch, cache):
    from lsp_server.bench.context import _new_lines

    _isolate(monkeypatch, cache)
    root = workspace(tmp_path / "ws")
    body = "".join(f"def f{i}(x):\n    return area_of(Shape('s{i}', x), {i}.0)\n\n" for i in range(20))
    (root / "long.py").write_text("from geo.shapes import Shape, area_of\n\n" + body)
    args = argparse.Namespace(workspace=root, new_lines=5, seed=0, target="tiny", json=True)
    out = _new_lines(args)
    assert out["files"] == 1  # only long.py has the 40 lines a replay needs
    assert 4 <= out["lines"] <= 8  # 8 consecutive lines, blank ones skipped
    assert out["answers_differ"] <= out["snippet_lists_differ"] <= out["lines"]
    assert max(out["exact_kept"], out["exact_fresh"]) <= out["lines"]
    assert 0.0 <= out["similarity_kept"] <= 1.0 and 0.0 <= out["similarity_fresh"] <= 1.0


def test_a_bestfirst_arm_shows_the_same_snippets_in_the_other_order(tmp_path, monkeypatch, cache):
    from lsp_server.bench.context import _arm

    assert _arm("digest") == ("digest", True, True) and _arm("digest-norepo-bestfirst") == ("digest", False, False)
    _isolate(monkeypatch, cache)
    root = workspace(tmp_path / "ws")
    args = argparse.Namespace(workspace=root, tasks=10, seed=0, arms="digest,digest-bestfirst", no_model=True,
                              target="tiny", json=True)
    report = _run(args)
    a, b = report["arms"]["digest"], report["arms"]["digest-bestfirst"]
    assert a["in_prompt"] == b["in_prompt"] == 1.0 and a["context_tokens_mean"] == b["context_tokens_mean"]


def test_from_line_start_chooses_the_snippets_at_the_lines_start_and_answers_lists_each_task(tmp_path, monkeypatch, cache):
    from lsp_server.context import ContextFinder

    _isolate(monkeypatch, cache)
    root = workspace(tmp_path / "ws")
    chosen_at: list[str] = []
    choose = ContextFinder._choose

    def spy(self, ctx, *a, **k):
        chosen_at.append(ctx.line)
        return choose(self, ctx, *a, **k)

    monkeypatch.setattr(ContextFinder, "_choose", spy)
    for from_line_start, lines in ((False, {"    s = ", "    return "}), (True, {"    "})):
        chosen_at.clear()
        args = argparse.Namespace(workspace=root, tasks=10, seed=0, arms="digest", no_model=False, target="tiny",
                                  json=True, answers=True, from_line_start=from_line_start)
        report = _run(args)
        assert set(chosen_at) == lines  # the memo answers the cut's own request when chosen at the line's start
        assert [(a["name"], a["expected"]) for a in report["answers"]] == [("Shape", "Shape('sq', n)"),
                                                                             ("area_of", "area_of(s, 2.0)")]
        assert all(isinstance(a["digest"], str) for a in report["answers"])
