#!/bin/bash
# Multi-host tests on one machine. Network namespaces are the "hosts", each
# with one interface (mhH, address 10.77.0.<H+1>, an address that exists
# only inside them) on a bridge that lives in a namespace of its own (the
# "switch"); ranks inside a host reach each other over shm and the other
# hosts over the network transport:
#
#     host 0 (10.77.0.1)     host 1 (10.77.0.2)     ... host H-1
#     ranks 0 2              ranks 1 3
#          \___ mh0              \___ mh1
#               \____ br0 (switch namespace) ____/
#
# MH_LAYOUT gives the ranks per host, comma-separated (default 2,2: two
# hosts of two ranks; 3,3,3 or 3,2 for other shapes). Ranks alternate
# between the hosts, skipping full ones (2,2: hosts 0 1 0 1; 3,2: 0 1 0 1 0),
# so the runtime has to reorder the ring host by host (2,2: ring 0 2 | 1 3).
#
# MH_NICS=K gives every host K addresses, each a network device to the
# runtime (NIC n of host H: 10.77.n.H+1), and local rank l of a host of M
# ranks advertises NIC l*K/M's (BRIGADE_BOOTSTRAP_ADDR): the rails of a
# rail-optimised fabric, whose NIC map and rings the INFO log shows.
#
# MH_SHAPE, when set, shapes every host's interface: a netem specification
# ("tc qdisc add dev mhH root netem $MH_SHAPE"), e.g. MH_SHAPE="delay 20us
# rate 2gbit", or a whole qdisc when it starts with the qdisc's name, e.g.
# MH_SHAPE="tbf rate 2gbit burst 256kb latency 2ms" (kernels without
# sch_netem have tbf: a rate, no added delay; the burst must hold a 64 KiB
# GSO packet). Each packet between hosts leaves through one shaped
# interface, so the links get that latency and rate.
#
# usage: run.sh MH_CHECK MODE TRANSPORT [args for exec]
#   MODE       collectives  every element of allreduce / reduce_scatter /
#                           all_gather / broadcast, and the INFO log: ring
#                           order host by host, one network link per boundary
#              allreduce    MH_CHECK allreduce: every dtype and op, every
#                           element, the same bits on every rank; the INFO
#                           log must hold MH_EXPECT_LOG (run it with
#                           BRIGADE_ALGO=ring or hier)
#              rings        the same, then MH_CHECK's collectives check:
#                           for several rings (BRIGADE_RINGS)
#              mismatch     BRIGADE_ALGO=hier on rank 0, ring on the others:
#                           every rank must fail at init with a collective
#                           mismatch that names BRIGADE_ALGO, none may hang
#              devmismatch  (MH_DEVICE=1, kernel mode) MH_CHECK devmismatch:
#                           device calls that differ between hosts (count,
#                           dtype, op, root, collective) must each fail
#                           with BRG_ERR_MISMATCH naming both calls, found
#                           through the host proxies, not at the timeout
#              netfail      the last rank can open no descriptor when its
#                           first allreduce makes kernel mode's net ring
#                           (MH_DEVICE=1, kernel mode) or the hierarchy's
#                           pieces (BRIGADE_ALGO=hier): every rank must
#                           fail that call at once, the others naming it
#              kill         the last rank is killed mid-allreduce: every
#                           other rank must fail within the timeout,
#                           naming it where MH_NAME_VICTIM=1 (with
#                           MH_DEVICE=1, and in the next two, on GPU
#                           buffers: mh_check's loop)
#              linkdown     host 1's interface goes down mid-allreduce:
#                           every rank must fail within the timeout
#              vanish       rank 1's host is cut off mid-allreduce, no socket
#                           closes: every rank of the other hosts must fail
#                           within 10 s, naming a silent rank of that host
#              exec         runs MH_CHECK with the remaining arguments on
#                           every rank and prints rank 0's output, e.g.
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
TIMEOUT_MS=5000 # BRIGADE_TIMEOUT_MS for the fault tests
# Runs that check values measure no failure time: they get a minute, since
# several of them share this machine's cores with the emulated GPU kernels
# (a loaded 2-core machine has taken more than 5 s to start 8 ranks).
case $MODE in collectives | allreduce | rings | exec) TIMEOUT_MS=60000 ;; esac
SLACK_S=10      # on top of it: process start-up, abort and teardown on 2 cores
# ibverbs queue pairs per link: two for the collectives (slots striped over
# them), one for the others
QPS=1
[ "$MODE" = collectives ] && QPS=2

