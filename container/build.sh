#!/usr/bin/env bash
# Builds the agent image from the repository root, with the pins of versions.env (the CLI
# versions and the base images, read from that file, so the image and the local install cannot
# drift), then prints the `docker run` line.
#
#   container/build.sh                       # docker build -t nanoclaw-agent:<workspace version>
#   container/build.sh --clis claude         # only the named CLIs (claude, codex, opencode,
#                                            # gemini, qwen, a list, all, or none for the mock
#                                            # provider); default the three native ones. No Node
#                                            # in the image unless gemini or qwen is chosen.
#   container/build.sh --ca-cert corp-ca.pem # an extra CA for the build's downloads (a
#                                            # TLS-intercepting proxy): a build secret, in no layer
#   container/build.sh --dry-run             # print the build command, do not run it
#   IMAGE=registry.example/nanoclaw-agent VERSION=dev container/build.sh --push
#   DOCKER=podman container/build.sh         # any docker-compatible CLI with BuildKit features
#   container/build.sh --offline --clis none # no image registry: a Debian root file system made
#                                            # with mmdebstrap (cached in .cache/image/, or
#                                            # $NANOCLAW_IMAGE_CACHE), the CLIs installed from
#                                            # the npm registry on this machine, the workspace's
#                                            # own release binaries (stripped), then the same runtime
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
CA_CERT=
CLIS="claude codex opencode"
ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DRY_RUN=1; shift ;;
    --offline) OFFLINE=1; shift ;;
    --clis) CLIS="${2:?--clis needs a list: claude, codex, opencode, gemini, qwen (comma or space separated), all or none}"; shift 2 ;;
    --clis=*) CLIS="${1#*=}"; shift ;;
    --ca-cert) CA_CERT="${2:?--ca-cert needs a PEM file}"; shift 2 ;;
    --ca-cert=*) CA_CERT="${1#*=}"; shift ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
