"""Configuration precedence: defaults < user TOML < workspace TOML < initializationOptions < didChangeConfiguration."""

from __future__ import annotations

from pathlib import Path

from lsp_server.config import CompletionConfig, Config, resolve_config


def test_precedence_of_every_layer(tmp_path: Path):
    user = tmp_path / "user.toml"
    user.write_text('[model]\ntarget = "user-model"\ndraft = "user-draft"\n[completion]\nmax_tokens = 10\ndebounce_ms = 1\nsnippets = 1\nprefix_chars = 100\n')
    root = tmp_path / "ws"
    root.mkdir()
    (root / ".draftline.toml").write_text('[completion]\nmax_tokens = 20\ndebounce_ms = 2\nsnippets = 2\n[model]\ntarget = "ws-model"\n')
    init = {"draftline": {"completion": {"max_tokens": 30, "debounce_ms": 3}, "model": {"target": "fake"}}}
    settings = {"draftline": {"completion": {"max_tokens": 40, "mode": "single", "unknown_key": 1, "suffix_chars": "bad"}}}

    config = resolve_config(user_file=user, workspace_roots=[root], init_options=init, client_settings=settings)

    assert config.completion.max_tokens == 40  # didChangeConfiguration wins
    assert config.completion.mode == "single"
    assert config.completion.debounce_ms == 3.0  # initializationOptions
    assert config.completion.snippets == 2  # workspace TOML
    assert config.completion.prefix_chars == 100  # user TOML
    # the user's draft went with the user's target (test_options_and_draft_belong_to_the_target_named_with_them)
    assert config.model.target == "fake" and config.model.draft is None
    assert config.completion.suffix_chars == CompletionConfig().suffix_chars  # ill-typed: default kept
    assert config.completion.window_quantum == CompletionConfig().window_quantum  # nobody set it: default
    assert resolve_config(user_file=tmp_path / "absent.toml") == Config()  # no layers: all defaults


def test_model_options_merge_key_by_key_across_layers(tmp_path: Path):
    """The fake engine's knobs live in model.options: a later layer changes one key, the others stay."""
    init = {"draftline": {"model": {"target": "fake", "options": {"text": "first", "step_s": 0.2}}}}
    settings = {"draftline": {"model": {"options": {"text": "second"}}}}
    config = resolve_config(user_file=tmp_path / "absent.toml", init_options=init, client_settings=settings)
    assert config.model.options == {"text": "second", "step_s": 0.2}


def test_options_and_draft_belong_to_the_target_named_with_them(tmp_path: Path):
    """A probe: the user file's `options` for its target went with the target the editor picked (it failed
    to load with `unknown engine option(s) step_s, text`, and no setting could remove them)."""
    user = tmp_path / "user.toml"
    user.write_text('[model]\ntarget = "fake"\ndraft = "d"\noptions = { text = "x", step_s = 0.1 }\n')
    other = resolve_config(user_file=user, client_settings={"model": {"target": "tiny"}})
    assert (other.model.target, other.model.options, other.model.draft) == ("tiny", {}, None)
    # its own options and draft, when the layer names them
    own = resolve_config(user_file=user, client_settings={"model": {"target": "tiny", "options": {"gamma": 3},
                                                                     "draft": "tiny"}})
    assert (own.model.options, own.model.draft) == ({"gamma": 3}, "tiny")
    # the same target named again, or none: the options stay
    same = resolve_config(user_file=user, client_settings={"model": {"target": "fake", "options": {"text": "y"}}})
    assert same.model.options == {"text": "y", "step_s": 0.1} and same.model.draft == "d"
    # options set without a target (a device, say) are anyone's
    user.write_text('[model]\noptions = { device = "cpu" }\n')
    assert resolve_config(user_file=user, client_settings={"model": {"target": "tiny"}}).model.options == {"device": "cpu"}
    # a route's table alike
    user.write_text('[model.routes.line]\ntarget = "a.gguf"\noptions = { template = "qwen2.5-coder" }\n')
    routes = resolve_config(user_file=user, client_settings={"model": {"routes": {"line": {"target": "b.gguf"}}}}).model.routes
    assert routes["line"] == {"target": "b.gguf"}


def test_a_null_or_ill_typed_value_leaves_the_layer_below_in_force(tmp_path, caplog):
    import logging

    user = tmp_path / "user.toml"
    user.write_text('[model]\ntarget = "my/model"\n[completion]\ndebounce_ms = 5.0\n[monitor]\nwindow_s = 30.0\n')
    init = {"model": {"target": "fake"}, "completion": {"debounce_ms": 0, "prefix_chars": 3000}}
    pushed = {"model": {"target": 7, "options": None}, "completion": {"debounce_ms": None, "prefix_chars": "many"},
              "monitor": {"window_s": None}, "index": None}
    with caplog.at_level(logging.WARNING, logger="lsp_server.config"):
        cfg = resolve_config(user_file=user, init_options=init, client_settings=pushed)
    assert cfg.model.target == "fake" and cfg.model.options == {}
    assert cfg.completion.debounce_ms == 0 and cfg.completion.prefix_chars == 3000
    assert cfg.monitor.window_s == 30.0 and cfg.index.enabled
    for key in ("model.target", "model.options", "completion.debounce_ms", "completion.prefix_chars",
                "monitor.window_s", "index"):
        assert f"config {key}: ignoring" in caplog.text, key
    # a null where no type is known (None by default) still clears the layer below: `draft = null`
    cfg = resolve_config(user_file=user, init_options={"model": {"draft": "d"}}, client_settings={"model": {"draft": None}})
    assert cfg.model.draft is None


def test_a_value_out_of_its_range_leaves_the_layer_below_in_force(tmp_path, caplog):
    """Well typed but harmful: a debounce of 1e9 ms or Infinity (every request unanswered), cache_size -1
    (every completion failed), max_tokens -5, a mode not among the choices, a route table given as a
    string, an int of 1e400 (int(inf) raised while the config was read)."""
    import logging

    init = {"completion": {"debounce_ms": 20, "cache_size": 50, "max_tokens": 40, "mode": "multi",
                           "digest_share": 0.5}, "monitor": {"window_s": 30.0}}
    pushed = {"completion": {"debounce_ms": float("inf"), "cache_size": -1, "max_tokens": -5, "mode": "weird",
                             "digest_share": 1.5, "prefix_chars": 1e400, "suffix_chars": 0},
              "monitor": {"window_s": 0}, "model": {"routes": "x"}}
    with caplog.at_level(logging.WARNING, logger="lsp_server.config"):
        cfg = resolve_config(user_file=tmp_path / "absent.toml", init_options=init, client_settings=pushed)
        assert resolve_config(user_file=tmp_path / "absent.toml",
                              client_settings={"completion": {"debounce_ms": 1e9}}).completion.debounce_ms == 10.0
    c = cfg.completion
    assert (c.debounce_ms, c.cache_size, c.max_tokens, c.mode, c.digest_share) == (20, 50, 40, "multi", 0.5)
    assert c.prefix_chars == CompletionConfig().prefix_chars and c.suffix_chars == 0  # 0 is in range
    assert cfg.monitor.window_s == 30.0 and cfg.model.routes is None
    for key in ("completion.debounce_ms", "completion.cache_size", "completion.max_tokens", "completion.mode",
                "completion.digest_share", "completion.prefix_chars", "monitor.window_s", "model.routes"):
        assert f"config {key}: ignoring" in caplog.text, key