# ---- the layout: HOST_OF[rank], LOCAL_OF[rank], RANKS_ON[host] ----
IFS=',' read -r -a PER_HOST <<<"${MH_LAYOUT:-2,2}"
NHOSTS=${#PER_HOST[@]}
NRANKS=0
for n in "${PER_HOST[@]}"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "FAIL: MH_LAYOUT=$MH_LAYOUT: '$n' is not a rank count"; exit 1; }
  NRANKS=$((NRANKS + n))
done
[ "$NHOSTS" -ge 2 ] || { echo "FAIL: MH_LAYOUT=$MH_LAYOUT: at least two hosts"; exit 1; }
HOST_OF=() LOCAL_OF=() RANKS_ON=() FILLED=()
for h in $(seq 0 $((NHOSTS - 1))); do FILLED[$h]=0 RANKS_ON[$h]=""; done
h=0
for r in $(seq 0 $((NRANKS - 1))); do
  while [ "${FILLED[$h]}" -ge "${PER_HOST[$h]}" ]; do h=$(((h + 1) % NHOSTS)); done
  HOST_OF[$r]=$h
  LOCAL_OF[$r]=${FILLED[$h]}
  FILLED[$h]=$((FILLED[$h] + 1))
  RANKS_ON[$h]="${RANKS_ON[$h]:+${RANKS_ON[$h]} }$r"
  h=$(((h + 1) % NHOSTS))
done
# The ring as the runtime orders it (hosts by their lowest rank, which is
# host order here; ranks ascending within a host), as rank 0 logs it.
RING=""
for h in $(seq 0 $((NHOSTS - 1))); do RING="${RING:+$RING | }${RANKS_ON[$h]}"; done

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

PFX=brg-mh-$$
SW=$PFX-sw
ns_of() { echo "$PFX-h${HOST_OF[$1]}"; }
# MH_NICS=K: K addresses per host (10.77.n.H+1 for NIC n, on its one
# interface), local rank l of a host of M ranks on NIC l*K/M: the NIC map
# and rails the runtime must find (topology.c).
NICS=${MH_NICS:-1}
[[ $NICS =~ ^[1-9][0-9]*$ ]] || { echo "FAIL: MH_NICS=$NICS is not a count"; exit 1; }
addr_of() {
  local h=${HOST_OF[$1]}
  echo "10.77.$((LOCAL_OF[$1] * NICS / PER_HOST[h])).$((h + 1))"
}
WORK=$(mktemp -d /tmp/brigade-mh.XXXXXX)
PIDS=()
MADE=()

cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  for ns in "${MADE[@]}"; do ip netns del "$ns" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$SW" 2>"$WORK/err" || skip "ip netns add failed: $(cat "$WORK/err")"
MADE+=("$SW")
ip -n "$SW" link add br0 type bridge 2>"$WORK/err" || skip "cannot create a bridge: $(cat "$WORK/err")"
ip -n "$SW" link set br0 up || fail "br0 up"
for h in $(seq 0 $((NHOSTS - 1))); do
  ns=$PFX-h$h
  ip netns add "$ns" 2>"$WORK/err" || skip "ip netns add failed: $(cat "$WORK/err")"
  MADE+=("$ns")
  ip -n "$SW" link add "sw$h" type veth peer name "mh$h" netns "$ns" 2>"$WORK/err" ||
    skip "cannot create a veth pair: $(cat "$WORK/err")"
  ip -n "$SW" link set "sw$h" master br0 || fail "sw$h into br0"
  ip -n "$SW" link set "sw$h" up || fail "sw$h up"
  ip -n "$ns" addr add "10.77.0.$((h + 1))/24" dev "mh$h" || fail "address on mh$h"
  for n in $(seq 1 $((NICS - 1))); do
    ip -n "$ns" addr add "10.77.$n.$((h + 1))/16" dev "mh$h" || fail "address $n on mh$h"
  done
  ip -n "$ns" link set lo up || fail "lo up in $ns"
  ip -n "$ns" link set "mh$h" up || fail "mh$h up"
  if [ -n "${MH_SHAPE:-}" ]; then
    qdisc="netem $MH_SHAPE"
    case $MH_SHAPE in netem* | tbf* | htb* | pfifo*) qdisc=$MH_SHAPE ;; esac
    # shellcheck disable=SC2086 # a list of tc words
    tc -n "$ns" qdisc add dev "mh$h" root $qdisc 2>"$WORK/err" ||
      fail "tc qdisc add dev mh$h root $qdisc: $(cat "$WORK/err")$(grep -q unknown "$WORK/err" &&
        echo " (this kernel lacks that qdisc; without sch_netem, tbf shapes the rate: MH_SHAPE='tbf rate 2gbit burst 256kb latency 2ms')")"
  fi
