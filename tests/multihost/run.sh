#!/bin/bash
# Multi-host tests on one machine. Two network namespaces joined by a veth
# pair are two "hosts" (10.77.0.1 and 10.77.0.2, addresses that exist only
# inside them); two ranks run in each, so a ring uses shm inside a host and
# the network transport between hosts:
#
#     namespace A (10.77.0.1)            namespace B (10.77.0.2)
#     rank 0, rank 2   ==== veth ====    rank 1, rank 3
#
# Ranks alternate between the hosts so the runtime has to reorder the ring
# host by host (expected ring: 0 2 | 1 3, two network links in all).
#
# usage: run.sh MH_CHECK MODE TRANSPORT
#   MODE       collectives  every element of allreduce / reduce_scatter /
#                           all_gather / broadcast, and the INFO log: ring
#                           order host by host, one network link per boundary
#              kill         a rank in namespace B is killed mid-allreduce:
#                           every other rank must fail within the timeout
#              linkdown     the veth goes down mid-allreduce: every rank must
#                           fail within the timeout
#              vanish       rank 1's host is cut off mid-allreduce, no socket
#                           closes: every rank of the other hosts must fail
#                           within 10 s, naming a silent rank of that host
#              exec         runs MH_CHECK with the remaining arguments on the
#                           four ranks and prints rank 0's output, e.g.
#                           run.sh build/bench/all_reduce_perf exec tcp -b 1M -e 64M -f 4
#   TRANSPORT  tcp | ibverbs (ibverbs runs its software backend: these are
#              not RDMA numbers or RDMA code paths below the verbs interface)
# Exit 0 pass, 1 fail, 77 when namespaces cannot be created here.
set -u

CHECK=$1
MODE=$2
NET=$3
shift 3
EXTRA=("$@")
NRANKS=4
TIMEOUT_MS=5000 # BRIGADE_TIMEOUT_MS for the fault tests
SLACK_S=10      # on top of it: process start-up, abort and teardown on 2 cores
# ibverbs queue pairs per link: two for the collectives (slots striped over
# them), one for the fault tests
QPS=1
[ "$MODE" = collectives ] && QPS=2

skip() {
  echo "SKIP: $*"
  exit 77
}
fail() {
  echo "FAIL: $*"
  for r in $(seq 0 $((NRANKS - 1))); do
    [ -f "$WORK/out.$r" ] && sed "s/^/  [out $r] /" "$WORK/out.$r"
    [ -f "$WORK/log.$r" ] && tail -n 15 "$WORK/log.$r" | sed "s/^/  [log $r] /"
  done
  exit 1
}

[ -x "$CHECK" ] || { echo "FAIL: $CHECK is not an executable"; exit 1; }
[ "$(id -u)" = 0 ] || skip "creating network namespaces needs root"
command -v ip >/dev/null || skip "iproute2 (ip) is not installed"

NS_A=brg-mh-$$-a
NS_B=brg-mh-$$-b
WORK=$(mktemp -d /tmp/brigade-mh.XXXXXX)
PIDS=()

cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  ip netns del "$NS_A" 2>/dev/null
  ip netns del "$NS_B" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$NS_A" 2>"$WORK/err" || skip "ip netns add failed: $(cat "$WORK/err")"
ip netns add "$NS_B" 2>"$WORK/err" || skip "ip netns add failed: $(cat "$WORK/err")"
ip -n "$NS_A" link add veth-a type veth peer name veth-b netns "$NS_B" 2>"$WORK/err" ||
  skip "cannot create a veth pair: $(cat "$WORK/err")"
ip -n "$NS_A" addr add 10.77.0.1/24 dev veth-a || fail "address on veth-a"
ip -n "$NS_B" addr add 10.77.0.2/24 dev veth-b || fail "address on veth-b"
for ns in "$NS_A" "$NS_B"; do
  ip -n "$ns" link set lo up || fail "lo up in $ns"
done
ip -n "$NS_A" link set veth-a up || fail "veth-a up"
ip -n "$NS_B" link set veth-b up || fail "veth-b up"

ns_of() { if [ $(($1 % 2)) = 0 ]; then echo "$NS_A"; else echo "$NS_B"; fi; }
addr_of() { if [ $(($1 % 2)) = 0 ]; then echo 10.77.0.1; else echo 10.77.0.2; fi; }

# Ports are private to the namespaces, but shared memory is not: a port of
# its own gives each run its own job identity, so that two runs at once on
# one machine never meet in /dev/shm.
PORT=$((20000 + RANDOM % 20000))