CLIS="${CLIS//,/ }"
read -r -a selected <<<"$CLIS"
[[ ${#selected[@]} -gt 0 ]] || die "--clis is empty: name at least one CLI, all, or none"
ALL_CLIS=(claude codex opencode gemini qwen)
if [[ "${selected[*]}" == all ]]; then
  selected=("${ALL_CLIS[@]}")
fi
for cli in "${selected[@]}"; do
  case "$cli" in
    claude | codex | opencode | gemini | qwen) ;;
    none) [[ ${#selected[@]} -eq 1 ]] || die "--clis none goes alone" ;;
    all) die "--clis all goes alone" ;;
    *) die "unknown CLI '$cli' in --clis (known: ${ALL_CLIS[*]}; or all, or none)" ;;
  esac
done
CLIS="${selected[*]}"
if [[ -n "$CA_CERT" ]]; then
  [[ -f "$CA_CERT" && -r "$CA_CERT" ]] || die "--ca-cert $CA_CERT: no readable file there"
  grep -q -- '-----BEGIN CERTIFICATE-----' "$CA_CERT" \
    || die "--ca-cert $CA_CERT: not a PEM certificate (no '-----BEGIN CERTIFICATE-----' line)"
  CA_CERT="$(cd "$(dirname "$CA_CERT")" && pwd)/$(basename "$CA_CERT")"
fi

# The pin of a Node CLI (Gemini CLI, Qwen Code): they run on Node, which the image then carries.
NODE_CLIS=()
for cli in "${selected[@]}"; do
  case "$cli" in
    gemini | qwen)
      name=GEMINI_CLI_VERSION
      [[ "$cli" == gemini ]] || name=QWEN_CODE_VERSION
      grep -q "^$name=[^[:space:]#]" versions.env \
        || die "--clis $cli: versions.env has no $name=... line (the pinned version of that CLI); pin it there (and teach scripts/install-clis.sh the package) before building an image with it"
      NODE_CLIS+=("$cli")
      ;;
  esac
done

# The pins the Dockerfile declares as build arguments.
PINS=(CLAUDE_CODE_VERSION CODEX_VERSION OPENCODE_VERSION RUST_IMAGE NODE_IMAGE DEBIAN_IMAGE)
BUILD_ARGS=()
for name in "${PINS[@]}"; do
  BUILD_ARGS+=(--build-arg "$name=$(pin "$name")")
done
# The image version defaults to the workspace version ([workspace.package] in Cargo.toml).
VERSION="${VERSION:-$(sed -n '/^\[workspace\.package\]/,/^\[/s/^version *= *"\([^"]*\)".*/\1/p' Cargo.toml | head -n 1)}"
[[ -n "$VERSION" ]] || die "cannot read the workspace version from Cargo.toml; set VERSION"
IMAGE="${IMAGE:-nanoclaw-agent}"
DOCKER="${DOCKER:-docker}"
# Each selection of CLIs is a tag of its own: nanoclaw-agent:0.1.0 carries the three native
# ones, nanoclaw-agent:0.1.0-none none, nanoclaw-agent:0.1.0-codex-opencode those two,
# nanoclaw-agent:0.1.0-all all five.
if [[ "$CLIS" == "claude codex opencode" ]]; then
  TAG="$IMAGE:$VERSION"
elif [[ "$CLIS" == "${ALL_CLIS[*]}" ]]; then
  TAG="$IMAGE:$VERSION-all"
else
  TAG="$IMAGE:$VERSION-${CLIS// /-}"
fi
case "$(basename "$DOCKER")" in
  # Podman and Buildah write OCI images by default, and the OCI format has no HEALTHCHECK: they
  # would drop the image's health check without a word (issue 43, D2).
  podman | buildah) BUILD_ARGS+=(--format docker) ;;
esac
# The extra CA is a build secret (BuildKit's and podman's --secret): the RUNs that fetch mount it
# at /run/secrets/ca for their own duration; no layer keeps it (issue 43, D7).
SECRET_ARGS=()
[[ -z "$CA_CERT" ]] || SECRET_ARGS=(--secret "id=ca,src=$CA_CERT")

# The offline path's CLIs: installed on this machine from the npm registry by
# scripts/install-clis.sh into the cache (its `cli/` folder), then laid out by
# container/stage-clis.sh into the build context, as the Dockerfile's `clis` stage does. A Node
# CLI gets Node from the npm registry's packaged builds (the `node-linux-<arch>` package of the
# NODE_IMAGE version), not from an image.
stage_clis_offline() {
  local cache="$1" out="$2" node=() ca_env=()
  [[ -z "$CA_CERT" ]] || ca_env=("NODE_EXTRA_CA_CERTS=$CA_CERT" "npm_config_cafile=$CA_CERT")
  rm -rf "$out"
  if [[ "$CLIS" != none ]]; then
    env ${ca_env[@]+"${ca_env[@]}"} NANOCLAW_CLI_DIR="$cache/cli" \
      NANOCLAW_OPENCODE_BUILD="${OPENCODE_BUILD:-baseline}" bash scripts/install-clis.sh "${selected[@]}" >&2
  fi
  if [[ ${#NODE_CLIS[@]} -gt 0 ]]; then
    local node_version arch
    node_version="$(pin NODE_IMAGE)"
    node_version="${node_version#*:}"
    node_version="${node_version%%-*}"
    case "$(uname -m)" in x86_64) arch=x64 ;; aarch64) arch=arm64 ;; *) die "no packaged Node build for $(uname -m)" ;; esac
    local node_dir="$cache/node-linux-$arch-$node_version"
    if [[ ! -x "$node_dir/package/bin/node" ]]; then
      log "Node $node_version from the npm registry (node-linux-$arch@$node_version)"
      mkdir -p "$node_dir"
      (cd "$node_dir" && env ${ca_env[@]+"${ca_env[@]}"} npm pack --silent "node-linux-$arch@$node_version" >/dev/null \
        && tar -xzf "node-linux-$arch-$node_version.tgz" && rm -f "node-linux-$arch-$node_version.tgz") \
        || die "could not fetch node-linux-$arch@$node_version from the npm registry"
    fi
    node=(--node "$node_dir/package/bin/node")
  fi
  bash container/stage-clis.sh --modules "$cache/cli/node_modules" --out "$out" ${node[@]+"${node[@]}"} "${selected[@]}"
}

# The offline path: no image registry. A Debian root file system from Debian's packages
# (mmdebstrap, cached by its arguments), imported as the runtime stage's base; the workspace's
# release binaries, stripped, as the build stage; container/Dockerfile's runtime stage itself,
# verbatim, on top. The build context is a small folder of its own (never the workspace).
offline_build() {
  local cache="${NANOCLAW_IMAGE_CACHE:-$ROOT/.cache/image}"
  local suite
  suite="$(pin DEBIAN_SUITE)"
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
    # A mirror that serves a snapshot has expired Release files; the setting stays out of the
    # image.
    '--aptopt=Acquire::Check-Valid-Until "false"'
    '--customize-hook=rm -f "$1/etc/apt/apt.conf.d/99mmdebstrap" "$1"/var/cache/apt/*.bin'
    # What the runtime never uses (Perl, git's servers, docs...): container/slim-rootfs.sh, the
    # same script the online path's base stage runs.
    '--customize-hook=copy-in container/slim-rootfs.sh /tmp'
    '--customize-hook=chroot "$1" sh /tmp/slim-rootfs.sh && rm -f "$1/tmp/slim-rootfs.sh"'
  )
  local key
  key="$(cat - container/slim-rootfs.sh <<<"$(printf '%s\n' "$suite" "${debootstrap[@]}")" | sha256sum | cut -c1-12)"
  local rootfs="$cache/rootfs-$suite-$key.tar"
  # The extra CA reaches mmdebstrap's apt on the host only (not part of the cache key: the file
  # system does not depend on it; the option file is removed by the customize hook above).
  [[ -z "$CA_CERT" ]] || debootstrap+=("--aptopt=Acquire::https::CAInfo \"$CA_CERT\"")
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
  # NANOCLAW_IMAGE_BIN_DIR: binaries built already (scripts/test.sh passes the test build's,
  # where a `cargo build -p ...` of its own would unify features differently and relink them).
  local prebuilt="${NANOCLAW_IMAGE_BIN_DIR:-}"
  if [[ -n "$DRY_RUN" ]]; then
    [[ -n "$prebuilt" ]] || printf 'cargo build --profile %s --locked -p agent-runner -p mcp-tools -p host\n' "$profile"
  else
    if [[ -n "$prebuilt" ]]; then
      target="$prebuilt"
      for bin in agent-runner mcp-tools nanoclaw; do
        [[ -x "$target/$bin" ]] || die "NANOCLAW_IMAGE_BIN_DIR=$prebuilt has no $bin: build it (cargo build -p agent-runner -p mcp-tools -p host) or unset the variable"
      done
      log "binaries: the ones in $prebuilt (NANOCLAW_IMAGE_BIN_DIR)"
    else
      log "binaries: cargo build --profile $profile --locked -p agent-runner -p mcp-tools -p host"
      # The extra CA for the crate registry (none is downloaded when the registry cache is warm).
      local cargo_env=()
      [[ -z "$CA_CERT" ]] || cargo_env=("CARGO_HTTP_CAINFO=$CA_CERT")
      env ${cargo_env[@]+"${cargo_env[@]}"} \
        cargo build --profile "$profile" --locked -p agent-runner -p mcp-tools -p host >&2
    fi
    rm -rf "$context"
    mkdir -p "$context/bin"
    for bin in agent-runner mcp-tools nanoclaw; do
      strip --strip-all -o "$context/bin/$bin" "$target/$bin"
    done
    stage_clis_offline "$cache" "$context/cli"
    # container/Dockerfile's global ARGs and comments, a build stage that is the prebuilt
    # binaries and a CLI stage that is the staged CLIs, then its runtime stage verbatim (from
    # `FROM ... AS runtime` to the end).
    awk '
      /^FROM / && !seen_from { seen_from = 1; print "FROM scratch AS build"; print "COPY bin/ /out/"; print "FROM scratch AS clis"; print "COPY cli/ /cli/"; print "" }
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
    --build-arg "RUNTIME_BASE=$base"
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
  ${SECRET_ARGS[@]+"${SECRET_ARGS[@]}"}
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