done

# Ports are private to the namespaces, but shared memory is not: a port of
# its own gives each run its own job identity, so that two runs at once on
# one machine never meet in /dev/shm.
PORT=$((20000 + RANDOM % 20000))

# RANK_ENV[r]: more VAR=value words for rank r (the mismatch test's).
RANK_ENV=()
# The "hosts" share this machine's cores, which each rank's runtime cannot
# see (it counts only the ranks of its own namespace): where the ranks
# outnumber the cores, waits yield at once, as the runtime itself decides
# for ranks that outnumber a real host's cores (unless BRIGADE_SPIN is set).
SPIN_ENV=""
if [ -z "${BRIGADE_SPIN:-}" ] && [ "$NRANKS" -gt "$(nproc)" ]; then SPIN_ENV="BRIGADE_SPIN=0"; fi

# start RANK ARGS...: one rank in its namespace, output in $WORK/out.R, log in $WORK/log.R
start() {
  local r=$1 ns addr
  ns=$(ns_of "$r")
  addr=$(addr_of "$r")
  # shellcheck disable=SC2086 # RANK_ENV holds words
  ip netns exec "$ns" env MASTER_ADDR=10.77.0.1 MASTER_PORT=$PORT RANK="$r" WORLD_SIZE=$NRANKS \
    LOCAL_RANK="${LOCAL_OF[$r]}" BRIGADE_BOOTSTRAP_ADDR="$addr" BRIGADE_TRANSPORTS="cuda_ipc,shm,$NET" \
    BRIGADE_IB_BACKEND=soft BRIGADE_IB_QPS_PER_LINK="$QPS" BRIGADE_DEBUG=INFO \
    BRIGADE_TIMEOUT_MS="$TIMEOUT_MS" $SPIN_ENV ${RANK_ENV[$r]:-} \
    "$CHECK" "${@:2}" >"$WORK/out.$r" 2>"$WORK/log.$r" &
  PIDS[$r]=$!
}

