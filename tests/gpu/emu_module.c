/*
 * libbrigade_cuda_emu.so: a stand-in for the CUDA module (brg_cuda.h) that
 * runs on the CPU, so that the device data path of the runtime (the device
 * ring, its IPC setup, its event ordering) runs in CI, on machines without
 * a GPU. Select it with BRIGADE_CUDA_MODULE=/path/libbrigade_cuda_emu.so.
 *
 * It keeps CUDA's semantics where the runtime depends on them:
 *
 *  - "Device memory" is host memory that this module handed out; pointer
 *    queries say device only for that memory.
 *  - Streams are asynchronous: each is a thread that runs its queue in
 *    order. A call returns once the work is queued, and the work runs
 *    later, with random small delays, so that work ordered only by luck
 *    shows up as wrong data.
 *  - IPC memory is a memfd shared between processes (the handle names the
 *    owner's pid and descriptor, opened through /proc).
 *  - Events live in shared memory. Recording one queues "record n ran" on
 *    the stream; waiting on one waits for the record that was the most
 *    recent when the wait was queued (never recorded: no wait), even when
 *    the event is recorded again meanwhile, on another stream.
 *  - Several devices (BRIGADE_EMU_DEVICES, default 2), with a current
 *    device per thread. Memory, streams and events belong to the device
 *    that was current when they were made. A kernel launched into a stream
 *    of another device than the current one fails (invalid resource
 *    handle), and so does an event recorded into another device's stream.
 *    A kernel that touches memory of another device without peer access
 *    (cudaDeviceEnablePeerAccess), or host memory that was not registered,
 *    fails with an illegal address, as a GPU would; BRIGADE_EMU_NO_PEER=1
 *    makes every pair of devices unable to reach each other.
 *    BRIGADE_EMU_VISIBLE lists the GPUs this process sees, as a
 *    CUDA_VISIBLE_DEVICES of its own; uuid_reaches finds a GPU it does not
 *    see as NVML would. set_device and any memory, stream or event on a
 *    device make a context there, which tests count (brg__emu_context).
 *  - Kernel mode's ring kernel runs with the launch's block size, and a
 *    launch whose FIFOs, flags or buffers its device cannot reach fails.
 *    Co-residency (emu_ring.cc): a GPU runs at most BRIGADE_EMU_SMS x
 *    BRIGADE_EMU_BLOCKS_PER_SM ring-kernel blocks at once, across every
 *    stream and rank of this process (per process: ranks of processes
 *    that share a GPU under MPS each get the whole bound); the others
 *    start, in launch order, as blocks end, so blocks that spin for a
 *    block that cannot start wait for ever, as on a GPU. SMs: 0 (no
 *    bound) unless set, 16 under BRIGADE_EMU_STRICT=1; blocks per SM:
 *    2048 / threads (at most 32) unless set. ring_occupancy answers with
 *    the same numbers. The emulator counts (brg__emu_count, by
 *    simt.cuh's BRG_SIMT_COUNT_*) the kernels' loads and stores of
 *    registered host memory, their system fences, posts and spins; with
 *    BRIGADE_EMU_HOT_READS=1 (on under BRIGADE_EMU_STRICT=1) a block that
 *    loads host words (not the flags it waits on) more than once per 1024
 *    spins, beyond 4 a launch, stops the process naming the counts.
 *    BRIGADE_EMU_BLOCK_THREADS (a multiple of 32) caps the block size, for
 *    runs whose subject is not the kernel (the hosts' proxies between
 *    namespaces) and that cannot afford 512 fibers per channel per rank.
 *  - MPS: BRIGADE_EMU_MPS=1 reports it running, 0 not running (and then
 *    kernels of different processes on one GPU take turns, one process's
 *    at a time, so a spinning kernel holds its GPU), unset that the driver
 *    cannot tell.
 *  - IPC memory that is closed is unmapped for real: a kernel that still
 *    uses it crashes the process. A process cannot open its own IPC
 *    handles (CUDA refuses them too).
 *  - Memory exported as a dmabuf takes RDMA writes that a GPU may not show
 *    to kernels until they are flushed (flush_rdma_writes). The emulation
 *    cannot see the network's writes, so it asks what a consumer of RDMA
 *    data must do anyway: a kernel that reads such memory fails (as its
 *    launch) unless a flush was made since the last kernel that read it.
 *  - Stream memory operations wait for and write 32-bit words of
 *    registered host memory, in stream order.
 *  - CUDA graphs: a capturing stream records its work instead of running
 *    it, and a launched graph queues that work again. Capture fails the
 *    way CUDA's does: the legacy stream cannot capture; synchronizing a
 *    capturing stream, or waiting in it for work recorded outside the
 *    capture, fails and invalidates the capture; allocating, mapping,
 *    registering, freeing and synchronous copies fail while a capture in
 *    global mode runs in any thread (or one in thread-local mode in this
 *    thread), and invalidate it; an event last recorded in a capture
 *    cannot be queried or synchronized. A stream that waits for an event
 *    recorded in a capture joins it (a fork): its work goes into the same
 *    graph, as a branch that runs beside the others at each launch, and
 *    ending the capture fails, as CUDA's does, unless the capturing stream
 *    has waited for an event recorded after each branch's last work.
 *  - Stream handles as CUDA's: NULL and cudaStreamLegacy (0x1) are the
 *    legacy stream, cudaStreamPerThread (0x2) a blocking stream of the
 *    calling thread's own.
 *  - The strict rules, on with BRIGADE_EMU_STRICT=1 (each also by a
 *    setting of its own, 0 or 1, which wins): BRIGADE_EMU_SYNC_FREE,
 *    freeing calls wait for the whole device; BRIGADE_EMU_HW_QUEUES,
 *    streams share CUDA_DEVICE_MAX_CONNECTIONS in-order hardware queues;
 *    BRIGADE_EMU_LAZY_LOAD, a kernel's first launch waits for the whole
 *    device (details at "strict rules" below).
 *  - BRIGADE_EMU_LAUNCH_GAP_US: each ring kernel starts that long after
 *    the op before it on its stream ended (a GPU's launch gap is a few
 *    microseconds; a larger one opens the window between two replays of
 *    a graph, where neither counts as running).
 *
 * Error codes are small integers; error_string() names them.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "brg_cuda.h"
#include "ring_args.h"
#include "elem.h"
#include "kernels.h"

/* emu_ring.cc */
int brg__emu_ring_run(const brg__rk_args *a, int channels, int threads, int gpu);
void brg__emu_ring_occupancy(int threads, int *sms, int *per_sm);

#define EXPORT __attribute__((visibility("default")))
#define HB BRG__CUDA_IPC_HANDLE_BYTES
#define MAGIC 0x42524745u /* "BRGE" */

enum {
  E_OK,
  E_ALLOC,
  E_HANDLE,
  E_ARG,
  E_SYS,
  E_RESOURCE,
  E_ILLEGAL,
  E_DEVICE,
  E_PEER_UNSUPPORTED,
  E_UNFLUSHED,
  E_NO_KERNEL_MODE,
  E_CAPTURE_UNSUPPORTED,
  E_CAPTURE_INVALIDATED,
  E_CAPTURE_ISOLATION,
  E_CAPTURED_EVENT,
  E_CAPTURE_WRONG_THREAD,
  E_ILLEGAL_STATE,
  E_CAPTURE_UNJOINED
};

static const char *error_string(int e) {
  switch (e) {
  case E_OK: return "no error (emulated GPU)";
  case E_ALLOC: return "out of memory (emulated GPU)";
  case E_HANDLE: return "invalid IPC handle (emulated GPU)";
  case E_ARG: return "invalid argument (emulated GPU)";
  case E_RESOURCE:
    return "invalid resource handle (emulated GPU: a stream or event of another device than the "
           "current one)";
  case E_ILLEGAL:
    return "an illegal memory access was encountered (emulated GPU: a kernel touched memory its "
           "device cannot reach)";
  case E_DEVICE: return "invalid device ordinal (emulated GPU)";
  case E_PEER_UNSUPPORTED:
    return "peer access is not supported between these devices (emulated GPU)";
  case E_NO_KERNEL_MODE:
    return "kernel mode needs the SIMT emulator, which this emulated module was built without (no "
           "C++ compiler)";
  case E_UNFLUSHED:
    return "a kernel read GPUDirect RDMA memory with no flush since the last read (emulated GPU: "
           "a GPU may show it stale data)";
  case E_CAPTURE_UNSUPPORTED:
    return "operation not permitted when stream is capturing (emulated GPU)";
  case E_CAPTURE_INVALIDATED:
    return "operation failed due to a previous error during capture (emulated GPU)";
  case E_CAPTURE_ISOLATION:
    return "operation would make the legacy stream depend on a capturing blocking stream, or a "
           "capture depend on work outside it (emulated GPU)";
  case E_CAPTURED_EVENT:
    return "operation not permitted on an event last recorded in a capturing stream (emulated "
           "GPU)";
  case E_CAPTURE_WRONG_THREAD:
    return "a capture sequence not begun in relaxed mode was ended in another thread (emulated "
           "GPU)";
  case E_ILLEGAL_STATE: return "operation not valid in the stream's current state (emulated GPU)";
  case BRG__CUDA_ERR_NO_MPS_QUERY:
    return "the driver cannot tell whether MPS serves this device (emulated GPU: BRIGADE_EMU_MPS "
           "unset)";
  case E_CAPTURE_UNJOINED:
    return "the capture sequence contains a fork that was not joined to the primary stream "
           "(emulated GPU)";
  default: return "system call failed (emulated GPU)";
  }
}

/* ---- devices ---- */

