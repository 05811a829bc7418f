#!/usr/bin/env bash
# A demo session end to end: creates a session workspace, starts agent-runner, sends messages as
# a host would, prints the conversation and stops.
#
#   scripts/demo.sh                      # the mock provider: no API key, no network, no Node.js;
#                                        # it replies with exactly the prompt it received
#   scripts/demo.sh --provider claude    # a real CLI (claude, codex or opencode) against the
#                                        # project's fake model server on 127.0.0.1: no key, no
#                                        # network; the agent runs a shell command, asks a
#                                        # question answered with `nanoclaw answer`, and replies
#   scripts/demo.sh --provider codex --base-url https://gateway.example/v1 --model gpt-5
#                                        # the same CLI against a real model gateway: the key comes
#                                        # from ANTHROPIC_API_KEY (claude) or OPENAI_API_KEY
#
# A CLI provider installs its pinned CLI into .cli/ (scripts/install-clis.sh <cli>) unless
# CLAUDE_PATH / CODEX_PATH / OPENCODE_PATH names one. DEMO_DIR (default .demo in the repository
# root) is the session folder: it is deleted and re-created on every run, so the demo refuses a
# folder it did not create (its marker file is .nanoclaw-demo). NANOCLAW_BIN_DIR names a folder
# with the built binaries and skips the build (the tests use it). A relative path in DEMO_DIR,
# NANOCLAW_BIN_DIR, NANOCLAW_CLI_DIR or a CLI's *_PATH is taken from the folder the demo is
# started in.
set -euo pipefail
CALLER_DIR=$PWD
cd "$(dirname "$0")/.."

