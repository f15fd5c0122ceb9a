/*
 * A stand-in for the NVIDIA driver library, libcuda.so.1, of a driver for
 * CUDA 12.2: it has nothing but cuDriverGetVersion. cudart, which the CUDA
 * module links statically, opens it by name, so LD_LIBRARY_PATH pointing
 * here makes the module meet a driver older than its toolkit (every
 * toolkit that builds the module is 12.5 or newer) on any machine.
 */
__attribute__((visibility("default"))) int cuDriverGetVersion(int *version);

int cuDriverGetVersion(int *version) {
  *version = 12020;
  return 0;
}
