#!/usr/bin/env bash
# The project's test command (README, .ci/run): installs the pinned CLIs into .cli/ and the test
# tools into .tools/ (bindfs, the Kubernetes manifest validator; reused when present), validates
# container/k8s/, checks formatting and lints, runs the README's demo, then every test; its last
# lines are the test runner's summary, then the run's elapsed time and the size of target/.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}

# Each step's line carries the run's elapsed time so far: where CI's minutes go (issue 42's
# 10-minute bound) is read off the log.
step() { printf '\n==> [%s] %s\n' "$(elapsed_so_far)" "$*"; }
elapsed_so_far() {
  local elapsed=$(($(date +%s) - started))
  printf '%dm%02ds' "$((elapsed / 60))" "$((elapsed % 60))"
}

# The figures issue 42 bounds (at most 10 minutes on 2 cores, target/ under 4 GiB), printed
# however the run ends.
started=$(date +%s)
report() {
  printf '\n==> elapsed %s; %s: %s\n' "$(elapsed_so_far)" \
    "${CARGO_TARGET_DIR:-target}" "$(du -sh "${CARGO_TARGET_DIR:-target}" 2>/dev/null | cut -f1)"
}
trap report EXIT

# A clean CI build writes each crate once: incremental caches only cost disk there (about 2.5 GiB
# of the ~7 GiB a from-scratch run wrote) and time.
if [ -n "${CI:-}" ]; then
  export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
fi

# A full disk fails the build deep inside rustc ("IO failure on output stream"); say so up front.
target_dir=${CARGO_TARGET_DIR:-target}
mkdir -p "$target_dir"
free_kib=$(df -Pk "$target_dir" | awk 'NR == 2 { print $4 }')
need_gib=6
if [ -n "$free_kib" ] && [ "$free_kib" -lt $((need_gib * 1024 * 1024)) ]; then
  printf 'warning: %s GiB free under %s; a build from scratch writes about %s GiB. Free space there or point CARGO_TARGET_DIR at a larger disk.\n' \
    "$((free_kib / 1024 / 1024))" "$target_dir" "$need_gib" >&2
fi

step "installing the pinned agent CLIs into .cli/ (npm)"
bash scripts/install-clis.sh
if [ -f scripts/install-inspector.sh ]; then
  step "installing the pinned MCP Inspector CLI"
  bash scripts/install-inspector.sh
fi
# bindfs, for the tests that refuse a session DB on a FUSE mount (they mount it as root; as
# another user they say that they skip the FUSE case).
step "unpacking the test tools into .tools/ (bindfs, from Debian's packages)"
bash scripts/install-test-tools.sh

# The Kubernetes manifests against the Kubernetes API schemas: installs the pinned validator into
# .tools/ (PyPI, reused when present), then validates offline (about 2 s). The container test
# agent-runner/tests/container.rs runs it again, offline, with a broken manifest too.
step "validating container/k8s/ against the Kubernetes schemas (kubernetes-validate)"
bash scripts/validate-k8s.sh

# The code's shape (issue 42's limits): functions over 120 lines and files over 1,000 production
# lines (scripts/code-size.sh), import loops between files and upward imports
# (scripts/module-deps.py). Printed on every run, and every crate is within them, so they fail
# the run (NANOCLAW_STRICT_SHAPE=1, the default); NANOCLAW_STRICT_SHAPE=0 only prints them, for
# a work-in-progress tree (docs/decisions/repo.md#D-REPO-03).
step "code shape: function and file sizes, import loops (NANOCLAW_STRICT_SHAPE=${NANOCLAW_STRICT_SHAPE:-1})"
shape_failed=0
bash scripts/code-size.sh || shape_failed=1
echo
python3 scripts/module-deps.py --strict || shape_failed=1
if [ "$shape_failed" = 1 ]; then
  if [ "${NANOCLAW_STRICT_SHAPE:-1}" = 1 ]; then
    echo "code shape: over the limits above (NANOCLAW_STRICT_SHAPE=1)" >&2
    exit 1
  fi
  echo "code shape: over the limits above; not failing the run (NANOCLAW_STRICT_SHAPE=0)"
fi

step "cargo fmt --check"
cargo fmt --all -- --check
# No --quiet: the first run compiles every crate (several minutes on 2 cores); cargo's progress
# says what it is doing.
step "cargo clippy -D warnings (the first build compiles about 300 crates: minutes)"
cargo clippy --workspace --all-targets -- -D warnings

# The test build also builds every binary the tests spawn (each package with a binary has
# integration tests, so cargo builds its binary for them): one build of the workspace with the
# tests' features, where a separate `cargo build --workspace --bins` compiled about 20 crates
# twice (the tests' dev-dependencies add features, e.g. tokio's `test-util`).
step "building the tests and every binary they spawn"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-run
else
  cargo test --workspace --no-run
fi

step "the README demo"
# With the binaries just built: the demo's own `cargo build -p …` unifies features differently
# from the workspace's and compiled about 100 crates again (74 s of a CI run).
NANOCLAW_BIN_DIR="${CARGO_TARGET_DIR:-target}/debug" bash scripts/demo.sh

# The container image, built by the offline path and run by a real engine (scripts/image-test.sh:
# it installs and starts one from Debian's packages when none runs, as root). Where no engine can
# run, it says why and the run goes on, loudly marked as without the image checks.
step "the container image: build (offline path) and run (scripts/image-test.sh)"
# The dev profile's binaries (the test build above made most of them; a release build with fat LTO
# would add minutes), stripped like release ones; the base file system cached outside the clone,
# so a CI run on the same machine reuses it.
image_test_status=0
# The test build's binaries as they are (NANOCLAW_IMAGE_BIN_DIR): build.sh's own `cargo build -p`
# would unify features differently and relink all three (as the demo's did).
NANOCLAW_IMAGE_PROFILE="${NANOCLAW_IMAGE_PROFILE:-dev}" \
  NANOCLAW_IMAGE_BIN_DIR="${NANOCLAW_IMAGE_BIN_DIR:-${CARGO_TARGET_DIR:-target}/debug}" \
  NANOCLAW_IMAGE_CACHE="${NANOCLAW_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nanoclaw-image}" \
  bash scripts/image-test.sh || image_test_status=$?
if [ "$image_test_status" -eq 77 ]; then
  printf '\n!!! SKIPPED: the container image checks (scripts/image-test.sh): no container engine can run here (the reason is printed above) !!!\n\n'
elif [ "$image_test_status" -ne 0 ]; then
  exit "$image_test_status"
fi

step "tests"
# cargo-nextest (when installed) runs the test binaries side by side, which matters here: the
# end-to-end suites spend most of their time waiting on real CLIs. Plain `cargo test` otherwise.
if cargo nextest --version >/dev/null 2>&1; then
  # The slots per kind of test are in .config/nextest.toml; NANOCLAW_TEST_THREADS overrides the
  # total.
  cargo nextest run --workspace --no-fail-fast ${NANOCLAW_TEST_THREADS:+--test-threads "$NANOCLAW_TEST_THREADS"}
else
  output=$(mktemp)
  trap 'rm -f "$output"; report' EXIT
  cargo test --workspace --no-fail-fast 2>&1 | tee "$output"
  # One closing line for CI: the sum of every test binary's result line.
  awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?/) p += $(i-1); if ($i ~ /^failed;?/) f += $(i-1); if ($i ~ /^ignored;?/) s += $(i-1) } }
       END { printf "cargo: %d passed, %d failed, %d skipped\n", p, f, s }' "$output"
fi

