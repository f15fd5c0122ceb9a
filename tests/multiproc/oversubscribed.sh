#!/bin/sh
# Ranks that outnumber the cores this process may run on stop spinning:
# two ranks pinned to one core (taskset) on a host with more cores online
# must say so at init (runtime/core/topology.c counts the affinity mask and the
# cgroup's CPU quota, not the cores online).
#   oversubscribed.sh TASKSET TEST_COLLECTIVES
set -eu
out=$(BRIGADE_DEBUG=INFO BRIGADE_TRANSPORTS=shm "$1" -c 0 "$2" 2 barrier 2>&1) || {
  echo "$out"
  exit 1
}
if ! echo "$out" | grep -q "2 ranks share 1 cores on this host: waits yield at once"; then
  echo "$out"
  echo "FAIL: two ranks pinned to one core did not detect it"
  exit 1
fi
echo "ok: two ranks on one core yield at once"
