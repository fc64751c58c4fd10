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


def test_emacs_ghost_text_inline_completion(tmp_path):
    """draftline-inline-mode: textDocument/inlineCompletion as an overlay after point; accepting inserts it."""
    emacs = which("emacs")
    if not emacs:
        pytest.skip("Emacs absent: apt-get install -y emacs-nox elpa-eglot")
    src = tmp_path / "demo.py"
    src.write_text("def add(a, b):\n    \n")
    out = tmp_path / "out.txt"
    env = server_env() | {"DRAFTLINE_PY": PY, "REPO": str(REPO), "OUT": str(out), "FILE": str(src)}
    proc = subprocess.run([emacs, "--batch", "-q", "-l", str(REPO / "tests/editors/emacs_inline_test.el")], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=90)
    assert out.exists(), proc.stderr[-2000:]
    report = out.read_text()
    assert "mode=t" in report, report  # the minor mode comes on in draftline's eglot buffers
    assert "shown=return a + b" in report, report + proc.stderr[-2000:]
    assert "tab=draftline-accept" in report, report  # TAB accepts while ghost text is shown
    assert "line=    return a + b" in report, report
    # client-side telemetry: didShowCompletion when shown, the item's command when accepted
    assert "accepted=1" in report and "shown_count=1" in report, report
    # the idle timer's request is automatic (2); `M-x draftline-inline-request` is invoked (1), which the
    # server answers inside a word too
    assert "kinds=(2 1)" in report, report
