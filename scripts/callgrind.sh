#!/usr/bin/env bash
# Instructions per request, counted by callgrind: a measure that other load
# on the machine does not move, for comparing changes to the hot path when
# wall-clock figures swing by ten per cent.
#
#   scripts/callgrind.sh /strategies/unlimited /strategies/fixed_window
#   LOAD_STORE=redis scripts/callgrind.sh /strategies/unlimited /strategies/fixed_window
#   ZOO_LIMIT=1 scripts/callgrind.sh ...     # every request after the first is a 429
#   ZOO_LIMIT=9999 ZOO_WINDOW_SECS=1 scripts/callgrind.sh ...   # headers with a
#                                   # real quota's four-digit numbers (under
#                                   # valgrind the zoo stays below that rate: no 429s)
#   CG_PROCESS=redis scripts/callgrind.sh /strategies/gcra   # Redis's side instead
#   ZOO_BIN=/tmp/zoo-before scripts/callgrind.sh ...  # a build copied aside
#   CG_SIM=1 scripts/callgrind.sh ...         # with cache and branch misses
#   CG_CALLERS=zipf LOAD_STORE=redis scripts/callgrind.sh /strategies/api_key
#                                   # each request's X-Api-Key drawn from a Zipf
#                                   # crowd (scripts/wrk_callers.lua; CG_ZIPF_S,
#                                   # 1.0, over 10,000 keys), or one (hot)
#
# Runs the release zoo (ZOO_BENCH=1) under valgrind on CPU 1, with a private
# redis-server for LOAD_STORE=redis; serves every route once; then for
# each route, warms up with wrk (CPU 0), zeroes the counters, runs wrk for
# CG_SECS (5) with CG_CONNS connections (4; 64 for Redis), and divides the
# instructions counted by the requests served.
#
# CG_PROCESS=redis counts redis-server instead: Redis runs under valgrind on
# CPU 1 and the zoo natively on CPU 0, so the figure is what a strategy's
# scripts cost Redis per request. Redis is some thirty times slower under
# valgrind, so at 64 connections decisions queue and batch more than on a
# native Redis (about ten a call, shown from `INFO commandstats`): compare
# strategies and commits with it, not absolute costs.
# The dumps stay in bench-out/callgrind/ for callgrind_annotate, one per
# store, route and ZOO_LIMIT. Where a route has tollgate's layer or
# tower_governor's, the layer's own share is printed beside
# (scripts/layer_cost.py: its call and response future, without the
# inner service), which moves less between runs than the whole process.
# The peers' routes count the same way:
#   scripts/callgrind.sh /strategies/governor_no_headers /strategies/governor_two_headers
set -euo pipefail
cd "$(dirname "$0")/.."

CG_SECS=${CG_SECS:-5}
# CG_SIM=1: also simulate the caches and the branch predictor (slower), and
# print per request the instruction-cache and data-cache misses and the
# mispredicted branches: what instruction counts leave out of a cycle.
sim=
[ -z "${CG_SIM:-}" ] || sim="--cache-sim=yes --branch-sim=yes"
CG_PROCESS=${CG_PROCESS:-zoo}
case $CG_PROCESS in
  zoo) LOAD_STORE=${LOAD_STORE:-memory} ;;
  redis) LOAD_STORE=redis ;;
  *) echo "callgrind.sh: CG_PROCESS is zoo or redis" >&2; exit 2 ;;
esac
# Redis at 64 connections, where decisions batch as they do under load; the
# memory store at 4, enough to keep the zoo busy under valgrind.
if [ "$LOAD_STORE" = redis ]; then CG_CONNS=${CG_CONNS:-64}; else CG_CONNS=${CG_CONNS:-4}; fi
# Who sends the requests: nobody in particular (no X-Api-Key), hot or zipf.
export WRK_CALLERS=${CG_CALLERS:-} WRK_ZIPF_N=10000 WRK_ZIPF_S=${CG_ZIPF_S:-1.0}
callers=(-s scripts/wrk_callers.lua)
for tool in valgrind callgrind_control wrk curl taskset redis-server redis-cli; do
  command -v "$tool" >/dev/null || { echo "callgrind.sh: $tool is required" >&2; exit 2; }
