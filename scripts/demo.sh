#!/usr/bin/env bash
# A demo session end to end with the mock provider (no API key, no network): creates a session
# workspace, starts agent-runner, sends two messages as a host would, prints the replies (the mock
# replies with exactly the prompt it received, so you see what an agent would see) and stops.
set -euo pipefail
cd "$(dirname "$0")/.."

DEMO_DIR=${DEMO_DIR:-.demo}
echo "==> building agent-runner and nanoclaw"
cargo build --quiet -p agent-runner -p host --bins
BIN="${CARGO_TARGET_DIR:-target}/debug"

rm -rf "$DEMO_DIR"
export SESSION_DB="$DEMO_DIR/session.db"
echo "==> nanoclaw init"
"$BIN/nanoclaw" init --workspace "$DEMO_DIR" --routing demo:chat-1 --destination "ops=demo:ops-room:Ops room"

echo "==> starting agent-runner (mock provider, log in $DEMO_DIR/runner.log)"
TZ=${TZ:-Europe/Berlin} NANOCLAW_MOCK_DELAY_MS=${NANOCLAW_MOCK_DELAY_MS:-200} \
  "$BIN/agent-runner" --workspace "$DEMO_DIR" --provider mock 2>"$DEMO_DIR/runner.log" &
RUNNER=$!
stop_runner() {
  if kill -0 "$RUNNER" 2>/dev/null; then
    kill -TERM "$RUNNER"
    wait "$RUNNER" || true
  fi
}
trap stop_runner EXIT

ask() {
  if ! kill -0 "$RUNNER" 2>/dev/null; then
    echo "agent-runner exited; its log:" >&2
    cat "$DEMO_DIR/runner.log" >&2
    exit 1
  fi
  local seq
  seq=$("$BIN/nanoclaw" send --sender "$1" --sender-id "$2" --text "$3" | sed -n 's/.*seq=\([0-9]*\).*/\1/p')
  echo "==> sent message seq $seq from $1: $3"
  # The reply's seq is always above the message's.
  "$BIN/nanoclaw" watch --after "$seq" --until-count 1 --timeout 30 --mark-delivered
}

ask Alice alice-1 "Hello, agent! Can you summarise <this> & that?"
ask Bob bob-7 "Thanks. Please post the summary to the ops room."

stop_runner
trap - EXIT
echo "==> nanoclaw status"
"$BIN/nanoclaw" status
echo "==> demo finished: both messages answered"
