#!/usr/bin/env bash
# Install the tools the tests mount filesystems with into a project-local folder (default:
# <repo>/.tools, git-ignored), from Debian's own packages, without installing them system-wide:
#
#   bindfs (and its libfuse2): a real FUSE filesystem, for the tests that check that every
#   binary refuses a session DB on a FUSE mount (docs/contract/db.md, "Where the DB may live").
#
#   scripts/install-test-tools.sh            # install or reuse
#   NANOCLAW_TOOLS_DIR=/opt/t scripts/install-test-tools.sh
#   FORCE=1 scripts/install-test-tools.sh    # download again
#
# Needs `apt-get` and `dpkg-deb` (Debian, Ubuntu). `apt-get download` fetches the .deb files
# into a temporary folder and `dpkg-deb -x` unpacks them under .tools/: nothing is installed and
# no maintainer script runs. As root with empty package lists (a fresh container), it runs
# `apt-get update` once. Non-interactive (works with CI=true and no stdin). Prints the path of
# bindfs on success. The tests run it as
#   LD_LIBRARY_PATH=.tools/lib/x86_64-linux-gnu:.tools/usr/lib/x86_64-linux-gnu .tools/usr/bin/bindfs
# and mount only as root (mounting FUSE directly needs no setuid fusermount); elsewhere they say
# that they skip the FUSE case, and why.
set -euo pipefail

PACKAGES=(bindfs libfuse2)

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${NANOCLAW_TOOLS_DIR:-$ROOT/.tools}"
BINDFS="$DIR/usr/bin/bindfs"

log() { printf '[install-test-tools] %s\n' "$*" >&2; }

if [[ -z "${FORCE:-}" && -x "$BINDFS" ]]; then
  log "bindfs already unpacked in $DIR (reusing)"
  printf '%s\n' "$BINDFS"
  exit 0
fi

for tool in apt-get dpkg-deb; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    log "warning: '$tool' not found (not a Debian-like system): the FUSE tests will say they skip"
    exit 0
  fi
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
download() { (cd "$work" && apt-get download -q "${PACKAGES[@]}" </dev/null >&2); }

if ! download; then
  if [[ "$(id -u)" == 0 ]]; then
    log "apt-get download failed; refreshing the package lists (apt-get update) and retrying"
    apt-get update -q </dev/null >&2
    download
  else
    log "error: apt-get download ${PACKAGES[*]} failed (run 'sudo apt-get update' and retry)"
    exit 1
  fi
fi

mkdir -p "$DIR"
for deb in "$work"/*.deb; do
  dpkg-deb -x "$deb" "$DIR"
done
if [[ ! -x "$BINDFS" ]]; then
  log "error: the bindfs package did not contain usr/bin/bindfs"
  exit 1
fi
log "unpacked ${PACKAGES[*]} into $DIR"
printf '%s\n' "$BINDFS"
