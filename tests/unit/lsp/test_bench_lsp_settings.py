"""`draftline bench lsp`'s settings: what its flags put into the server's initializationOptions."""

from __future__ import annotations

import argparse

from lsp_server.bench.lsp import bench_settings


def _args(**kw) -> argparse.Namespace:
    base = dict(no_index=False, target=None, draft=None, backend=None, remote=None, remote_model="", remote_key_env="",
                debounce_ms=None)
    return argparse.Namespace(**{**base, **kw})


def test_backend_reaches_model_options_and_is_absent_unless_asked():
    assert "options" not in bench_settings(_args(), remote=False)["model"]
    settings = bench_settings(_args(backend="llamacpp", target="x.gguf"), remote=False)
    assert settings["model"] == {"target": "x.gguf", "options": {"backend": "llamacpp"}}
    assert settings["index"] == {"enabled": True}


def test_prompt_slots_reach_model_options_beside_the_backend():
    assert bench_settings(_args(prompt_slots=0), remote=False)["model"] == {"options": {"prompt_slots": 0}}
    settings = bench_settings(_args(backend="lean", prompt_slots=2), remote=False)
    assert settings["model"]["options"] == {"backend": "lean", "prompt_slots": 2}


def test_suffix_share_reaches_model_options():
    assert bench_settings(_args(suffix_share=0.0), remote=False)["model"] == {"options": {"suffix_share": 0.0}}
    assert "options" not in bench_settings(_args(), remote=False)["model"]
