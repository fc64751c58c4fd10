"""Emacs 28 batch + eglot against the real server (fake engine): completion at point offers draftline's text."""

from __future__ import annotations

import subprocess

import pytest

from tests.editors.conftest import PY, REPO, server_env, which


def test_emacs_eglot_completion_at_point(tmp_path):
    emacs = which("emacs")
    if not emacs:
        pytest.skip("Emacs absent: apt-get install -y emacs-nox elpa-eglot")
    src = tmp_path / "demo.py"
    src.write_text("def add(a, b):\n    \n")
    out = tmp_path / "out.txt"
    env = server_env() | {"DRAFTLINE_PY": PY, "REPO": str(REPO), "OUT": str(out), "FILE": str(src)}
    proc = subprocess.run([emacs, "--batch", "-q", "-l", str(REPO / "tests/editors/emacs_test.el")], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=90)
    assert out.exists(), proc.stderr[-2000:]
    assert "return a + b" in out.read_text(), proc.stderr[-2000:]