start_all() {
  local r
  for r in $(seq 0 $((NRANKS - 1))); do start "$r" "$@"; done
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

# wait_all_ok SECONDS [MARK]: every rank exits 0 (and prints MARK) in time
wait_all_ok() {
  local deadline=$(($(date +%s) + $1)) r st
  for r in $(seq 0 $((NRANKS - 1))); do
    wait_exit "$r" "$deadline"
    st=$?
    [ $st = 0 ] || fail "rank $r exited with status $st"
    if [ -n "${2:-}" ]; then
      grep -q "$2" "$WORK/out.$r" || fail "rank $r did not report $2"
    fi
  done
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

# MH_EXPECT_LOG: texts, separated by ';', that every rank's INFO log must
# hold (what ran).
expect_log() {
  [ -n "${MH_EXPECT_LOG:-}" ] || return 0
  local expect text r
  IFS=';' read -r -a expect <<<"$MH_EXPECT_LOG"
  for text in "${expect[@]}"; do
    for r in $(seq 0 $((NRANKS - 1))); do
      grep -q -- "$text" "$WORK/log.$r" ||
        fail "rank $r's log lacks '$text': $(grep -h 'device ring\|GPUDirect\|algorithm' "$WORK/log.$r")"
    done
    echo "every rank logged: $text"
  done
}

# expect_failures RANKS STATUS: each rank exits with STATUS within the
# fault timeout and printed an error
expect_failures() {
  local deadline=$(($(date +%s) + TIMEOUT_MS / 1000 + SLACK_S)) r st
  for r in $1; do
    wait_exit "$r" "$deadline"
    st=$?
    [ $st = 124 ] && fail "rank $r still running $((TIMEOUT_MS / 1000 + SLACK_S)) s after the fault"
    [ $st = "$2" ] || fail "rank $r exited with status $st, expected $2"
    grep -q -i "error\|FAIL" "$WORK/out.$r" || fail "rank $r did not report an error"
    grep -i "error\|FAIL" "$WORK/out.$r"
  done
}

hosts_line=""
for h in $(seq 0 $((NHOSTS - 1))); do
  hosts_line="$hosts_line${hosts_line:+; }host $h (10.77.0.$((h + 1))): ranks ${RANKS_ON[$h]}"
done
echo "$hosts_line; between hosts: $NET$([ "$NET" = ibverbs ] && echo ' (software verbs backend, not RDMA)')${MH_SHAPE:+; links shaped: $MH_SHAPE}"

case $MODE in
collectives)
  start_all check
  wait_all_ok 240 OK
  cat "$WORK"/out.*
  # The ring, as rank 0 logs it: host by host.
  grep -q "ring order (| separates hosts): $RING$" "$WORK/log.0" ||
    fail "rank 0 did not log the ring $RING: $(grep 'ring order' "$WORK/log.0")"
  echo "ring order (rank 0's INFO log): $(grep -m1 -o 'ring order.*' "$WORK/log.0")"
  # One network link per host boundary (NHOSTS boundaries on a ring), shm
  # for the links inside a host: each rank's first link line is its own
  # (communicators of a hierarchical allreduce log theirs later).
  firsts=$(for r in $(seq 0 $((NRANKS - 1))); do grep -m1 "(next) via" "$WORK/log.$r"; done)
  nnet=$(grep -c "(next) via $NET," <<<"$firsts")
  nshm=$(grep -c "(next) via shm," <<<"$firsts")
  [ "$nnet" = "$NHOSTS" ] || fail "$nnet links use $NET, expected $NHOSTS (one per host boundary)"
  [ "$nshm" = $((NRANKS - NHOSTS)) ] || fail "$nshm links use shm, expected $((NRANKS - NHOSTS))"
  for h in $(seq 0 $((NHOSTS - 1))); do # the last rank of a host sends to the next host
    r=${RANKS_ON[$h]##* }
    grep -m1 "(next) via" "$WORK/log.$r" | grep -q "link to rank [0-9]* (next) via $NET" ||
      fail "rank $r does not send via $NET"
  done
  echo "links: $nnet via $NET, $nshm via shm"
  # Point-to-point (all_to_all and a ring of messages: every pair): a
  # rank's link to another host takes NET's byte stream (tcp's socket,
  # ibverbs' queue pairs); to a rank of its own host, shm.
  want_p2p=$NET
  for r in $(seq 0 $((NRANKS - 1))); do
    for p in $(seq 0 $((NRANKS - 1))); do
      [ "$p" = "$r" ] && continue
      w=$([ "${HOST_OF[$p]}" = "${HOST_OF[$r]}" ] && echo shm || echo "$want_p2p")
      grep -q "rank $r: link to rank $p over $w\$" "$WORK/log.$r" ||
        fail "rank $r's point-to-point link to rank $p is not over $w: $(grep "rank $r: link to rank $p over" "$WORK/log.$r")"
    done
  done
  echo "point-to-point links: shm within a host, $want_p2p between hosts"
  if [ "$NET" = ibverbs ]; then
    r=${RANKS_ON[0]##* }
    grep -q "ibverbs backend: soft" "$WORK/log.$r" || fail "the log does not say which verbs backend ran"
    grep -q "over the soft verbs backend, 2 queue pairs" "$WORK/log.$r" || fail "rank $r does not use 2 queue pairs"
    echo "verbs backend logged: $(grep -h -o 'ibverbs backend: .*' "$WORK/log.$r" | head -1)"
  fi
  ;;
allreduce | rings)
  start_all "$MODE"
  wait_all_ok 240 OK
  cat "$WORK"/out.*
  expect_log
  # With several NICs a host: every hop between hosts of every ring rank 0
  # logs has both ends on one NIC index (a rail), but the hop that closes
  # a ring over an odd number of hosts of a NIC per rank.
  if [ "$NICS" -gt 1 ]; then
    nic_of() {
      local h=${HOST_OF[$1]}
      echo $((LOCAL_OF[$1] * NICS / PER_HOST[h]))
    }
    while read -r line; do
      read -r -a words <<<"${line#*: }"
      ranks=() cross=()
      for w in "${words[@]}"; do
        if [ "$w" = "|" ]; then cross[${#ranks[@]}]=1; else ranks+=("$w"); fi
      done
      cross[0]=1 # the hop that closes the ring
      n=${#ranks[@]} off=0
      for i in $(seq 0 $((n - 1))); do
        [ -n "${cross[$i]:-}" ] || continue
        a=${ranks[$(((i + n - 1) % n))]} b=${ranks[$i]}
        [ "$(nic_of "$a")" = "$(nic_of "$b")" ] && continue
        off=$((off + 1))
      done
      allowed=0
      [ $((NHOSTS % 2)) = 1 ] && [ "$NICS" -ge "${PER_HOST[0]}" ] && allowed=1
      [ "$off" -le "$allowed" ] || fail "$off hop(s) between hosts cross rails: $line"
      echo "rails kept ($off off): $line"
    done < <(grep -o 'ring [0-9]* of [0-9]* (| separates hosts): .*' "$WORK/log.0")
  fi
  ;;
devmismatch)
  start_all devmismatch
  wait_all_ok 120 "mismatch ok"
  cat "$WORK"/out.*
  for r in $(seq 0 $((NRANKS - 1))); do
    n=$(grep -c "mismatch ok" "$WORK/out.$r")
    [ "$n" = 5 ] || fail "rank $r named $n of the 5 mismatches"
  done
  expect_log
  ;;
netfail)
  # the last rank cannot set up its ends of the links its first
  # allreduce makes (no descriptors left): kernel mode's net ring with
  # MH_DEVICE=1, else the hierarchy's pieces (BRIGADE_ALGO=hier); every
  # rank fails the call within the timeout, naming it
  start_all netfail
  wait_all_ok $((TIMEOUT_MS / 1000 + SLACK_S)) "set-up failure ok"
  cat "$WORK"/out.*
  ;;
mismatch)
  # MH_MISMATCH="VAR A B": VAR=A on rank 0, B on the others (default
  # BRIGADE_ALGO hier ring); every rank must fail naming VAR
  read -r mvar mfirst mrest <<<"${MH_MISMATCH:-BRIGADE_ALGO hier ring}"
  RANK_ENV[0]="$mvar=$mfirst"
  for r in $(seq 1 $((NRANKS - 1))); do RANK_ENV[$r]="$mvar=$mrest"; done
  start_all check
  expect_failures "$(seq 0 $((NRANKS - 1)))" 1
  for r in $(seq 0 $((NRANKS - 1))); do
    grep -q "collective mismatch ($mvar is " "$WORK/out.$r" ||
      fail "rank $r did not fail with a mismatch naming $mvar"
  done
  echo "every rank failed with BRG_ERR_MISMATCH naming $mvar"
  ;;
kill | linkdown)
  start_all loop
  wait_looping
  t0=$(date +%s.%N)
  if [ "$MODE" = kill ]; then
    victim=$((NRANKS - 1))
    kill -9 "${PIDS[$victim]}"
    wait "${PIDS[$victim]}" 2>/dev/null
    echo "killed rank $victim on host ${HOST_OF[$victim]}"
    ranks=$(seq 0 $((NRANKS - 2)))
  else
    ip -n "$PFX-h1" link set mh1 down || fail "cannot take mh1 down"
    echo "took host 1's interface (mh1) down"
    ranks=$(seq 0 $((NRANKS - 1)))
  fi
  expect_failures "$ranks" 3
  echo "every rank failed within $(echo "$(date +%s.%N) - $t0" | bc 2>/dev/null || echo '?') s of the fault (limit: BRIGADE_TIMEOUT_MS=$TIMEOUT_MS + ${SLACK_S} s)"
  # MH_NAME_VICTIM=1: each survivor's error names the killed rank in the
  # job's numbering, "rank V (pid ..." or, where the hierarchy's
  # communicators number it otherwise, "pid ... is rank V here"
  if [ "$MODE" = kill ] && [ "${MH_NAME_VICTIM:-0}" = 1 ]; then
    for r in $ranks; do
      grep -E "error" "$WORK/out.$r" | grep -q -E "rank $victim \(pid |is rank $victim here" ||
        fail "rank $r's error does not name rank $victim, the rank killed"
    done
    echo "every survivor named rank $victim"
  fi
  expect_log
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
  expect_log
  ;;
exec)
  start_all "${EXTRA[@]}"
  wait_all_ok 3600
  cat "$WORK/out.0"
  expect_log
  ;;
*)
  echo "usage: run.sh MH_CHECK collectives|allreduce|rings|mismatch|devmismatch|netfail|kill|linkdown|vanish|exec tcp|ibverbs [args for exec]"
  exit 1
  ;;
esac
echo "PASS"
exit 0
