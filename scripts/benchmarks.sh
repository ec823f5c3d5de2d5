#!/usr/bin/env bash
# Every benchmark behind BENCHMARKS.md, in one command (about 12 minutes):
# the criterion decision benches, then the HTTP load test. Both reports go to
# bench-out/ (git-ignored) and to the terminal.
#
#   scripts/benchmarks.sh
#   LOAD_RUNS=5 LOAD_SECS=5 scripts/benchmarks.sh   # longer, steadier
#
# For figures worth quoting, run it on an otherwise idle machine
# (uptime's 1-minute load average below 1).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench-out
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
cargo bench --bench decision 2>&1 | tee bench-out/decision.txt | sed -n '/^summary/,$p'
scripts/load.sh | tee bench-out/load.md
echo "reports: bench-out/decision.txt, bench-out/load.md"