# start RANK ARGS...: one rank in its namespace, output in $WORK/out.R, log in $WORK/log.R
start() {
  local r=$1 ns addr
  ns=$(ns_of "$r")
  addr=$(addr_of "$r")
  ip netns exec "$ns" env MASTER_ADDR=10.77.0.1 MASTER_PORT=$PORT RANK="$r" WORLD_SIZE=$NRANKS \
    LOCAL_RANK=$((r / 2)) BRIGADE_BOOTSTRAP_ADDR="$addr" BRIGADE_TRANSPORTS="shm,$NET" \
    BRIGADE_IB_BACKEND=soft BRIGADE_IB_QPS_PER_LINK="$QPS" BRIGADE_DEBUG=INFO \
    BRIGADE_TIMEOUT_MS="$TIMEOUT_MS" \
    "$CHECK" "${@:2}" >"$WORK/out.$r" 2>"$WORK/log.$r" &
  PIDS[$r]=$!
}

# wait_exit RANK DEADLINE(epoch s): the rank's exit status, or 124 at the deadline
wait_exit() {
  local p=${PIDS[$1]}
  while kill -0 "$p" 2>/dev/null; do
    [ "$(date +%s)" -ge "$2" ] && return 124
    sleep 0.1
  done
  wait "$p"
}

# waits until every running rank printed "looping"
wait_looping() {
  local deadline=$(($(date +%s) + 60)) r
  for r in $(seq 0 $((NRANKS - 1))); do
    until grep -q looping "$WORK/out.$r" 2>/dev/null; do
      [ "$(date +%s)" -ge "$deadline" ] && fail "rank $r did not start its allreduce loop"
      kill -0 "${PIDS[$r]}" 2>/dev/null || fail "rank $r exited before looping"
      sleep 0.1
    done
  done
}

echo "hosts: $NS_A (10.77.0.1: ranks 0 2), $NS_B (10.77.0.2: ranks 1 3); transport between hosts: $NET$([ "$NET" = ibverbs ] && echo ' (software verbs backend, not RDMA)')"

case $MODE in
collectives)
  for r in $(seq 0 $((NRANKS - 1))); do start "$r" check; done
  deadline=$(($(date +%s) + 240))
  for r in $(seq 0 $((NRANKS - 1))); do
    wait_exit "$r" "$deadline"
    st=$?
    [ $st = 0 ] || fail "rank $r exited with status $st"
    grep -q "OK" "$WORK/out.$r" || fail "rank $r did not report OK"
    cat "$WORK/out.$r"
  done
  # The ring, as rank 0 logs it: host by host.
  grep -q "ring order (| separates hosts): 0 2 | 1 3$" "$WORK/log.0" ||
    fail "rank 0 did not log the ring 0 2 | 1 3: $(grep 'ring order' "$WORK/log.0")"
  echo "ring order (rank 0's INFO log): $(grep -o 'ring order.*' "$WORK/log.0")"
  # One network link per host boundary (two hosts on a ring: two boundaries),
  # shm for the links inside a host.
  nnet=$(cat "$WORK"/log.* | grep -c "(next) via $NET,")
  nshm=$(cat "$WORK"/log.* | grep -c "(next) via shm,")
  [ "$nnet" = 2 ] || fail "$nnet links use $NET, expected 2 (one per host boundary)"
  [ "$nshm" = 2 ] || fail "$nshm links use shm, expected 2"
  for r in 2 3; do # the ranks whose next is on the other host
    grep -q "link to rank [0-9]* (next) via $NET" "$WORK/log.$r" || fail "rank $r does not send via $NET"
  done
  echo "links: $nnet via $NET (ranks 2->1 and 3->0), $nshm via shm"
  if [ "$NET" = ibverbs ]; then
    grep -q "ibverbs backend: soft" "$WORK/log.2" || fail "the log does not say which verbs backend ran"
    grep -q "over the soft verbs backend, 2 queue pairs" "$WORK/log.2" || fail "rank 2 does not use 2 queue pairs"
    echo "verbs backend logged: $(grep -h -o 'ibverbs backend: .*' "$WORK/log.2" | head -1)"
  fi
  ;;
kill | linkdown)
  for r in $(seq 0 $((NRANKS - 1))); do start "$r" loop; done
  wait_looping
  t0=$(date +%s.%N)
  if [ "$MODE" = kill ]; then
    kill -9 "${PIDS[3]}"
    wait "${PIDS[3]}" 2>/dev/null
    echo "killed rank 3 in $NS_B"
    ranks="0 1 2"
  else
    ip -n "$NS_B" link set veth-b down || fail "cannot take veth-b down"
    echo "took veth-b down"
    ranks="0 1 2 3"
  fi
  deadline=$(($(date +%s) + TIMEOUT_MS / 1000 + SLACK_S))
  for r in $ranks; do
    wait_exit "$r" "$deadline"
    st=$?
    [ $st = 124 ] && fail "rank $r still running $((TIMEOUT_MS / 1000 + SLACK_S)) s after the fault"
    [ $st = 3 ] || fail "rank $r exited with status $st, expected 3 (a failed allreduce)"
    grep -q "error" "$WORK/out.$r" || fail "rank $r did not report an error"
    grep "error" "$WORK/out.$r"
  done
  echo "every rank failed within $(echo "$(date +%s.%N) - $t0" | bc 2>/dev/null || echo '?') s of the fault (limit: BRIGADE_TIMEOUT_MS=$TIMEOUT_MS + ${SLACK_S} s)"
  ;;
