#!/usr/bin/env bash
# Instructions per request of the zoo, counted by callgrind: a measure that
# other load on the machine does not move, for comparing changes to the hot
# path when wall-clock figures swing by ten per cent.
#
#   scripts/callgrind.sh /strategies/unlimited /strategies/fixed_window
#   LOAD_STORE=redis scripts/callgrind.sh /strategies/unlimited /strategies/fixed_window
#   ZOO_LIMIT=1 scripts/callgrind.sh ...     # every request after the first is a 429
#
# Runs the release zoo (ZOO_BENCH=1) under valgrind on CPU 1, with a private
# redis-server for LOAD_STORE=redis; for each route, warms up with wrk
# (CPU 0), zeroes the counters, runs wrk for CG_SECS (5) with CG_CONNS
# connections (4; 64 for Redis), and divides the instructions counted by the
# requests served.
# The dumps stay in bench-out/callgrind/ for callgrind_annotate.
set -euo pipefail
cd "$(dirname "$0")/.."

CG_SECS=${CG_SECS:-5}
LOAD_STORE=${LOAD_STORE:-memory}
# Redis at 64 connections, where decisions batch as they do under load; the
# memory store at 4, enough to keep the zoo busy under valgrind.
if [ "$LOAD_STORE" = redis ]; then CG_CONNS=${CG_CONNS:-64}; else CG_CONNS=${CG_CONNS:-4}; fi
for tool in valgrind callgrind_control wrk curl taskset; do
  command -v "$tool" >/dev/null || { echo "callgrind.sh: $tool is required" >&2; exit 2; }
done
[ $# -gt 0 ] || { echo "usage: scripts/callgrind.sh ROUTE..." >&2; exit 2; }

cargo build --release --example zoo --quiet
zoo_bin="${CARGO_TARGET_DIR:-target}/release/examples/zoo"
out=bench-out/callgrind
mkdir -p "$out"

pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

port() { echo $((20000 + RANDOM % 12000)); }
redis_url=
if [ "$LOAD_STORE" = redis ]; then
  redis_port=$(port)
  taskset -c 1 redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
    --logfile /dev/null &
  pids+=($!)
  for _ in $(seq 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  redis_url="redis://127.0.0.1:$redis_port/"
fi

zoo_port=$(port)
REDIS_URL=$redis_url ZOO_ADDR="127.0.0.1:$zoo_port" ZOO_BENCH=1 \
  ZOO_LIMIT="${ZOO_LIMIT:-3600000000}" ZOO_WINDOW_SECS=3600 RUST_LOG=warn \
  taskset -c 1 valgrind --tool=callgrind --callgrind-out-file="$out/zoo.%p" "$zoo_bin" \
  >"$out/zoo.log" 2>&1 &
zoo=$!
pids+=("$zoo")
for _ in $(seq 200); do curl -s -o /dev/null "http://127.0.0.1:$zoo_port/strategies" && break; sleep 0.3; done

echo "store: $LOAD_STORE; wrk -c$CG_CONNS for ${CG_SECS}s per route"
for route in "$@"; do
  url="http://127.0.0.1:$zoo_port$route"
  taskset -c 0 wrk -t1 -c"$CG_CONNS" -d2s "$url" >/dev/null
  callgrind_control -z "$zoo" >/dev/null 2>&1
  served=$(taskset -c 0 wrk -t1 -c"$CG_CONNS" -d"${CG_SECS}s" "$url" | awk '/requests in/ { print $1 }')
  callgrind_control -d "$zoo" >/dev/null 2>&1
  sleep 0.5
  dump=$(ls -t "$out"/zoo."$zoo".* | head -1)
  instructions=$(awk '/^(summary|totals):/ { print $2; exit }' "$dump")
  name="$out/$LOAD_STORE$(echo "$route" | tr / _)"
  mv "$dump" "$name"
  echo "$route  requests: $served  instructions per request: $((instructions / served))  ($name)"
done
