#!/usr/bin/env bash
# Install the pinned agent CLIs (Claude Code, Codex, OpenCode, Gemini CLI, Qwen Code) from the npm
# registry into a project-local folder (default: <repo>/.cli, git-ignored).
#
#   scripts/install-clis.sh                  # all five: install or reuse
#   scripts/install-clis.sh codex            # only the named CLIs (claude, codex, opencode,
#                                            # gemini, qwen)
#   NANOCLAW_CLIS="claude opencode" scripts/install-clis.sh     # the same through the environment
#   NANOCLAW_CLI_DIR=/opt/cli scripts/install-clis.sh
#   FORCE=1 scripts/install-clis.sh          # reinstall even if the pinned versions are present
#   scripts/install-clis.sh --print-packages [CLI...]   # the npm packages it would install
#   scripts/install-clis.sh --print-native              # the native binaries installed
#
# Prerequisites: Node.js >= NODE_MIN_MAJOR of versions.env (22: the pinned Claude Code and Qwen
# Code declare "engines": {"node": ">=22.0.0"}; npm only warns EBADENGINE below it) and npm. The
# script checks the Node version first and says what to do.
#
# Non-interactive (works with CI=true and no stdin). Re-runs are fast: when every selected
# package already has the pinned version and its native binary is present, npm is not invoked.
#
# The pins are in versions.env at the repository root (the one place of every pin, shared with
# container/build.sh and the Dockerfile); CLAUDE_CODE_VERSION, CODEX_VERSION, OPENCODE_VERSION,
# GEMINI_CLI_VERSION and QWEN_CODE_VERSION set in the environment win (the image build passes its
# build arguments so).
#
# Where the binaries live after install (linux x64 shown; other platforms are analogous):
#   .cli/node_modules/.bin/claude   -> @anthropic-ai/claude-code/bin/claude.exe. The package's
#       postinstall (install.cjs) replaces that placeholder with a hard link/copy of the native
#       binary from the optional dependency @anthropic-ai/claude-code-linux-x64/claude, so after
#       install `.bin/claude` IS the native binary (no node process stays resident).
#   .cli/node_modules/.bin/codex    -> @openai/codex/bin/codex.js, a node launcher that spawns the
#       native binary and forwards SIGINT/SIGTERM/SIGHUP. Native (musl, static):
#       .cli/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex
#   .cli/node_modules/.bin/opencode -> opencode-ai/bin/opencode.exe. npm installs EVERY optional
#       dependency whose os/cpu match (on linux x64: opencode-linux-x64 AND
#       opencode-linux-x64-baseline, 177 MB each); the postinstall (postinstall.mjs) then links
#       one into opencode.exe: the AVX2 build when /proc/cpuinfo has avx2, else the baseline.
#       This script keeps one build and deletes the others (keep_one_opencode_build), chosen by
#       NANOCLAW_OPENCODE_BUILD: auto (default: the postinstall's choice for this CPU), baseline
#       (runs on every x64 CPU: what an image built on one machine and run on others needs), or
#       avx2.
#   .cli/node_modules/.bin/gemini   -> @google/gemini-cli/bundle/gemini.js and
#   .cli/node_modules/.bin/qwen     -> @qwen-code/qwen-code/cli-entry.js: JavaScript bundles run
#       by node (no native binary; node stays resident as the agent's process). Their optional
#       native modules (node-pty for a pseudo-terminal, keytar for the OS keychain) are not needed:
#       without them the shell tool falls back to plain child processes and the key comes from
#       the environment. Together about 250 MB.
# The native binaries come as optional dependencies selected by os/cpu(/libc), so optional
# dependencies must not be omitted (--include=optional). The postinstall scripts must run; if the
# npm config disables them we run them by hand (see run_postinstalls).

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSIONS="${NANOCLAW_VERSIONS_FILE:-$ROOT/versions.env}"
CLI_DIR="${NANOCLAW_CLI_DIR:-$ROOT/.cli}"
NM="$CLI_DIR/node_modules"
BIN_DIR="$NM/.bin"
ALL_CLIS=(claude codex opencode gemini qwen)

