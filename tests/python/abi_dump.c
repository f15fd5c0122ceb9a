/*
 * Prints, as JSON, what a C compiler makes of brigade.h and
 * brigade_reducer.h: every enum value and constant, and the size and field
 * offsets of every struct the Python package declares with ctypes.
 * test_abi.py compares this with python/brigade/_capi.py.
 */
#include <stddef.h>
#include <stdio.h>

#include "brigade.h"
#include "brigade_reducer.h"

#define NUM(name) printf("  \"%s\": %lld,\n", #name, (long long)(name))
#define FIELD(type, f)                                                                             \
  printf("    \"%s\": [%zu, %zu],\n", #f, offsetof(type, f), sizeof(((type *)0)->f))

int main(void) {
  printf("{\n \"constants\": {\n");
  NUM(BRG_VERSION_MAJOR);
  NUM(BRG_VERSION_MINOR);
  NUM(BRG_VERSION_PATCH);
  NUM(BRG_UNIQUE_ID_BYTES);
  NUM(BRG_NUM_DTYPES);
  NUM(BRG_NUM_OPS);
  NUM(BRG_SPLIT_NOCOLOR);
  NUM(BRG_COMM_CONFIG_VERSION);
  NUM(BRG_CONFIG_UNSET);
  NUM(BRG_REDUCER_SUM);
  NUM(BRG_REDUCER_FIND_UNUSED);
  NUM(BRG_REDUCER_STATIC_GRAPH);
  NUM(BRG_REDUCER_GRAD_AS_VIEW);
  NUM(BRG_REDUCER_NO_REBUILD);
  NUM(BRG_REDUCER_DEVICE);
  NUM(BRG_REDUCER_NO_SYNC);
  printf("  \"end\": 0\n },\n \"status\": {\n");
  NUM(BRG_SUCCESS);
  NUM(BRG_IN_PROGRESS);
  NUM(BRG_ERR_INVALID_ARGUMENT);
  NUM(BRG_ERR_INVALID_USAGE);
  NUM(BRG_ERR_SYSTEM);
  NUM(BRG_ERR_TIMEOUT);
  NUM(BRG_ERR_REMOTE);
  NUM(BRG_ERR_MISMATCH);
  NUM(BRG_ERR_UNAVAILABLE);
  NUM(BRG_ERR_ABORTED);
  NUM(BRG_ERR_NO_MEMORY);
  NUM(BRG_ERR_INTERNAL);
  printf("  \"end\": 0\n },\n \"dtype\": {\n");
  NUM(BRG_INT8);
  NUM(BRG_UINT8);
  NUM(BRG_INT32);
  NUM(BRG_UINT32);
  NUM(BRG_INT64);
  NUM(BRG_UINT64);
  NUM(BRG_FLOAT16);
  NUM(BRG_BFLOAT16);
  NUM(BRG_FLOAT32);
  NUM(BRG_FLOAT64);
  printf("  \"end\": 0\n },\n \"op\": {\n");
  NUM(BRG_SUM);
  NUM(BRG_PROD);
  NUM(BRG_MIN);
  NUM(BRG_MAX);
  NUM(BRG_AVG);
  NUM(BRG_BAND);
  NUM(BRG_BOR);
  NUM(BRG_BXOR);
  printf("  \"end\": 0\n },\n \"hook\": {\n");
  NUM(BRG_REDUCER_HOOK_ALLREDUCE);
  NUM(BRG_REDUCER_HOOK_FP16);
  NUM(BRG_REDUCER_HOOK_BF16);
  NUM(BRG_REDUCER_HOOK_CUSTOM);
  printf("  \"end\": 0\n },\n \"structs\": {\n");
  printf("  \"brg_unique_id\": {\"size\": %zu, \"fields\": {\n", sizeof(brg_unique_id));
  FIELD(brg_unique_id, internal);
  printf("    \"end\": [0, 0]}},\n");
  printf("  \"brg_request\": {\"size\": %zu, \"fields\": {\n", sizeof(brg_request));
  FIELD(brg_request, internal);
  printf("    \"end\": [0, 0]}},\n");
  printf("  \"brg_comm_config\": {\"size\": %zu, \"fields\": {\n", sizeof(brg_comm_config));
  FIELD(brg_comm_config, size);
  FIELD(brg_comm_config, version);
  FIELD(brg_comm_config, timeout_ms);
  FIELD(brg_comm_config, transports);
  printf("    \"end\": [0, 0]}},\n");
  printf("  \"brg_reducer_param\": {\"size\": %zu, \"fields\": {\n", sizeof(brg_reducer_param));
  FIELD(brg_reducer_param, name);
  FIELD(brg_reducer_param, count);
  FIELD(brg_reducer_param, dtype);
  FIELD(brg_reducer_param, data);
  FIELD(brg_reducer_param, grad);
  printf("    \"end\": [0, 0]}},\n");
  printf("  \"brg_reducer_bucket\": {\"size\": %zu, \"fields\": {\n", sizeof(brg_reducer_bucket));
  FIELD(brg_reducer_bucket, index);
  FIELD(brg_reducer_bucket, data);
  FIELD(brg_reducer_bucket, count);
  FIELD(brg_reducer_bucket, dtype);
  FIELD(brg_reducer_bucket, nranks);
  FIELD(brg_reducer_bucket, average);
  FIELD(brg_reducer_bucket, request);
  FIELD(brg_reducer_bucket, stream);
  printf("    \"end\": [0, 0]}},\n");
  printf("  \"brg_reducer_config\": {\"size\": %zu, \"fields\": {\n", sizeof(brg_reducer_config));
  FIELD(brg_reducer_config, bucket_cap_bytes);
  FIELD(brg_reducer_config, first_bucket_cap_bytes);
  FIELD(brg_reducer_config, flags);
  FIELD(brg_reducer_config, hook);
  FIELD(brg_reducer_config, hook_launch);
  FIELD(brg_reducer_config, hook_finish);
  FIELD(brg_reducer_config, hook_arg);
  FIELD(brg_reducer_config, stream);
  printf("    \"end\": [0, 0]}}\n }\n}\n");
  return 0;
}
