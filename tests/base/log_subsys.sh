#!/bin/sh
# The subsystems BRIGADE_DEBUG_SUBSYS accepts are the ones the code logs
# under: brigade-info's help text lists exactly the names used in the
# sources, and filtering by one of them shows that subsystem's lines only.
#   log_subsys.sh SOURCE_ROOT BRIGADE_INFO BRIGADE_RUN ALL_REDUCE_PERF
set -eu
src=$1 info=$2 run=$3 perf=$4
fail() { echo "FAIL: $*" >&2; exit 1; }

listed=$(BRIGADE_DEBUG= "$info" | sed -n 's/.*comma-separated subsystems to log (\([^)]*\)).*/\1/p' |
         tr ',' '\n' | sort -u)
[ -n "$listed" ] || fail "brigade-info prints no list of subsystems"

# Names passed to the log macros and brg__error, and *_SUBSYS constants.
used=$(grep -rhoE 'BRG__(WARN|INFO|TRACE)\("[a-z_]+"|brg__error\([^,]+, [^,]+, "[a-z_]+"|_SUBSYS "[a-z_]+"' \
         "$src/base" "$src/kernels" "$src/transport" "$src/runtime" |
       grep -oE '"[a-z_]+"$' | tr -d '"' | sort -u)
[ -n "$used" ] || fail "found no subsystem in the sources"

missing=$(printf '%s\n' "$used" | grep -vxF "$listed" || true)
[ -z "$missing" ] || fail "logged under but not listed by brigade-info: $(echo $missing)"
unused=$(printf '%s\n' "$listed" | grep -vxF "$used" || true)
[ -z "$unused" ] || fail "listed by brigade-info but never logged under: $(echo $unused)"

# Filtering by one name shows that subsystem's INFO lines and no other's.
out=$(BRIGADE_DEBUG=INFO BRIGADE_DEBUG_SUBSYS=bootstrap BRIGADE_TRANSPORTS=shm \
      "$run" -n 2 "$perf" -b 8 -e 8 -n 1 -w 0 2>&1 >/dev/null)
echo "$out" | grep -q ' INFO \[bootstrap\] ' || fail "no [bootstrap] INFO line with BRIGADE_DEBUG_SUBSYS=bootstrap:
$out"
if echo "$out" | grep ' INFO \[' | grep -qv ' INFO \[bootstrap\] '; then
  fail "lines of other subsystems with BRIGADE_DEBUG_SUBSYS=bootstrap:
$out"
fi
echo "subsystems: $(echo $listed)"