/* Devices as a process sees them: ordinals 0 .. ndev-1 (what set_device
 * takes) name physical GPUs 0 .. nphys-1 (BRIGADE_EMU_DEVICES, default 2),
 * all of them in order unless BRIGADE_EMU_VISIBLE lists some, as
 * CUDA_VISIBLE_DEVICES does for one process ("1" shows GPU 1 as device 0;
 * the list stops at the first entry that names no GPU). A UUID, IPC
 * memory and peer access are of physical GPUs; another process's GPU that
 * this one does not see still has a UUID, and its memory opens from a
 * handle (as CUDA >= 10.1 maps memory of devices a process does not see). */
#define MAX_DEV 8
static int ndev, nphys;
static int vis[MAX_DEV]; /* ordinal -> physical */
static int no_peer;
static __thread int cur_dev;
static int peer_on[MAX_DEV][MAX_DEV]; /* physical [from][to]: kernels of `from` may touch `to` */
static int contexts[MAX_DEV];         /* ordinals this process made a context on */
static pthread_once_t dev_once = PTHREAD_ONCE_INIT;

static void devices_init(void) {
  const char *v = getenv("BRIGADE_EMU_DEVICES");
  int n = v && *v ? atoi(v) : 2;
  no_peer = getenv("BRIGADE_EMU_NO_PEER") && atoi(getenv("BRIGADE_EMU_NO_PEER"));
  nphys = n < 1 ? 1 : n > MAX_DEV ? MAX_DEV : n;
  const char *list = getenv("BRIGADE_EMU_VISIBLE");
  if (!list || !*list) {
    for (ndev = 0; ndev < nphys; ndev++) vis[ndev] = ndev;
    return;
  }
  for (const char *c = list; ndev < MAX_DEV;) {
    char *end;
    long g = strtol(c, &end, 10);
    if (end == c || g < 0 || g >= nphys) break;
    vis[ndev++] = (int)g;
    if (*end != ',') break;
    c = end + 1;
  }
}

static int devices(void) {
  pthread_once(&dev_once, devices_init);
  return ndev;
}

/* The physical GPU of ordinal `dev` (a valid one). */
static int phys(int dev) {
  devices();
  return vis[dev];
}

/* The ordinal of physical GPU g in this process, or -1: not visible. */
static int ordinal(int g) {
  for (int i = 0; i < devices(); i++)
    if (vis[i] == g) return i;
  return -1;
}

/* A context on the current device: made by set_device (as CUDA 12's
 * cudaSetDevice makes the primary context) and by anything that puts
 * memory, streams or events on it. Counted for tests (brg__emu_context). */
static void context_on(int dev) {
  __atomic_store_n(&contexts[dev], 1, __ATOMIC_RELAXED);
}

static int set_device(int dev) {
  if (dev < 0 || dev >= devices()) return E_DEVICE;
  cur_dev = dev;
  context_on(dev);
  return E_OK;
}

static int get_device(int *dev) {
  *dev = cur_dev;
  return E_OK;
}

static int can_access_peer(int *can, int dev, int peer) {
  if (dev < 0 || peer < 0 || dev >= devices() || peer >= devices()) return E_DEVICE;
  *can = phys(dev) != phys(peer) && !no_peer;
  return E_OK;
}

static int enable_peer_access(int peer) {
  if (peer < 0 || peer >= devices() || peer == cur_dev) return E_DEVICE;
  if (no_peer) return E_PEER_UNSUPPORTED;
  context_on(cur_dev);
  __atomic_store_n(&peer_on[phys(cur_dev)][phys(peer)], 1, __ATOMIC_RELEASE);
  return E_OK;
}

static void uuid_of(int g, unsigned char uuid[16]) {
  char u[32];
  snprintf(u, sizeof u, "brigade-emu-gpu%d", g);
  memcpy(uuid, u, 16);
}

/* The physical GPU of a UUID (-1: none), from the UUIDs alone. */
static int gpu_of_uuid(const unsigned char uuid[16]) {
  devices();
  for (int g = 0; g < nphys; g++) {
    unsigned char u[16];
    uuid_of(g, u);
    if (!memcmp(u, uuid, 16)) return g;
  }
  return -1;
}

/* Reach by UUID without a context anywhere: a visible GPU is asked as
 * cudaDeviceCanAccessPeer would be, one this process does not see as NVML
 * would be (every GPU of the host, whatever the process sees). */
static int uuid_reaches(const unsigned char uuid[16], int dev, int *can, int *how) {
  if (dev < 0 || dev >= devices()) return E_DEVICE;
  int g = gpu_of_uuid(uuid);
  if (g < 0) return E_DEVICE;
  int o = ordinal(g);
  *how = g == phys(dev) ? BRG__CUDA_REACH_SAME
         : o >= 0       ? BRG__CUDA_REACH_PEER
                        : BRG__CUDA_REACH_NVML;
  *can = g == phys(dev) || !no_peer;
  return E_OK;
}

/* BRIGADE_EMU_MPS: 1, the MPS daemon serves this process (kernels of
 * processes on one GPU run at once); 0, it does not, and kernels of
 * different processes on one GPU take turns (below); unset, the driver
 * cannot tell (as an old one), and kernels run at once. */
static int mps_setting(void) {
  const char *v = getenv("BRIGADE_EMU_MPS");
  return v && *v ? atoi(v) != 0 : -1;
}

static int mps_enabled(int dev, int *on) {
  if (dev < 0 || dev >= devices()) return E_DEVICE;
  int m = mps_setting();
  if (m < 0) return BRG__CUDA_ERR_NO_MPS_QUERY;
  *on = m;
  return E_OK;
}

/*
 * Without MPS (BRIGADE_EMU_MPS=0), a GPU runs the kernels of one process
 * (one context) at a time: a kernel waits until no other process has a
 * kernel running on its GPU, then holds it to its end. Kernels of one
 * process run side by side. A real GPU switches contexts every few
 * milliseconds, so there two spinning kernels of two processes crawl
 * rather than hang; either way a ring of them does not finish in time.
 * The turn is a Unix socket bound to an abstract name per physical GPU
 * and test (meson runs each test in a session of its own): bound by one
 * process at a time, and let go when it closes or dies, leaving no file.
 */
static void pause_a_little(void);

static pthread_mutex_t slice_mu[MAX_DEV] = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
                                            PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
                                            PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
                                            PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER};
static int slice_users[MAX_DEV];
static int slice_fd[MAX_DEV];

static void slice_enter(int g) {
  if (mps_setting() != 0) return;
  pthread_mutex_lock(&slice_mu[g]);
  if (slice_users[g]++ == 0) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int n = snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "brigade-emu-gpu%d-%u-%d", g,
                     (unsigned)getuid(), (int)getsid(0));
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
    for (;;) {
      int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) break; /* no turns then */
      if (bind(fd, (struct sockaddr *)&a, len) == 0) {
        slice_fd[g] = fd;
        break;
      }
      close(fd);
      pause_a_little();
    }
  }
  pthread_mutex_unlock(&slice_mu[g]);
}

static void slice_exit(int g) {
  if (mps_setting() != 0) return;
  pthread_mutex_lock(&slice_mu[g]);
  if (--slice_users[g] == 0 && slice_fd[g] > 0) {
    close(slice_fd[g]);
    slice_fd[g] = 0;
  }
  pthread_mutex_unlock(&slice_mu[g]);
}

/* Graph capture (below): a potentially unsafe call while a capture
 * forbids it fails and invalidates that capture. */
static int capture_forbids(void);
/* The strict rules' device-wide wait of freeing calls (below). */
static void sync_free_wait(void);

/* ---- memory the module handed out ---- */

typedef struct region {
  char *p;
  size_t bytes;
  int fd;              /* exported: the memfd, kept open so peers can open it */
  int mapped;          /* opened from a peer's handle */
  int dev;             /* the device it belongs to; -1: registered host memory */
  int rdma;            /* exported as a dmabuf: RDMA writes land in it */
  uint64_t seen_flush; /* the device's flush count at the last kernel that read it */
} region;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static region *regions;
static int nregions, capregions;

static int add_region(char *p, size_t bytes, int fd, int mapped, int dev) {
  pthread_mutex_lock(&lock);
  if (nregions == capregions) {
    int cap = capregions ? 2 * capregions : 64;
    region *r = realloc(regions, (size_t)cap * sizeof *r);
    if (!r) {
      pthread_mutex_unlock(&lock);
      return E_ALLOC;
    }
    regions = r;
    capregions = cap;
  }
  regions[nregions++] = (region){p, bytes, fd, mapped, dev, 0, 0};
  pthread_mutex_unlock(&lock);
  return E_OK;
}

static int find_region(const void *p, region *out, int remove) {
  pthread_mutex_lock(&lock);
  for (int i = 0; i < nregions; i++) {
    const char *c = p;
    if (c >= regions[i].p && c < regions[i].p + (regions[i].bytes ? regions[i].bytes : 1)) {
      if (out) *out = regions[i];
      if (remove) regions[i] = regions[--nregions];
      pthread_mutex_unlock(&lock);
      return 1;
    }
  }
  pthread_mutex_unlock(&lock);
  return 0;
}

static int map_new(size_t bytes, int *fd_out, char **p) {
  int fd = memfd_create("brigade-emu-gpu", MFD_CLOEXEC);
  if (fd < 0) return E_SYS;
  if (ftruncate(fd, (off_t)(bytes ? bytes : 1)) != 0) {
    close(fd);
    return E_SYS;
  }
  void *m = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    close(fd);
    return E_ALLOC;
  }
  *fd_out = fd;
  *p = m;
  return E_OK;
}

typedef struct handle {
  uint32_t magic;
  int32_t pid, fd;
  int32_t dev; /* the exporter's device */
  uint64_t bytes;
} handle;

