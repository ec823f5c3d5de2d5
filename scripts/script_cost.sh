#!/usr/bin/env bash
# What each strategy's script costs Redis, in instructions, counted by
# callgrind in redis-server: deterministic, so two commits compare in one
# sitting however busy the machine is.
#
#   scripts/script_cost.sh                 # the work tree's scripts
#   scripts/script_cost.sh dbd40f5 HEAD    # each commit's scripts, side by side
#   CS_CALLER=override scripts/script_cost.sh   # an overridable policy's scripts
#                                               # (lua/caller.lua), a caller without an override
#   CS_CALLER=overridden ...                    # the same, the caller with one
#   CS_CALLER=penalty ...                       # a penalty box, the caller never struck
#   CS_STRATEGIES="fixed_window gcra" ...       # only these
#
# The scripts go exactly as the store sends them (examples/lua.rs prints
# them; lua/SENT.md lists them). For every strategy: a lone decision
# (EVALSHA of <strategy>), its peek (the no-writes twin, unflagged so any
# server runs it), and a batch of ten decisions of one caller
# (<strategy>_batch, the flood the batcher sends), per decision. Each is
# sent CS_CALLS (5,000) times by redis-benchmark from one connection, after
# a warm-up, to a private redis-server under valgrind on a free port; the
# figure is the server's instructions divided by the decisions. Quotas are
# wide, so every decision passes and writes, as most do. Compare commits,
# not absolute costs: the zoo's traffic (scripts/callgrind.sh
# CG_PROCESS=redis) mixes passes, rejections and batch sizes. Then, for the
# strategies that lease (docs/leases.md), a decision that takes a lease of
# 1,000 units over a span of 1 s (<strategy>_lease; "-" at a commit
# without it).
set -euo pipefail
cd "$(dirname "$0")/.."

CS_CALLS=${CS_CALLS:-5000}
for tool in valgrind callgrind_control redis-server redis-cli redis-benchmark; do
  command -v "$tool" >/dev/null || { echo "script_cost.sh: $tool is required" >&2; exit 2; }
done
revs=("$@")
[ ${#revs[@]} -gt 0 ] || revs=(worktree)

out=bench-out/script-cost
mkdir -p "$out"
port=$((20000 + RANDOM % 12000))
valgrind --tool=callgrind --callgrind-out-file="$out/redis.%p" \
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --logfile /dev/null \
  >"$out/valgrind.log" 2>&1 &
redis=$!
trap 'kill $redis 2>/dev/null || true; wait 2>/dev/null || true' EXIT INT TERM
for _ in $(seq 150); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done

# The text Redis runs of script $2 at commit $1 (the work tree's for
# "worktree"), as examples/lua.rs prints it; a commit's tree is exported
# once under $out and built in the same target directory. Commits from
# before lua/SENT.md kept a copy of each script in lua/sent/.
sent() {
  local src
  if [ "$1" = worktree ]; then
    cargo run -q --all-features --example lua -- --raw "$2"
  elif git cat-file -e "$1:lua/sent" 2>/dev/null; then
    git show "$1:lua/sent/$2.lua"
  else
    src=$out/src-$(git rev-parse --verify "$1^{commit}")
    if [ ! -d "$src" ]; then
      mkdir -p "$src"
      git archive "$1" | tar -x -C "$src"
    fi
    CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target} \
      cargo run -q --all-features --manifest-path "$src/Cargo.toml" --example lua -- --raw "$2"
  fi
}

# Instructions per decision of `redis-benchmark ARGS...`, DECISIONS per call.
measure() {
  local decisions=$1 dump total
  shift
  redis-benchmark -p "$port" -c 1 -n 200 "$@" >/dev/null
  callgrind_control -z "$redis" >/dev/null 2>&1
  redis-benchmark -p "$port" -c 1 -n "$CS_CALLS" "$@" >/dev/null
  callgrind_control -d "$redis" >/dev/null 2>&1
  sleep 0.3
  dump=$(ls -t "$out"/redis."$redis".* | head -1)
  total=$(awk '/^(summary|totals):/ { print $2; exit }' "$dump")
  rm -f "$dump"
  echo $((total / CS_CALLS / decisions))
}

# Each strategy's keys and arguments for one decision that passes.
declare -A KEYS=(
  [fixed_window]=1 [aligned_window]=1 [sliding_window]=1 [gcra]=1
  [leaky_bucket]=1 [uniform_gate]=1 [concurrency]=1 [sliding_log]=2
)
declare -A ARGS=(
  [fixed_window]="-1 1 1000000000 3600000000"
  [aligned_window]="-1 1 1000000000 3600000000"
  [sliding_window]="-1 1 1000000000 3600000000"
  [gcra]="-1 1 1 1000000000"
  [leaky_bucket]="-1 1 1000000000 1"
  [uniform_gate]="-1 1 0 0"
  [concurrency]="-1 1 1000000000 60000000 42"
  [sliding_log]="-1 1 42 1000000000 1000 1000000000 1000"
)
strategies=${CS_STRATEGIES:-"fixed_window aligned_window sliding_window gcra leaky_bucket uniform_gate concurrency sliding_log"}

# Where each strategy's quota arguments start (1-based): what an override
# replaces, in lua/caller.lua's `at`.
declare -A AT=(
  [fixed_window]=3 [aligned_window]=3 [sliding_window]=3 [gcra]=3
  [leaky_bucket]=3 [uniform_gate]=3 [concurrency]=3 [sliding_log]=4
)
# How many there are.
declare -A QN=(
  [fixed_window]=2 [aligned_window]=2 [sliding_window]=2 [gcra]=2
  [leaky_bucket]=2 [uniform_gate]=1 [concurrency]=2 [sliding_log]=4
)
caller=${CS_CALLER:-}
case "$caller" in
  "" | override | overridden | penalty) ;;
  *) echo "script_cost.sh: CS_CALLER is override, overridden or penalty" >&2; exit 2 ;;
