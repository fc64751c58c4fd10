#!/usr/bin/env bash
# Fetch llama.cpp's llama-server from Debian sid as .debs and extract them (no system install) into
# ${DRAFTLINE_EDITORS_CACHE:-~/.cache/draftline-editors}/llama-sid; writes a wrapper bin/llama-server there.
#
# sid's build needs glibc >= 2.43 (newer than bookworm's), so the wrapper runs it through sid's own
# loader with sid's libraries. ggml loads its CPU backend at run time, from a folder compiled in
# (/usr/lib/x86_64-linux-gnu/ggml/backends0, absent here), then from the executable's folder. The
# executable is the loader, so the wrapper runs a copy of it that sits in auto/ next to links to every
# extracted ggml/backends0/libggml-cpu-<cpu>.so: ggml then picks the best variant for the CPU it runs
# on (a cache restored on another machine still works). Set GGML_BACKEND_PATH to one of those files to
# choose yourself (the wrapper then uses the loader beside the libraries, which has no backends near it).
#
# Used by tests/e2e/test_remote_llama_server.py, which skips when the wrapper is absent.
# Idempotent. Exits 1 with a message saying what failed (editors/ci-install.sh only warns then).
set -u
CACHE="${DRAFTLINE_EDITORS_CACHE:-$HOME/.cache/draftline-editors}"
D="$CACHE/llama-sid"
W="$D/bin/llama-server"
# -m of a missing file: loads the backends, says which, and exits (no model needed).
probe() { "$W" -m /nonexistent/draftline-probe.gguf -lv 4 2>&1 | grep -m1 'loaded CPU backend from'; }
if [ -x "$W" ] && probe >/dev/null; then
  echo "llama-sid: already present: $W ($("$W" --version 2>&1 | head -1); $(probe | sed 's/.*from //'))"; exit 0
fi
fail() { echo "ERROR: llama-server from Debian sid not available: $*" >&2; exit 1; }
[ "$(uname -m)" = x86_64 ] || fail "only x86_64 is handled, this is $(uname -m)"
command -v apt-get >/dev/null && command -v dpkg >/dev/null || fail "apt-get and dpkg are needed (Debian/Ubuntu)"
mkdir -p "$D/apt/lists/partial" "$D/apt/cache/archives/partial" "$D/debs" "$D/bin" || fail "mkdir under $D"
echo "deb http://deb.debian.org/debian sid main" > "$D/apt/sources.list"
O=(-o Dir::Etc::sourcelist="$D/apt/sources.list" -o Dir::Etc::sourceparts=- -o Dir::State::Lists="$D/apt/lists"
   -o Dir::Cache="$D/apt/cache" -o Debug::NoLocking=1 -o APT::Get::List-Cleanup=0)
apt-get "${O[@]}" update -qq >/dev/null 2>&1 || fail "apt-get update (sid) failed"
rm -f "$D"/debs/*.deb  # one consistent set from today's sid (a half-done earlier run may have mixed versions)
cd "$D/debs" || fail "cd $D/debs"
# llama.cpp-tools: llama-server (its code in libllama0's llama/libllama-server-impl.so); libggml0 holds
# the CPU backends; libc6 brings sid's loader; the rest are what these link against, at sid's versions.
PKGS="llama.cpp-tools libllama0 libggml0 libc6 libgcc-s1 libstdc++6 libgomp1 libssl3t64 libzstd1 zlib1g"
for p in $PKGS; do
  apt-get "${O[@]}" download -qq "$p/sid" >/dev/null 2>&1 || fail "apt-get download $p/sid failed"
done
rm -rf "$D/root.new" && mkdir "$D/root.new" || fail "mkdir $D/root.new"
for d in *.deb; do dpkg -x "$d" "$D/root.new" || fail "dpkg -x $d"; done
rm -rf "$D/root" && mv "$D/root.new" "$D/root" || fail "mv $D/root.new $D/root"
LIB="$D/root/usr/lib/x86_64-linux-gnu"
[ -x "$LIB/ld-linux-x86-64.so.2" ] || fail "no loader in the extracted libc6 ($LIB/ld-linux-x86-64.so.2)"
[ -x "$D/root/usr/bin/llama-server" ] || fail "no usr/bin/llama-server in the extracted llama.cpp-tools"
ls "$LIB"/ggml/backends*/libggml-cpu-*.so >/dev/null 2>&1 || fail "no ggml/backends*/libggml-cpu-*.so in the extracted libggml0"
rm -rf "$D/auto" && mkdir "$D/auto" || fail "mkdir $D/auto"
cp "$LIB/ld-linux-x86-64.so.2" "$D/auto/" || fail "copy the loader to $D/auto"  # a copy: /proc/self/exe resolves links
for b in "$LIB"/ggml/backends*/libggml-cpu-*.so; do ln -s "$b" "$D/auto/" || fail "ln -s $b"; done
cat > "$W" <<WRAP
#!/bin/sh
# llama-server from Debian sid, run with sid's loader and libraries (written by editors/fetch-llama-server-sid.sh).
# ggml picks the best CPU backend of $D/auto for this CPU, unless GGML_BACKEND_PATH names one, e.g.
# GGML_BACKEND_PATH=$(ls "$LIB"/ggml/backends*/libggml-cpu-x64.so 2>/dev/null | head -1)
L="$LIB"
if [ -n "\${GGML_BACKEND_PATH:-}" ]; then
  exec "\$L/ld-linux-x86-64.so.2" --library-path "\$L:\$L/llama" "$D/root/usr/bin/llama-server" "\$@"
fi
exec "$D/auto/ld-linux-x86-64.so.2" --library-path "\$L:\$L/llama" "$D/root/usr/bin/llama-server" "\$@"
WRAP
chmod +x "$W" || fail "chmod +x $W"
"$W" --version >/dev/null 2>&1 || fail "the extracted llama-server does not run: $("$W" --version 2>&1 | tail -2)"
chosen="$(probe)" || fail "ggml loads none of its CPU backends on this CPU: $("$W" -m /nonexistent.gguf 2>&1 | grep -m2 -i 'backend')"
echo "llama-sid: $W ($("$W" --version 2>&1 | head -1); ${chosen#*from })"
