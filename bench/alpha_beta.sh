#!/bin/bash
# α and β of the ring on this machine, from all_reduce_perf through
# brigade-run: the α-β model says a ring allreduce of S bytes on N ranks
# takes 2(N-1)·α + 2(N-1)/N·S·β. α comes from 8-byte allreduces forced
# through the ring (BRIGADE_SMALL_BYTES=0: 2(N-1) hops), β from 64 MiB ones.
# Each figure is the best of ROUNDS runs, so that a busy machine's worst
# moments drop out.
#
#   bench/alpha_beta.sh BUILD [ROUNDS] [TRANSPORTS] [NRANKS...]
#   e.g. bench/alpha_beta.sh build 5 "shm tcp" 2 4
set -euo pipefail
build=$1 rounds=${2:-5} transports=${3:-"shm tcp"}
shift $(($# < 3 ? $# : 3))
ranks=${*:-2 4}

# best TRANSPORT N SIZE ITERS: the least out-of-place time (us) of ROUNDS runs
best() {
  local tr=$1 n=$2 size=$3 iters=$4 r t min=
  for r in $(seq "$rounds"); do
    t=$(BRIGADE_TRANSPORTS=$tr BRIGADE_SMALL_BYTES=0 "$build/tools/brigade-run" -n "$n" \
      "$build/bench/all_reduce_perf" -b "$size" -e "$size" -n "$iters" -w $((iters / 10 + 1)) \
      -R 0 -c 0 | awk '$1 ~ /^[0-9]+$/ {print $6}')
    min=$(awk -v a="$t" -v b="$min" 'BEGIN {print (b == "" || a + 0 < b + 0) ? a : b}')
  done
  echo "$min"
}
echo "# best of $rounds runs; alpha = T(8 B) / 2(N-1), beta = T(64 MiB) / (2(N-1)/N * 64 MiB)"
printf "%-5s %3s %12s %10s %14s %12s\n" transport N "T(8B) us" "alpha us" "T(64MiB) us" "1/beta GB/s"
for tr in $transports; do
  for n in $ranks; do
    small=$(best "$tr" "$n" 8 200)
    large=$(best "$tr" "$n" 64M 3)
    awk -v tr="$tr" -v n="$n" -v s="$small" -v l="$large" 'BEGIN {
      a = s / (2 * (n - 1)); bytes = 2 * (n - 1) / n * 67108864
      printf "%-5s %3d %12.2f %10.2f %14.0f %12.2f\n", tr, n, s, a, l, bytes / (l * 1e3) }'
  done
done