log() { printf '[install-clis] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

need() {
  command -v "$1" >/dev/null 2>&1 || die "'$1' not found in PATH${2:+: $2}"
}

# NAME=value of versions.env, unless NAME is already set in the environment.
pin() {
  local value="${!1:-}"
  if [[ -z "$value" ]]; then
    [[ -f "$VERSIONS" ]] || die "the pins file $VERSIONS is missing"
    value="$(sed -n "s/^$1=\\([^[:space:]#]*\\).*/\\1/p" "$VERSIONS" | head -n 1)"
  fi
  [[ -n "$value" ]] || die "no $1=... line in $VERSIONS"
  printf '%s' "$value"
}

CLAUDE_CODE_VERSION="$(pin CLAUDE_CODE_VERSION)"
CODEX_VERSION="$(pin CODEX_VERSION)"
OPENCODE_VERSION="$(pin OPENCODE_VERSION)"
GEMINI_CLI_VERSION="$(pin GEMINI_CLI_VERSION)"
QWEN_CODE_VERSION="$(pin QWEN_CODE_VERSION)"
NODE_MIN_MAJOR="$(pin NODE_MIN_MAJOR)"

# The npm package of a CLI.
package_of() {
  case "$1" in
    claude) printf '@anthropic-ai/claude-code' ;;
    codex) printf '@openai/codex' ;;
    opencode) printf 'opencode-ai' ;;
    gemini) printf '@google/gemini-cli' ;;
    qwen) printf '@qwen-code/qwen-code' ;;
  esac
}

version_of() {
  case "$1" in
    claude) printf '%s' "$CLAUDE_CODE_VERSION" ;;
    codex) printf '%s' "$CODEX_VERSION" ;;
    opencode) printf '%s' "$OPENCODE_VERSION" ;;
    gemini) printf '%s' "$GEMINI_CLI_VERSION" ;;
    qwen) printf '%s' "$QWEN_CODE_VERSION" ;;
  esac
}

# Version recorded in node_modules/<pkg>/package.json, or empty.
installed_version() {
  local pj="$NM/$1/package.json"
  [[ -f "$pj" ]] || return 0
  node -e 'try{process.stdout.write(String(require(process.argv[1]).version||""))}catch(e){}' "$pj"
}

# Whether a CLI comes with a native binary (Gemini CLI and Qwen Code are node bundles).
has_native() {
  case "$1" in
    claude | codex | opencode) return 0 ;;
    *) return 1 ;;
  esac
}

# The native binary of a CLI, if installed (searched, not hard-coded, so other platforms work).
native_of() {
  case "$1" in
    # codex: @openai/codex-<os>-<arch>/vendor/<triple>/bin/codex (or vendor/ in @openai/codex)
    codex) find "$NM/@openai" -path '*/vendor/*/bin/codex' -type f 2>/dev/null | sort | head -n 1 || true ;;
    # opencode and claude: the postinstall put the native binary in place of the placeholder
    # (a few hundred bytes); anything above 1 MB is the real one.
    opencode) find "$NM/opencode-ai/bin/opencode.exe" -size +1M 2>/dev/null || true ;;
    claude) find "$NM/@anthropic-ai/claude-code/bin/claude.exe" -size +1M 2>/dev/null || true ;;
  esac
}

