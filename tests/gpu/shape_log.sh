#!/bin/sh
# Kernel mode's shape as the INFO log states it: a run of
# test_device_threads (emulated module) must pass and its log hold every
# text given after the program's arguments.
# Usage: shape_log.sh test_device_threads N -- TEXT...
prog=${1:?usage: shape_log.sh PROGRAM N -- TEXT...}
n=${2:?usage: shape_log.sh PROGRAM N -- TEXT...}
shift 3
out=$(BRIGADE_DEBUG=INFO "$prog" "$n" 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
  echo "$out"
  echo "FAIL: $prog $n exited with $rc"
  exit 1
fi
for want in "$@"; do
  if ! printf '%s\n' "$out" | grep -F -- "$want" >/dev/null; then
    printf '%s\n' "$out" | grep -F "shape" | head -3
    echo "FAIL: the log lacks: $want"
    exit 1
  fi
done
echo "ok: the log states the shape"
