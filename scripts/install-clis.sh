#!/usr/bin/env bash
# Install the pinned agent CLIs (Claude Code, Codex, OpenCode) from the npm registry into a
# project-local folder (default: <repo>/.cli, git-ignored).
#
#   scripts/install-clis.sh            # install or reuse
#   NANOCLAW_CLI_DIR=/opt/cli scripts/install-clis.sh
#   FORCE=1 scripts/install-clis.sh    # reinstall even if the pinned versions are present
#
# Non-interactive (works with CI=true and no stdin). Re-runs are fast: when every package.json
# under node_modules already has the pinned version and every native binary is present, npm is
# not invoked at all.
#
# The pins below are the single source of truth for the scripts; a test compares them with the
# Dockerfile. The protocol behaviour the providers rely on was measured with these versions:
# re-run the end-to-end suites (scripts/test.sh) before moving a pin.
CLAUDE_CODE_VERSION=2.1.330
CODEX_VERSION=0.169.0
OPENCODE_VERSION=1.18.33

# Where the binaries live after install (linux x64 shown; other platforms are analogous):
#   .cli/node_modules/.bin/claude   -> @anthropic-ai/claude-code/bin/claude.exe. The package's
#       postinstall (install.cjs) replaces that placeholder with a hard link/copy of the native
#       binary from the optional dependency @anthropic-ai/claude-code-linux-x64/claude, so after
#       install `.bin/claude` IS the native binary (no node process stays resident).
#   .cli/node_modules/.bin/codex    -> @openai/codex/bin/codex.js, a node launcher that spawns the
#       native binary and forwards SIGINT/SIGTERM/SIGHUP. Native (musl, static):
#       .cli/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex
#       (a Rust harness can exec this directly and skip node).
#   .cli/node_modules/.bin/opencode -> opencode-ai/bin/opencode.exe. Its postinstall
#       (postinstall.mjs) links in opencode-linux-x64/bin/opencode (or -baseline without AVX2),
#       so after install `.bin/opencode` IS the native (Bun) binary.
# The native binaries come as optional dependencies selected by os/cpu(/libc), so optional
# dependencies must not be omitted (--include=optional). The postinstall scripts must run; if the
# npm config disables them we run them by hand (see run_postinstalls).
# `scripts/install-clis.sh --print-native` prints the native binaries found on this machine.

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CLI_DIR="${NANOCLAW_CLI_DIR:-$ROOT/.cli}"
BIN_DIR="$CLI_DIR/node_modules/.bin"

PACKAGES=(
  "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION"
  "@openai/codex@$CODEX_VERSION"
  "opencode-ai@$OPENCODE_VERSION"
)

log() { printf '[install-clis] %s\n' "$*" >&2; }

need() {
  command -v "$1" >/dev/null 2>&1 || { log "error: '$1' not found in PATH"; exit 1; }
}

# Version recorded in node_modules/<pkg>/package.json, or empty.
installed_version() {
  local pj="$CLI_DIR/node_modules/$1/package.json"
  [[ -f "$pj" ]] || return 0
  node -e 'try{process.stdout.write(String(require(process.argv[1]).version||""))}catch(e){}' "$pj"
}

# Native binaries shipped as optional dependencies (searched, not hard-coded, so other
# platforms work too). Prints one path per line.
native_binaries() {
  local nm="$CLI_DIR/node_modules"
  [[ -d "$nm" ]] || return 0
  # codex: @openai/codex-<os>-<arch>/vendor/<triple>/bin/codex (or vendor/ inside @openai/codex)
  find "$nm/@openai" -path '*/vendor/*/bin/codex' -type f 2>/dev/null | sort | head -n 1 || true
  # opencode: opencode-<os>-<arch>[-musl|-baseline]/bin/opencode
  # (prefer the variant the postinstall linked in, e.g. non-baseline on AVX2 machines)
  { [[ -f "$nm/opencode-ai/bin/opencode.exe" ]] &&
      find "$nm" -maxdepth 3 -path "$nm/opencode-*/bin/opencode" -samefile "$nm/opencode-ai/bin/opencode.exe" 2>/dev/null
    find "$nm" -maxdepth 3 -path "$nm/opencode-*/bin/opencode" -type f 2>/dev/null | sort
  } | head -n 1 || true
  # claude: native build, if the package ships one as an optional dependency
  find "$nm/@anthropic-ai" -maxdepth 3 -path '*/claude-code-*/claude' -type f 2>/dev/null | sort | head -n 1 || true
}

