#!/usr/bin/env bash
# Builds the agent image from the repository root, with the pins of versions.env (the CLI
# versions and the base images, read from that file, so the image and the local install cannot
# drift), then prints the `docker run` line.
#
#   container/build.sh                       # docker build -t nanoclaw-agent:<workspace version>
#   container/build.sh --clis claude         # only the named CLIs (claude, codex, opencode,
#                                            # gemini, qwen, or none for the mock provider);
#                                            # default claude, codex and opencode
#   container/build.sh --dry-run             # print the build command, do not run it
#   IMAGE=registry.example/nanoclaw-agent VERSION=dev container/build.sh --push
#   DOCKER=podman container/build.sh         # any docker-compatible CLI with BuildKit features
#   container/build.sh --offline --clis none # no image registry: a Debian root file system made
#                                            # with mmdebstrap (cached in .cache/image/, or
#                                            # $NANOCLAW_IMAGE_CACHE) and the workspace's own
#                                            # release binaries (stripped), then the same runtime
#                                            # stage of container/Dockerfile; any builder (no
#                                            # BuildKit needed)
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
OFFLINE=
CLIS="claude codex opencode"
ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DRY_RUN=1; shift ;;
    --offline) OFFLINE=1; shift ;;
    --clis) CLIS="${2:?--clis needs a list: claude, codex, opencode, gemini, qwen (comma or space separated) or none}"; shift 2 ;;
    --clis=*) CLIS="${1#*=}"; shift ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
