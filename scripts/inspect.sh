#!/usr/bin/env bash
# Drive the mcp-tools MCP server with the official MCP Inspector CLI, as an agent CLI would
# (stdio), to list and call its tools by hand. Everything runs locally; the only network use is
# the one-time install of the pinned inspector from the npm registry (scripts/install-inspector.sh).
#
#   scripts/inspect.sh                                   # tools/list
#   scripts/inspect.sh --method tools/call --tool-name send_message --tool-arg text=hello
#   scripts/inspect.sh --method resources/list
#   SESSION_DB=/srv/s1/session.db WORKSPACE_DIR=/srv/s1 scripts/inspect.sh ...   # a real session
#
# Without SESSION_DB the tools work on a scratch session (`nanoclaw init` in a temporary folder,
# deleted afterwards), so a tool call writes its rows there; the script prints them at the end.
# NANOCLAW_BIN_DIR names a folder with the built binaries and skips the build.
#
# Why this script: the inspector package installed is the CLI only (no web UI), its entry point
# must be run with --cli, and it resolves its own files relative to the working directory, so it
# runs from inside the package's build/ folder (hence absolute paths for everything else).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

log() { printf '[inspect] %s\n' "$*" >&2; }

command -v node >/dev/null 2>&1 || { log "error: Node.js not found: install Node.js 22 or later (README.md, Prerequisites)"; exit 1; }

ENTRY=$(bash scripts/install-inspector.sh)
BUILD_DIR=$(dirname "$ENTRY")

if [[ -n "${NANOCLAW_BIN_DIR:-}" ]]; then
  BIN=$(cd "$NANOCLAW_BIN_DIR" && pwd)
else
  log "building mcp-tools and nanoclaw (cargo's progress below; the first build takes minutes)"
  cargo build -p mcp-tools -p host --bins
  BIN=$(cd "${CARGO_TARGET_DIR:-target}/debug" && pwd)
fi

SCRATCH=
if [[ -z "${SESSION_DB:-}" ]]; then
  SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/nanoclaw-inspect.XXXXXX")
  trap 'rm -rf -- "$SCRATCH"' EXIT
  "$BIN/nanoclaw" --db "$SCRATCH/session.db" init --workspace "$SCRATCH" --routing inspect:chat-1 >/dev/null
  export SESSION_DB="$SCRATCH/session.db" WORKSPACE_DIR="$SCRATCH"
  log "scratch session in $SCRATCH (deleted at exit; set SESSION_DB to use a real one)"
fi
# Absolute: the inspector runs from its build/ folder.
SESSION_DB=$(cd "$(dirname "$SESSION_DB")" && pwd)/$(basename "$SESSION_DB")
export SESSION_DB
[[ -n "${WORKSPACE_DIR:-}" ]] && WORKSPACE_DIR=$(cd "$WORKSPACE_DIR" && pwd) && export WORKSPACE_DIR

[[ $# -gt 0 ]] || set -- --method tools/list
# The server gets its session from these variables: the inspector passes them on with -e.
ENV_ARGS=(-e "SESSION_DB=$SESSION_DB" -e "TZ=${TZ:-UTC}")
[[ -n "${WORKSPACE_DIR:-}" ]] && ENV_ARGS+=(-e "WORKSPACE_DIR=$WORKSPACE_DIR")
status=0
(cd "$BUILD_DIR" && node "$ENTRY" --cli "${ENV_ARGS[@]}" "$BIN/mcp-tools" "$@") || status=$?

if [[ -n "$SCRATCH" ]]; then
  rows=$("$BIN/nanoclaw" --db "$SESSION_DB" watch --no-follow 2>/dev/null || true)
  if [[ -n "$rows" ]]; then
    log "rows the tool calls wrote to the scratch session:"
    printf '%s\n' "$rows" >&2
  fi
fi
exit "$status"
