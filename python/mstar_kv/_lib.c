/* The one shared library the Python package loads with ctypes: the
   implementations of the three headers and nothing else (no Python API, so no
   Python headers are needed to build it, and any shared build of the
   headers can stand in for it through MSKV_LIBRARY; one without
   mstar_kv_ucx.h leaves mstar_kv.Ucx unavailable). UCX itself is loaded at
   run time by mstar_kv_ucx.h: building this needs no UCX header or library. */
#define MSTAR_KV_IMPLEMENTATION
#include "mstar_kv.h"
#define MSTAR_KV_CUDA_IMPLEMENTATION
#include "mstar_kv_cuda.h"
#define MSTAR_KV_UCX_IMPLEMENTATION
#include "mstar_kv_ucx.h"
