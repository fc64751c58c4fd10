#!/usr/bin/env bash
# Fetch Neovim 0.12 from Debian sid as .debs and extract them (no system install) into
# ${DRAFTLINE_EDITORS_CACHE:-~/.cache/draftline-editors}/nvim-sid; writes a wrapper bin/nvim there.
# Idempotent; exits 0 with a warning when anything can't be fetched (the 0.12 test then skips, and
# fails under CI=true).
#
# Which .debs: apt resolves neovim's dependencies itself (download only, --no-install-recommends)
# against an empty dpkg status of its own under $D, so every library comes from sid at sid's versions
# (sid's nvim needs a newer glibc than the host's) and nothing of the host's apt/dpkg state is read
# for it or changed. A hand-written list broke whenever sid renamed a library (libtree-sitter0.25 -> 0.26).
set -u -o pipefail
CACHE="${DRAFTLINE_EDITORS_CACHE:-$HOME/.cache/draftline-editors}"
D="$CACHE/nvim-sid"
# The first line of `nvim --version` when it runs and is 0.12+. Not a pipe into grep -q / head:
# under pipefail their early exit can fail the pipeline with SIGPIPE.
version() {
  local v
  v="$("$D/bin/nvim" --version 2>&1)" || { echo "${v:-no output}" | tail -2; return 1; }
  v="${v%%$'\n'*}"
  case "$v" in "NVIM v0.1"[2-9]*) echo "$v" ;; *) echo "not 0.12+: $v"; return 1 ;; esac
}
if [ -x "$D/bin/nvim" ] && v="$(version)"; then
  echo "nvim-sid: already present: $v"; exit 0
fi
warn() { echo "WARNING: nvim 0.12 from sid not available: $*" >&2; exit 0; }
mkdir -p "$D/apt/lists/partial" "$D/apt/cache" "$D/apt/state" "$D/debs/partial" "$D/bin" || warn "mkdir under $D"
echo "deb http://deb.debian.org/debian sid main" > "$D/apt/sources.list"
: > "$D/apt/state/status"  # nothing "installed": every dependency is fetched
O=(-o Dir::Etc::sourcelist="$D/apt/sources.list" -o Dir::Etc::sourceparts=- -o Dir::State="$D/apt/state"
   -o Dir::State::status="$D/apt/state/status" -o Dir::State::Lists="$D/apt/lists" -o Dir::Cache="$D/apt/cache"
   -o Dir::Cache::archives="$D/debs" -o Debug::NoLocking=1 -o APT::Get::List-Cleanup=0)
out="$(apt-get "${O[@]}" update -qq 2>&1)" || warn "apt-get update (sid) failed: $(tail -3 <<<"$out")"
rm -f "$D"/debs/*.deb  # one consistent set from today's sid (an earlier run's may be older or mixed)
out="$(apt-get "${O[@]}" install --download-only --no-install-recommends -y -qq neovim 2>&1)" \
  || warn "apt-get install --download-only neovim (sid) failed: $(tail -3 <<<"$out")"
cd "$D/debs" || warn "cd $D/debs"
ls neovim_*.deb >/dev/null 2>&1 || warn "apt downloaded no neovim .deb into $D/debs"
rm -rf "$D/root.new" && mkdir "$D/root.new" || warn "mkdir $D/root.new"
for d in *.deb; do dpkg -x "$d" "$D/root.new" || warn "dpkg -x $d"; done
rm -rf "$D/root" && mv "$D/root.new" "$D/root" || warn "mv $D/root.new $D/root"
cat > "$D/bin/nvim" <<WRAP
#!/bin/sh
# Neovim from Debian sid run with sid's own loader and libraries (it needs a newer glibc than bookworm's).
R="$D/root"
export VIMRUNTIME="\$R/usr/share/nvim/runtime"
exec "\$R/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" --library-path "\$R/usr/lib/x86_64-linux-gnu" "\$R/usr/bin/nvim" "\$@"
WRAP
chmod +x "$D/bin/nvim" || warn "chmod +x $D/bin/nvim"
v="$(version)" || warn "the extracted nvim does not run: $v"
echo "nvim-sid: $v ($(ls "$D"/debs/*.deb | wc -l) .debs)"
