#!/usr/bin/env bash
# Validates the Kubernetes manifests (container/k8s/*.yaml) against the Kubernetes API schemas of
# each version in KUBERNETES_SCHEMA_VERSIONS (versions.env), strictly (an unknown field is an
# error, not ignored), with no network: the validator, kubernetes-validate from PyPI, bundles the
# schemas in its wheel. It is installed once into a project-local virtualenv (.tools/, ignored by
# git) at the versions of scripts/validate-k8s.requirements.txt; that install is the only step
# that needs the network (PyPI).
#
#   scripts/validate-k8s.sh                  # install if needed, then validate container/k8s/*.yaml
#   scripts/validate-k8s.sh FILE...          # validate these files instead
#   scripts/validate-k8s.sh --install        # install (or reinstall after a pin moved) only
#   scripts/validate-k8s.sh --offline [FILE...]  # never install: fail, naming the command, when
#                                            # the validator is missing (the tests use this)
#
# Needs python3 with its venv module (Debian: apt-get install python3-venv). Exit 0 when every
# document of every file is a known kind that validates against every version; 1 otherwise, with
# the file, the resource, the version, the field and the reason on one line each.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REQUIREMENTS="$ROOT/scripts/validate-k8s.requirements.txt"
VENV="${NANOCLAW_K8S_VALIDATE_DIR:-$ROOT/.tools/kubernetes-validate}"
VALIDATOR="$VENV/bin/kubernetes-validate"
# What the virtualenv was installed from: a changed requirements file means a reinstall.
STAMP="$VENV/.requirements"

log() { printf '[validate-k8s] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

MODE=validate
OFFLINE=
FILES=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --install) MODE=install; shift ;;
    --offline) OFFLINE=1; shift ;;
    -h | --help) sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1 (--install, --offline, or manifest files)" ;;
    *) FILES+=("$1"); shift ;;
  esac
done

installed() {
  [[ -x "$VALIDATOR" && -f "$STAMP" ]] && cmp -s "$REQUIREMENTS" "$STAMP"
}

install() {
  command -v python3 >/dev/null 2>&1 || die "python3 not found: install Python 3.8 or later with its venv module"
  log "installing $(grep -m1 '^kubernetes-validate==' "$REQUIREMENTS") into ${VENV#"$ROOT"/} (PyPI)"
  rm -rf "$VENV"
  python3 -m venv "$VENV" \
    || die "python3 -m venv failed: install the venv module (Debian: apt-get install python3-venv)"
  "$VENV/bin/pip" install --disable-pip-version-check --no-input --quiet -r "$REQUIREMENTS" \
    || die "pip could not install scripts/validate-k8s.requirements.txt (is PyPI reachable?)"
  cp "$REQUIREMENTS" "$STAMP"
}

if ! installed; then
  if [[ -n "$OFFLINE" ]]; then
    die "the validator is not installed in ${VENV#"$ROOT"/} (or its pins moved): run scripts/validate-k8s.sh --install"
  fi
  install
fi
[[ "$MODE" == install ]] && exit 0

versions="$(sed -n 's/^KUBERNETES_SCHEMA_VERSIONS=\([^[:space:]#]*\).*/\1/p' "$ROOT/versions.env" | head -n 1)"
[[ -n "$versions" ]] || die "no KUBERNETES_SCHEMA_VERSIONS=... line in versions.env"
IFS=, read -r -a VERSIONS <<<"$versions"

if [[ ${#FILES[@]} -eq 0 ]]; then
  shopt -s nullglob
  FILES=("$ROOT"/container/k8s/*.yaml "$ROOT"/container/k8s/*.yml)
  shopt -u nullglob
  [[ ${#FILES[@]} -gt 0 ]] || die "no manifests in container/k8s/"
fi

for file in "${FILES[@]}"; do
  [[ -f "$file" ]] || die "$file: no such file"
done

failed=0
resources=0
for version in "${VERSIONS[@]}"; do
  for file in "${FILES[@]}"; do
    # kubernetes-validate exits 0 on a kind it has no schema for (a WARN line), so every line
    # that is not a pass counts as a failure here, and a file must hold at least one resource.
    set +e
    output="$("$VALIDATOR" --strict --kubernetes-version "$version" "$file" 2>&1)"
    status=$?
    set -e
    name="${file#"$ROOT"/}"
    passes=0
    while IFS= read -r line; do
      [[ -z "$line" ]] && continue
      if [[ "$line" == "INFO "*" passed for resource "* ]]; then
        passes=$((passes + 1))
      else
        printf '%s\n' "${line/"$file"/"$name"}"
        failed=1
      fi
    done <<<"$output"
    if [[ $status -ne 0 ]]; then
      failed=1
    elif [[ $passes -eq 0 ]]; then
      log "error: $name holds no Kubernetes resource"
      failed=1
    fi
    resources=$((resources + passes))
  done
done

if [[ $failed -ne 0 ]]; then
  log "FAILED: fix the fields named above (Kubernetes ${VERSIONS[*]}, strict)"
  exit 1
fi
log "ok: ${#FILES[@]} files, $((resources / ${#VERSIONS[@]})) resources, valid against Kubernetes ${VERSIONS[*]} (strict, offline)"
