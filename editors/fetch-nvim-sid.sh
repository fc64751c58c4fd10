#!/usr/bin/env bash
# Fetch Neovim 0.12 from Debian sid as .debs and extract them (no system install) into
# ${DRAFTLINE_EDITORS_CACHE:-~/.cache/draftline-editors}/nvim-sid; writes a wrapper bin/nvim there.
# Idempotent; exits 0 with a warning when anything can't be fetched (the 0.12 test then skips).
set -u
CACHE="${DRAFTLINE_EDITORS_CACHE:-$HOME/.cache/draftline-editors}"
D="$CACHE/nvim-sid"
if [ -x "$D/bin/nvim" ] && "$D/bin/nvim" --version 2>/dev/null | grep -q 'NVIM v0\.1[2-9]'; then
  echo "nvim-sid: already present: $("$D/bin/nvim" --version | head -1)"; exit 0
fi
warn() { echo "WARNING: nvim 0.12 from sid not available: $*" >&2; exit 0; }
mkdir -p "$D/apt/lists/partial" "$D/apt/cache/archives/partial" "$D/debs" "$D/root" "$D/bin" || warn "mkdir"
echo "deb http://deb.debian.org/debian sid main" > "$D/apt/sources.list"
O=(-o Dir::Etc::sourcelist="$D/apt/sources.list" -o Dir::Etc::sourceparts=- -o Dir::State::Lists="$D/apt/lists"
   -o Dir::Cache="$D/apt/cache" -o Debug::NoLocking=1 -o APT::Get::List-Cleanup=0)
apt-get "${O[@]}" update -qq >/dev/null 2>&1 || warn "apt-get update (sid) failed"
cd "$D/debs" || warn "cd"
PKGS="neovim neovim-runtime libc6 libluajit-5.1-2 libluajit-5.1-common libtree-sitter0.26 libunibilium4
      libutf8proc3 libuv1t64 lua-lpeg lua-luv libgcc-s1"
for p in $PKGS; do
  ls "$p"_*.deb >/dev/null 2>&1 || apt-get "${O[@]}" download -qq "$p/sid" >/dev/null 2>&1 || warn "download $p/sid failed"
done
for d in *.deb; do dpkg -x "$d" "$D/root" || warn "dpkg -x $d"; done
cat > "$D/bin/nvim" <<WRAP
#!/bin/sh
# Neovim from Debian sid run with sid's own loader and libraries (it needs a newer glibc than bookworm's).
R="$D/root"
export VIMRUNTIME="\$R/usr/share/nvim/runtime"
exec "\$R/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" --library-path "\$R/usr/lib/x86_64-linux-gnu" "\$R/usr/bin/nvim" "\$@"
WRAP
chmod +x "$D/bin/nvim"
"$D/bin/nvim" --version 2>/dev/null | head -1 || warn "the extracted nvim does not run"