static int map_handle(const void *h, char **p, size_t *bytes, int *dev) {
  handle hd;
  memcpy(&hd, h, sizeof hd);
  if (hd.magic != MAGIC) return E_HANDLE;
  if (hd.pid == (int32_t)getpid()) return E_HANDLE; /* CUDA refuses a process's own handles */
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", hd.pid, hd.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return E_HANDLE;
  void *m = mmap(NULL, hd.bytes ? hd.bytes : 1, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return E_ALLOC;
  *p = m;
  *bytes = hd.bytes;
  if (dev) *dev = hd.dev;
  return E_OK;
}

static int mem_alloc(void **p, size_t bytes) {
  int e = capture_forbids();
  if (e) return e;
  void *m =
      mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return E_ALLOC;
  context_on(cur_dev);
  if (add_region(m, bytes, -1, 0, phys(cur_dev))) {
    munmap(m, bytes ? bytes : 1);
    return E_ALLOC;
  }
  *p = m;
  return E_OK;
}

static int mem_free(void *p) {
  region r;
  if (!p) return E_OK;
  int e = capture_forbids();
  if (e) return e;
  if (!find_region(p, &r, 0) || r.p != p || r.mapped) return E_ARG;
  sync_free_wait();
  if (!find_region(p, &r, 1)) return E_ARG;
  munmap(r.p, r.bytes ? r.bytes : 1);
  if (r.fd >= 0) close(r.fd);
  return E_OK;
}

static int ipc_mem_export(void **p, size_t bytes, void *h) {
  int fd;
  char *m;
  int e = capture_forbids();
  if (!e) e = map_new(bytes, &fd, &m);
  if (e) return e;
  context_on(cur_dev);
  if ((e = add_region(m, bytes, fd, 0, phys(cur_dev))) != 0) {
    munmap(m, bytes ? bytes : 1);
    close(fd);
    return e;
  }
  handle hd = {MAGIC, (int32_t)getpid(), fd, phys(cur_dev), bytes};
  memset(h, 0, HB);
  memcpy(h, &hd, sizeof hd);
  *p = m;
  return E_OK;
}

/* As cudaIpcOpenMemHandle with cudaIpcMemLazyEnablePeerAccess: memory of
 * another device is mapped with peer access to it, where there is any. */
static int ipc_mem_open(void **p, const void *h) {
  char *m;
  size_t bytes;
  int dev = 0;
  int e = capture_forbids();
  if (!e) e = map_handle(h, &m, &bytes, &dev);
  if (e) return e;
  context_on(cur_dev);
  if (dev != phys(cur_dev)) {
    if (no_peer || dev < 0 || dev >= nphys) {
      munmap(m, bytes ? bytes : 1);
      return E_PEER_UNSUPPORTED;
    }
    __atomic_store_n(&peer_on[phys(cur_dev)][dev], 1, __ATOMIC_RELEASE);
  }
  if ((e = add_region(m, bytes, -1, 1, dev)) != 0) {
    munmap(m, bytes ? bytes : 1);
    return e;
  }
  *p = m;
  return E_OK;
}

static int ipc_mem_close(void *p) {
  region r;
  int e = capture_forbids();
  if (e) return e;
  if (!find_region(p, &r, 0) || r.p != p || !r.mapped) return E_ARG;
  sync_free_wait();
  if (!find_region(p, &r, 1)) return E_ARG;
  munmap(r.p, r.bytes ? r.bytes : 1);
  return E_OK;
}

/* For the SIMT emulator's counts (emu_ring.cc): 1 where p is registered
 * host memory, and the range of its region ([p, p + 1) outside any). */
int brg__emu_host_range(const void *p, uintptr_t *lo, uintptr_t *hi) {
  region r;
  if (!find_region(p, &r, 0)) return 0;
  *lo = (uintptr_t)r.p;
  *hi = (uintptr_t)r.p + (r.bytes ? r.bytes : 1);
  return r.dev < 0;
}

static int pointer_is_device(const void *p, int *device) {
  region r;
  if (!p || !find_region(p, &r, 0) || r.dev < 0) return 0;
  if (device) *device = ordinal(r.dev); /* -1: a GPU this process does not see */
  return 1;
}

/* Whether a kernel of `dev` may touch [p, p + bytes): memory of its own
 * device, of a device it has peer access to, or registered host memory. */
static int reachable(int dev, const void *p, size_t bytes) {
  region r;
  if (!p || bytes == 0) return 1;
  if (!find_region(p, &r, 0)) return 0;
  if ((const char *)p + bytes > r.p + (r.bytes ? r.bytes : 1)) return 0;
  int g = phys(dev);
  return r.dev < 0 || r.dev == g || __atomic_load_n(&peer_on[g][r.dev], __ATOMIC_ACQUIRE);
}

/* ---- GPUDirect RDMA ---- */

static uint64_t flushes[MAX_DEV]; /* flush_rdma_writes per physical GPU (under lock) */

static int flush_rdma_writes(void) {
  pthread_mutex_lock(&lock);
  flushes[phys(cur_dev)]++;
  pthread_mutex_unlock(&lock);
  return E_OK;
}

/* Marks the region holding p as a target of RDMA writes. */
static void mark_rdma(const void *p) {
  pthread_mutex_lock(&lock);
  for (int i = 0; i < nregions; i++)
    if ((const char *)p >= regions[i].p && (const char *)p < regions[i].p + regions[i].bytes) {
      regions[i].rdma = 1;
      regions[i].seen_flush = flushes[regions[i].dev < 0 ? 0 : regions[i].dev];
    }
  pthread_mutex_unlock(&lock);
}

/* Whether a kernel of `dev` may read p now: memory that takes RDMA writes
 * needs a flush since the last kernel that read it. */
static int rdma_read_ok(int dev, const void *p) {
  int ok = 1;
  if (!p) return 1;
  dev = phys(dev);
  pthread_mutex_lock(&lock);
  for (int i = 0; i < nregions; i++)
    if (regions[i].rdma && (const char *)p >= regions[i].p &&
        (const char *)p < regions[i].p + regions[i].bytes) {
      if (flushes[dev] == regions[i].seen_flush)
        ok = 0;
      else
        regions[i].seen_flush = flushes[dev];
    }
  pthread_mutex_unlock(&lock);
  return ok;
}

/* ---- events ---- */

#define EV_RING 256

typedef struct ev_shared {
  volatile uint64_t issued; /* records queued so far (by the owner) */
  /* done[t % EV_RING] = t once record t ran: records queued on different
   * streams run in any order, and a wait is for one record, not the
   * latest (CUDA's rule: the record current when the wait was issued). */
  volatile uint64_t done[EV_RING];
  volatile int64_t when_ns; /* CLOCK_MONOTONIC when it ran (timing events) */
} ev_shared;

typedef struct event {
  ev_shared *s;
  int fd;       /* owner: the memfd; -1 for an opened one */
  int dev;      /* the device current when it was made or opened */
  int captured; /* its last record was made into a capturing stream (atomic:
                 * recorded and queried from different threads) */
  /* That record, as a node of the capture's graph (under cap_lock): the
   * capture's id, the node, the branch it was recorded in, and how many
   * ops that branch had recorded then. */
  uint64_t cap_id;
  size_t cap_node, cap_ops;
  int cap_branch;
} event;

static int ipc_event_export(void **out, void *h) {
  event *ev = calloc(1, sizeof *ev);
  char *m;
  if (!ev) return E_ALLOC;
  int e = map_new(sizeof(ev_shared), &ev->fd, &m);
  if (e) {
    free(ev);
    return e;
  }
  ev->s = (ev_shared *)m;
  ev->dev = cur_dev;
  context_on(cur_dev);
  handle hd = {MAGIC, (int32_t)getpid(), ev->fd, cur_dev, sizeof(ev_shared)};
  memset(h, 0, HB);
  memcpy(h, &hd, sizeof hd);
  *out = ev;
  return E_OK;
}

static int ipc_event_open(void **out, const void *h) {
  event *ev = calloc(1, sizeof *ev);
  char *m;
  size_t bytes;
  if (!ev) return E_ALLOC;
  int e = map_handle(h, &m, &bytes, NULL);
  if (e) {
    free(ev);
    return e;
  }
  ev->s = (ev_shared *)m;
  ev->fd = -1;
  ev->dev = cur_dev;
  *out = ev;
  return E_OK;
}

static int event_destroy(void *p) {
  event *ev = p;
  if (!ev) return E_ARG;
  munmap(ev->s, sizeof(ev_shared));
  if (ev->fd >= 0) close(ev->fd);
  free(ev);
  return E_OK;
}

static void pause_a_little(void) {
  struct timespec ts = {0, 20000};
  nanosleep(&ts, NULL);
}

/* Whether record t has run (0: never recorded). A slot overwritten by a
 * later record counts as done: EV_RING records later, this one is long
 * past in any run here. */
static int ticket_done(ev_shared *s, uint64_t t) {
  return t == 0 || __atomic_load_n(&s->done[t % EV_RING], __ATOMIC_ACQUIRE) >= t;
}

static void wait_completed(ev_shared *s, uint64_t target) {
  for (int i = 0; !ticket_done(s, target); i++) {
    if (i < 100)
      sched_yield();
    else
      pause_a_little();
  }
}

/* ---- streams ---- */

enum {
  OP_REDUCE,
  OP_COPY,
  OP_DIVIDE,
  OP_RECORD,
  OP_WAIT,
  OP_WAIT_VALUE,
  OP_WRITE_VALUE,
  OP_CAST,
  OP_BUSY,
  OP_RING,
  OP_GRAPH_RECORD, /* in a graph only: a record of node n, across branches */
  OP_GRAPH_WAIT    /* in a graph only: a wait for node n */
};

typedef struct op {
  int kind;
  void *d0, *d1;
  const void *a, *b;
  size_t n;
  int dtype, rop, div;
  ev_shared *ev;
  uint64_t ticket;
  uint64_t conn_ticket; /* its place in its hardware queue (rule 2; 0: none) */
} op;

typedef struct stream {
  int dev;      /* the device current when it was made */
  int blocking; /* the legacy and per-thread default streams (the rest are non-blocking) */
  int conn;     /* its hardware queue (rule 2) */
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  op *q;
  size_t head, tail, cap; /* queue of ops [head, tail) in a ring of cap */
  int busy;
  unsigned seed;
} stream;

static stream *default_stream[MAX_DEV];         /* each device's legacy stream */
static __thread stream *thread_stream[MAX_DEV]; /* this thread's per-thread default streams */

/*
 * The strict rules (BRIGADE_EMU_STRICT=1 turns each on unless its own
 * setting says otherwise): what a GPU does that a kind emulator would not.
 *
 *  SYNC_FREE   mem_free, host_unregister and ipc_mem_close wait for all
 *              work queued on the current device by this process, on every
 *              stream (cudaFree's implicit synchronization; CUDA's pages do
 *              not promise it of cudaIpcCloseMemHandle, nor rule it out,
 *              and unmapping what kernels may still use is taken to wait as
 *              a free does: the assumption that finds more); mem_copy and mem_set
 *              wait for the work of the blocking streams (the legacy one
 *              and the per-thread default streams), as the legacy stream's
 *              synchronous calls do.
 *  HW_QUEUES   each device has CUDA_DEVICE_MAX_CONNECTIONS (default 8, 1 to
 *              32) hardware queues; streams are given them round-robin in
 *              creation order, and a queue starts its work in issue order:
 *              an op starts only once every op issued before it on its
 *              queue has started, and an op that waits (an event, a value)
 *              or that follows unfinished work of its own stream holds
 *              the queue meanwhile. Streams that share a queue then wait
 *              for each other (false dependencies).
 *  LAZY_LOAD   CUDA_MODULE_LOADING=LAZY: the first launch of each kernel
 *              (a ring kernel per dtype and op, a reduce per dtype and op,
 *              a divide per dtype, the copy, cast and busy kernels) on a
 *              device waits, in the launching thread, for all work queued
 *              on that device to finish; load_kernels loads them all (the
 *              same wait, once).
 */
static int rule_sync_free, rule_hw_queues, rule_lazy_load, max_connections = 8;
static long launch_gap_us;
static pthread_once_t rules_once = PTHREAD_ONCE_INIT;

static int rule_setting(const char *name, int strict) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) != 0 : strict;
}