done
[ $# -gt 0 ] || { echo "usage: scripts/callgrind.sh ROUTE..." >&2; exit 2; }

# ZOO_BIN: another build of the zoo (a copy made at another commit), to
# compare two commits in one sitting.
if [ -n "${ZOO_BIN:-}" ]; then
  zoo_bin=$ZOO_BIN
else
  cargo build --release --example zoo --all-features --quiet
  zoo_bin="${CARGO_TARGET_DIR:-target}/release/examples/zoo"
fi
out=bench-out/callgrind
mkdir -p "$out"

pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

# Runs process NAME: under callgrind on CPU 1 if it is the one counted, else
# natively (the zoo beside wrk on CPU 0 when Redis is counted). Called in the
# background; `exec` keeps $! the process's own PID for callgrind_control.
counted() {
  local name=$1
  shift
  if [ "$CG_PROCESS" = "$name" ]; then
    # shellcheck disable=SC2086
    exec taskset -c 1 valgrind --tool=callgrind $sim --callgrind-out-file="$out/$name.%p" "$@"
  elif [ "$name" = zoo ]; then
    exec taskset -c 0 "$@"
  else
    exec taskset -c 1 "$@"
  fi
}

port() { echo $((20000 + RANDOM % 12000)); }
redis_url=
if [ "$LOAD_STORE" = redis ]; then
  redis_port=$(port)
  counted redis redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
    --logfile /dev/null >"$out/redis.log" 2>&1 &
  redis=$!
  pids+=("$redis")
  for _ in $(seq 100); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.2; done
  redis_url="redis://127.0.0.1:$redis_port/"
fi

zoo_port=$(port)
REDIS_URL=$redis_url ZOO_ADDR="127.0.0.1:$zoo_port" ZOO_BENCH=1 \
  ZOO_LIMIT="${ZOO_LIMIT:-3600000000}" ZOO_WINDOW_SECS="${ZOO_WINDOW_SECS:-3600}" RUST_LOG=warn \
  counted zoo "$zoo_bin" >"$out/zoo.log" 2>&1 &
zoo=$!
pids+=("$zoo")
for _ in $(seq 200); do curl -s -o /dev/null "http://127.0.0.1:$zoo_port/strategies" && break; sleep 0.3; done
if [ "$CG_PROCESS" = redis ]; then target=$redis; else target=$zoo; fi

echo "store: $LOAD_STORE; counting: $CG_PROCESS; wrk -c$CG_CONNS for ${CG_SECS}s per route"
# Every route is served once before any is counted. The first route
# counted in a fresh process otherwise pays for glibc's heap settling
# (`_int_malloc`, `malloc_consolidate`), and the order of the routes would
# decide a close comparison (BENCHMARKS.md has the size of it).
for route in "$@"; do
  taskset -c 0 wrk "${callers[@]}" -t1 -c"$CG_CONNS" -d2s "http://127.0.0.1:$zoo_port$route" >/dev/null
done
for route in "$@"; do
  url="http://127.0.0.1:$zoo_port$route"
  taskset -c 0 wrk "${callers[@]}" -t1 -c"$CG_CONNS" -d2s "$url" >/dev/null
  callgrind_control -z "$target" >/dev/null 2>&1
  [ "$LOAD_STORE" != redis ] || redis-cli -p "$redis_port" config resetstat >/dev/null
  served=$(taskset -c 0 wrk "${callers[@]}" -t1 -c"$CG_CONNS" -d"${CG_SECS}s" "$url" | awk '/requests in/ { print $1 }')
  callgrind_control -d "$target" >/dev/null 2>&1
  sleep 0.5
  calls=
  if [ "$CG_PROCESS" = redis ]; then
    calls="  EVALSHA calls: $(redis-cli -p "$redis_port" info commandstats |
      awk -F'[=,:]' '/^cmdstat_evalsha:/ { print $3 }')"
  fi
  dump=$(ls -t "$out"/"$CG_PROCESS"."$target".* | head -1)
  instructions=$(awk '/^(summary|totals):/ { print $2; exit }' "$dump")
  # A rejecting run (ZOO_LIMIT set) is named apart, not over the passing one.
  name="$out/$CG_PROCESS-$LOAD_STORE${CG_CALLERS:+-$CG_CALLERS}${ZOO_LIMIT:+-limit$ZOO_LIMIT}${ZOO_WINDOW_SECS:+-per$ZOO_WINDOW_SECS}$(echo "$route" | tr / _)"
  mv "$dump" "$name"
  # The layer's own share (tollgate's or tower_governor's), when there is one.
  layer=
  if [ "$CG_PROCESS" = zoo ] && command -v python3 >/dev/null; then
    own=$(python3 scripts/layer_cost.py "$name" "$served" 2>/dev/null || true)
    [ -z "$own" ] || layer="  the layer's own: $own"
  fi
  if [ -n "$sim" ]; then
    layer="$layer$(awk -v n="$served" '
      /^events:/ { for (i = 2; i <= NF; i++) col[$i] = i }
      /^(summary|totals):/ {
        printf "  I1 misses: %.0f  D1 misses: %.0f  mispredicted branches: %.0f",
          $col["I1mr"] / n, ($col["D1mr"] + $col["D1mw"]) / n, ($col["Bcm"] + $col["Bim"]) / n
        exit
      }' "$name")"
  fi
  echo "$route  requests: $served$calls  instructions per request: $((instructions / served))$layer  ($name)"
done
