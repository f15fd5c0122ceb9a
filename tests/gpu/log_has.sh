#!/bin/bash
# What the INFO log states: a run of PROGRAM with its arguments (run with
# BRIGADE_DEBUG=INFO) must pass and its log hold every text given after
# "--" (kernel mode's shape, the allreduce algorithm the policy chose).
# Usage: log_has.sh PROGRAM [ARG...] -- TEXT...
args=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  args+=("$1")
  shift
done
if [ ${#args[@]} -eq 0 ] || [ $# -eq 0 ]; then
  echo "usage: log_has.sh PROGRAM [ARG...] -- TEXT..."
  exit 2
fi
shift # the "--"
out=$(BRIGADE_DEBUG=INFO "${args[@]}" 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
  echo "$out"
  echo "FAIL: ${args[*]} exited with $rc"
  exit 1
fi
for want in "$@"; do
  if ! printf '%s\n' "$out" | grep -F -- "$want" >/dev/null; then
    printf '%s\n' "$out" | grep -F "INFO" | head -20
    echo "FAIL: the log lacks: $want"
    exit 1
  fi
done
echo "ok: the log holds every text"