vanish)
  # Rank 1's host vanishes mid-allreduce without closing a socket: every
  # packet to and from it is dropped (netem loss 100% on its interface,
  # where the kernel has netem, else a blackhole route; and blackhole routes
  # to it on every other host). No FIN, no RST, no error on any socket: only
  # the silence of the ring's heartbeats tells. BRIGADE_TIMEOUT_MS is a
  # minute; every rank on the other hosts must fail within LIMIT_S, naming a
  # rank of the vanished host as silent. Only the helpers every layout of
  # this script has are used (ns_of, addr_of, start, wait_looping, wait_exit).
  TIMEOUT_MS=60000 LIMIT_S=10
  command -v tc >/dev/null || skip "tc (iproute2) is not installed"
  gone_ns=$(ns_of 1) gone_addr=$(addr_of 1) survivors="" gone=""
  for r in $(seq 0 $((NRANKS - 1))); do
    if [ "$(ns_of "$r")" = "$gone_ns" ]; then gone="$gone|$r"; else survivors="$survivors $r"; fi
  done
  gone=${gone#|}
  for r in $(seq 0 $((NRANKS - 1))); do start "$r" loop; done
  wait_looping
  dev=$(ip -n "$gone_ns" -o link show | awk -F': ' '$2 != "lo" {sub(/@.*/, "", $2); print $2; exit}')
  t0=$(date +%s.%N)
  if tc -n "$gone_ns" qdisc add dev "$dev" root netem loss 100% 2>"$WORK/err"; then
    how="netem loss 100% on $dev"
  else
    how="blackhole routes (no netem here: $(cat "$WORK/err"))"
  fi
  for r in $survivors; do
    ns=$(ns_of "$r")
    ip -n "$ns" route replace blackhole "$gone_addr/32" || fail "blackhole route in $ns"
    case $how in blackhole*)
      ip -n "$gone_ns" route replace blackhole "$(addr_of "$r")/32" || fail "blackhole route in $gone_ns"
      ;;
    esac
  done
  echo "rank 1's host ($gone_ns: ranks ${gone//|/ }) cut off: $how, blackhole routes to $gone_addr"
  deadline=$(($(date +%s) + LIMIT_S))
  for r in $survivors; do
    wait_exit "$r" "$deadline"
    st=$?
    [ $st = 124 ] && fail "rank $r still running $LIMIT_S s after rank 1's host vanished (BRIGADE_TIMEOUT_MS=$TIMEOUT_MS)"
    [ $st = 3 ] || fail "rank $r exited with status $st, expected 3 (a failed allreduce)"
    grep -Eq "error.*rank ($gone) \(pid [0-9]+ on [^)]*\) has been silent" "$WORK/out.$r" ||
      fail "rank $r's error does not name a rank of the vanished host ($gone) as silent"
    grep "error" "$WORK/out.$r"
  done
  echo "every other rank failed within $(echo "$(date +%s.%N) - $t0" | bc 2>/dev/null || echo "?") s of the cut (limit ${LIMIT_S} s, BRIGADE_TIMEOUT_MS=$TIMEOUT_MS)"
  ;;
exec)
  for r in $(seq 0 $((NRANKS - 1))); do start "$r" "${EXTRA[@]}"; done
  deadline=$(($(date +%s) + 3600))
  for r in $(seq 0 $((NRANKS - 1))); do
    wait_exit "$r" "$deadline"
    st=$?
    [ $st = 0 ] || fail "rank $r exited with status $st"
  done
  cat "$WORK/out.0"
  # MH_EXPECT_LOG: texts, separated by ';', that every rank's INFO log must
  # hold (what ran).
  if [ -n "${MH_EXPECT_LOG:-}" ]; then
    IFS=';' read -r -a expect <<<"$MH_EXPECT_LOG"
    for text in "${expect[@]}"; do
      for r in $(seq 0 $((NRANKS - 1))); do
        grep -q -- "$text" "$WORK/log.$r" ||
          fail "rank $r's log lacks '$text': $(grep -h 'device ring\|GPUDirect' "$WORK/log.$r")"
      done
      echo "every rank logged: $text"
    done
  fi
  ;;
*)
  echo "usage: run.sh MH_CHECK collectives|kill|linkdown|vanish|exec tcp|ibverbs [args for exec]"
  exit 1
  ;;
esac
echo "PASS"
exit 0
