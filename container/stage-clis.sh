#!/usr/bin/env bash
# Lays out the selected agent CLIs for the image, without Node where a CLI does not need it
# (issue 43, D8): from a node_modules folder made by scripts/install-clis.sh, copies into OUT
#   OUT/<cli>/...        the CLI's own files
#   OUT/bin/<cli>        a relative link to its entry point (the image links it into /usr/local/bin)
#   OUT/clis             the selection, one name a line (never empty: `none` for none)
# Claude Code, Codex and OpenCode ship native binaries in their npm packages: only those are
# copied (Claude Code's and OpenCode's single-file builds as they are; Codex's package layout
# with its ripgrep and bubblewrap, without the voice host and the code-mode host, which a headless
# agent never starts). Gemini CLI and Qwen Code are Node programs: their npm package with its
# production dependencies, plus OUT/node/bin/node (the Node binary given with --node, stripped).
#
#   container/stage-clis.sh --modules DIR --out DIR [--node FILE] CLI...   (or: none)
#
# Bun's single-file executables (Claude Code, OpenCode) are never stripped: `strip` removes the
# appended program and leaves a plain Bun runtime that answers `--version` with Bun's version.
# Run by container/Dockerfile's `clis` stage (online path) and by container/build.sh --offline.
set -euo pipefail

log() { printf '[stage-clis] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

MODULES=
OUT=
NODE=
CLIS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --modules) MODULES="${2:?}"; shift 2 ;;
    --out) OUT="${2:?}"; shift 2 ;;
    --node) NODE="${2:?}"; shift 2 ;;
    *) CLIS+=("$1"); shift ;;
  esac
done
[[ -n "$OUT" ]] || die "--out DIR is required"
[[ ${#CLIS[@]} -gt 0 ]] || die "name the CLIs to stage (or none)"
mkdir -p "$OUT/bin"
printf '%s\n' "${CLIS[@]}" >"$OUT/clis"
[[ "${CLIS[*]}" != none ]] || exit 0
[[ -d "$MODULES" ]] || die "--modules $MODULES is not a node_modules folder (run scripts/install-clis.sh)"

# A file of at least 1 MB: the native binary, not the package's placeholder.
native() {
  [[ -f "$1" && $(stat -c %s "$1") -ge 1000000 ]] || die "$2: no native binary at $1 (run scripts/install-clis.sh $2)"
}

stage_claude() {
  local exe="$MODULES/@anthropic-ai/claude-code/bin/claude.exe"
  native "$exe" claude
  install -D -m 0755 "$exe" "$OUT/claude/claude"
  ln -sf ../claude/claude "$OUT/bin/claude"
}

stage_opencode() {
  local exe="$MODULES/opencode-ai/bin/opencode.exe"
  native "$exe" opencode
  install -D -m 0755 "$exe" "$OUT/opencode/opencode"
  ln -sf ../opencode/opencode "$OUT/bin/opencode"
}

stage_codex() {
  # The platform package's vendor/<target triple>/: codex-package.json (the layout codex reads),
  # bin/codex, codex-path/ (its ripgrep, put on the PATH of its tools), codex-resources/bwrap
  # (its sandbox).
  local vendor
  vendor="$(find "$MODULES/@openai" -path '*/vendor/*/bin/codex' -type f 2>/dev/null | sort | head -n 1)"
  [[ -n "$vendor" ]] || die "codex: no native binary under $MODULES/@openai (run scripts/install-clis.sh codex)"
  vendor="$(dirname "$(dirname "$vendor")")"
  native "$vendor/bin/codex" codex
  mkdir -p "$OUT/codex/bin" "$OUT/codex/codex-resources"
  install -m 0644 "$vendor/codex-package.json" "$OUT/codex/"
  install -m 0755 "$vendor/bin/codex" "$OUT/codex/bin/"
  cp -R "$vendor/codex-path" "$OUT/codex/"
  [[ ! -f "$vendor/codex-resources/bwrap" ]] || install -m 0755 "$vendor/codex-resources/bwrap" "$OUT/codex/codex-resources/"
  ln -sf ../codex/bin/codex "$OUT/bin/codex"
}

# A Node CLI: its package and production dependencies as npm installed them, and Node itself.
stage_node_cli() {
  local cli="$1" package="$2" bin="$3"
  [[ -d "$MODULES/$package" ]] || die "$cli: $MODULES/$package is missing (run scripts/install-clis.sh $cli)"
  [[ -n "$NODE" && -x "$NODE" ]] || die "$cli needs Node.js: pass --node FILE (the npm registry's packaged Node build)"
  if [[ ! -x "$OUT/node/bin/node" ]]; then
    install -D -m 0755 "$NODE" "$OUT/node/bin/node"
    strip --strip-all "$OUT/node/bin/node" 2>/dev/null || log "warning: could not strip $OUT/node/bin/node"
    ln -sf ../node/bin/node "$OUT/bin/node"
  fi
  mkdir -p "$OUT/$cli"
  # The whole node_modules: npm hoists the package's dependencies beside it.
  cp -R "$MODULES" "$OUT/$cli/node_modules"
  ln -sf "../$cli/node_modules/.bin/$bin" "$OUT/bin/$bin"
}

for cli in "${CLIS[@]}"; do
  case "$cli" in
    claude) stage_claude ;;
    codex) stage_codex ;;
    opencode) stage_opencode ;;
    gemini) stage_node_cli gemini @google/gemini-cli gemini ;;
    qwen) stage_node_cli qwen @qwen-code/qwen-code qwen ;;
    *) die "unknown CLI '$cli' (known: claude codex opencode gemini qwen)" ;;
  esac
  log "staged $cli: $(du -sh "$OUT/$cli" | cut -f1)"
done