static void rules_init(void) {
  const char *v = getenv("BRIGADE_EMU_STRICT");
  int strict = v && *v && atoi(v) != 0;
  rule_sync_free = rule_setting("BRIGADE_EMU_SYNC_FREE", strict);
  rule_hw_queues = rule_setting("BRIGADE_EMU_HW_QUEUES", strict);
  rule_lazy_load = rule_setting("BRIGADE_EMU_LAZY_LOAD", strict);
  const char *c = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  int n = c && *c ? atoi(c) : 8;
  max_connections = n < 1 ? 1 : n > 32 ? 32 : n;
  const char *g = getenv("BRIGADE_EMU_LAUNCH_GAP_US");
  launch_gap_us = g && *g ? atol(g) : 0;
}

static void rules(void) {
  pthread_once(&rules_once, rules_init);
}

/* Every stream this process made (streams are never freed), for the
 * device-wide waits. */
static pthread_mutex_t streams_lock = PTHREAD_MUTEX_INITIALIZER;
static stream **all_streams;
static int nall_streams, cap_all_streams;
static int streams_made[MAX_DEV]; /* per device, for the round-robin queues */

/* A hardware queue: tickets in issue order, and how many have started. */
static struct hwq {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t issued, started;
} hwq[MAX_DEV][32];
static pthread_once_t hwq_once = PTHREAD_ONCE_INIT;

static void hwq_init(void) {
  for (int d = 0; d < MAX_DEV; d++)
    for (int q = 0; q < 32; q++) {
      pthread_mutex_init(&hwq[d][q].mu, NULL);
      pthread_cond_init(&hwq[d][q].cv, NULL);
    }
}

static void hwq_start(const stream *s, uint64_t t) {
  struct hwq *q = &hwq[s->dev][s->conn];
  pthread_mutex_lock(&q->mu);
  while (q->started + 1 != t) pthread_cond_wait(&q->cv, &q->mu);
  pthread_mutex_unlock(&q->mu);
}

static void hwq_started(const stream *s) {
  struct hwq *q = &hwq[s->dev][s->conn];
  pthread_mutex_lock(&q->mu);
  q->started++;
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
}

/* Device-wide waits and loads, counted for tests (brg__emu_strict_counts);
 * launch_loads: the loads a launch made (LAZY_LOAD's first launch of a
 * kernel), not load_kernels. */
static long device_waits, kernel_loads, launch_loads;

/* Waits until the work queued so far on device `dev`'s streams (the
 * blocking ones only, with blocking_only) has run; work queued meanwhile
 * does not count. */
static void device_wait(int dev, int blocking_only) {
  pthread_mutex_lock(&streams_lock);
  int n = nall_streams;
  stream **list = malloc((size_t)(n ? n : 1) * sizeof *list);
  size_t *until = malloc((size_t)(n ? n : 1) * sizeof *until);
  int m = 0;
  for (int i = 0; list && until && i < n; i++)
    if (all_streams[i]->dev == dev && (!blocking_only || all_streams[i]->blocking))
      list[m++] = all_streams[i];
  pthread_mutex_unlock(&streams_lock);
  if (!list || !until) { /* no memory for the list: no wait */
    free(list);
    free(until);
    return;
  }
  __atomic_add_fetch(&device_waits, 1, __ATOMIC_RELAXED);
  for (int i = 0; i < m; i++) {
    pthread_mutex_lock(&list[i]->mu);
    until[i] = list[i]->tail;
    pthread_mutex_unlock(&list[i]->mu);
  }
  for (int i = 0; i < m; i++) {
    pthread_mutex_lock(&list[i]->mu);
    while ((int64_t)(list[i]->head - until[i]) < 0) pthread_cond_wait(&list[i]->cv, &list[i]->mu);
    pthread_mutex_unlock(&list[i]->mu);
  }
  free(list);
  free(until);
}

/* Kernels for LAZY_LOAD: a ring or reduce kernel per (dtype, op), a divide
 * per dtype, then copy, cast and busy. */
enum { K_RING = 0, K_REDUCE = 80, K_DIVIDE = 160, K_COPY = 170, K_CAST, K_BUSY, K_ALL };
static unsigned char loaded[MAX_DEV][K_ALL];
static pthread_mutex_t load_mu[MAX_DEV] = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
                                           PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
                                           PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
                                           PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER};

static int kernel_id(int base, int dtype, int op) {
  if (dtype < 0 || dtype >= BRG_NUM_DTYPES) dtype = 0;
  if (op < 0 || op >= 8) op = 0;
  return base == K_RING || base == K_REDUCE ? base + dtype * 8 + op
         : base == K_DIVIDE                 ? base + dtype
                                            : base;
}

/* A launch of kernel `k` on device `dev`: the first loads it, which waits
 * for the device's work (other threads launching it meanwhile wait for
 * the load). */
