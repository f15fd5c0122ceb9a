/* The transports, in order of preference: the runtime takes, for each ring
 * link, the first one allowed by BRIGADE_TRANSPORTS that carries the
 * collective's memory and whose can_connect accepts the pair. cuda_ipc
 * carries device collectives only, so host collectives start at shm. */
#include <string.h>

#include "transport.h"

const brg__transport_ops *const brg__transports[] = {
    &brg__transport_cuda_ipc,
    &brg__transport_shm,
    &brg__transport_ibverbs,
    &brg__transport_tcp,
    NULL,
};

int brg__transport_allowed(const char *allow, const char *name) {
  if (!allow || !*allow) return 1;
  size_t n = strlen(name);
  for (const char *p = allow; *p;) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len == n && !strncmp(p, name, n)) return 1;
    if (!end) break;
    p = end + 1;
  }
  return 0;
}

const brg__transport_ops *brg__transport_pick(const brg__peer_info *self,
                                              const brg__peer_info *peer, const char *allow,
                                              unsigned carries) {
  for (int i = 0; brg__transports[i]; i++) {
    const brg__transport_ops *t = brg__transports[i];
    if ((t->carries & carries) == carries && brg__transport_allowed(allow, t->name) &&
        t->can_connect(self, peer))
      return t;
  }
  return NULL;
}