up_to_date() {
  [[ "$(installed_version @anthropic-ai/claude-code)" == "$CLAUDE_CODE_VERSION" ]] || return 1
  [[ "$(installed_version @openai/codex)" == "$CODEX_VERSION" ]] || return 1
  [[ "$(installed_version opencode-ai)" == "$OPENCODE_VERSION" ]] || return 1
  local b
  for b in claude codex opencode; do
    [[ -x "$BIN_DIR/$b" ]] || return 1
  done
  # The launchers are useless without their native optional dependencies.
  find "$CLI_DIR/node_modules/@openai" -path '*/vendor/*/bin/codex' -type f 2>/dev/null | grep -q . || return 1
  find "$CLI_DIR/node_modules" -maxdepth 3 -path "$CLI_DIR/node_modules/opencode-*/bin/opencode" -type f 2>/dev/null | grep -q . || return 1
  return 0
}

# If npm skipped lifecycle scripts (ignore-scripts, allowScripts policy), the claude and opencode
# launchers are still placeholders: run the packages' postinstall scripts ourselves.
run_postinstalls() {
  local b dir script
  for b in claude:@anthropic-ai/claude-code:install.cjs opencode:opencode-ai:postinstall.mjs; do
    IFS=: read -r b dir script <<<"$b"
    if ! "$BIN_DIR/$b" --version </dev/null >/dev/null 2>&1; then
      log "running postinstall of $dir ($script) by hand"
      (cd "$CLI_DIR/node_modules/$dir" && node "$script" </dev/null) || log "warning: $dir postinstall failed"
    fi
  done
}

if [[ "${1:-}" == "--print-native" ]]; then
  native_binaries
  exit 0
fi

need node
need npm

export CI="${CI:-true}"
export npm_config_yes=true
export npm_config_fund=false
export npm_config_audit=false
export npm_config_update_notifier=false
export npm_config_progress=false

mkdir -p "$CLI_DIR"

if [[ -z "${FORCE:-}" ]] && up_to_date; then
  log "pinned CLIs already installed in $CLI_DIR (reusing)"
else
  log "installing ${PACKAGES[*]} into $CLI_DIR"
  if [[ ! -f "$CLI_DIR/package.json" ]]; then
    printf '{\n  "name": "nanoclaw-clis",\n  "private": true\n}\n' >"$CLI_DIR/package.json"
  fi
  # --save-exact keeps the pins in .cli/package.json; --include=optional makes sure the native
  # binaries (optional dependencies) are installed even if the user's npm config omits them.
  npm install \
    --prefix "$CLI_DIR" \
    --no-audit --no-fund --no-progress \
    --save-exact \
    --ignore-scripts=false \
    --include=optional \
    --loglevel=warn \
    "${PACKAGES[@]}" </dev/null
  run_postinstalls
  if ! up_to_date; then
    log "error: install finished but the pinned versions / native binaries are not all present:"
    log "  claude-code=$(installed_version @anthropic-ai/claude-code) codex=$(installed_version @openai/codex) opencode-ai=$(installed_version opencode-ai)"
    native_binaries >&2 || true
    exit 1
  fi
fi

# Verify each CLI runs.
status=0
for b in claude codex opencode; do
  if out="$(cd "$CLI_DIR" && HOME="${HOME:-/tmp}" timeout 60 "$BIN_DIR/$b" --version </dev/null 2>&1)"; then
    printf '%-9s %s  (%s)\n' "$b" "$BIN_DIR/$b" "$(printf '%s' "$out" | tail -n 1)"
  else
    log "error: '$BIN_DIR/$b --version' failed: $out"
    status=1
  fi
done
while IFS= read -r native; do
  [[ -n "$native" ]] && printf 'native    %s\n' "$native"
done < <(native_binaries)
exit "$status"