static void kernel_load(int dev, int k) {
  rules();
  if (!rule_lazy_load || __atomic_load_n(&loaded[dev][k], __ATOMIC_ACQUIRE)) return;
  pthread_mutex_lock(&load_mu[dev]);
  if (!loaded[dev][k]) {
    device_wait(dev, 0);
    __atomic_add_fetch(&kernel_loads, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&launch_loads, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&loaded[dev][k], 1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&load_mu[dev]);
}

/* Loads every kernel on the current device, as touching each one does. */
static int load_kernels(void) {
  rules();
  if (!rule_lazy_load) return E_OK;
  pthread_mutex_lock(&load_mu[cur_dev]);
  int all = 1;
  for (int k = 0; k < K_ALL; k++) all &= loaded[cur_dev][k];
  if (!all) {
    device_wait(cur_dev, 0);
    __atomic_add_fetch(&kernel_loads, 1, __ATOMIC_RELAXED);
    for (int k = 0; k < K_ALL; k++) __atomic_store_n(&loaded[cur_dev][k], 1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&load_mu[cur_dev]);
  return E_OK;
}

/* The waits of SYNC_FREE. */
static void sync_free_wait(void) {
  rules();
  if (rule_sync_free) device_wait(cur_dev, 0);
}

/* dst = src converted (brg_cuda.h's cast), with elem.h's conversions as
 * the real kernel uses them; the scale travels in div's bits. */
static void run_cast(const op *o) {
  float scale;
  memcpy(&scale, &o->div, sizeof scale);
  int half = o->dtype == BRG_FLOAT16 || o->dtype == BRG_BFLOAT16 ? o->dtype : o->rop;
  for (size_t i = 0; i < o->n; i++) {
    if (o->rop == BRG_FLOAT32 || o->rop == BRG_FLOAT64) {
      float f = o->rop == BRG_FLOAT32 ? ((const float *)o->a)[i] * scale
                                      : (float)(((const double *)o->a)[i] * (double)scale);
      ((uint16_t *)o->d0)[i] = half == BRG_FLOAT16 ? brg__f32_to_f16(f) : brg__f32_to_bf16(f);
    } else {
      uint16_t h = ((const uint16_t *)o->a)[i];
      float f = half == BRG_FLOAT16 ? brg__f16_to_f32(h) : brg__bf16_to_f32(h);
      if (o->dtype == BRG_FLOAT32)
        ((float *)o->d0)[i] = f;
      else
        ((double *)o->d0)[i] = f;
    }
  }
}

static void run_kernel(stream *s, const op *o);

/* Kernels take their GPU's turn (slice_enter) where processes share it
 * without MPS; the rest of a stream's work needs none. */
static void run_op(stream *s, const op *o) {
  int kernel = o->kind == OP_REDUCE || o->kind == OP_COPY || o->kind == OP_DIVIDE ||
               o->kind == OP_CAST || o->kind == OP_BUSY || o->kind == OP_RING;
  if (kernel) slice_enter(phys(s->dev));
  run_kernel(s, o);
  if (kernel) slice_exit(phys(s->dev));
}

static void run_kernel(stream *s, const op *o) {
  /* Now and then a delay, so that work ordered by luck shows. */
  if (o->kind != OP_WAIT && o->kind != OP_WAIT_VALUE && o->kind != OP_BUSY &&
      rand_r(&s->seed) % 4 == 0) {
    struct timespec ts = {0, (long)(rand_r(&s->seed) % 200) * 1000};
    nanosleep(&ts, NULL);
  }
  switch (o->kind) {
  case OP_REDUCE:
    brg__reduce(o->d0, o->d1, o->a, o->b, o->n, (brg_dtype)o->dtype, (brg_op)o->rop, o->div);
    break;
  case OP_COPY: brg__copy(o->d0, o->d1, o->a, o->n); break;
  case OP_DIVIDE: brg__divide(o->d0, o->a, o->n, (brg_dtype)o->dtype, o->div); break;
  case OP_RECORD: {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    o->ev->when_ns = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
    volatile uint64_t *slot = &o->ev->done[o->ticket % EV_RING];
    uint64_t cur = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    while (cur < o->ticket && !__atomic_compare_exchange_n(slot, &cur, o->ticket, 0,
                                                           __ATOMIC_RELEASE, __ATOMIC_ACQUIRE)) {}
    break;
  }
  case OP_WAIT: wait_completed(o->ev, o->ticket); break;
  case OP_WAIT_VALUE:
    for (int i = 0;
         (int32_t)(__atomic_load_n((uint32_t *)o->d0, __ATOMIC_ACQUIRE) - (uint32_t)o->n) < 0;
         i++) {
      if (i < 100)
        sched_yield();
      else
        pause_a_little();
    }
    break;
  case OP_WRITE_VALUE: __atomic_store_n((uint32_t *)o->d0, (uint32_t)o->n, __ATOMIC_RELEASE); break;
  case OP_CAST: run_cast(o); break;
  case OP_RING: {
    /* A launch whose abort word is already set ends at the kernel's first
     * check (ring_kernel.cuh's run()): do just that, without making the
     * blocks, so that thousands of launches queued behind a stopped one
     * drain at once, as on a GPU. */
    const brg__rk_args *ra = o->a;
    rules();
    if (launch_gap_us > 0) {
      struct timespec gap = {(time_t)(launch_gap_us / 1000000), (launch_gap_us % 1000000) * 1000};
      nanosleep(&gap, NULL);
    }
    if (__atomic_load_n(ra->abort_word, __ATOMIC_ACQUIRE))
      __atomic_store_n(ra->status, BRG__RK_ABORTED, __ATOMIC_RELEASE);
#ifndef BRG_EMU_NO_KERNEL_MODE
    else
      brg__emu_ring_run(ra, o->div, o->rop, phys(s->dev));
#endif
    free((void *)o->a);
    break;
  }
  case OP_BUSY: {
    struct timespec ts = {(time_t)(o->n / 1000000), (long)(o->n % 1000000) * 1000};
    nanosleep(&ts, NULL);
    break;
  }
  }
}

static void *stream_main(void *arg) {
  stream *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (s->head == s->tail) pthread_cond_wait(&s->cv, &s->mu);
    op o = s->q[s->head % s->cap];
    s->busy = 1;
    pthread_mutex_unlock(&s->mu);
    /* A hardware queue starts its work in issue order; a wait holds it
     * until it is over. */
    int holds = o.kind == OP_WAIT || o.kind == OP_WAIT_VALUE;
    if (o.conn_ticket) hwq_start(s, o.conn_ticket);
    if (o.conn_ticket && !holds) hwq_started(s);
    run_op(s, &o);
    if (o.conn_ticket && holds) hwq_started(s);
    pthread_mutex_lock(&s->mu);
    s->head++;
    s->busy = 0;
    pthread_cond_broadcast(&s->cv);
  }
  return NULL;
}

static stream *stream_new(int blocking) {
  rules();
  pthread_once(&hwq_once, hwq_init);
  stream *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->dev = cur_dev;
  s->blocking = blocking;
  context_on(cur_dev);
  s->cap = 1024;
  s->q = calloc(s->cap, sizeof *s->q);
  s->seed = (unsigned)getpid() ^ (unsigned)(uintptr_t)s;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  if (!s->q || pthread_create(&s->thread, NULL, stream_main, s) != 0) {
    free(s->q);
    free(s);
    return NULL;
  }
  pthread_detach(s->thread);
  pthread_mutex_lock(&streams_lock);
  if (nall_streams == cap_all_streams) {
    int cap = cap_all_streams ? 2 * cap_all_streams : 64;
    stream **l = realloc(all_streams, (size_t)cap * sizeof *l);
    if (l) {
      all_streams = l;
      cap_all_streams = cap;
    }
  }
  if (nall_streams < cap_all_streams) all_streams[nall_streams++] = s;
  s->conn = streams_made[s->dev]++ % max_connections; /* round-robin, as the driver */
  pthread_mutex_unlock(&streams_lock);
  return s;
}

/* The legacy default stream: NULL or cudaStreamLegacy (0x1). */
static int is_legacy(const void *p) {
  return p == NULL || (uintptr_t)p == 1;
}

/* NULL and 0x1 are the current device's legacy default stream;
 * cudaStreamPerThread (0x2) the calling thread's own default stream on it
 * (a blocking stream of its own for each host thread). */
static stream *get_stream(void *p) {
  if (p && !is_legacy(p) && (uintptr_t)p != 2) return p;
  devices();
  if ((uintptr_t)p == 2) {
    if (!thread_stream[cur_dev]) thread_stream[cur_dev] = stream_new(1);
    return thread_stream[cur_dev];
  }
  pthread_mutex_lock(&lock);
  if (!default_stream[cur_dev]) default_stream[cur_dev] = stream_new(1);
  stream *s = default_stream[cur_dev];
  pthread_mutex_unlock(&lock);
  return s;
}

static size_t elem_size(int dtype) {
  static const size_t sizes[BRG_NUM_DTYPES] = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8};
  return (unsigned)dtype < BRG_NUM_DTYPES ? sizes[dtype] : 0;
}

/* A kernel goes into a stream of the current device, and touches only
 * memory that device can reach. */
static int launch_check(void *st, const void *d0, const void *d1, const void *a, const void *b,
                        size_t bytes) {
  stream *s = get_stream(st);
  if (!s) return E_ALLOC;
  if (s->dev != cur_dev) return E_RESOURCE;
  if (!reachable(s->dev, d0, bytes) || !reachable(s->dev, d1, bytes) ||
      !reachable(s->dev, a, bytes) || !reachable(s->dev, b, bytes))
    return E_ILLEGAL;
  if (!rdma_read_ok(s->dev, a) || !rdma_read_ok(s->dev, b)) return E_UNFLUSHED;
  return E_OK;
}

/* Graph capture (below): op recorded into s's capture, or -1 when s is not
 * capturing. */
static int capture_record(stream *s, const op *o);
static int capturing(stream *s);
static void capture_invalidate(stream *s);
/* Events in a capture (below): the record, as a node of s's capture (-1
 * when s is not capturing); a wait for a captured record, which makes s
 * join that capture when it is not capturing. */
static int capture_event_record(stream *s, event *ev);
static int capture_event_wait(stream *s, event *ev);

static int enqueue(void *st, const op *o) {
  stream *s = get_stream(st);
  if (!s) return E_ALLOC;
  int e = capture_record(s, o);
  if (e >= 0) return e;
  op mine = *o;
  pthread_mutex_lock(&s->mu);
  if (rule_hw_queues) {
    struct hwq *q = &hwq[s->dev][s->conn];
    pthread_mutex_lock(&q->mu);
    mine.conn_ticket = ++q->issued;
    pthread_mutex_unlock(&q->mu);
  }
  if (s->tail - s->head == s->cap) {
    size_t cap = 2 * s->cap;
    op *q = malloc(cap * sizeof *q);
    if (!q) {
      pthread_mutex_unlock(&s->mu);
      return E_ALLOC;
    }
    for (size_t i = s->head; i < s->tail; i++) q[i % cap] = s->q[i % s->cap];
    free(s->q);
    s->q = q;
    s->cap = cap;
  }
  s->q[s->tail % s->cap] = mine;
  s->tail++;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return E_OK;
}

static int stream_sync(void *st) {
  stream *s = get_stream(st);
  if (!s) return E_ALLOC;
  if (capturing(s)) {
    capture_invalidate(s);
    return E_CAPTURE_UNSUPPORTED;
  }
  pthread_mutex_lock(&s->mu);
  while (s->head != s->tail || s->busy) pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  return E_OK;
}

static int stream_create(void **out) {
  stream *s = stream_new(0);
  if (!s) return E_ALLOC;
  *out = s;
  return E_OK;
}

/* Streams are left running: their threads are detached and idle once empty. */
static int stream_destroy(void *st) {
  return stream_sync(st);
}

static int reduce(void *d0, void *d1, const void *a, const void *b, size_t n, int dtype, int rop,
                  int div, void *st) {
  int e = launch_check(st, d0, d1, a, b, n * elem_size(dtype));
  if (e) return e;
  kernel_load(cur_dev, kernel_id(K_REDUCE, dtype, rop));
  op o = {.kind = OP_REDUCE,
          .d0 = d0,
          .d1 = d1,
          .a = a,
          .b = b,
          .n = n,
          .dtype = dtype,
          .rop = rop,
          .div = div};
  return enqueue(st, &o);
}