esac

printf '%-16s' strategy
for rev in "${revs[@]}"; do printf '%12s %12s %12s' "lone@$rev" "peek@$rev" "batch@$rev"; done
echo
for s in $strategies; do
  printf '%-16s' "$s"
  nk=${KEYS[$s]}
  keys=()
  for i in $(seq "$nk"); do keys+=("cost:{$s}:$i"); done
  read -ra args <<<"${ARGS[$s]}"
  name=$s
  if [ -n "$caller" ]; then
    name=${s}_caller
    case "$caller" in
      override | overridden)
        keys+=("cost:{$s}:override")
        args+=("${AT[$s]}") ;;
      penalty)
        keys+=("cost:{$s}:penalty")
        args+=(3 1000000000 1000000000 1000000000 -1) ;;
    esac
    nk=${#keys[@]}
  fi
  for rev in "${revs[@]}"; do
    lone=$(redis-cli -p "$port" SCRIPT LOAD "$(sent "$rev" "$name")")
    peek=$(redis-cli -p "$port" SCRIPT LOAD "$(sent "$rev" "${name}_peek.noflags")")
    batch=$(redis-cli -p "$port" SCRIPT LOAD "$(sent "$rev" "${name}_batch")")
    redis-cli -p "$port" FLUSHALL >/dev/null
    if [ "$caller" = overridden ]; then
      # The strategy's own quota arguments again: the same decisions, read
      # from the override.
      quota_args=("${args[@]:$((AT[$s] - 1)):${QN[$s]}}")
      redis-cli -p "$port" SET "cost:{$s}:override" "0 ${quota_args[*]}|0 1 1" >/dev/null
    fi
    a=$(measure 1 EVALSHA "$lone" "$nk" "${keys[@]}" "${args[@]}")
    b=$(measure 1 EVALSHA "$peek" "$nk" "${keys[@]}" "${args[@]}")
    # Ten decisions of one caller: the first with its keys and arguments,
    # then nine '=' (lua/batch.lua).
    c=$(measure 10 EVALSHA "$batch" "$nk" "${keys[@]}" 10 0 "$nk" "${#args[@]}" "${args[@]}" = = = = = = = = =)
    printf '%12s %12s %12s' "$a" "$b" "$c"
  done
  echo
done

echo
printf '%-16s' "lease"
for rev in "${revs[@]}"; do printf '%12s' "lease@$rev"; done
echo
for s in fixed_window aligned_window gcra; do
  printf '%-16s' "$s"
  read -ra args <<<"${ARGS[$s]}"
  for rev in "${revs[@]}"; do
    if source=$(sent "$rev" "${s}_lease" 2>/dev/null); then
      sha=$(redis-cli -p "$port" SCRIPT LOAD "$source")
      redis-cli -p "$port" FLUSHALL >/dev/null
      # 1,000 units wanted over a span of 1 s (older scripts ignore the span).
      printf '%12s' "$(measure 1 EVALSHA "$sha" 1 "cost:{$s}:1" "${args[@]}" 1000 1000000)"
    else
      printf '%12s' -
    fi
  done
  echo
done
