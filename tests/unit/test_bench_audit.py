"""`draftline bench ...`: what an audit of the bench commands found (each test failed before its fix).

Bad input is a one-line error and a non-zero exit, never a traceback, and is refused before a model
loads where it can be; a count of 0 measures nothing rather than everything.
"""

from __future__ import annotations

import json
import socket

import pytest

from lsp_server.cli import main

MISSING_GGUF = "/no/such/dir/model.gguf"


def _one_line_error(capsys, *words: str) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, err
    return err


@pytest.fixture
def no_model_load(monkeypatch):
    """Arguments refused up front must not wait for a model to load."""
    import engine.engine

    def refuse(*a, **k):
        raise AssertionError("a model was loaded for arguments the bench refuses")

    monkeypatch.setattr(engine.engine, "load_engine", refuse)


# -- bench scenarios -----------------------------------------------------------------------------------

def test_scenarios_n_0_makes_no_tasks(monkeypatch):
    """`make_tasks` tested `made == n` only after a cut: with n = 0 it cut a task from every held-out file."""
    from lsp_server.bench import scenarios

    code = "def f(value):\n    if value:\n" + "".join(f"        total_{i} = compute(value, {i}) + other\n" for i in range(20))
    monkeypatch.setattr(scenarios, "_held_out_files", lambda: [(f"pkg/m{i}.py", code) for i in range(5)])
    assert len(scenarios.make_tasks(2, 0, ("single-line",))) == 2
    assert scenarios.make_tasks(0, 0, ("single-line",)) == []


@pytest.mark.parametrize("argv, words", [
    (["--modes", "plain,bogus"], ["unknown mode", "bogus"]),
    (["--scenarios", "single-line,bogus"], ["unknown scenario", "bogus"]),  # was cut as a refactor, then a KeyError
    (["--cache", "hot"], ["unknown cache", "hot"]),  # silently ran warm
    (["--n", "0"], ["--n"]),
])
def test_scenarios_refuses_unknown_names_and_n_0_before_loading(argv, words, capsys, no_model_load):
    assert main(["bench", "scenarios", "--target", "tiny", *argv]) == 2
    _one_line_error(capsys, "bench scenarios", *words)


@pytest.mark.parametrize("bench", ["scenarios", "model", "engine", "quant"])
def test_a_model_path_that_does_not_exist_is_a_one_line_error(bench, capsys):
    assert main(["bench", bench, "--target", MISSING_GGUF]) == 2
    _one_line_error(capsys, f"bench {bench}", MISSING_GGUF)


# -- bench engine / quant / selfdraft / llama-server: counts of 0 --------------------------------------

@pytest.mark.parametrize("argv", [
    ["engine", "--prompts", "0"],  # ZeroDivisionError at plain's tokens/s
    ["engine", "--max-new", "0"],
    ["quant", "--prompts", "0"],  # statistics.median of nothing
    ["quant", "--max-new", "0"],  # ZeroDivisionError in ms/token
    ["selfdraft", "--prompts", "0"],  # IndexError at the first prompt
    ["llama-server", "--prompts", "0", "--server", "/bin/true"],
])
def test_zero_counts_are_refused_before_loading(argv, capsys, no_model_load):
    assert main(["bench", *argv]) == 2
    _one_line_error(capsys, f"bench {argv[0]}", "at least 1")


# -- bench lsp -----------------------------------------------------------------------------------------

def test_lsp_keys_per_s_0_is_refused(tmp_path, capsys):
    (tmp_path / "m.py").write_text("import os\n\n\n\n\n\nvalue = os.path.join('a', 'b')\n")
    assert main(["bench", "lsp", str(tmp_path), "--keys-per-s", "0", "--target", "fake"]) == 2  # was ZeroDivisionError
    _one_line_error(capsys, "bench lsp", "--keys-per-s")
    assert main(["bench", "lsp", "--storm", "--keys-per-s", "0", "--keystrokes", "5"]) == 2
    _one_line_error(capsys, "--keys-per-s")