# A path the user gave, absolute against the folder the demo was started in (the script itself
# runs in the repository root).
from_caller() {
  case "$1" in
    /*) printf '%s\n' "$1" ;;
    *) printf '%s\n' "$CALLER_DIR/$1" ;;
  esac
}

usage() {
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
}

PROVIDER=mock
BASE_URL=
MODEL=
while [[ $# -gt 0 ]]; do
  case "$1" in
    --provider) PROVIDER=${2:?--provider needs mock, claude, codex or opencode}; shift 2 ;;
    --provider=*) PROVIDER=${1#*=}; shift ;;
    --base-url) BASE_URL=${2:?--base-url needs the gateway URL}; shift 2 ;;
    --base-url=*) BASE_URL=${1#*=}; shift ;;
    --model) MODEL=${2:?--model needs a model name}; shift 2 ;;
    --model=*) MODEL=${1#*=}; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "demo.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
case "$PROVIDER" in
  mock | claude | codex | opencode) ;;
  *) echo "demo.sh: --provider must be mock, claude, codex or opencode (not '$PROVIDER')" >&2; exit 2 ;;
esac
if [[ -n "$BASE_URL" && "$PROVIDER" == mock ]]; then
  echo "demo.sh: --base-url needs a CLI provider (--provider claude, codex or opencode)" >&2
  exit 2
fi

# The default stays relative: the binaries make it absolute themselves (the demo runs them from
# the repository root), which the demo test checks for each CLI.
if [[ -n "${DEMO_DIR:-}" ]]; then
  DEMO_DIR=$(from_caller "$DEMO_DIR")
else
  DEMO_DIR=.demo
fi
if [[ -n "${NANOCLAW_CLI_DIR:-}" ]]; then
  NANOCLAW_CLI_DIR=$(from_caller "$NANOCLAW_CLI_DIR")
  export NANOCLAW_CLI_DIR
fi
MARKER=.nanoclaw-demo
# One demo at a time per parent folder (the tests run the default .demo beside other demos): a
# lock on the folder itself, no file. Background processes get the descriptor closed (9<&-), so
# none of them holds the lock after the demo.
demo_parent=$(dirname "$DEMO_DIR")
mkdir -p "$demo_parent"
if command -v flock >/dev/null 2>&1; then
  exec 9<"$demo_parent"
  if ! flock -n 9; then
    echo "==> waiting for another demo in $demo_parent to finish"
    flock 9
  fi
fi
# The folder is removed with rm -rf: only a folder this script created (its marker file, not a
# link) or nothing at all. The default .demo of an older demo (no marker yet) is the project's
# own git-ignored folder, and is taken as one.
if [[ -L "$DEMO_DIR" ]]; then
  echo "demo.sh: DEMO_DIR=$DEMO_DIR is a symbolic link, not a demo folder: refusing to delete it" >&2
  exit 1
fi
if [[ -e "$DEMO_DIR" ]]; then
  legacy=
  [[ "$DEMO_DIR" == .demo && -f .demo/session.db && -f .demo/runner.log ]] && legacy=1
  if [[ ! -d "$DEMO_DIR" ]] ||
    { [[ -n "$(ls -A "$DEMO_DIR")" ]] && [[ -z "$legacy" ]] &&
      { [[ -L "$DEMO_DIR/$MARKER" ]] || [[ ! -f "$DEMO_DIR/$MARKER" ]]; }; }; then
    echo "demo.sh: DEMO_DIR=$DEMO_DIR exists and is not a demo folder (no $MARKER file in it): refusing to delete it; choose another DEMO_DIR" >&2
    exit 1
  fi
fi

if [[ -n "${NANOCLAW_BIN_DIR:-}" ]]; then
  BIN=$(cd "$(from_caller "$NANOCLAW_BIN_DIR")" && pwd)
else
  BIN="${CARGO_TARGET_DIR:-target}/debug"
  crates=(-p agent-runner -p mcp-tools -p host)
  what="agent-runner, mcp-tools and nanoclaw"
  if [[ "$PROVIDER" != mock && -z "$BASE_URL" ]]; then
    crates+=(-p e2e)
    what="$what and the fake model server"
  fi
  if [[ -x "$BIN/agent-runner" ]]; then
    echo "==> building $what (cargo's progress below)"
  else
    echo "==> building $what: the first build compiles about 300 crates, several minutes on 2 cores (cargo's progress below); later runs take seconds"
  fi
  cargo build "${crates[@]}" --bins
  # Absolute: the CLI starts mcp-tools from its own working directory.
  BIN=$(cd "$BIN" && pwd)
fi

CLI=
if [[ "$PROVIDER" != mock ]]; then
  command -v node >/dev/null 2>&1 || {
    echo "demo.sh: --provider $PROVIDER needs Node.js (22 or later) and npm for the CLI: see README.md, Prerequisites" >&2
    exit 1
  }
  case "$PROVIDER" in
    claude) cli_var=CLAUDE_PATH ;;
    codex) cli_var=CODEX_PATH ;;
    opencode) cli_var=OPENCODE_PATH ;;
  esac
  CLI=${!cli_var:-}
  if [[ -n "$CLI" ]]; then
    CLI=$(from_caller "$CLI")
  else
    echo "==> the pinned $PROVIDER CLI (scripts/install-clis.sh $PROVIDER)"
    bash scripts/install-clis.sh "$PROVIDER"
    CLI="${NANOCLAW_CLI_DIR:-$PWD/.cli}/node_modules/.bin/$PROVIDER"
  fi
  [[ -x "$CLI" ]] || { echo "demo.sh: the $PROVIDER CLI is not at $CLI" >&2; exit 1; }
fi

rm -rf -- "$DEMO_DIR"
mkdir -p "$DEMO_DIR"
echo "created by scripts/demo.sh; the next demo run deletes this folder" >"$DEMO_DIR/$MARKER"
export SESSION_DB="$DEMO_DIR/session.db"
echo "==> nanoclaw init"
"$BIN/nanoclaw" init --workspace "$DEMO_DIR" --routing demo:chat-1 --destination "ops=demo:ops-room:Ops room"

RUNNER=
FAKE=
stop_runner() {
  if [[ -n "$RUNNER" ]] && kill -0 "$RUNNER" 2>/dev/null; then
    kill -TERM "$RUNNER"
    wait "$RUNNER" || true
  fi
  if [[ -n "$FAKE" ]] && kill -0 "$FAKE" 2>/dev/null; then
    kill -TERM "$FAKE"
    wait "$FAKE" 2>/dev/null || true
  fi
}
trap stop_runner EXIT

runner_alive() {
  if ! kill -0 "$RUNNER" 2>/dev/null; then
    echo "agent-runner exited; its log:" >&2
    cat "$DEMO_DIR/runner.log" >&2
    exit 1
  fi
}

# Sends a chat message; prints its seq.
send() {
  "$BIN/nanoclaw" send --sender "$1" --sender-id "$2" --text "$3" | sed -n 's/.*seq=\([0-9]*\).*/\1/p'
}

if [[ "$PROVIDER" == mock ]]; then
  echo "==> starting agent-runner (mock provider, log in $DEMO_DIR/runner.log)"
  TZ=${TZ:-Europe/Berlin} NANOCLAW_MOCK_DELAY_MS=${NANOCLAW_MOCK_DELAY_MS:-200} \
    "$BIN/agent-runner" --workspace "$DEMO_DIR" --provider mock 2>"$DEMO_DIR/runner.log" 9<&- &
  RUNNER=$!

  ask() {
    runner_alive
    local seq
    seq=$(send "$1" "$2" "$3")
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
  exit 0
fi

# A real CLI. Its model: the fake model server (scripted: a shell command, a question, a reply)
# or the gateway of --base-url.
if [[ -z "$BASE_URL" ]]; then
  case "$PROVIDER" in
    claude) shell='{"kind":"raw_tool_call","name":"Bash","arguments":{"command":"uname -sr","description":"Show the kernel"}}' ;;
    codex) shell='{"kind":"raw_tool_call","name":"exec_command","arguments":{"cmd":"uname -sr"}}' ;;
    opencode) shell='{"kind":"raw_tool_call","name":"bash","arguments":{"command":"uname -sr","description":"Show the kernel"}}' ;;
  esac
  cat >"$DEMO_DIR/fake-model-script.json" <<EOF