CLIS="${CLIS//,/ }"
read -r -a selected <<<"$CLIS"
[[ ${#selected[@]} -gt 0 ]] || die "--clis is empty: name at least one CLI, or none"
for cli in "${selected[@]}"; do
  case "$cli" in
    claude | codex | opencode | gemini | qwen) ;;
    none) [[ ${#selected[@]} -eq 1 ]] || die "--clis none goes alone" ;;
    *) die "unknown CLI '$cli' in --clis (known: claude codex opencode gemini qwen, or none)" ;;
  esac
done
CLIS="${selected[*]}"

# The pins the Dockerfile declares as build arguments.
PINS=(CLAUDE_CODE_VERSION CODEX_VERSION OPENCODE_VERSION GEMINI_CLI_VERSION QWEN_CODE_VERSION RUST_IMAGE NODE_IMAGE)
BUILD_ARGS=()
for name in "${PINS[@]}"; do
  BUILD_ARGS+=(--build-arg "$name=$(pin "$name")")
done
# The image version defaults to the workspace version ([workspace.package] in Cargo.toml).
VERSION="${VERSION:-$(sed -n '/^\[workspace\.package\]/,/^\[/s/^version *= *"\([^"]*\)".*/\1/p' Cargo.toml | head -n 1)}"
[[ -n "$VERSION" ]] || die "cannot read the workspace version from Cargo.toml; set VERSION"
IMAGE="${IMAGE:-nanoclaw-agent}"
DOCKER="${DOCKER:-docker}"
# Each selection of CLIs is a tag of its own: nanoclaw-agent:0.1.0 carries all three,
# nanoclaw-agent:0.1.0-none none, nanoclaw-agent:0.1.0-codex-opencode those two.
if [[ "$CLIS" == "claude codex opencode" ]]; then
  TAG="$IMAGE:$VERSION"
else
  TAG="$IMAGE:$VERSION-${CLIS// /-}"
fi
case "$(basename "$DOCKER")" in
  # Podman and Buildah write OCI images by default, and the OCI format has no HEALTHCHECK: they
  # would drop the image's health check without a word (issue 43, D2).
  podman | buildah) BUILD_ARGS+=(--format docker) ;;
esac

# The offline path: no image registry. A Debian root file system from Debian's packages
# (mmdebstrap, cached by its arguments), imported as the runtime stage's base; the workspace's
# release binaries, stripped, as the build stage; container/Dockerfile's runtime stage itself,
# verbatim, on top. The build context is a small folder of its own (never the workspace).
offline_build() {
  local cache="${NANOCLAW_IMAGE_CACHE:-$ROOT/.cache/image}"
  local suite
  suite="$(pin DEBIAN_SUITE)"
  [[ "$CLIS" == none ]] \
    || die "--offline builds --clis none only so far (a Node CLI needs Node from the npm registry's packaged builds: not built yet, issue 43)"
  mkdir -p "$cache"
  # The runtime stage's base packages (its apt-get RUN is skipped when all are present) and
  # passwd for useradd; no documentation, manuals or translations.
  local debootstrap=(
    --variant=minbase
    --include=bash,git,ca-certificates,tzdata,passwd
    '--dpkgopt=path-exclude=/usr/share/doc/*'
    '--dpkgopt=path-include=/usr/share/doc/*/copyright'
    '--dpkgopt=path-exclude=/usr/share/man/*'
    '--dpkgopt=path-exclude=/usr/share/info/*'
    '--dpkgopt=path-exclude=/usr/share/locale/*'
    # Perl (git's) without its C headers and the CJK encodings, which no git command uses.
    '--dpkgopt=path-exclude=/usr/lib/x86_64-linux-gnu/perl/*/CORE/*.h'
    '--dpkgopt=path-exclude=/usr/lib/x86_64-linux-gnu/perl/*/auto/Encode/??/*'
    # A mirror that serves a snapshot has expired Release files; the setting stays out of the
    # image.
    '--aptopt=Acquire::Check-Valid-Until "false"'
    '--customize-hook=rm -f "$1/etc/apt/apt.conf.d/99mmdebstrap" "$1"/var/cache/apt/*.bin'
  )
  local key
  key="$(printf '%s\n' "$suite" "${debootstrap[@]}" | sha256sum | cut -c1-12)"
  local rootfs="$cache/rootfs-$suite-$key.tar"
  local base="$IMAGE-base:$suite-$key"
  if [[ -n "$DRY_RUN" ]]; then
    printf 'mmdebstrap %s %s %s\n' "${debootstrap[*]}" "$suite" "$rootfs"
  elif [[ -s "$rootfs" ]]; then
    log "base file system: $rootfs (cached)"
  else
    command -v mmdebstrap >/dev/null 2>&1 \
      || die "mmdebstrap not found: install it from Debian's packages (apt-get install mmdebstrap)"
    log "making the base file system with mmdebstrap ($suite): $rootfs"
    mmdebstrap "${debootstrap[@]}" "$suite" "$rootfs.partial.tar" >&2
    mv "$rootfs.partial.tar" "$rootfs"
  fi
  if [[ -n "$DRY_RUN" ]]; then
    printf '%q import %q %q\n' "$DOCKER" "$rootfs" "$base"
  elif ! "$DOCKER" image inspect "$base" >/dev/null 2>&1; then
    log "importing $rootfs as $base"
    "$DOCKER" import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      "$rootfs" "$base" >/dev/null
  fi

  # The cargo profile of the binaries: release (the default, fat LTO), or e.g. dev for a quick
  # image of a change (NANOCLAW_IMAGE_PROFILE=dev; the binaries are stripped either way).
  local profile="${NANOCLAW_IMAGE_PROFILE:-release}"
  local profile_dir="$profile"
  [[ "$profile" != dev ]] || profile_dir=debug
  local target="${CARGO_TARGET_DIR:-$ROOT/target}/$profile_dir"
  local context="$cache/context"
  if [[ -n "$DRY_RUN" ]]; then
    printf 'cargo build --profile %s --locked -p agent-runner -p mcp-tools -p host\n' "$profile"
  else
    log "binaries: cargo build --profile $profile --locked -p agent-runner -p mcp-tools -p host"
    cargo build --profile "$profile" --locked -p agent-runner -p mcp-tools -p host >&2
    rm -rf "$context"
    mkdir -p "$context/bin" "$context/scripts"
    for bin in agent-runner mcp-tools nanoclaw; do
      strip --strip-all -o "$context/bin/$bin" "$target/$bin"
    done
    cp versions.env "$context/"
    cp scripts/install-clis.sh "$context/scripts/"
    # container/Dockerfile's global ARGs and comments, a build stage that is the prebuilt
    # binaries, then its runtime stage verbatim (from `FROM ... AS runtime` to the end).
    awk '
      /^FROM / && !seen_from { seen_from = 1; print "FROM scratch AS build"; print "COPY bin/ /out/"; print "" }
      !seen_from { print }
      /^FROM .* AS runtime$/ { runtime = 1 }
      runtime { print }
    ' container/Dockerfile >"$context/Dockerfile"
    grep -q '^FROM .* AS runtime$' "$context/Dockerfile" \
      || die "container/Dockerfile has no 'FROM ... AS runtime' stage"
  fi
  CMD=(
    "$DOCKER" build
    -f "$context/Dockerfile"
    "${BUILD_ARGS[@]}"
    --build-arg "NODE_IMAGE=$base"
    --build-arg "CLIS=$CLIS"
    -t "$TAG"
    ${ARGS[@]+"${ARGS[@]}"}
    "$context"
  )
  if [[ -n "$DRY_RUN" ]]; then
    printf '%q ' "${CMD[@]}"
    printf '\n'
  else
    log "building $TAG offline (base $base, CLIs: $CLIS)"
    "${CMD[@]}"
    log "built $TAG"
  fi
}

CMD=(
  "$DOCKER" build
  -f container/Dockerfile
  "${BUILD_ARGS[@]}"
  --build-arg "CLIS=$CLIS"
  -t "$TAG"
  ${ARGS[@]+"${ARGS[@]}"}
  .
)

if [[ -n "$OFFLINE" ]]; then
  [[ -n "$DRY_RUN" ]] || command -v "$DOCKER" >/dev/null 2>&1 \
    || die "'$DOCKER' not found (set DOCKER=podman to use Podman)"
  offline_build
elif [[ -n "$DRY_RUN" ]]; then
  printf '%q ' "${CMD[@]}"
  printf '\n'
else
  command -v "$DOCKER" >/dev/null 2>&1 || die "'$DOCKER' not found (set DOCKER=podman to use Podman)"
  # The build stage's cache mounts need BuildKit. A docker client from 23 on runs it only
  # through the buildx plugin and, without it, fails in BuildKit's own words (issue 43, D5).
  if [[ "$(basename "$DOCKER")" == docker ]] && ! "$DOCKER" buildx version >/dev/null 2>&1 \
    && ! "$DOCKER" version --format '{{.Client.Version}}' 2>/dev/null | grep -q '^20\.'; then
    die "'$DOCKER' has no buildx plugin, which this build needs (BuildKit cache mounts): install it (Docker's packages: docker-buildx-plugin; Debian 12 has none), use Debian's own docker.io client (/usr/bin/docker, BuildKit built in: DOCKER=/usr/bin/docker), or build with --offline, which needs no BuildKit"
  fi
  log "building $TAG (CLIs: $CLIS; ${BUILD_ARGS[*]})"
  DOCKER_BUILDKIT=1 "${CMD[@]}"
  log "built $TAG"
fi

cat <<EOF

Run one session (container/README.md, "Run"; the session folder must be on a Linux filesystem
shared with the host process, never a VM's file share: for Docker Desktop, OrbStack or Podman
machine, see "serve in the VM" there):

  docker run --rm --name nanoclaw-SESSION \\
    -e NANOCLAW_RUN_AS="\$(id -u):\$(id -g)" \\
    -v /srv/nanoclaw/sessions/SESSION:/workspace \\
    -v /srv/nanoclaw/global:/workspace/global:ro \\
    -v /srv/projects/website:/workspace/extra/website \\
    -v /srv/nanoclaw/keys/anthropic:/run/secrets/anthropic:ro \\
    -e AGENT_PROVIDER=claude -e ANTHROPIC_API_KEY_FILE=/run/secrets/anthropic \\
    -e TZ=Europe/Berlin -e NANOCLAW_ADMIN_USER_ID=U0123ADMIN \\
    $TAG
EOF