static int copy(void *d0, void *d1, const void *src, size_t bytes, void *st) {
  int e = launch_check(st, d0, d1, src, NULL, bytes);
  if (e) return e;
  /* one destination (or one that is the source) is a copy engine's job: no kernel */
  if (d1 && d0 != src && d1 != src) kernel_load(cur_dev, K_COPY);
  op o = {.kind = OP_COPY, .d0 = d0, .d1 = d1, .a = src, .n = bytes};
  return enqueue(st, &o);
}

static int divide(void *d, const void *src, size_t n, int dtype, int div, void *st) {
  int e = launch_check(st, d, NULL, src, NULL, n * elem_size(dtype));
  if (e) return e;
  kernel_load(cur_dev, kernel_id(K_DIVIDE, dtype, 0));
  op o = {.kind = OP_DIVIDE, .d0 = d, .a = src, .n = n, .dtype = dtype, .div = div};
  return enqueue(st, &o);
}

static int cast(void *dst, int dt, const void *src, int st, size_t n, float scale, void *stream) {
  int half_src = st == BRG_FLOAT16 || st == BRG_BFLOAT16,
      wide_src = st == BRG_FLOAT32 || st == BRG_FLOAT64;
  int half_dst = dt == BRG_FLOAT16 || dt == BRG_BFLOAT16,
      wide_dst = dt == BRG_FLOAT32 || dt == BRG_FLOAT64;
  if (!((wide_src && half_dst) || (half_src && wide_dst))) return E_ARG;
  int e = launch_check(stream, dst, NULL, src, NULL, 0);
  if (!e && n > 0 &&
      (!reachable(get_stream(stream)->dev, dst, n * elem_size(dt)) ||
       !reachable(get_stream(stream)->dev, src, n * elem_size(st))))
    e = E_ILLEGAL;
  if (e) return e;
  kernel_load(cur_dev, K_CAST);
  op o = {.kind = OP_CAST, .d0 = dst, .a = src, .n = n, .dtype = dt, .rop = st};
  memcpy(&o.div, &scale, sizeof scale);
  return enqueue(stream, &o);
}

/* The stream's thread sleeps: the CPU stays free, as under a GPU kernel. */
static int busy(unsigned us, void *stream) {
  int e = launch_check(stream, NULL, NULL, NULL, NULL, 0);
  if (e) return e;
  kernel_load(cur_dev, K_BUSY);
  op o = {.kind = OP_BUSY, .n = us};
  return enqueue(stream, &o);
}

static int event_record(void *p, void *st) {
  event *ev = p;
  stream *s = get_stream(st);
  if (!s) return E_ALLOC;
  if (s->dev != ev->dev) return E_RESOURCE;
  /* Recorded in a capture: a node of the graph, for other captured work
   * to wait on; nothing runs now. */
  int e = capture_event_record(s, ev);
  __atomic_store_n(&ev->captured, e >= 0, __ATOMIC_RELAXED);
  if (e >= 0) return e;
  uint64_t t = __atomic_add_fetch(&ev->s->issued, 1, __ATOMIC_ACQ_REL);
  op o = {.kind = OP_RECORD, .ev = ev->s, .ticket = t};
  return enqueue(st, &o);
}

static int stream_wait_event(void *st, void *p) {
  event *ev = p;
  stream *s = get_stream(st);
  if (!s) return E_ALLOC;
  if (__atomic_load_n(&ev->captured, __ATOMIC_RELAXED)) {
    if (!is_legacy(st)) return capture_event_wait(s, ev);
    return E_CAPTURE_ISOLATION; /* the legacy stream cannot join a capture */
  }
  int cap = capturing(s);
  uint64_t t = __atomic_load_n(&ev->s->issued, __ATOMIC_ACQUIRE);
  if (t == 0) return E_OK;
  if (cap) { /* a graph cannot wait for work outside it */
    capture_invalidate(s);
    return E_CAPTURE_ISOLATION;
  }
  op o = {.kind = OP_WAIT, .ev = ev->s, .ticket = t};
  return enqueue(st, &o);
}

/* 0 when the event's last record has run, -1 while it has not. */
static int event_query(void *p) {
  event *ev = p;
  if (__atomic_load_n(&ev->captured, __ATOMIC_RELAXED)) return E_CAPTURED_EVENT;
  return ticket_done(ev->s, __atomic_load_n(&ev->s->issued, __ATOMIC_ACQUIRE)) ? E_OK : -1;
}

static int event_sync(void *p) {
  event *ev = p;
  if (__atomic_load_n(&ev->captured, __ATOMIC_RELAXED)) return E_CAPTURED_EVENT;
  wait_completed(ev->s, __atomic_load_n(&ev->s->issued, __ATOMIC_ACQUIRE));
  return E_OK;
}

static int event_create_timing(void **out) {
  void *h = malloc(HB);
  if (!h) return E_ALLOC;
  int e = ipc_event_export(out, h);
  free(h);
  return e;
}

static int event_create(void **out) {
  return event_create_timing(out);
}

/* Waits for and writes a word of registered host memory, in stream order. */
static int stream_value(int kind, void *st, void *addr, unsigned value) {
  stream *s = get_stream(st);
  if (!s) return E_ALLOC;
  if (s->dev != cur_dev) return E_RESOURCE;
  if (((uintptr_t)addr & 3) || !reachable(s->dev, addr, 4)) return E_ILLEGAL;
  op o = {.kind = kind, .d0 = addr, .n = value};
  return enqueue(st, &o);
}
static int stream_wait_value(void *st, void *addr, unsigned value) {
  return stream_value(OP_WAIT_VALUE, st, addr, value);
}
static int stream_write_value(void *st, void *addr, unsigned value) {
  return stream_value(OP_WRITE_VALUE, st, addr, value);
}

static int event_elapsed_ms(float *ms, void *a, void *b) {
  event *s = a, *t = b;
  if (!ticket_done(s->s, s->s->issued) || !ticket_done(t->s, t->s->issued) || !s->s->issued ||
      !t->s->issued)
    return E_ARG;
  *ms = (float)((double)(t->s->when_ns - s->s->when_ns) / 1e6);
  return E_OK;
}

/* Registered host memory keeps its address for kernels of every device. */
static int host_register(void *p, size_t bytes, void **dev) {
  int e = capture_forbids();
  if (!e) e = add_region(p, bytes, -1, 0, -1);
  if (e) return e;
  *dev = p;
  return E_OK;
}

static int host_unregister(void *p) {
  region r;
  int e = capture_forbids();
  if (e) return e;
  if (!find_region(p, &r, 0) || r.p != p || r.dev >= 0) return E_ARG;
  sync_free_wait();
  if (!find_region(p, &r, 1)) return E_ARG;
  return E_OK;
}

/* The memfd behind exported memory stands in for a dmabuf. */
static int dmabuf_export(void *p, size_t bytes, int *fd, unsigned long long *offset) {
  region r;
  if (!find_region(p, &r, 0) || r.fd < 0 || (char *)p + bytes > r.p + r.bytes) return E_ARG;
  int d = dup(r.fd);
  if (d < 0) return E_SYS;
  *fd = d;
  *offset = (unsigned long long)((char *)p - r.p);
  mark_rdma(p);
  return E_OK;
}

/* ---- CUDA graphs ---- */

/* A captured graph: the ops its streams recorded, queued again at each
 * launch. The capturing stream is branch 0; each stream that joined the
 * capture is a branch of its own, which a launch runs on a stream of the
 * graph's own beside the others. A record in one branch and a wait for it
 * in another order the two: each launch turns them into a record and a
 * wait of an event of the graph's own (a node). The graph owns the
 * kernel-mode arguments of its OP_RING ops. */
#define MAX_BRANCHES 32

typedef struct graph_op {
  op o;
  int branch;
} graph_op;

typedef struct graph {
  int dev;
  uint64_t id; /* its capture's, unique in the process */
  graph_op *ops;
  size_t n, cap;
  int invalid; /* an error during capture: capture_end fails */
  int nbranches;
  size_t branch_ops[MAX_BRANCHES]; /* ops each branch recorded */
  int unjoined[MAX_BRANCHES];      /* branch b has work branch 0 has not waited for */
  size_t nnodes;                   /* records that are nodes */
  ev_shared *nodes;                /* at launch, one event per node (made at capture_end) */
  uint64_t *tickets;               /* graph_launch's: each node's record of this launch */
  stream *branch_stream[MAX_BRANCHES];
} graph;

#define MAX_CAPTURES 64

/* The captures in progress: one entry per stream, branch 0 the one that
 * began it. */
static struct capture {
  stream *s;
  int global; /* global mode, else thread-local */
  pthread_t thread;
  int branch;
  graph *g;
} captures[MAX_CAPTURES];
static int ncaptures; /* under cap_lock; read unlocked as a hint */
static uint64_t capture_ids;
static pthread_mutex_t cap_lock = PTHREAD_MUTEX_INITIALIZER;

/* Node events of destroyed graphs: work a launch queued may still wait on
 * them, so they stay. */
static struct retired {
  struct retired *next;
  ev_shared *nodes;
} * retired;

static struct capture *find_capture(const stream *s) {
  for (int i = 0; i < ncaptures; i++)
    if (captures[i].s == s) return &captures[i];
  return NULL;
}

static int capturing(stream *s) {
  if (!__atomic_load_n(&ncaptures, __ATOMIC_ACQUIRE)) return 0;
  pthread_mutex_lock(&cap_lock);
  int yes = find_capture(s) != NULL;
  pthread_mutex_unlock(&cap_lock);
  return yes;
}

