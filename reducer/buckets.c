#include "buckets.h"

#include <stdlib.h>
#include <string.h>

brg_status brg__bucket_assign(size_t nparams, const size_t *count, const brg_dtype *dtype,
                              const size_t *fill_order, size_t first_cap, size_t cap,
                              size_t *members, size_t *bucket_start, size_t *bucket_of,
                              size_t *nbuckets) {
  /* Per dtype: the open bucket (or SIZE_MAX), its bytes and its cap. */
  size_t open[BRG_NUM_DTYPES], open_bytes[BRG_NUM_DTYPES], open_cap[BRG_NUM_DTYPES];
  size_t nb = 0;

  for (int d = 0; d < BRG_NUM_DTYPES; d++) open[d] = (size_t)-1;
  for (size_t i = 0; i < nparams; i++) bucket_of[i] = (size_t)-1;

  for (size_t k = 0; k < nparams; k++) {
    size_t p = fill_order[k];
    if (p >= nparams || bucket_of[p] != (size_t)-1) return BRG_ERR_INVALID_ARGUMENT;
    int d = (int)dtype[p];
    size_t esize = brg_dtype_size(dtype[p]);
    if (esize == 0) return BRG_ERR_INVALID_ARGUMENT;
    size_t bytes = count[p] * esize;

    if (open[d] != (size_t)-1 && open_bytes[d] > 0 && open_bytes[d] + bytes > open_cap[d])
      open[d] = (size_t)-1; /* would overflow: close it, the tensor starts a new one */
    if (open[d] == (size_t)-1) {
      open[d] = nb;
      open_bytes[d] = 0;
      open_cap[d] = nb == 0 ? first_cap : cap;
      nb++;
    }
    bucket_of[p] = open[d];
    open_bytes[d] += bytes;
    if (open_bytes[d] >= open_cap[d]) open[d] = (size_t)-1;
  }

  /* Group members by bucket, keeping fill order inside each (counting sort). */
  size_t *cursor = calloc(nb + 1, sizeof(*cursor));
  if (cursor == NULL && nb + 1 > 0) return BRG_ERR_NO_MEMORY;
  for (size_t i = 0; i < nparams; i++) cursor[bucket_of[i] + 1]++;
  for (size_t b = 0; b < nb; b++) cursor[b + 1] += cursor[b];
  memcpy(bucket_start, cursor, (nb + 1) * sizeof(*cursor));
  for (size_t k = 0; k < nparams; k++) {
    size_t p = fill_order[k];
    members[cursor[bucket_of[p]]++] = p;
  }
  free(cursor);
  *nbuckets = nb;
  return BRG_SUCCESS;
}
