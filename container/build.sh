#!/usr/bin/env bash
# Builds the agent image from the repository root, with the CLI versions pinned in
# scripts/install-clis.sh (read from that script, so the image and the local install cannot
# drift), then prints the `docker run` line.
#
#   container/build.sh                       # docker build -t nanoclaw-agent:<workspace version>
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

# NAME=value at the start of a line of scripts/install-clis.sh.
pin() {
  local value
  value="$(sed -n "s/^$1=\\([^[:space:]#]*\\).*/\\1/p" scripts/install-clis.sh | head -n 1)"
  [[ -n "$value" ]] || die "no $1=... line in scripts/install-clis.sh"
  printf '%s' "$value"
}

DRY_RUN=
ARGS=()
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    *) ARGS+=("$arg") ;;
  esac
done

CLAUDE_CODE_VERSION="$(pin CLAUDE_CODE_VERSION)"
CODEX_VERSION="$(pin CODEX_VERSION)"
OPENCODE_VERSION="$(pin OPENCODE_VERSION)"
# The image version defaults to the workspace version ([workspace.package] in Cargo.toml).
VERSION="${VERSION:-$(sed -n '/^\[workspace\.package\]/,/^\[/s/^version *= *"\([^"]*\)".*/\1/p' Cargo.toml | head -n 1)}"
[[ -n "$VERSION" ]] || die "cannot read the workspace version from Cargo.toml; set VERSION"
IMAGE="${IMAGE:-nanoclaw-agent}"
DOCKER="${DOCKER:-docker}"
TAG="$IMAGE:$VERSION"

CMD=(
  "$DOCKER" build
  -f container/Dockerfile
  --build-arg "CLAUDE_CODE_VERSION=$CLAUDE_CODE_VERSION"
  --build-arg "CODEX_VERSION=$CODEX_VERSION"
  --build-arg "OPENCODE_VERSION=$OPENCODE_VERSION"
  -t "$TAG"
  ${ARGS[@]+"${ARGS[@]}"}
  .
)

if [[ -n "$DRY_RUN" ]]; then
  printf '%q ' "${CMD[@]}"
  printf '\n'
else
  command -v "$DOCKER" >/dev/null 2>&1 || die "'$DOCKER' not found (set DOCKER=podman to use Podman)"
  log "building $TAG (claude-code $CLAUDE_CODE_VERSION, codex $CODEX_VERSION, opencode $OPENCODE_VERSION)"
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