static void capture_invalidate(stream *s) {
  pthread_mutex_lock(&cap_lock);
  struct capture *c = find_capture(s);
  if (c) c->g->invalid = 1;
  pthread_mutex_unlock(&cap_lock);
}

static int capture_forbids(void) {
  if (!__atomic_load_n(&ncaptures, __ATOMIC_ACQUIRE)) return E_OK;
  int e = E_OK;
  pthread_mutex_lock(&cap_lock);
  for (int i = 0; i < ncaptures; i++)
    if (captures[i].global || pthread_equal(captures[i].thread, pthread_self())) {
      captures[i].g->invalid = 1;
      e = E_CAPTURE_UNSUPPORTED;
    }
  pthread_mutex_unlock(&cap_lock);
  return e;
}

static void graph_free(graph *g) {
  if (!g) return;
  for (size_t i = 0; i < g->n; i++)
    if (g->ops[i].o.kind == OP_RING) free((void *)g->ops[i].o.a);
  struct retired *r = g->nodes ? malloc(sizeof *r) : NULL;
  if (r) {
    pthread_mutex_lock(&cap_lock);
    *r = (struct retired){retired, g->nodes};
    retired = r;
    pthread_mutex_unlock(&cap_lock);
  }
  free(g->tickets);
  free(g->ops);
  free(g);
}

/* Appends o to branch b of g (under cap_lock). */
static int graph_append(graph *g, const op *o, int b) {
  if (g->n == g->cap) {
    size_t cap = g->cap ? 2 * g->cap : 16;
    graph_op *ops = realloc(g->ops, cap * sizeof *ops);
    if (!ops) {
      g->invalid = 1;
      return E_ALLOC;
    }
    g->ops = ops;
    g->cap = cap;
  }
  g->ops[g->n++] = (graph_op){*o, b};
  g->branch_ops[b]++;
  if (b > 0) g->unjoined[b] = 1;
  return E_OK;
}

static int capture_record(stream *s, const op *o) {
  if (!__atomic_load_n(&ncaptures, __ATOMIC_ACQUIRE)) return -1;
  pthread_mutex_lock(&cap_lock);
  struct capture *c = find_capture(s);
  int e = c ? graph_append(c->g, o, c->branch) : -1;
  pthread_mutex_unlock(&cap_lock);
  return e;
}

static int capture_event_record(stream *s, event *ev) {
  if (!__atomic_load_n(&ncaptures, __ATOMIC_ACQUIRE)) return -1;
  pthread_mutex_lock(&cap_lock);
  struct capture *c = find_capture(s);
  int e = -1;
  if (c) {
    graph *g = c->g;
    op o = {.kind = OP_GRAPH_RECORD, .n = g->nnodes};
    if ((e = graph_append(g, &o, c->branch)) == E_OK) {
      ev->cap_id = g->id;
      ev->cap_node = g->nnodes++;
      ev->cap_branch = c->branch;
      ev->cap_ops = g->branch_ops[c->branch];
    }
  }
  pthread_mutex_unlock(&cap_lock);
  return e;
}

static int capture_event_wait(stream *s, event *ev) {
  pthread_mutex_lock(&cap_lock);
  struct capture *origin = NULL, *c = find_capture(s);
  for (int i = 0; i < ncaptures && !origin; i++)
    if (captures[i].g->id == ev->cap_id && captures[i].branch == 0) origin = &captures[i];
  int e = E_OK;
  if (!origin) {
    e = E_CAPTURED_EVENT; /* its capture has ended */
  } else if (c && c->g != origin->g) {
    c->g->invalid = origin->g->invalid = 1;
    e = E_CAPTURE_ISOLATION;
  } else if (!c) {
    /* a fork: s joins the capture as a branch of its own */
    graph *g = origin->g;
    if (g->nbranches == MAX_BRANCHES || ncaptures == MAX_CAPTURES) {
      g->invalid = 1;
      e = E_ALLOC;
    } else {
      captures[ncaptures] = (struct capture){s, origin->global, origin->thread, g->nbranches++, g};
      c = &captures[ncaptures];
      __atomic_store_n(&ncaptures, ncaptures + 1, __ATOMIC_RELEASE);
      g->unjoined[c->branch] = 1;
    }
  }
  if (e == E_OK) {
    graph *g = c->g;
    op o = {.kind = OP_GRAPH_WAIT, .n = ev->cap_node};
    e = graph_append(g, &o, c->branch);
    /* branch 0 waiting for all of a branch's work joins that branch back */
    if (e == E_OK && c->branch == 0 && ev->cap_branch > 0 &&
        ev->cap_ops == g->branch_ops[ev->cap_branch])
      g->unjoined[ev->cap_branch] = 0;
  }
  pthread_mutex_unlock(&cap_lock);
  return e;
}

static int stream_capturing(void *st, int *yes) {
  stream *s = get_stream(st);
  if (!s) return E_ALLOC;
  *yes = capturing(s);
  return E_OK;
}

static int capture_begin(void *st, int global) {
  if (is_legacy(st)) return E_CAPTURE_UNSUPPORTED; /* the legacy stream cannot capture */
  stream *s = get_stream(st);
  if (!s) return E_ALLOC;
  if (s->dev != cur_dev) return E_RESOURCE;
  graph *g = calloc(1, sizeof *g);
  if (!g) return E_ALLOC;
  g->dev = s->dev;
  g->nbranches = 1;
  int e = E_OK;
  pthread_mutex_lock(&cap_lock);
  g->id = ++capture_ids;
  if (find_capture(s))
    e = E_ILLEGAL_STATE;
  else if (ncaptures == MAX_CAPTURES)
    e = E_ALLOC;
  else
    captures[ncaptures] = (struct capture){s, global, pthread_self(), 0, g};
  if (!e) __atomic_store_n(&ncaptures, ncaptures + 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&cap_lock);
  if (e) free(g);
  return e;
}

static int capture_end(void *st, void **out) {
  stream *s = get_stream(st);
  if (!s) return E_ALLOC;
  pthread_mutex_lock(&cap_lock);
  struct capture *c = find_capture(s);
  if (!c || c->branch != 0) { /* not capturing, or a branch: only branch 0 ends it */
    pthread_mutex_unlock(&cap_lock);
    return E_ILLEGAL_STATE;
  }
  if (!pthread_equal(c->thread, pthread_self())) {
    pthread_mutex_unlock(&cap_lock);
    return E_CAPTURE_WRONG_THREAD;
  }
  graph *g = c->g;
  int n = ncaptures;
  for (int i = 0; i < n;)
    if (captures[i].g == g)
      captures[i] = captures[--n];
    else
      i++;
  __atomic_store_n(&ncaptures, n, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&cap_lock);
  int e = g->invalid ? E_CAPTURE_INVALIDATED : E_OK;
  for (int b = 1; !e && b < g->nbranches; b++)
    if (g->unjoined[b]) e = E_CAPTURE_UNJOINED;
  if (!e) {
    g->nodes = calloc(g->nnodes + 1, sizeof *g->nodes);
    g->tickets = calloc(g->nnodes + 1, sizeof *g->tickets);
    if (!g->nodes || !g->tickets) e = E_ALLOC;
  }
  if (e) {
    graph_free(g);
    return e;
  }
  *out = g;
  return E_OK;
}

/* Queues the graph's work, as it was captured: branch 0 on the stream,
 * each other branch on a stream of the graph's own, the nodes as records
 * and waits of this launch; a kernel-mode launch gets its own copy of its
 * arguments, as each launch of a CUDA graph passes the captured ones. */
static int graph_launch(void *p, void *st) {
  graph *g = p;
  stream *s = get_stream(st);
  if (!g || !s) return E_ARG;
  if (s->dev != cur_dev || s->dev != g->dev) return E_RESOURCE;
  if (capturing(s)) return E_CAPTURE_UNSUPPORTED;
  for (int b = 1; b < g->nbranches; b++)
    if (!g->branch_stream[b] && !(g->branch_stream[b] = stream_new(0))) return E_ALLOC;
  for (size_t i = 0; i < g->n; i++) {
    op o = g->ops[i].o;
    stream *to = g->ops[i].branch ? g->branch_stream[g->ops[i].branch] : s;
    if (o.kind == OP_GRAPH_RECORD) {
      ev_shared *node = &g->nodes[o.n];
      g->tickets[o.n] = __atomic_add_fetch(&node->issued, 1, __ATOMIC_ACQ_REL);
      o = (op){.kind = OP_RECORD, .ev = node, .ticket = g->tickets[o.n]};
    } else if (o.kind == OP_GRAPH_WAIT) {
      o = (op){.kind = OP_WAIT, .ev = &g->nodes[o.n], .ticket = g->tickets[o.n]};
    } else if (o.kind == OP_RING) {
      void *a = malloc(sizeof(brg__rk_args));
      if (!a) return E_ALLOC;
      memcpy(a, o.a, sizeof(brg__rk_args));
      o.a = a;
    }
    int e = enqueue(to, &o);
    if (e) {
      if (o.kind == OP_RING) free((void *)o.a);
      return e;
    }
  }
  return E_OK;
}

static int graph_destroy(void *p) {
  graph_free(p);
  return E_OK;
}

/* ---- the rest of the table ---- */

/* Checked and kept like the real module's bound, though these streams have no grid. */
static int max_blocks = 32;
static long ring_launches;
static int ring_threads;
static int set_max_blocks(int blocks) {
  if (blocks < 1 || blocks > 1024) return E_ARG;
  max_blocks = blocks;
  return E_OK;
}

static int probe(char *why, size_t n) {
  if (devices() == 0 && why)
    snprintf(why, n, "no emulated GPU is visible (BRIGADE_EMU_VISIBLE=%s names none of the %d)",
             getenv("BRIGADE_EMU_VISIBLE"), nphys);
  return devices();
}