def test_lsp_an_engine_that_does_not_load_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    from lsp_server.bench import lsp

    (tmp_path / "m.py").write_text("import os\n\n\n\n\n\nvalue = os.path.join('a', 'b')\n")

    async def failed(*a, **k):  # what run_bench raises when the server's engine state is "failed"
        raise RuntimeError(f"engine did not load: {{'state': 'failed', 'error': 'GGUF file not found: {MISSING_GGUF}'}}")

    monkeypatch.setattr(lsp, "run_bench", failed)
    assert main(["bench", "lsp", str(tmp_path), "--target", MISSING_GGUF]) == 2
    _one_line_error(capsys, "bench lsp", "engine did not load")


# -- bench index / retrieval / context / index-yield: the directory ------------------------------------

def test_index_and_retrieval_refuse_a_missing_directory(tmp_path, capsys):
    missing = tmp_path / "nope"
    for bench in ("index", "retrieval"):  # index: IndexError; retrieval: a report of 0 tasks, exit 0
        with pytest.raises(SystemExit) as exc:
            main(["bench", bench, str(missing)])
        assert exc.value.code not in (0, None) and str(missing) in str(exc.value.code)


def test_index_on_an_empty_workspace_reports_zeros_as_valid_json(tmp_path, capsys):
    (tmp_path / "ws").mkdir()
    assert main(["bench", "index", str(tmp_path / "ws"), "--json"]) == 0  # was IndexError at sample[0]
    report = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    assert report["files"] == 0 and report["samples"]["queries"] == 0
    assert all(v == 0.0 for v in report["query_p99_ms"].values())


def test_context_refuses_a_missing_workspace_and_unknown_arms(tmp_path, capsys, no_model_load):
    assert main(["bench", "context", str(tmp_path / "nope"), "--no-model"]) == 2  # was a report of 0 tasks, exit 0
    _one_line_error(capsys, "bench context", "not a directory")
    assert main(["bench", "context", str(tmp_path), "--no-model", "--arms", "digest,bogus"]) == 2
    _one_line_error(capsys, "bench context", "bogus")


def test_index_yield_refuses_a_missing_tree(tmp_path, capsys, no_model_load):
    assert main(["bench", "index-yield", str(tmp_path / "nope")]) == 2  # was: load the model, build nothing
    _one_line_error(capsys, "bench index-yield", "not a directory")


# -- bench remote-cancel -------------------------------------------------------------------------------

def test_remote_cancel_refuses_0_trials_and_reports_an_unreachable_server_in_one_line(capsys):
    assert main(["bench", "remote-cancel", "--trials", "0", "--url", "http://127.0.0.1:9"]) == 2
    _one_line_error(capsys, "bench remote-cancel", "--trials")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["bench", "remote-cancel", "--trials", "1", "--url", f"http://127.0.0.1:{port}"]) == 2  # was httpx's traceback
    _one_line_error(capsys, "bench remote-cancel", str(port))


def test_postprocess_bench_cuts_an_argument_or_a_brackets_content_and_refuses_bad_input(tmp_path, capsys):
    """`bench postprocess`: the expected text is what sat between the cursor and the rest of its line."""
    import argparse
    from types import SimpleNamespace

    from lsp_server.bench.postprocess import make_tasks, run_bench_postprocess

    code = "import os\n" + "x = 1\n" * 41 + "value = compute(alpha, beta)\nitems = table[key_name]\n"
    files = [SimpleNamespace(path="m.py", text=code)]
    for cut, want in (("argument", {("alpha", ", beta)\n")}), ("brackets", {("alpha, beta", ")\n"), ("key_name", "]\n")})):
        tasks = make_tasks(files, 20, 0, cut)
        assert tasks and {(expected, suffix.split("items")[0]) for _, _, expected, suffix in tasks} <= want
        for _, prefix, expected, suffix in tasks:
            assert prefix + expected + suffix == code
    args = argparse.Namespace(tasks=0, seed=0, cut="argument", against=None, target=None, json=False)
    assert run_bench_postprocess(args) == 2
    args.tasks, args.against = 5, tmp_path / "missing.py"
    assert run_bench_postprocess(args) == 2
    assert "is not a file" in capsys.readouterr().err
