#!/usr/bin/env bash
# Redis's own instructions per request, counted by callgrind: what a
# strategy's scripts cost redis-server, apart from the app server, and
# unmoved by other load on the machine.
#
#   scripts/callgrind_redis.sh /strategies/fixed_window /strategies/gcra
#   CG_CONNS=1 scripts/callgrind_redis.sh /strategies/fixed_window  # one at a time
#
# Starts a private redis-server under valgrind on CPU 1 and the release zoo
# (ZOO_BENCH=1, natively) on CPU 0; for each route, warms up with wrk,
# zeroes the counters, runs wrk for CG_SECS (5) with CG_CONNS connections
# (64), and divides redis-server's instructions by the requests served. Redis
# runs some thirty times slower under valgrind, so at 64 connections decisions
# queue and batch more than on a native Redis (about ten a call): compare
# strategies and commits with it, not absolute costs. `INFO commandstats`
# (printed) says how many calls the decisions took.
# The dumps stay in bench-out/callgrind/.
set -euo pipefail
cd "$(dirname "$0")/.."

CG_SECS=${CG_SECS:-5}
CG_CONNS=${CG_CONNS:-64}
for tool in valgrind callgrind_control wrk curl taskset redis-server redis-cli; do
  command -v "$tool" >/dev/null || { echo "callgrind_redis.sh: $tool is required" >&2; exit 2; }
done
[ $# -gt 0 ] || { echo "usage: scripts/callgrind_redis.sh ROUTE..." >&2; exit 2; }

cargo build --release --example zoo --quiet
zoo_bin="${CARGO_TARGET_DIR:-target}/release/examples/zoo"
out=bench-out/callgrind
mkdir -p "$out"

pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

port() { echo $((20000 + RANDOM % 12000)); }
redis_port=$(port)
taskset -c 1 valgrind --tool=callgrind --callgrind-out-file="$out/redis.%p" \
  redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --logfile /dev/null \
  >"$out/redis.log" 2>&1 &
redis=$!
pids+=("$redis")
for _ in $(seq 100); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.2; done

zoo_port=$(port)
REDIS_URL="redis://127.0.0.1:$redis_port/" ZOO_ADDR="127.0.0.1:$zoo_port" ZOO_BENCH=1 \
  ZOO_LIMIT=3600000000 ZOO_WINDOW_SECS=3600 RUST_LOG=warn \
  taskset -c 0 "$zoo_bin" >"$out/zoo.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$zoo_port/strategies" && break; sleep 0.2; done

echo "redis-server under callgrind; wrk -c$CG_CONNS for ${CG_SECS}s per route"
for route in "$@"; do
  url="http://127.0.0.1:$zoo_port$route"
  taskset -c 0 wrk -t1 -c"$CG_CONNS" -d2s "$url" >/dev/null
  callgrind_control -z "$redis" >/dev/null 2>&1
  redis-cli -p "$redis_port" config resetstat >/dev/null
  served=$(taskset -c 0 wrk -t1 -c"$CG_CONNS" -d"${CG_SECS}s" "$url" | awk '/requests in/ { print $1 }')
  callgrind_control -d "$redis" >/dev/null 2>&1
  sleep 0.5
  calls=$(redis-cli -p "$redis_port" info commandstats | awk -F'[=,:]' '/^cmdstat_evalsha:/ { print $3 }')
  dump=$(ls -t "$out"/redis."$redis".* | head -1)
  instructions=$(awk '/^(summary|totals):/ { print $2; exit }' "$dump")
  name="$out/redis-server$(echo "$route" | tr / _)"
  mv "$dump" "$name"
  echo "$route  requests: $served  EVALSHA calls: ${calls:-0}  redis-server instructions per request: $((instructions / served))  ($name)"
done