static void describe(char *out, size_t n) {
  snprintf(out, n,
           "device %d of %d (GPU %d of %d): emulated GPU (host memory, streams run by threads; "
           "tests only)",
           cur_dev, devices(), phys(cur_dev), nphys);
}

/* Synchronous copies run behind the default stream's work, as CUDA's do
 * (strict: behind every blocking stream's, as the legacy stream's calls). */
static void legacy_wait(void) {
  rules();
  if (rule_sync_free)
    device_wait(cur_dev, 1);
  else
    stream_sync(NULL);
}

static int mem_copy(void *dst, const void *src, size_t bytes) {
  int e = capture_forbids();
  if (e) return e;
  legacy_wait();
  memmove(dst, src, bytes);
  return E_OK;
}

static int mem_set(void *p, int value, size_t bytes) {
  int e = capture_forbids();
  if (e) return e;
  legacy_wait();
  memset(p, value, bytes);
  return E_OK;
}

static int last_error(void) {
  return E_OK;
}

static int device_uuid(unsigned char uuid[16]) {
  uuid_of(phys(cur_dev), uuid);
  return E_OK;
}

/* Kernel mode: the real kernel on the stream's thread (emu_ring.cc), with
 * the block size the launch asks for, as on a GPU. Every pointer it
 * hands the kernel must be reachable from the stream's device, as a GPU
 * would fault on one that is not (checked here, at the launch, so the
 * error names it instead of a kernel that dies). */
static int ring_reachable(int dev, const brg__rk_args *a, int channels) {
  size_t slots = (size_t)a->nslots * (a->slot_stride ? a->slot_stride : a->slot_bytes);
  int ok = reachable(dev, a->abort_word, sizeof(int)) && reachable(dev, a->status, sizeof(int)) &&
           reachable(dev, a->ring, (size_t)a->nranks * sizeof(int)) &&
           reachable(dev, a->sendbuf, a->count ? 1 : 0) &&
           reachable(dev, a->recvbuf, a->count ? 1 : 0);
  for (int c = 0; ok && !a->oneshot && c < channels; c++) {
    const brg__rk_link *l = &a->chan[c];
    ok = reachable(dev, l->send_slots, slots) && reachable(dev, l->send_tail, 8) &&
         reachable(dev, l->send_head, 8) && reachable(dev, l->recv_slots, slots) &&
         reachable(dev, l->recv_tail, 8) && reachable(dev, l->recv_head, 8) &&
         reachable(dev, l->counters, 16) &&
         reachable(dev, l->send_sizes, (size_t)a->nslots * sizeof(uint64_t));
  }
  for (int r = 0; ok && a->oneshot && r < a->nranks && r < BRG__RK_MAX_PEERS; r++)
    ok = reachable(dev, a->os.area[r],
                   brg__rk_os_bytes(a->nranks, a->os.slot_bytes, a->os.ll_slot)) &&
         (!a->os.direct || reachable(dev, a->os.area[r] + a->os.direct_off,
                                     brg__rk_direct_bytes(a->nranks, a->os.dslot)));
  return ok;
}

static int ring_launch(const void *args, size_t args_bytes, int channels, int threads, void *st) {
#ifdef BRG_EMU_NO_KERNEL_MODE
  (void)args;
  (void)args_bytes;
  (void)channels;
  (void)threads;
  (void)st;
  return E_NO_KERNEL_MODE;
#else
  if (args_bytes != sizeof(brg__rk_args) || channels < 1 || channels > BRG__RK_MAX_CHANNELS ||
      threads < 32 || threads > 512 || threads % 32 != 0)
    return E_ARG;
  stream *s = get_stream(st);
  if (!s) return E_ALLOC;
  if (s->dev != cur_dev) return E_RESOURCE;
  if (!ring_reachable(s->dev, args, channels)) return E_ILLEGAL;
  kernel_load(cur_dev, kernel_id(K_RING, ((const brg__rk_args *)args)->dtype,
                                 ((const brg__rk_args *)args)->op));
  brg__rk_args *copy = malloc(sizeof *copy);
  if (!copy) return E_ALLOC;
  memcpy(copy, args, sizeof *copy);
  static int cap_read = -1; /* streams of several ranks (threads) launch */
  int cap = __atomic_load_n(&cap_read, __ATOMIC_RELAXED);
  if (cap < 0) {
    const char *v = getenv("BRIGADE_EMU_BLOCK_THREADS");
    cap = v ? atoi(v) : 0;
    if (cap < 32 || cap > 512 || cap % 32 != 0) cap = 0;
    __atomic_store_n(&cap_read, cap, __ATOMIC_RELAXED);
  }
  if (cap && threads > cap) threads = cap;
#if defined(__SANITIZE_THREAD__)
  /* ThreadSanitizer counts each fiber as a thread, and dies past 8128 of
   * them at once (3 ranks x 8 channels x 512 would be 12288): its tree
   * runs blocks of 64 (the kernel works with any multiple of 32). */
  if (threads > 64) threads = 64;
#endif
  op o = {.kind = OP_RING, .a = copy, .div = channels, .rop = threads};
  __atomic_add_fetch(&ring_launches, 1, __ATOMIC_RELAXED);
  __atomic_store_n(&ring_threads, threads, __ATOMIC_RELAXED);
  int e = enqueue(st, &o);
  if (e) free(copy);
  return e;
#endif
}

/* For the block size ring_launch runs with (BRIGADE_EMU_BLOCK_THREADS,
 * and ThreadSanitizer's 64). */
static int ring_occupancy(int threads, int *sms, int *per_sm) {
  if (threads < 32 || threads > 512 || threads % 32 != 0) return E_ARG;
  const char *v = getenv("BRIGADE_EMU_BLOCK_THREADS");
  int cap = v ? atoi(v) : 0;
  if (cap >= 32 && cap <= 512 && cap % 32 == 0 && threads > cap) threads = cap;
#if defined(__SANITIZE_THREAD__)
  if (threads > 64) threads = 64;
#endif
#ifdef BRG_EMU_NO_KERNEL_MODE
  *sms = 0;
  *per_sm = 1;
#else
  brg__emu_ring_occupancy(threads, sms, per_sm);
#endif
  return E_OK;
}

/* For tests (dlsym on this module): whether this process made a context
 * on device `dev` (-1: the number of devices with one), and the ring
 * kernel launches so far with the block size of the last. */
EXPORT int brg__emu_context(int dev) {
  if (dev < 0) {
    int n = 0;
    for (int i = 0; i < devices(); i++) n += __atomic_load_n(&contexts[i], __ATOMIC_RELAXED);
    return n;
  }
  return dev < devices() ? __atomic_load_n(&contexts[dev], __ATOMIC_RELAXED) : 0;
}
/* The strict rules' counts: device-wide waits (SYNC_FREE and loads) and
 * kernel loads (LAZY_LOAD) so far. */
EXPORT void brg__emu_strict_counts(long *waits, long *loads) {
  if (waits) *waits = __atomic_load_n(&device_waits, __ATOMIC_RELAXED);
  if (loads) *loads = __atomic_load_n(&kernel_loads, __ATOMIC_RELAXED);
}
/* The kernels the strict rules loaded at a launch rather than in
 * load_kernels: each waited there for the whole device. */
EXPORT long brg__emu_launch_loads(void) {
  return __atomic_load_n(&launch_loads, __ATOMIC_RELAXED);
}
EXPORT long brg__emu_ring_launches(int *threads) {
  if (threads) *threads = __atomic_load_n(&ring_threads, __ATOMIC_RELAXED);
  return __atomic_load_n(&ring_launches, __ATOMIC_RELAXED);
}

static const brg__cuda_api api = {
    .abi = BRG__CUDA_ABI,
    .drv =
        {
            .probe = probe,
            .describe = describe,
            .error_string = error_string,
            .pointer_is_device = pointer_is_device,
            .mem_alloc = mem_alloc,
            .mem_free = mem_free,
            .mem_copy = mem_copy,
            .mem_set = mem_set,
            .stream_sync = stream_sync,
            .last_error = last_error,
            .ipc_mem_export = ipc_mem_export,
            .ipc_mem_open = ipc_mem_open,
            .ipc_mem_close = ipc_mem_close,
            .ipc_event_export = ipc_event_export,
            .ipc_event_open = ipc_event_open,
            .event_destroy = event_destroy,
            .event_record = event_record,
            .stream_wait_event = stream_wait_event,
            .event_sync = event_sync,
            .stream_create = stream_create,
            .stream_destroy = stream_destroy,
            .device_uuid = device_uuid,
            .event_create_timing = event_create_timing,
            .event_elapsed_ms = event_elapsed_ms,
            .host_register = host_register,
            .host_unregister = host_unregister,
            .dmabuf_export = dmabuf_export,
            .event_query = event_query,
            .set_device = set_device,
            .get_device = get_device,
            .can_access_peer = can_access_peer,
            .enable_peer_access = enable_peer_access,
            .event_create = event_create,
            .stream_wait_value = stream_wait_value,
            .stream_write_value = stream_write_value,
            .flush_rdma_writes = flush_rdma_writes,
            .stream_capturing = stream_capturing,
            .capture_begin = capture_begin,
            .capture_end = capture_end,
            .graph_launch = graph_launch,
            .graph_destroy = graph_destroy,
            .uuid_reaches = uuid_reaches,
            .mps_enabled = mps_enabled,
            .load_kernels = load_kernels,
        },
    .kern =
        {
            .reduce = reduce,
            .copy = copy,
            .divide = divide,
            .set_max_blocks = set_max_blocks,
            .cast = cast,
            .busy = busy,
            .ring_launch = ring_launch,
            .ring_occupancy = ring_occupancy,
        },
};

EXPORT const brg__cuda_api *brg__cuda_module_api(void) {
  return &api;
}