[
  $shell,
  {"kind":"tool_call","name":"ask_user_question","arguments":{"question":"Post the kernel version to the ops room?","options":["Yes","No"]}},
  {"kind":"text","text":"Done: I ran uname -sr, asked you, and you said Yes."}
]
EOF
  echo "==> starting the fake model server on 127.0.0.1 (log in $DEMO_DIR/fake-model.log)"
  "$BIN/fake-model" --script "$DEMO_DIR/fake-model-script.json" --default-text "ok" \
    >"$DEMO_DIR/fake-model.log" 2>&1 9<&- &
  FAKE=$!
  url=
  for _ in $(seq 1 100); do
    url=$(head -n 1 "$DEMO_DIR/fake-model.log" 2>/dev/null | grep '^http://127\.0\.0\.1:' || true)
    [[ -n "$url" ]] && break
    kill -0 "$FAKE" 2>/dev/null || { cat "$DEMO_DIR/fake-model.log" >&2; exit 1; }
    sleep 0.1
  done
  [[ -n "$url" ]] || { echo "demo.sh: the fake model server did not start" >&2; exit 1; }
  key=sk-fake-demo
  export ANTHROPIC_BASE_URL="$url" ANTHROPIC_API_KEY="$key"
  export OPENAI_BASE_URL="$url/v1" OPENAI_API_KEY="$key"
  MODEL=${MODEL:-fake-model}
  # OpenCode looks up plugins in the npm registry in the background: keep that on loopback too.
  export NPM_CONFIG_REGISTRY="$url/npm/"
  export NANOCLAW_CLI_MAX_RETRIES=1
  TEXT="Please check which kernel this machine runs, and ask me before you post it."
else
  case "$PROVIDER" in
    claude) key_var=ANTHROPIC_API_KEY; export ANTHROPIC_BASE_URL="$BASE_URL" ;;
    *) key_var=OPENAI_API_KEY; export OPENAI_BASE_URL="$BASE_URL" ;;
  esac
  if [[ -z "${!key_var:-}" && -z "$(printenv "${key_var}_FILE" || true)" ]]; then
    echo "demo.sh: --base-url needs the gateway's key in $key_var (or ${key_var}_FILE)" >&2
    exit 1
  fi
  TEXT="Please run 'uname -sr' in your shell, then ask me with the ask_user_question tool whether to post the result to the ops room (options: Yes, No), then reply with what you did."
fi
if [[ -n "$MODEL" ]]; then
  case "$PROVIDER" in
    claude) export CLAUDE_MODEL="$MODEL" ;;
    codex) export CODEX_MODEL="$MODEL" ;;
    opencode) export OPENCODE_MODEL="$MODEL" ;;
  esac
fi
export "$cli_var=$CLI"
export MCP_TOOLS_PATH="$BIN/mcp-tools"

echo "==> starting agent-runner ($PROVIDER: $CLI; log in $DEMO_DIR/runner.log)"
TZ=${TZ:-Europe/Berlin} "$BIN/agent-runner" --workspace "$DEMO_DIR" --provider "$PROVIDER" \
  2>"$DEMO_DIR/runner.log" 9<&- &
RUNNER=$!

# The value of a top-level field of one `nanoclaw watch --json` line (or of its content).
field() {
  node -e '
    const row = JSON.parse(process.argv[1]);
    const content = typeof row.content === "object" && row.content !== null ? row.content : {};
    const value = row[process.argv[2]] ?? content[process.argv[2]];
    process.stdout.write(value === undefined || value === null ? "" : String(value));
  ' "$1" "$2"
}

runner_alive
seq=$(send Alice alice-1 "$TEXT")
echo "==> sent message seq $seq from Alice: $TEXT"
last=$seq
answered=
while :; do
  runner_alive
  # The next row the agent writes, as JSON to read and as a line to show.
  row=$("$BIN/nanoclaw" watch --json --after "$last" --until-count 1 --timeout 120 --mark-delivered)
  "$BIN/nanoclaw" watch --after "$last" --until-count 1 --no-follow
  last=$(field "$row" seq)
  question=$(field "$row" questionId)
  if [[ -n "$question" ]]; then
    echo "==> answering: nanoclaw answer --question $question --option Yes"
    "$BIN/nanoclaw" answer --question "$question" --option Yes
    answered=1
    continue
  fi
  if [[ "$(field "$row" kind)" == system ]]; then
    echo "demo.sh: the turn failed (a system row above); the runner's log:" >&2
    tail -n 30 "$DEMO_DIR/runner.log" >&2
    exit 1
  fi
  break
done
if [[ -z "$answered" && -z "$BASE_URL" ]]; then
  echo "demo.sh: the agent replied without asking its question (the MCP tools did not reach it?); the runner's log:" >&2
  tail -n 30 "$DEMO_DIR/runner.log" >&2
  exit 1
fi

stop_runner
trap - EXIT
if [[ -z "$BASE_URL" ]]; then
  echo "==> what the model server received (the tool results are what the agent's tools returned)"
  sed -n '2,$p' "$DEMO_DIR/fake-model.log" | grep -v '^fake-model:' || true
fi
echo "==> nanoclaw status"
"$BIN/nanoclaw" status
echo "==> demo finished: $PROVIDER ran a tool, asked a question, got the answer and replied"
