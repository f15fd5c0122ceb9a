#!/bin/bash
# α and β of the ring on this machine, from all_reduce_perf through
# brigade-run: the α-β model says a ring allreduce of S bytes on N ranks
# takes 2(N-1)·α + 2(N-1)/N·S·β. α comes from 8-byte allreduces forced
# through the ring (BRIGADE_SMALL_BYTES=0: 2(N-1) hops), β from 64 MiB ones.
# Each figure is the best of ROUNDS runs, so that a busy machine's worst
# moments drop out. The runs and the arithmetic are bench/model's
# (`bench/model alphabeta`); `bench/model calibrate` fits α and β over
# every size instead of two.
#
#   bench/alpha_beta.sh BUILD [ROUNDS] [TRANSPORTS] [NRANKS...]
#   e.g. bench/alpha_beta.sh build 5 "shm tcp" 2 4
exec "$(dirname "$0")/model" alphabeta "$@"