# The selection: the arguments, else NANOCLAW_CLIS, else all; each checked.
SELECTED=()
select_clis() {
  local names=("$@") name known
  if [[ ${#names[@]} -eq 0 && -n "${NANOCLAW_CLIS:-}" ]]; then
    read -r -a names <<<"${NANOCLAW_CLIS//,/ }"
  fi
  [[ ${#names[@]} -gt 0 ]] || names=("${ALL_CLIS[@]}")
  for name in "${names[@]}"; do
    known=
    for cli in "${ALL_CLIS[@]}"; do [[ "$cli" == "$name" ]] && known=1; done
    [[ -n "$known" ]] || die "unknown CLI '$name' (known: ${ALL_CLIS[*]})"
    SELECTED+=("$name")
  done
}

up_to_date() {
  local cli
  for cli in "${SELECTED[@]}"; do
    [[ "$(installed_version "$(package_of "$cli")")" == "$(version_of "$cli")" ]] || return 1
    [[ -x "$BIN_DIR/$cli" ]] || return 1
    # The launchers are useless without their native binaries.
    if has_native "$cli"; then
      [[ -n "$(native_of "$cli")" ]] || return 1
    fi
  done
  return 0
}

# The Node.js prerequisite: at least NODE_MIN_MAJOR for Claude Code (its `engines`); below that
# npm only warns EBADENGINE and the install still works today, so it is a warning, with what to
# do. Below 16 nothing works (the launchers and postinstall scripts are ES modules).
check_node() {
  need node "install Node.js $NODE_MIN_MAJOR or later (https://nodejs.org/en/download, or nvm install $NODE_MIN_MAJOR)"
  need npm "it comes with Node.js; install Node.js $NODE_MIN_MAJOR or later"
  local version major
  version="$(node --version 2>/dev/null || true)"
  major="${version#v}"
  major="${major%%.*}"
  [[ "$major" =~ ^[0-9]+$ ]] || die "cannot read the Node.js version ('node --version' printed '$version')"
  if ((major < 16)); then
    die "Node.js $version is too old for the pinned CLIs: install Node.js $NODE_MIN_MAJOR or later (https://nodejs.org/en/download, or 'nvm install $NODE_MIN_MAJOR')"
  fi
  # The CLIs whose `engines` ask for NODE_MIN_MAJOR (Gemini CLI asks for >=20, Codex >=16,
  # OpenCode nothing).
  local cli needs
  for cli in claude qwen; do
    [[ " ${SELECTED[*]} " == *" $cli "* ]] || continue
    needs="$(package_of "$cli")@$(version_of "$cli")"
    if ((major < NODE_MIN_MAJOR)); then
      log "warning: Node.js $version is older than $NODE_MIN_MAJOR, which $needs requires (\"engines\": {\"node\": \">=22.0.0\"}; npm warns EBADENGINE). The install goes on, but it is unsupported: install Node.js $NODE_MIN_MAJOR or later (https://nodejs.org/en/download, or 'nvm install $NODE_MIN_MAJOR')."
    fi
  done
}

# If npm skipped lifecycle scripts (ignore-scripts, allowScripts policy), the claude and opencode
# launchers are still placeholders: run the packages' postinstall scripts ourselves.
run_postinstalls() {
  local entry b dir script
  for entry in claude:@anthropic-ai/claude-code:install.cjs opencode:opencode-ai:postinstall.mjs; do
    IFS=: read -r b dir script <<<"$entry"
    [[ " ${SELECTED[*]} " == *" $b "* ]] || continue
    if ! "$BIN_DIR/$b" --version </dev/null >/dev/null 2>&1; then
      log "running postinstall of $dir ($script) by hand"
      (cd "$NM/$dir" && node "$script" </dev/null) || log "warning: $dir postinstall failed"
    fi
  done
}

# One OpenCode build (see the header): link the wanted build into opencode-ai/bin/opencode.exe
# and delete every opencode-<platform> package (their binary is that file's other name, or a
# build not used).
keep_one_opencode_build() {
  local target="$NM/opencode-ai/bin/opencode.exe" want="${NANOCLAW_OPENCODE_BUILD:-auto}" dir
  [[ -f "$target" ]] || return 0
  local builds=()
  for dir in "$NM"/opencode-*/; do
    dir="${dir%/}"
    [[ "$dir" != "$NM/opencode-ai" && -f "$dir/bin/opencode" ]] && builds+=("$dir")
  done
  [[ ${#builds[@]} -gt 0 ]] || return 0
  if [[ "$want" != auto ]]; then
    local current="" chosen=""
    for dir in "${builds[@]}"; do
      [[ "$dir/bin/opencode" -ef "$target" ]] && current="$dir"
    done
    # Same libc as the build the postinstall chose; baseline or not as asked.
    local musl current_musl=0
    [[ "$current" == *-musl ]] && current_musl=1
    for dir in "${builds[@]}"; do
      musl=0
      [[ "$dir" == *-musl ]] && musl=1
      [[ "$musl" == "$current_musl" ]] || continue
      case "$want" in
        baseline) [[ "$dir" == *-baseline* ]] && chosen="$dir" ;;
        avx2) [[ "$dir" != *-baseline* ]] && chosen="$dir" ;;
        *) die "NANOCLAW_OPENCODE_BUILD=$want: use auto, baseline or avx2" ;;
      esac
      [[ -n "$chosen" ]] && break
    done
    [[ -n "$chosen" ]] || die "no $want build of OpenCode among: ${builds[*]##*/}"
    if [[ ! "$chosen/bin/opencode" -ef "$target" ]]; then
      log "OpenCode: using the $want build ${chosen##*/}"
      ln -f "$chosen/bin/opencode" "$target" 2>/dev/null || cp -f "$chosen/bin/opencode" "$target"
      chmod 0755 "$target"
    fi
  fi
  for dir in "${builds[@]}"; do
    log "OpenCode: removing ${dir##*/} (opencode-ai/bin/opencode.exe is the one build kept)"
    rm -rf -- "$dir"
  done
}

case "${1:-}" in
  --print-native)
    shift
    select_clis "$@"
    for cli in "${SELECTED[@]}"; do native_of "$cli"; done
    exit 0
    ;;
  --print-packages)
    shift
    select_clis "$@"
    for cli in "${SELECTED[@]}"; do printf '%s@%s\n' "$(package_of "$cli")" "$(version_of "$cli")"; done
    exit 0
    ;;
esac

select_clis "$@"
check_node

export CI="${CI:-true}"
export npm_config_yes=true
export npm_config_fund=false
export npm_config_audit=false
export npm_config_update_notifier=false
export npm_config_progress=false

mkdir -p "$CLI_DIR"

if [[ -z "${FORCE:-}" ]] && up_to_date; then
  log "pinned CLIs (${SELECTED[*]}) already installed in $CLI_DIR (reusing)"
else
  PACKAGES=()
  for cli in "${SELECTED[@]}"; do PACKAGES+=("$(package_of "$cli")@$(version_of "$cli")"); done
  log "installing ${PACKAGES[*]} into $CLI_DIR (a few hundred MB from the npm registry)"
  install_started=$SECONDS
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
  log "npm install took $((SECONDS - install_started)) s"
  if ! up_to_date; then
    log "error: install finished but the pinned versions / native binaries are not all present:"
    for cli in "${SELECTED[@]}"; do
      log "  $cli: $(package_of "$cli")=$(installed_version "$(package_of "$cli")") (pinned $(version_of "$cli")), native: $(native_of "$cli")"
    done
    exit 1
  fi
fi
# Whatever the selection: npm reconciles the whole folder, so installing another CLI beside
# OpenCode brings its deleted builds back (177 MB each).
if [[ -d "$NM/opencode-ai" ]]; then
  keep_one_opencode_build
fi

# Verify each selected CLI runs.
status=0
for b in "${SELECTED[@]}"; do
  if out="$(cd "$CLI_DIR" && HOME="${HOME:-/tmp}" timeout 60 "$BIN_DIR/$b" --version </dev/null 2>&1)"; then
    printf '%-9s %s  (%s)\n' "$b" "$BIN_DIR/$b" "$(printf '%s' "$out" | tail -n 1)"
  else
    log "error: '$BIN_DIR/$b --version' failed: $out"
    status=1
  fi
done
for b in "${SELECTED[@]}"; do
  native="$(native_of "$b")"
  [[ -n "$native" ]] && printf 'native    %s\n' "$native"
done
exit "$status"
