#!/usr/bin/env bash
# Builds the agent image from the repository root, with the pins of versions.env (the CLI
# versions and the base images, read from that file, so the image and the local install cannot
# drift), then prints the `docker run` line.
#
#   container/build.sh                       # docker build -t nanoclaw-agent:<workspace version>
#   container/build.sh --clis claude         # only the named CLIs (claude, codex, opencode, or
#                                            # none for the mock provider); default all three
#   container/build.sh --dry-run             # print the build command, do not run it
#   IMAGE=registry.example/nanoclaw-agent VERSION=dev container/build.sh --push
#   DOCKER=podman container/build.sh         # any docker-compatible CLI with BuildKit features
#
# Extra arguments go to `docker build` (e.g. --platform linux/arm64, --no-cache, --push with
# buildx).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

log() { printf '[container/build] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# NAME=value at the start of a line of versions.env.
pin() {
  local value
  value="$(sed -n "s/^$1=\\([^[:space:]#]*\\).*/\\1/p" versions.env | head -n 1)"
  [[ -n "$value" ]] || die "no $1=... line in versions.env"
  printf '%s' "$value"
}

DRY_RUN=
CLIS="claude codex opencode"
ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DRY_RUN=1; shift ;;
    --clis) CLIS="${2:?--clis needs a list: claude, codex, opencode (comma or space separated) or none}"; shift 2 ;;
    --clis=*) CLIS="${1#*=}"; shift ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
CLIS="${CLIS//,/ }"
read -r -a selected <<<"$CLIS"
[[ ${#selected[@]} -gt 0 ]] || die "--clis is empty: name at least one CLI, or none"
for cli in "${selected[@]}"; do
  case "$cli" in
    claude | codex | opencode) ;;
    none) [[ ${#selected[@]} -eq 1 ]] || die "--clis none goes alone" ;;
    *) die "unknown CLI '$cli' in --clis (known: claude codex opencode, or none)" ;;
  esac
done
CLIS="${selected[*]}"

# The pins the Dockerfile declares as build arguments.
PINS=(CLAUDE_CODE_VERSION CODEX_VERSION OPENCODE_VERSION RUST_IMAGE NODE_IMAGE)
BUILD_ARGS=()
for name in "${PINS[@]}"; do
  BUILD_ARGS+=(--build-arg "$name=$(pin "$name")")
done
# The image version defaults to the workspace version ([workspace.package] in Cargo.toml).
VERSION="${VERSION:-$(sed -n '/^\[workspace\.package\]/,/^\[/s/^version *= *"\([^"]*\)".*/\1/p' Cargo.toml | head -n 1)}"
[[ -n "$VERSION" ]] || die "cannot read the workspace version from Cargo.toml; set VERSION"
IMAGE="${IMAGE:-nanoclaw-agent}"
DOCKER="${DOCKER:-docker}"
TAG="$IMAGE:$VERSION"

CMD=(
  "$DOCKER" build
  -f container/Dockerfile
  "${BUILD_ARGS[@]}"
  --build-arg "CLIS=$CLIS"
  -t "$TAG"
  ${ARGS[@]+"${ARGS[@]}"}
  .
)

if [[ -n "$DRY_RUN" ]]; then
  printf '%q ' "${CMD[@]}"
  printf '\n'
else
  command -v "$DOCKER" >/dev/null 2>&1 || die "'$DOCKER' not found (set DOCKER=podman to use Podman)"
  log "building $TAG (CLIs: $CLIS; ${BUILD_ARGS[*]})"
  DOCKER_BUILDKIT=1 "${CMD[@]}"
  log "built $TAG"
fi

cat <<EOF

Run one session (see container/README.md; the session folder must be on a Linux filesystem
shared with the host process, not a VM file share):

  docker run --rm --name nanoclaw-SESSION \\
    --user "\$(id -u):\$(id -g)" \\
    -v /srv/nanoclaw/sessions/SESSION:/workspace \\
    -v /srv/nanoclaw/global:/workspace/global:ro \\
    -v /srv/projects/website:/workspace/extra/website \\
    -e AGENT_PROVIDER=claude -e ANTHROPIC_API_KEY \\
    -e TZ=Europe/Berlin -e NANOCLAW_ADMIN_USER_ID=U0123ADMIN \\
    $TAG
EOF
