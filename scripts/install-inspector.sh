#!/usr/bin/env bash
# Install the official MCP Inspector CLI (@modelcontextprotocol/inspector-cli) at a pinned
# version into a project-local folder (default: <repo>/.cli-inspector, git-ignored). The
# mcp-tools integration test `inspector` drives the mcp-tools binary with it.
#
#   scripts/install-inspector.sh            # install or reuse
#   NANOCLAW_INSPECTOR_DIR=/opt/insp scripts/install-inspector.sh
#   FORCE=1 scripts/install-inspector.sh    # reinstall even if the pinned version is present
#
# Non-interactive (works with CI=true and no stdin). A re-run with the pinned version already
# installed does not invoke npm at all. Prints the path of the CLI entry point on success.
#
# Use it through scripts/inspect.sh (tools/list by default; any inspector arguments, e.g.
# `--method tools/call --tool-name send_message --tool-arg text=hi`). By hand: the package is the
# CLI only (without --cli it tries to start a web UI that is not installed: "Cannot find module
# .../client/bin/start.js"), and it resolves its files from the working directory, so run it
# from its build/ folder with absolute paths and the server's session passed with -e:
#   cd .cli-inspector/node_modules/@modelcontextprotocol/inspector-cli/build &&
#     node cli.js --cli -e SESSION_DB=<abs path>/session.db <abs path>/target/debug/mcp-tools \
#     --method tools/list
set -euo pipefail

INSPECTOR_VERSION=1.0.3
PACKAGE=@modelcontextprotocol/inspector-cli

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${NANOCLAW_INSPECTOR_DIR:-$ROOT/.cli-inspector}"
PKG_DIR="$DIR/node_modules/$PACKAGE"
ENTRY="$PKG_DIR/build/cli.js"

log() { printf '[install-inspector] %s\n' "$*" >&2; }

need() {
  command -v "$1" >/dev/null 2>&1 || { log "error: '$1' not found in PATH"; exit 1; }
}

installed_version() {
  [[ -f "$PKG_DIR/package.json" ]] || return 0
  node -e 'try{process.stdout.write(String(require(process.argv[1]).version||""))}catch(e){}' \
    "$PKG_DIR/package.json"
}

need node
need npm

if [[ -z "${FORCE:-}" && -f "$ENTRY" && "$(installed_version)" == "$INSPECTOR_VERSION" ]]; then
  log "$PACKAGE@$INSPECTOR_VERSION already installed in $DIR (reusing)"
else
  export CI="${CI:-true}"
  export npm_config_yes=true
  export npm_config_fund=false
  export npm_config_audit=false
  export npm_config_update_notifier=false
  export npm_config_progress=false
  mkdir -p "$DIR"
  if [[ ! -f "$DIR/package.json" ]]; then
    printf '{\n  "name": "nanoclaw-inspector",\n  "private": true\n}\n' >"$DIR/package.json"
  fi
  log "installing $PACKAGE@$INSPECTOR_VERSION into $DIR"
  npm install \
    --prefix "$DIR" \
    --no-audit --no-fund --no-progress \
    --save-exact \
    --loglevel=warn \
    "$PACKAGE@$INSPECTOR_VERSION" </dev/null
  if [[ ! -f "$ENTRY" || "$(installed_version)" != "$INSPECTOR_VERSION" ]]; then
    log "error: install finished but $ENTRY (version $INSPECTOR_VERSION) is missing"
    exit 1
  fi
fi

printf '%s\n' "$ENTRY"
