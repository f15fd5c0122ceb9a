#!/bin/bash
# What tracing costs: all_reduce_perf at 8 B and 64 MiB with tracing off
# and on (BRIGADE_TRACE_FILE) in one build, and optionally with tracing off
# in a second build (the same code without the trace hooks), alternating
# the variants round after round so that drift hits them all alike.
#
#   bench/trace_overhead.sh BUILD [BASE_BUILD] [ROUNDS] [NRANKS]
#
# Prints the median out-of-place time (us) of each variant and size, and
# the change against tracing off in BUILD.
set -euo pipefail
build=$1 base=${2:-} rounds=${3:-5} n=${4:-2}
out=$(mktemp -d /tmp/brigade-trace-overhead.XXXXXX)
trap 'rm -rf "$out"' EXIT
export BRIGADE_TRANSPORTS=${BRIGADE_TRANSPORTS:-shm}

# one VARIANT BUILD SIZE ITERS [ENV...]: the out-of-place time of one row
one() {
  local v=$1 b=$2 size=$3 iters=$4
  shift 4
  env "$@" "$b/tools/brigade-run" -n "$n" "$b/bench/all_reduce_perf" -b "$size" -e "$size" \
    -n "$iters" -w $((iters / 10 + 1)) -R 0 -c 0 | awk '$1 ~ /^[0-9]+$/ {print $6}' \
    >>"$out/$v.$size"
}
for r in $(seq "$rounds"); do
  for size in 8 64M; do
    iters=2000
    [ "$size" = 64M ] && iters=10
    [ -n "$base" ] && one base-off "$base" "$size" "$iters"
    one off "$build" "$size" "$iters"
    one on "$build" "$size" "$iters" BRIGADE_TRACE_FILE="$out/trace.%r.json"
  done
done
median() { sort -g "$1" | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
echo "# $n ranks over $BRIGADE_TRANSPORTS, $rounds rounds; out-of-place time (us), median [min..max]"
for size in 8 64M; do
  ref=$(median "$out/off.$size")
  for v in base-off off on; do
    [ -f "$out/$v.$size" ] || continue
    m=$(median "$out/$v.$size")
    lo=$(sort -g "$out/$v.$size" | head -1)
    hi=$(sort -g "$out/$v.$size" | tail -1)
    awk -v s="$size" -v v="$v" -v m="$m" -v lo="$lo" -v hi="$hi" -v ref="$ref" \
      'BEGIN {printf "%6s  %-9s %12.2f  [%.2f..%.2f]  %+6.1f%%\n", s, v, m, lo, hi, 100 * (m - ref) / ref}'
  done
done
