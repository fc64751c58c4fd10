"""A workspace .draftline.toml comes with a cloned repository: what it may not set, and what the user still can."""

from __future__ import annotations

import logging
from pathlib import Path

from lsp_server.config import resolve_config

HOSTILE = """
[model]
target = "someone/repo"
options = { trust_remote_code = true, dtype = "bfloat16" }

[model.routes.block]
target = "someone/other"
options = { trust_remote_code = true }

[model.routes.line]
draft = "someone/draft"
options = { trust_remote_code = 1 }

[index.options]
cache_dir = "~/.ssh"
model_cache_dir = "/tmp/models"
follow_symlinks = true
exclude_secrets = false
secret_name_patterns = []
secret_content_patterns = []
max_file_bytes = 500
"""

DENIED = ["model.options.trust_remote_code", "model.routes.block.options.trust_remote_code",
          "model.routes.line.options.trust_remote_code", "index.options.cache_dir", "index.options.model_cache_dir",
          "index.options.follow_symlinks", "index.options.exclude_secrets", "index.options.secret_name_patterns",
          "index.options.secret_content_patterns"]


def workspace(tmp_path: Path, text: str) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / ".draftline.toml").write_text(text)
    return root


def test_a_workspace_file_cannot_run_code_or_reach_outside_the_workspace(tmp_path: Path, caplog):
    with caplog.at_level(logging.WARNING, logger="lsp_server.config"):
        cfg = resolve_config(user_file=tmp_path / "none.toml", workspace_roots=[workspace(tmp_path, HOSTILE)])
    assert cfg.model.target == "someone/repo" and cfg.model.options == {"dtype": "bfloat16"}  # the rest stays
    assert cfg.model.routes == {"block": {"target": "someone/other", "options": {}},
                                "line": {"draft": "someone/draft", "options": {}}}
    assert cfg.index.options == {"max_file_bytes": 500}
    for key in DENIED:  # one warning naming each dropped key
        assert sum(f"ignoring {key} " in r.getMessage() for r in caplog.records) == 1, key


def test_a_workspace_file_may_still_tighten(tmp_path: Path, caplog):
    ws = workspace(tmp_path, "[model.options]\ntrust_remote_code = false\n"
                             "[index.options]\nfollow_symlinks = false\nexclude_secrets = true\n")
    user = tmp_path / "user.toml"
    user.write_text("[model.options]\ntrust_remote_code = true\n[index.options]\nfollow_symlinks = true\n")
    with caplog.at_level(logging.WARNING, logger="lsp_server.config"):
        cfg = resolve_config(user_file=user, workspace_roots=[ws])
    assert cfg.model.options == {"trust_remote_code": False}
    assert cfg.index.options == {"follow_symlinks": False, "exclude_secrets": True}
    assert not caplog.records


def test_the_user_and_the_editor_keep_every_key(tmp_path: Path, caplog):
    user = tmp_path / "user.toml"
    user.write_text('[model]\ntarget = "me/custom-arch"\noptions = { trust_remote_code = true }\n'
                    '[index.options]\ncache_dir = "/tmp/c"\nexclude_secrets = false\n')
    ws = workspace(tmp_path, "[completion]\nmax_tokens = 20\n")  # a harmless workspace file
    with caplog.at_level(logging.WARNING, logger="lsp_server.config"):
        cfg = resolve_config(user_file=user, workspace_roots=[ws],
                             client_settings={"model": {"routes": {"block": {"target": "me/other",
                                                                             "options": {"trust_remote_code": True}}}},
                                              "index": {"options": {"follow_symlinks": False}}})
    assert cfg.model.target == "me/custom-arch" and cfg.model.options == {"trust_remote_code": True}
    assert cfg.model.routes == {"block": {"target": "me/other", "options": {"trust_remote_code": True}}}
    assert cfg.index.options == {"cache_dir": "/tmp/c", "exclude_secrets": False, "follow_symlinks": False}
    assert cfg.completion.max_tokens == 20 and not caplog.records


def test_the_users_trust_does_not_extend_to_a_model_the_workspace_chose(tmp_path: Path, caplog):
    user = tmp_path / "user.toml"
    user.write_text('[model]\ntarget = "me/custom-arch"\noptions = { trust_remote_code = true, dtype = "float32" }\n')
    ws = workspace(tmp_path, '[model]\ntarget = "someone/repo"\n')
    cfg = resolve_config(user_file=user, workspace_roots=[ws])
    # the options named with the user's target stay with it (test_config's options-belong-to-the-target)
    assert cfg.model.target == "someone/repo" and cfg.model.options == {}
    # options the user set for any model: all but the trust
    user.write_text('[model]\noptions = { trust_remote_code = true, dtype = "float32" }\n')
    with caplog.at_level(logging.WARNING, logger="lsp_server.config"):
        cfg = resolve_config(user_file=user, workspace_roots=[ws])
    assert cfg.model.target == "someone/repo" and cfg.model.options == {"dtype": "float32"}
    assert any("model.options.trust_remote_code" in r.getMessage() for r in caplog.records)
    user.write_text('[model]\ntarget = "me/custom-arch"\noptions = { trust_remote_code = true, dtype = "float32" }\n')
    # the editor naming the model again makes it the user's choice: the trust holds
    cfg = resolve_config(user_file=user, workspace_roots=[ws], client_settings={"model": {"target": "me/custom-arch"}})
    assert cfg.model.options == {"trust_remote_code": True, "dtype": "float32"}
    # so does a workspace file that only adds a route naming no model of its own
    ws.joinpath(".draftline.toml").write_text("[model.routes.line]\ntime_limit_ms = 100\n")
    assert resolve_config(user_file=user, workspace_roots=[ws]).model.options["trust_remote_code"] is True


def test_a_workspace_value_that_should_be_a_table_cannot_replace_the_users_table(tmp_path: Path, caplog):
    user = tmp_path / "user.toml"
    user.write_text('[index.options]\nsecret_name_patterns = ["*.mine"]\ncache_dir = "/home/me/idx"\n'
                    '[model]\ntarget = "my/model"\n[model.options]\ndtype = "float32"\n'
                    '[model.routes.line]\ntarget = "my/small"\n[model.routes.line.options]\ndtype = "float32"\n')
    hostile = ('[index]\noptions = "x"\n[model]\noptions = 1\n[model.routes]\nline = "x"\n'
               '[model.routes.block]\noptions = []\n')
    with caplog.at_level(logging.WARNING, logger="lsp_server.config"):
        cfg = resolve_config(user_file=user, workspace_roots=[workspace(tmp_path, hostile)])
    assert cfg.index.options == {"secret_name_patterns": ["*.mine"], "cache_dir": "/home/me/idx"}
    assert cfg.model.options == {"dtype": "float32"}
    assert cfg.model.routes == {"line": {"target": "my/small", "options": {"dtype": "float32"}}, "block": {}}
    for key in ("index.options", "model.options", "model.routes.line", "model.routes.block.options"):
        assert f"ignoring {key}: not a table" in caplog.text
    # and a whole section given as a value
    (tmp_path / "b").mkdir()
    cfg = resolve_config(user_file=user, workspace_roots=[workspace(tmp_path / "b", 'index = "x"\nmodel = 3\n')])
    assert cfg.index.options["cache_dir"] == "/home/me/idx" and cfg.model.target == "my/model"
