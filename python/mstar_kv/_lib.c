/* The one shared library the Python package loads with ctypes: the
   implementations of both headers and nothing else (no Python API, so no
   Python headers are needed to build it, and any shared build of the two
   headers can stand in for it through MSKV_LIBRARY). */
#define MSTAR_KV_IMPLEMENTATION
#include "mstar_kv.h"
#define MSTAR_KV_CUDA_IMPLEMENTATION
#include "mstar_kv_cuda.h"
