#!/usr/bin/env bash
# Manual check (needs npm and PyPI): the zoo, unmodified, against real clients
# that honour rate-limit headers: GitHub's @octokit/plugin-throttling and
# urllib3's Retry. Not part of .ci/run.
#
#   scripts/clients/check.sh            # memory store, then Redis (a private redis-server)
#   CHECK_STORES=memory scripts/clients/check.sh
#
# Builds the zoo (debug), installs the pinned clients when missing
# (node_modules/ and .venv/ here, both ignored by git), starts the zoo on a free
# loopback port with ZOO_LIMIT=3 per ZOO_WINDOW_SECS=3, runs both clients at
# once (each with its own X-Api-Key), stops what it started, and exits non-zero
# if any check failed. About 12 s per store once built and installed.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$repo/target}
export ZOO_LIMIT=${ZOO_LIMIT:-3}
export ZOO_WINDOW_SECS=${ZOO_WINDOW_SECS:-3}
# /penalty/tigerfeeding: 2 per window; 2 rejections within it block for 2 s.
export ZOO_PENALTY_LIMIT=${ZOO_PENALTY_LIMIT:-2} ZOO_PENALTY_STRIKES=${ZOO_PENALTY_STRIKES:-2}
export ZOO_PENALTY_WINDOW_SECS=$ZOO_WINDOW_SECS ZOO_PENALTY_BLOCK_SECS=${ZOO_PENALTY_BLOCK_SECS:-2}
stores=${CHECK_STORES:-memory redis}
# A client needs three windows for its burst, plus octokit's extra second or two per wait.
client_timeout=$((6 * ZOO_WINDOW_SECS + 15))

if [ "$ZOO_WINDOW_SECS" -lt 2 ] || [ "$ZOO_LIMIT" -lt 1 ]; then
  echo "check.sh: needs ZOO_LIMIT >= 1 and ZOO_WINDOW_SECS >= 2" >&2
  exit 2
fi

work=$(mktemp -d)
zoo_pid= redis_pid=
cleanup() {
  [ -n "$zoo_pid" ] && kill "$zoo_pid" 2>/dev/null && wait "$zoo_pid" 2>/dev/null
  [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

echo "== building the zoo"
(cd "$repo" && cargo build --quiet --example zoo --all-features)
zoo_bin=$CARGO_TARGET_DIR/debug/examples/zoo

echo "== clients"
cd "$here"
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements.txt

# Starts the zoo on a free port (REDIS_URL as given) and waits until it answers.
start_zoo() {
  local port
  for _ in 1 2 3; do
    port=$(free_port)
    ZOO_ADDR=127.0.0.1:$port RUST_LOG=warn "$zoo_bin" >"$work/zoo.log" 2>&1 &
    zoo_pid=$!
    for _ in $(seq 50); do
      if curl -fs -o /dev/null "http://127.0.0.1:$port/rate_limit"; then
        zoo_url=http://127.0.0.1:$port
        return 0
      fi
      kill -0 "$zoo_pid" 2>/dev/null || break
      sleep 0.1
    done
    kill "$zoo_pid" 2>/dev/null; wait "$zoo_pid" 2>/dev/null || true
    zoo_pid=
  done
  echo "check.sh: the zoo did not start:" >&2
  cat "$work/zoo.log" >&2
  return 1
}

start_redis() {
  local port
  port=$(free_port)
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
    >"$work/redis.log" 2>&1 &
  redis_pid=$!
  for _ in $(seq 50); do
    if redis-cli -p "$port" ping >/dev/null 2>&1; then
      redis_url=redis://127.0.0.1:$port/
      return 0
    fi
    sleep 0.1
  done
  echo "check.sh: redis-server did not start:" >&2
  cat "$work/redis.log" >&2
  return 1
}

failed=0
for store in $stores; do
  unset REDIS_URL
  if [ "$store" = redis ]; then
    if ! command -v redis-server >/dev/null; then
      echo "== redis: skipped (no redis-server on PATH)"
      continue
    fi
    start_redis
    export REDIS_URL=$redis_url
  fi
  start_zoo
  echo "== $store store: zoo at $zoo_url, $ZOO_LIMIT requests per $ZOO_WINDOW_SECS s"
  export ZOO_URL=$zoo_url
  timeout "$client_timeout" node octokit-check.mjs >"$work/octokit.log" 2>&1 &
  octokit=$!
  timeout "$client_timeout" .venv/bin/python urllib3_check.py >"$work/urllib3.log" 2>&1 &
  urllib3=$!
  rc_o=0 rc_u=0
  wait "$octokit" || rc_o=$?
  wait "$urllib3" || rc_u=$?
  echo "-- octokit (exit $rc_o)"; cat "$work/octokit.log"
  echo "-- urllib3 (exit $rc_u)"; cat "$work/urllib3.log"
  if [ "$rc_o" -ne 0 ] || [ "$rc_u" -ne 0 ]; then
    failed=1
    echo "-- zoo log"; cat "$work/zoo.log"
  fi
  kill "$zoo_pid"; wait "$zoo_pid" 2>/dev/null || true; zoo_pid=
  if [ -n "$redis_pid" ]; then
    kill "$redis_pid"; wait "$redis_pid" 2>/dev/null || true; redis_pid=
  fi
done

if [ "$failed" -ne 0 ]; then
  echo "check.sh: FAILED" >&2
  exit 1
fi
echo "check.sh: both clients work with the zoo ($stores)"
