#include <stdarg.h>
#include <stdio.h>

#include "status.h"

const char *brg_status_string(brg_status s) {
  switch (s) {
  case BRG_SUCCESS: return "success";
  case BRG_IN_PROGRESS: return "in progress";
  case BRG_ERR_INVALID_ARGUMENT: return "invalid argument";
  case BRG_ERR_INVALID_USAGE: return "invalid usage";
  case BRG_ERR_SYSTEM: return "system error";
  case BRG_ERR_TIMEOUT: return "timeout";
  case BRG_ERR_REMOTE: return "remote error";
  case BRG_ERR_MISMATCH: return "collective mismatch";
  case BRG_ERR_UNAVAILABLE: return "unavailable";
  case BRG_ERR_ABORTED: return "aborted";
  case BRG_ERR_NO_MEMORY: return "out of memory";
  case BRG_ERR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

static const char *const dtype_names[BRG_NUM_DTYPES] = {"int8",    "uint8",  "int32",   "uint32",
                                                        "int64",   "uint64", "float16", "bfloat16",
                                                        "float32", "float64"};
static const size_t dtype_sizes[BRG_NUM_DTYPES] = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8};
static const char *const op_names[BRG_NUM_OPS] = {"sum", "prod", "min", "max",
                                                  "avg", "band", "bor", "bxor"};

const char *brg_dtype_name(brg_dtype d) {
  return (unsigned)d < BRG_NUM_DTYPES ? dtype_names[d] : NULL;
}
size_t brg_dtype_size(brg_dtype d) {
  return (unsigned)d < BRG_NUM_DTYPES ? dtype_sizes[d] : 0;
}
const char *brg_op_name(brg_op op) {
  return (unsigned)op < BRG_NUM_OPS ? op_names[op] : NULL;
}

brg_status brg__error_quiet(brg__errbuf *eb, brg_status status, const char *fmt, ...) {
  if (eb) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(eb->msg, sizeof eb->msg, fmt, ap);
    va_end(ap);
    eb->logged = 0;
  }
  return status;
}
