/* mstar_kv_cuda.h - v0.1.0 - the GPU layer of mstar_kv: a run-time loader for
   the CUDA driver and NVRTC, a JIT with an in-memory and on-disk kernel cache,
   a device K/V store that plugs into the arena of mstar_kv.h, fences, and the
   launch wrappers of the kernels in kernels.cu (embedded below).

   Nothing here needs the CUDA toolkit, its headers or a GPU at compile time:
   libcuda and libnvrtc are opened with dlopen when a context is created, and a
   machine without them gets MSKV_ERROR_CUDA_UNAVAILABLE (the CPU backend of
   mstar_kv.h keeps working).

   Do this in exactly one C or C++ file, after mstar_kv.h:
       #define MSTAR_KV_IMPLEMENTATION
       #include "mstar_kv.h"
       #define MSTAR_KV_CUDA_IMPLEMENTATION
       #include "mstar_kv_cuda.h"
   Build:
       cc -std=c99 -O2 app.c -ldl -lpthread -lm

   Run-time environment:
     MSKV_NVRTC_PATH   a libnvrtc to try first (after mskv_cuda_desc.nvrtc_path)
     MSKV_CACHE_DIR    the kernel cache directory (else $XDG_CACHE_HOME/mstar_kv,
                       else ~/.cache/mstar_kv); mskv_cuda_desc.cache_dir wins

   Example:
       mskv_cuda_desc cd = {0};
       mskv_cuda *cu;
       if (mskv_cuda_create(&cd, &cu) != MSKV_SUCCESS) ... use the CPU backend;
       mskv_cuda_store_desc sd = {0};
       sd.num_pages = 4096; sd.page_size = 16; sd.num_layers = 32;
       sd.kv_heads = 8; sd.head_dim = 128; sd.dtype = MSKV_DTYPE_BF16;
       mskv_cuda_store *st;  mskv_cuda_store_create(cu, &sd, &st);
       mskv_arena_desc ad = {0};
       mskv_cuda_store_arena_desc(st, &ad);   // geometry, store_ops, FENCED retire
       mskv_arena *a;  mskv_arena_create(&ad, &a);  mskv_cuda_store_bind(st, a);
       per step: mskv_admit, mskv_plan_build, mskv_cuda_plan_upload,
                 mskv_cuda_write_kv (per layer), attention, mskv_commit,
                 mskv_cuda_publish (= mskv_publish + fence event + retire)
       offload / reload / export / import: the arena's own functions.

   Streams and ordering: every launch and copy of a store runs on the store's
   stream, so the offload of a page is ordered after the kernels that wrote
   it. K/V written on another stream must be ordered by the caller.

   CUDA graphs: mskv_cuda_capture_begin/end capture the launches of a step;
   their plan arguments live in fixed device buffers, so upload a new plan
   with mskv_cuda_plan_upload (outside the capture) and replay the graph with
   mskv_cuda_graph_launch. Kernels are compiled on first use: run a step once
   before capturing it.

   License: MIT, at the end of mstar_kv.h.
*/
#ifndef MSTAR_KV_CUDA_H
#define MSTAR_KV_CUDA_H

#ifndef MSTAR_KV_H
#error "include mstar_kv.h before mstar_kv_cuda.h"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* // >>driver types --------------------------------------------------------
   The few CUDA driver and NVRTC types the layer uses, declared here so that
   no CUDA header is needed. Handles are opaque pointers, as in cuda.h. */

typedef int mskv_cu_result;                       /* CUresult; 0 = success */
typedef int mskv_cu_device;                       /* CUdevice */
typedef unsigned long long mskv_cu_ptr;           /* CUdeviceptr */
typedef struct mskv_cu_ctx_st *mskv_cu_context;   /* CUcontext */
typedef struct mskv_cu_mod_st *mskv_cu_module;    /* CUmodule */
typedef struct mskv_cu_func_st *mskv_cu_function; /* CUfunction */
typedef struct mskv_cu_stream_st *mskv_cu_stream; /* CUstream */
typedef struct mskv_cu_event_st *mskv_cu_event;   /* CUevent */
typedef struct mskv_cu_graph_st *mskv_cu_graph;   /* CUgraph */
typedef struct mskv_cu_gexec_st *mskv_cu_graph_exec; /* CUgraphExec */
typedef int mskv_nvrtc_result;                    /* nvrtcResult; 0 = success */
typedef struct mskv_nvrtc_prog_st *mskv_nvrtc_program; /* nvrtcProgram */

/* Values from the driver API that the layer relies on. */
#define MSKV_CU_SUCCESS 0
#define MSKV_CU_ERROR_OUT_OF_MEMORY 2
#define MSKV_CU_ERROR_NOT_INITIALIZED 3
#define MSKV_CU_ERROR_STUB_LIBRARY 34
#define MSKV_CU_ERROR_NO_DEVICE 100
#define MSKV_CU_ERROR_INVALID_IMAGE 200
#define MSKV_CU_ERROR_NOT_FOUND 500
#define MSKV_CU_ERROR_NOT_READY 600
#define MSKV_CU_ERROR_LAUNCH_FAILED 719
#define MSKV_CU_ATTR_MULTIPROCESSOR_COUNT 16
#define MSKV_CU_ATTR_CC_MAJOR 75
#define MSKV_CU_ATTR_CC_MINOR 76
#define MSKV_CU_ATTR_MAX_SMEM_OPTIN 97
#define MSKV_CU_FUNC_ATTR_MAX_DYNAMIC_SMEM 8
#define MSKV_CU_STREAM_NON_BLOCKING 1
#define MSKV_CU_EVENT_DISABLE_TIMING 2
#define MSKV_CU_CAPTURE_MODE_RELAXED 2
#define MSKV_NVRTC_ERROR_COMPILATION 6

/* The one list of every driver and NVRTC function the layer calls:
   X(return type, name, versioned symbol exported by the library, parameters).
   Driver functions are resolved through cuGetProcAddress_v2 by their base
   name at ABI version 12.0 when the driver has it, else by the versioned
   symbol with dlsym. */
#define MSKV_CUDA_DRIVER_FUNCTIONS(X)                                                          \
    X(mskv_cu_result, cuInit, "cuInit", (unsigned int flags))                                  \
    X(mskv_cu_result, cuDriverGetVersion, "cuDriverGetVersion", (int *version))                \
    X(mskv_cu_result, cuGetErrorString, "cuGetErrorString", (mskv_cu_result e, const char **s)) \
    X(mskv_cu_result, cuDeviceGetCount, "cuDeviceGetCount", (int *count))                      \
    X(mskv_cu_result, cuDeviceGet, "cuDeviceGet", (mskv_cu_device *dev, int ordinal))          \
    X(mskv_cu_result, cuDeviceGetAttribute, "cuDeviceGetAttribute", (int *value, int attrib, mskv_cu_device dev)) \
    X(mskv_cu_result, cuDeviceGetName, "cuDeviceGetName", (char *name, int len, mskv_cu_device dev)) \
    X(mskv_cu_result, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", (mskv_cu_context *ctx, mskv_cu_device dev)) \
    X(mskv_cu_result, cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", (mskv_cu_device dev)) \
    X(mskv_cu_result, cuCtxSetCurrent, "cuCtxSetCurrent", (mskv_cu_context ctx))               \
    X(mskv_cu_result, cuMemAlloc, "cuMemAlloc_v2", (mskv_cu_ptr *dptr, size_t bytes))          \
    X(mskv_cu_result, cuMemFree, "cuMemFree_v2", (mskv_cu_ptr dptr))                           \
    X(mskv_cu_result, cuMemAllocHost, "cuMemAllocHost_v2", (void **pp, size_t bytes))          \
    X(mskv_cu_result, cuMemFreeHost, "cuMemFreeHost", (void *p))                               \
    X(mskv_cu_result, cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", (mskv_cu_ptr dst, const void *src, size_t bytes, mskv_cu_stream s)) \
    X(mskv_cu_result, cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", (void *dst, mskv_cu_ptr src, size_t bytes, mskv_cu_stream s)) \
    X(mskv_cu_result, cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", (mskv_cu_ptr dst, mskv_cu_ptr src, size_t bytes, mskv_cu_stream s)) \
    X(mskv_cu_result, cuMemsetD8Async, "cuMemsetD8Async", (mskv_cu_ptr dst, unsigned char v, size_t n, mskv_cu_stream s)) \
    X(mskv_cu_result, cuStreamCreate, "cuStreamCreate", (mskv_cu_stream *s, unsigned int flags)) \
    X(mskv_cu_result, cuStreamDestroy, "cuStreamDestroy_v2", (mskv_cu_stream s))               \
    X(mskv_cu_result, cuStreamSynchronize, "cuStreamSynchronize", (mskv_cu_stream s))          \
    X(mskv_cu_result, cuEventCreate, "cuEventCreate", (mskv_cu_event *e, unsigned int flags))  \
    X(mskv_cu_result, cuEventRecord, "cuEventRecord", (mskv_cu_event e, mskv_cu_stream s))     \
    X(mskv_cu_result, cuEventQuery, "cuEventQuery", (mskv_cu_event e))                         \
    X(mskv_cu_result, cuEventSynchronize, "cuEventSynchronize", (mskv_cu_event e))             \
    X(mskv_cu_result, cuEventDestroy, "cuEventDestroy_v2", (mskv_cu_event e))                  \
    X(mskv_cu_result, cuModuleLoadData, "cuModuleLoadData", (mskv_cu_module *m, const void *image)) \
    X(mskv_cu_result, cuModuleUnload, "cuModuleUnload", (mskv_cu_module m))                    \
    X(mskv_cu_result, cuModuleGetFunction, "cuModuleGetFunction", (mskv_cu_function *f, mskv_cu_module m, const char *name)) \
    X(mskv_cu_result, cuFuncSetAttribute, "cuFuncSetAttribute", (mskv_cu_function f, int attrib, int value)) \
    X(mskv_cu_result, cuLaunchKernel, "cuLaunchKernel", (mskv_cu_function f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz, unsigned int smem, mskv_cu_stream s, void **params, void **extra)) \
    X(mskv_cu_result, cuStreamBeginCapture, "cuStreamBeginCapture_v2", (mskv_cu_stream s, int mode)) \
    X(mskv_cu_result, cuStreamEndCapture, "cuStreamEndCapture", (mskv_cu_stream s, mskv_cu_graph *g)) \
    X(mskv_cu_result, cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", (mskv_cu_graph_exec *e, mskv_cu_graph g, unsigned long long flags)) \
    X(mskv_cu_result, cuGraphLaunch, "cuGraphLaunch", (mskv_cu_graph_exec e, mskv_cu_stream s)) \
    X(mskv_cu_result, cuGraphExecDestroy, "cuGraphExecDestroy", (mskv_cu_graph_exec e))        \
    X(mskv_cu_result, cuGraphDestroy, "cuGraphDestroy", (mskv_cu_graph g))

#define MSKV_CUDA_NVRTC_FUNCTIONS(X)                                                           \
    X(mskv_nvrtc_result, nvrtcVersion, "nvrtcVersion", (int *major, int *minor))               \
    X(const char *, nvrtcGetErrorString, "nvrtcGetErrorString", (mskv_nvrtc_result r))         \
    X(mskv_nvrtc_result, nvrtcGetNumSupportedArchs, "nvrtcGetNumSupportedArchs", (int *n))     \
    X(mskv_nvrtc_result, nvrtcGetSupportedArchs, "nvrtcGetSupportedArchs", (int *archs))       \
    X(mskv_nvrtc_result, nvrtcCreateProgram, "nvrtcCreateProgram", (mskv_nvrtc_program *p, const char *src, const char *name, int num_headers, const char *const *headers, const char *const *include_names)) \
    X(mskv_nvrtc_result, nvrtcDestroyProgram, "nvrtcDestroyProgram", (mskv_nvrtc_program *p)) \
    X(mskv_nvrtc_result, nvrtcCompileProgram, "nvrtcCompileProgram", (mskv_nvrtc_program p, int num_options, const char *const *options)) \
    X(mskv_nvrtc_result, nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize", (mskv_nvrtc_program p, size_t *size)) \
    X(mskv_nvrtc_result, nvrtcGetProgramLog, "nvrtcGetProgramLog", (mskv_nvrtc_program p, char *log)) \
    X(mskv_nvrtc_result, nvrtcGetPTXSize, "nvrtcGetPTXSize", (mskv_nvrtc_program p, size_t *size)) \
    X(mskv_nvrtc_result, nvrtcGetPTX, "nvrtcGetPTX", (mskv_nvrtc_program p, char *ptx))        \
    X(mskv_nvrtc_result, nvrtcGetCUBINSize, "nvrtcGetCUBINSize", (mskv_nvrtc_program p, size_t *size)) \
    X(mskv_nvrtc_result, nvrtcGetCUBIN, "nvrtcGetCUBIN", (mskv_nvrtc_program p, char *cubin))

/* The function table. Normally filled by the loader; a test or an embedder
   may pass its own (mskv_cuda_desc.functions) to run without CUDA or to
   inject failures. Every member must be set. */
typedef struct mskv_cuda_functions {
#define MSKV__CUDA_MEMBER(ret, name, sym, params) ret (*name) params;
    MSKV_CUDA_DRIVER_FUNCTIONS(MSKV__CUDA_MEMBER)
    MSKV_CUDA_NVRTC_FUNCTIONS(MSKV__CUDA_MEMBER)
#undef MSKV__CUDA_MEMBER
} mskv_cuda_functions;

/* // >>context ------------------------------------------------------------- */

typedef struct mskv_cuda mskv_cuda;

typedef struct mskv_cuda_desc {
    int32_t device;                 /* ordinal */
    const char *driver_path;        /* a libcuda to open instead of the default names (development) */
    const char *nvrtc_path;         /* a libnvrtc to try first */
    const char *kernel_source;      /* NUL-terminated CUDA source instead of the embedded kernels.cu */
    const char *cache_dir;          /* NULL: $MSKV_CACHE_DIR, $XDG_CACHE_HOME/mstar_kv, ~/.cache/mstar_kv */
    int32_t disable_disk_cache;     /* compile every variant afresh on each run (still cached in memory) */
    const mskv_cuda_functions *functions; /* an injected table; NULL = load libcuda and libnvrtc */
    mskv_allocator allocator;
    mskv_log_fn log;
    void *log_user;
} mskv_cuda_desc;

typedef struct mskv_cuda_info {
    char name[128];
    int32_t device;
    int32_t cc_major, cc_minor;
    int32_t arch;                   /* the sm_XY the kernels are compiled for (10*X+Y) */
    int32_t ptx_fallback;           /* NVRTC does not know the device: PTX for an older arch, JIT by the driver */
    int32_t multiprocessors;
    int32_t driver_version;         /* 1000*major + 10*minor */
    int32_t nvrtc_version;          /* likewise */
    int32_t compiles;               /* NVRTC compilations done by this context (0 on a warm start) */
    int32_t disk_hits;              /* variants read from the disk cache */
} mskv_cuda_info;

/* Checks, without creating anything, whether a context could be created:
   driver, device, NVRTC. Return value: MSKV_SUCCESS or
   MSKV_ERROR_CUDA_UNAVAILABLE with what was tried in why (optional).
   Thread safety: any thread; the libraries are loaded once. */
MSKV_API mskv_result mskv_cuda_probe(const mskv_cuda_desc *desc, char *why, size_t why_cap);
/* Loads the libraries (once per process), opens the device's primary context.
   Return value: MSKV_SUCCESS, CUDA_UNAVAILABLE (details to the logger and to
   mskv_cuda_probe), OUT_OF_MEMORY, CUDA. */
MSKV_API mskv_result mskv_cuda_create(const mskv_cuda_desc *desc, mskv_cuda **out);
MSKV_API void mskv_cuda_destroy(mskv_cuda *cu);
MSKV_API mskv_result mskv_cuda_info_get(mskv_cuda *cu, mskv_cuda_info *out);
/* Details of the last failure of a call on this context (NVRTC log, driver
   error name); "" when none. Valid until the next call. */
MSKV_API const char *mskv_cuda_last_error(mskv_cuda *cu);

/* Device memory for the caller's own tensors (q, k, v, o, ...). */
MSKV_API mskv_result mskv_cuda_malloc(mskv_cuda *cu, size_t bytes, mskv_cu_ptr *out);
MSKV_API void mskv_cuda_free(mskv_cuda *cu, mskv_cu_ptr ptr);

/* // >>jit ----------------------------------------------------------------- */

/* One compilation, without a device: for tools and tests. */
typedef struct mskv_cuda_compile_info {
    int32_t arch;                   /* 80, 89, 90, ... */
    int32_t arch_specific;          /* sm_90a-style target (wgmma) */
    int32_t ptx;                    /* PTX for compute_XY instead of CUBIN */
    const char *const *options;     /* e.g. "-DMSKV_DTYPE=2"; "--ptxas-options=-v" for a register report */
    int32_t num_options;
} mskv_cuda_compile_info;

typedef struct mskv_cuda_image {
    void *data;                     /* CUBIN or NUL-terminated PTX */
    size_t size;
    char *log;                      /* NVRTC's log (NUL-terminated, may be empty); set on failure too */
    int32_t is_ptx;
    int32_t from_disk;              /* read from the disk cache (nothing compiled) */
    uint64_t key;                   /* the cache key: source + options + arch + NVRTC version */
    char path[512];                 /* the cache file ("" with the disk cache off) */
} mskv_cuda_image;

/* Compiles the kernel source (desc->kernel_source or the embedded copy)
   through the disk cache. On MSKV_ERROR_NVRTC, out->log holds the log (also
   sent to the logger). Free out with mskv_cuda_image_free in every case. */
MSKV_API mskv_result mskv_cuda_compile(const mskv_cuda_desc *desc, const mskv_cuda_compile_info *info, mskv_cuda_image *out);
MSKV_API void mskv_cuda_image_free(const mskv_cuda_desc *desc, mskv_cuda_image *img);
/* Register spills reported by ptxas (--ptxas-options=-v) in a log: the sum of
   "bytes spill stores" and "bytes spill loads"; -1 when the log has no report. */
MSKV_API int64_t mskv_cuda_log_spills(const char *log);
/* The embedded copy of kernels.cu. */
MSKV_API const char *const *mskv_cuda_embedded_lines(int32_t *count);
/* Joins it into buf; *size (optional) gets the length without the NUL. */
MSKV_API mskv_result mskv_cuda_embedded_source(char *buf, size_t cap, size_t *size);

/* // >>device store --------------------------------------------------------- */

typedef struct mskv_cuda_store mskv_cuda_store;

typedef struct mskv_cuda_store_desc {
    int32_t num_pages, page_size, num_layers, kv_heads, head_dim;
    mskv_dtype dtype;
    /* capacities of the fixed device plan buffers (0 = 64, 16384, 65536) */
    int32_t max_batch, max_tokens, max_page_ids;
    size_t staging_bytes;           /* offload/reload staging (0 = 16 MiB; at least one page of every layer) */
    int32_t plan_ring;              /* pinned plan buffers (0 = 3) */
} mskv_cuda_store_desc;

/* A plan's arrays in the store's fixed device buffers (same addresses on
   every upload). Counts are host values. */
typedef struct mskv_cuda_dplan {
    int32_t batch, total_q, num_page_ids, page_size;
    mskv_pos_mode pos_mode;
    mskv_cu_ptr qo_indptr, kv_indptr, kv_indices, kv_last_page_len, kv_len;
    mskv_cu_ptr kv_pos_split, kv_pos_shift, kv_token_indptr, slot_mapping, positions;
    uint64_t step;
} mskv_cuda_dplan;

/* Device pools, one per layer for K and one for V, layout
   [page][slot][kv_head][dim] (the host store's), a stream, staging buffers.
   Sizes are checked against what a kernel can index (64-bit offsets). */
MSKV_API mskv_result mskv_cuda_store_create(mskv_cuda *cu, const mskv_cuda_store_desc *desc, mskv_cuda_store **out);
/* Waits for the stream, then frees everything. */
MSKV_API void mskv_cuda_store_destroy(mskv_cuda_store *st);
/* Fills the geometry, store_ops (offload/reload/fork through the device) and
   MSKV_RETIRE_FENCED into an arena descriptor; other fields are kept. */
MSKV_API mskv_result mskv_cuda_store_arena_desc(mskv_cuda_store *st, mskv_arena_desc *desc);
/* The arena whose fences this store retires (created with the desc above). */
MSKV_API mskv_result mskv_cuda_store_bind(mskv_cuda_store *st, mskv_arena *arena);
MSKV_API const mskv_store_ops *mskv_cuda_store_ops(mskv_cuda_store *st);
MSKV_API mskv_cu_ptr mskv_cuda_store_pool(mskv_cuda_store *st, int32_t layer, int kind);
MSKV_API mskv_cu_stream mskv_cuda_store_stream(mskv_cuda_store *st);
/* Copies on the store's stream; return when the bytes have arrived. */
MSKV_API mskv_result mskv_cuda_upload(mskv_cuda_store *st, mskv_cu_ptr dst, const void *src, size_t bytes);
MSKV_API mskv_result mskv_cuda_download(mskv_cuda_store *st, void *dst, mskv_cu_ptr src, size_t bytes);
MSKV_API mskv_result mskv_cuda_store_sync(mskv_cuda_store *st);

/* // >>fences --------------------------------------------------------------- */

/* mskv_publish, then an event for the fence that ended, then a retire poll.
   Pages freed in a step return to the free list once its event completed. */
MSKV_API mskv_result mskv_cuda_publish(mskv_cuda_store *st, const mskv_segment *segs, int32_t n, uint64_t *step_out);
/* The same two parts, for a caller that publishes itself. */
MSKV_API mskv_result mskv_cuda_fence_record(mskv_cuda_store *st, uint64_t fence);
/* Retires every recorded fence whose event completed (wait: wait for all). */
MSKV_API mskv_result mskv_cuda_retire(mskv_cuda_store *st, int wait);

/* // >>launches ------------------------------------------------------------- */

/* Copies a plan into the store's fixed device buffers through a ring of
   pinned host buffers (each reused after its event). pos_mode says how many
   positions to copy. CAPACITY when a count exceeds the store's buffers;
   BAD_STATE during a capture. */
MSKV_API mskv_result mskv_cuda_plan_upload(mskv_cuda_store *st, const mskv_plan *plan, mskv_pos_mode pos_mode, mskv_cuda_dplan *out);
/* Scatters k, v (device, [total_q][kv_heads][head_dim], the store's dtype)
   into layer `layer` through plan->slot_mapping; rope (optional) rotates K on
   the way in at plan->positions. */
MSKV_API mskv_result mskv_cuda_write_kv(mskv_cuda_store *st, int32_t layer, const mskv_cuda_dplan *plan, mskv_cu_ptr k, mskv_cu_ptr v, const mskv_rope *rope);

/* // >>graphs --------------------------------------------------------------- */

typedef struct mskv_cuda_graph mskv_cuda_graph;
MSKV_API mskv_result mskv_cuda_capture_begin(mskv_cuda_store *st);
MSKV_API mskv_result mskv_cuda_capture_end(mskv_cuda_store *st, mskv_cuda_graph **out);
MSKV_API mskv_result mskv_cuda_graph_launch(mskv_cuda_store *st, mskv_cuda_graph *g);
MSKV_API void mskv_cuda_graph_destroy(mskv_cuda_store *st, mskv_cuda_graph *g);

/* // >>attention wrappers ---------------------------------------------------- */
#include "wip/mskv_cuda_attn_decl.h"

#ifdef __cplusplus
}
#endif
#endif /* MSTAR_KV_CUDA_H */

/* ========================================================================== */
#ifdef MSTAR_KV_CUDA_IMPLEMENTATION
#ifndef MSTAR_KV_CUDA_IMPLEMENTED
#define MSTAR_KV_CUDA_IMPLEMENTED

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/types.h>
#ifndef MSKV_NO_THREADS
#include <pthread.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* // >>embedded kernels ------------------------------------------------------
   Generated by tools/embed_kernels.sh from kernels.cu: do not edit by hand. */
/* >>kernels-begin */
static const char *const mskv__cuda_kernel_lines[] = {
    "/* kernels.cu - the GPU kernel blob of mstar_kv.\n",
    "\n",
    "   Self-contained CUDA C++ (no #include at all: NVRTC compiles it without any\n",
    "   -I), every kernel extern \"C\" __global__, specialised at JIT time by -D\n",
    "   defines. The same source also compiles as host C++17 under the emulation\n",
    "   layer (tests/emu/mskv_emu.h, included first), which runs each block on the\n",
    "   CPU with one fibre per GPU thread, so CI tests the kernels without a GPU.\n",
    "\n",
    "   Pools: per layer, K and V separately, layout [page][slot][kv_head][head_dim];\n",
    "   element (slot, h, d) at ((long long)slot * kv_heads + h) * head_dim + d,\n",
    "   slot = page * page_size + offset. All offsets are 64-bit.\n",
    "\n",
    "   Defines (the runtime passes every one a kernel uses):\n",
    "     MSKV_DTYPE      storage dtype of pools, K/V sources, q and o: 0 f32, 1 f16, 2 bf16\n",
    "     MSKV_HEAD_DIM   64, 128 or 256\n",
    "     MSKV_ROPE       0 none, 1 one-D, 2 three-D (kv_write and rope kernels)\n",
    "     MSKV_ROPE_STYLE 0 half: pairs (x[i], x[i+w/2]) in a part of width w;\n",
    "                     1 interleaved: pairs (x[2i], x[2i+1])\n",
    "     MSKV_ROPE_D0/D1/D2  part widths, consecutive from dim 0 (1-D uses D0;\n",
    "                     0 = head_dim for 1-D; for 3-D all 0 = the default split\n",
    "                     2*(p-2*(p/3)), 2*(p/3), 2*(p/3) with p = head_dim/2).\n",
    "                     Pair i of a part of width w turns by pos * theta^(-2i/w):\n",
    "                     (x, y) -> (x cos - y sin, x sin + y cos), in f32.\n",
    "     MSKV_ATTN_WARP_KEYS  attention only: 0 = prefill layout (4 warps x 16\n",
    "                     query rows, 64 rows per block); 1 = decode layout (16 rows\n",
    "                     per block, the 4 warps split each key tile, merged in smem)\n",
    "\n",
    "   Kernels, parameters and launch geometry:\n",
    "\n",
    "   mskv_kv_write(k_src, v_src, slot_mapping, n_tokens, kv_heads, k_pool,\n",
    "                 v_pool, pool_slots, positions, theta)\n",
    "     Row r = token * kv_heads + h of k_src/v_src ([n_tokens][kv_heads][D],\n",
    "     pool dtype) goes to slot slot_mapping[token]; slots < 0 or >= pool_slots\n",
    "     are skipped. With MSKV_ROPE, K is rotated on the way in at positions\n",
    "     ([n] or [n][3]); theta <= 0 means 10000.\n",
    "     Block 128, grid ceil(n_tokens * kv_heads / 4): one warp per row.\n",
    "\n",
    "   mskv_page_gather(pool, pages, n_pages, page_bytes, dst, dst_stride)\n",
    "   mskv_page_scatter(pool, pages, n_pages, page_bytes, src, src_stride)\n",
    "     Copy page pages[i] (page_bytes at pool + pages[i] * page_bytes) to / from\n",
    "     dst + i * dst_stride. Block 256, grid (min(ceil(page_bytes / 4096),\n",
    "     65535), n_pages); 16-byte accesses when every base, size and stride is\n",
    "     16-byte aligned, bytes otherwise.\n",
    "\n",
    "   mskv_rope(x, n, heads, positions, theta)\n",
    "     Rotates x [n][heads][D] in place. Block 128, grid ceil(n * heads / 4).\n",
    "\n",
    "   mskv_attn(q, k_pool, v_pool, qo_indptr, kv_indptr, kv_indices, kv_len,\n",
    "             kv_pos_split, kv_pos_shift, q_heads, kv_heads, page_size,\n",
    "             scale_log2, mask, window_left, kv_chunk, n_splits,\n",
    "             o, lse, o_part, lse_part)\n",
    "     Paged attention over a CSR plan (MSKV_DTYPE 1 or 2; mma.sync m16n8k16\n",
    "     with f32 accumulation). A block takes one (segment, kv head, key split)\n",
    "     and a tile of \"rows\", row = query * group + (q head within the kv head's\n",
    "     group), so every K/V byte is read once for all of a kv head's q heads.\n",
    "     Grid (ceil(max over segments of qo_len * group / BM), batch,\n",
    "     kv_heads * n_splits); block 128; dynamic shared memory\n",
    "     2 * (BM * D + 4 * BN * D) bytes (Q tile, two stages of K and V):\n",
    "     BM = 64 rows, BN = 64 keys (32 for D = 256) in the prefill layout,\n",
    "     BM = 16, BN = 64 in the decode layout (e.g. 80 KiB prefill at D = 128).\n",
    "     K/V tiles are gathered row by row through kv_indices with cp.async\n",
    "     (any page size), rows past kv_len zero-filled; S = Q K^T and O += P V\n",
    "     with ldmatrix(.trans) fragments and mma; online softmax in exp2.\n",
    "     Positions must not decrease with the compacted index (kv_pos_shift >= 0):\n",
    "     the mask's reach bounds the key range a block visits.\n",
    "     mask: 0 none, 1 causal (key pos <= query pos), 2 causal and\n",
    "     q - k <= window_left, on absolute positions. scale_log2 = scale * log2(e).\n",
    "     Keys of split s: [s * kv_chunk, (s + 1) * kv_chunk) (kv_chunk a multiple\n",
    "     of BN; n_splits 1 = no split). With n_splits == 1: o [total_q][q_heads][D]\n",
    "     (dtype) and lse [total_q][q_heads] (natural log; may be NULL). Otherwise\n",
    "     f32 partials o_part [n_splits][total_q][q_heads][D] and lse_part\n",
    "     [n_splits][total_q][q_heads], merged by mskv_lse_merge. A row that sees\n",
    "     no key: o = 0, lse = -inf.\n",
    "\n",
    "   mskv_state_merge(o_a, lse_a, o_b, lse_b, rows, o, lse)\n",
    "     Merges two partial states (f32 o [rows][D], lse [rows]) into o, lse\n",
    "     (f32; may alias either input). Block 128 (one warp per row), grid\n",
    "     ceil(rows / 4).\n",
    "\n",
    "   mskv_lse_merge(o_part, lse_part, n_parts, part_rows, rows, o, lse)\n",
    "     o/lse of each of `rows` rows (row = token * heads + head) from n_parts\n",
    "     partial states at o_part + p * part_rows * D, lse_part + p * part_rows.\n",
    "     Output o in MSKV_DTYPE (0 = f32; may alias part 0 when f32), lse f32\n",
    "     (may be NULL). Block 128 (one warp per row), grid ceil(rows / 4).\n",
    "*/\n",
    "\n",
    "/* >>primitives ---------------------------------------------------------- */\n",
    "#if defined(__CUDACC_RTC__) || defined(__CUDACC__)\n",
    "#define MSKV_GPU 1\n",
    "typedef unsigned short mskv_u16;\n",
    "typedef unsigned int mskv_u32;\n",
    "typedef long long mskv_i64;\n",
    "typedef unsigned long long mskv_u64;\n",
    "#define MSKV_KERNEL extern \"C\" __global__\n",
    "#define MSKV_DEV static __device__ __forceinline__\n",
    "#define MSKV_SMEM(name) extern __shared__ __align__(16) unsigned char name[]\n",
    "#define MSKV_RESTRICT __restrict__\n",
    "#define MSKV_UNROLL _Pragma(\"unroll\")\n",
    "MSKV_DEV int mskv_tid(void) { return (int)threadIdx.x; }\n",
    "MSKV_DEV int mskv_bid_x(void) { return (int)blockIdx.x; }\n",
    "MSKV_DEV int mskv_bid_y(void) { return (int)blockIdx.y; }\n",
    "MSKV_DEV int mskv_bid_z(void) { return (int)blockIdx.z; }\n",
    "MSKV_DEV int mskv_nblk_x(void) { return (int)gridDim.x; }\n",
    "MSKV_DEV int mskv_nblk_y(void) { return (int)gridDim.y; }\n",
    "MSKV_DEV float mskv_u_as_f(mskv_u32 u) { return __uint_as_float(u); }\n",
    "MSKV_DEV mskv_u32 mskv_f_as_u(float f) { return __float_as_uint(f); }\n",
    "MSKV_DEV void mskv_sync(void) { __syncthreads(); }\n",
    "/* A barrier the emulation can drop on purpose (planted-bug tests); always real here. */\n",
    "#define MSKV_SYNC_ID(id) __syncthreads()\n",
    "MSKV_DEV float mskv_shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }\n",
    "MSKV_DEV void mskv_syncwarp(void) { __syncwarp(); }\n",
    "MSKV_DEV float mskv_exp2(float x) { float y; asm(\"ex2.approx.ftz.f32 %0, %1;\" : \"=f\"(y) : \"f\"(x)); return y; }\n",
    "MSKV_DEV float mskv_h2f(mskv_u16 h) { float f; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h)); return f; }\n",
    "MSKV_DEV mskv_u16 mskv_f2h(float f) { mskv_u16 h; asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h; }\n",
    "MSKV_DEV float mskv_b2f(mskv_u16 h) { return __uint_as_float(((mskv_u32)h) << 16); }\n",
    "MSKV_DEV mskv_u16 mskv_f2b(float f) { mskv_u16 h; asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h; }\n",
    "MSKV_DEV mskv_u32 mskv_smem_addr(const void *p) { return (mskv_u32)__cvta_generic_to_shared(p); }\n",
    "/* D += A * B, m16n8k16, A row-major (4 regs), B column-major (2 regs), f32 accumulators. */\n",
    "MSKV_DEV void mskv_mma_f16(float d[4], const mskv_u32 a[4], const mskv_u32 b[2]) {\n",
    "    asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\"\n",
    "                 : \"+f\"(d[0]), \"+f\"(d[1]), \"+f\"(d[2]), \"+f\"(d[3])\n",
    "                 : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b[0]), \"r\"(b[1]));\n",
    "}\n",
    "MSKV_DEV void mskv_mma_bf16(float d[4], const mskv_u32 a[4], const mskv_u32 b[2]) {\n",
    "    asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\"\n",
    "                 : \"+f\"(d[0]), \"+f\"(d[1]), \"+f\"(d[2]), \"+f\"(d[3])\n",
    "                 : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b[0]), \"r\"(b[1]));\n",
    "}\n",
    "MSKV_DEV void mskv_ldsm_x4(mskv_u32 r[4], const void *smem_row) {\n",
    "    asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\"\n",
    "                 : \"=r\"(r[0]), \"=r\"(r[1]), \"=r\"(r[2]), \"=r\"(r[3]) : \"r\"(mskv_smem_addr(smem_row)));\n",
    "}\n",
    "MSKV_DEV void mskv_ldsm_x4_t(mskv_u32 r[4], const void *smem_row) {\n",
    "    asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\"\n",
    "                 : \"=r\"(r[0]), \"=r\"(r[1]), \"=r\"(r[2]), \"=r\"(r[3]) : \"r\"(mskv_smem_addr(smem_row)));\n",
    "}\n",
    "/* 16 bytes global -> shared, asynchronous; src_bytes 0 zero-fills the destination. */\n",
    "MSKV_DEV void mskv_cp_async16(void *smem_dst, const void *gsrc, int src_bytes) {\n",
    "    asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16, %2;\"\n",
    "                 :: \"r\"(mskv_smem_addr(smem_dst)), \"l\"(gsrc), \"r\"(src_bytes) : \"memory\");\n",
    "}\n",
    "MSKV_DEV void mskv_cp_commit(void) { asm volatile(\"cp.async.commit_group;\" ::: \"memory\"); }\n",
    "template <int N> MSKV_DEV void mskv_cp_wait(void) { asm volatile(\"cp.async.wait_group %0;\" :: \"n\"(N) : \"memory\"); }\n",
    "struct __align__(16) mskv_v16 { mskv_u32 x, y, z, w; };\n",
    "#else\n",
    "/* Host C++: tests/emu/mskv_emu.h must be included first; it defines the same\n",
    "   names (MSKV_KERNEL, MSKV_DEV, MSKV_SMEM, mskv_tid, mskv_sync, MSKV_SYNC_ID,\n",
    "   mskv_shfl_xor, mskv_syncwarp, mskv_exp2, conversions, mma, ldmatrix, cp.async, mskv_v16). */\n",
    "#ifndef MSKV_EMU_H\n",
    "#error \"kernels.cu: include tests/emu/mskv_emu.h before compiling the kernels on the host\"\n",
    "#endif\n",
    "#endif\n",
    "\n",
    "#ifndef MSKV_DTYPE\n",
    "#define MSKV_DTYPE 2\n",
    "#endif\n",
    "#ifndef MSKV_HEAD_DIM\n",
    "#define MSKV_HEAD_DIM 128\n",
    "#endif\n",
    "#ifndef MSKV_ROPE\n",
    "#define MSKV_ROPE 0\n",
    "#endif\n",
    "#ifndef MSKV_ROPE_STYLE\n",
    "#define MSKV_ROPE_STYLE 0\n",
    "#endif\n",
    "#ifndef MSKV_ROPE_D0\n",
    "#define MSKV_ROPE_D0 0\n",
    "#endif\n",
    "#ifndef MSKV_ROPE_D1\n",
    "#define MSKV_ROPE_D1 0\n",
    "#endif\n",
    "#ifndef MSKV_ROPE_D2\n",
    "#define MSKV_ROPE_D2 0\n",
    "#endif\n",
    "#ifndef MSKV_ATTN_WARP_KEYS\n",
    "#define MSKV_ATTN_WARP_KEYS 0\n",
    "#endif\n",
    "\n",
    "#define MSKV_D MSKV_HEAD_DIM\n",
    "#if MSKV_DTYPE == 0\n",
    "#define MSKV_ESIZE 4\n",
    "#else\n",
    "#define MSKV_ESIZE 2\n",
    "#endif\n",
    "\n",
    "/* >>elements ------------------------------------------------------------- */\n",
    "MSKV_DEV float mskv_load_el(const void *base, mskv_i64 i) {\n",
    "#if MSKV_DTYPE == 0\n",
    "    return ((const float *)base)[i];\n",
    "#elif MSKV_DTYPE == 1\n",
    "    return mskv_h2f(((const mskv_u16 *)base)[i]);\n",
    "#else\n",
    "    return mskv_b2f(((const mskv_u16 *)base)[i]);\n",
    "#endif\n",
    "}\n",
    "MSKV_DEV void mskv_store_el(void *base, mskv_i64 i, float v) {\n",
    "#if MSKV_DTYPE == 0\n",
    "    ((float *)base)[i] = v;\n",
    "#elif MSKV_DTYPE == 1\n",
    "    ((mskv_u16 *)base)[i] = mskv_f2h(v);\n",
    "#else\n",
    "    ((mskv_u16 *)base)[i] = mskv_f2b(v);\n",
    "#endif\n",
    "}\n",
    "\n",
    "/* >>rope ----------------------------------------------------------------- */\n",
    "#if MSKV_ROPE == 1\n",
    "#define MSKV_RD0 (MSKV_ROPE_D0 > 0 ? MSKV_ROPE_D0 : MSKV_D)\n",
    "#define MSKV_RD1 0\n",
    "#define MSKV_RD2 0\n",
    "#elif MSKV_ROPE == 2\n",
    "#if (MSKV_ROPE_D0 + MSKV_ROPE_D1 + MSKV_ROPE_D2) == 0\n",
    "#define MSKV_RD1 (2 * ((MSKV_D / 2) / 3))\n",
    "#define MSKV_RD2 (2 * ((MSKV_D / 2) / 3))\n",
    "#define MSKV_RD0 (MSKV_D - MSKV_RD1 - MSKV_RD2)\n",
    "#else\n",
    "#define MSKV_RD0 MSKV_ROPE_D0\n",
    "#define MSKV_RD1 MSKV_ROPE_D1\n",
    "#define MSKV_RD2 MSKV_ROPE_D2\n",
    "#endif\n",
    "#endif\n",
    "\n",
    "#if MSKV_ROPE != 0\n",
    "/* Pair p of the head (0 <= p < D/2): the two element indices it moves and its\n",
    "   angle. Pairs past the rotated parts keep (2p, 2p+1) unrotated. */\n",
    "MSKV_DEV void mskv_rope_pair(int p, const int *pos, float log2_theta, int *e0, int *e1, float *c, float *s) {\n",
    "    int base = 0, w = MSKV_RD0, axis = 0;\n",
    "    if (2 * p >= MSKV_RD0) { base = MSKV_RD0; w = MSKV_RD1; axis = 1; }\n",
    "    if (2 * p >= MSKV_RD0 + MSKV_RD1) { base = MSKV_RD0 + MSKV_RD1; w = MSKV_RD2; axis = 2; }\n",
    "    if (2 * p >= MSKV_RD0 + MSKV_RD1 + MSKV_RD2 || w == 0) {\n",
    "        *e0 = 2 * p; *e1 = 2 * p + 1; *c = 1.0f; *s = 0.0f;\n",
    "        return;\n",
    "    }\n",
    "    {\n",
    "        int i = p - base / 2;\n",
    "        float ang, inv_freq = exp2f(-(float)(2 * i) / (float)w * log2_theta);\n",
    "#if MSKV_ROPE_STYLE == 0\n",
    "        *e0 = base + i; *e1 = base + i + w / 2;\n",
    "#else\n",
    "        *e0 = base + 2 * i; *e1 = base + 2 * i + 1;\n",
    "#endif\n",
    "        ang = (float)pos[MSKV_ROPE == 2 ? axis : 0] * inv_freq;\n",
    "        *c = cosf(ang); *s = sinf(ang);\n",
    "    }\n",
    "}\n",
    "\n",
    "/* Rotates one row src -> dst (both D elements of the pool dtype; may alias). */\n",
    "MSKV_DEV void mskv_rope_row(const void *src, void *dst, const int *pos, float theta, int lane) {\n",
    "    float l2t = log2f(theta > 0.0f ? theta : 10000.0f);\n",
    "    for (int p = lane; p < MSKV_D / 2; p += 32) {\n",
    "        int e0, e1;\n",
    "        float c, s, x, y;\n",
    "        mskv_rope_pair(p, pos, l2t, &e0, &e1, &c, &s);\n",
    "        x = mskv_load_el(src, e0);\n",
    "        y = mskv_load_el(src, e1);\n",
    "        mskv_store_el(dst, e0, x * c - y * s);\n",
    "        mskv_store_el(dst, e1, x * s + y * c);\n",
    "    }\n",
    "}\n",
    "#endif\n",
    "\n",
    "/* >>kv write ------------------------------------------------------------- */\n",
    "/* Copies one row of D elements with 16-byte accesses (rows are 16-byte aligned:\n",
    "   D * esize is a multiple of 16 and the bases come from the allocator). */\n",
    "MSKV_DEV void mskv_copy_row(const void *src, void *dst, int lane) {\n",
    "    const mskv_v16 *s = (const mskv_v16 *)src;\n",
    "    mskv_v16 *d = (mskv_v16 *)dst;\n",
    "    for (int c = lane; c < MSKV_D * MSKV_ESIZE / 16; c += 32) d[c] = s[c];\n",
    "}\n",
    "\n",
    "MSKV_KERNEL void mskv_kv_write(const void *k_src, const void *v_src, const mskv_i64 *slot_mapping,\n",
    "                               int n_tokens, int kv_heads, void *k_pool, void *v_pool,\n",
    "                               mskv_i64 pool_slots, const int *positions, float theta) {\n",
    "    int lane = mskv_tid() & 31;\n",
    "    mskv_i64 row = (mskv_i64)mskv_bid_x() * 4 + (mskv_tid() >> 5);\n",
    "    mskv_i64 token, slot, h, src_off, dst_off;\n",
    "    if (row >= (mskv_i64)n_tokens * kv_heads) return;\n",
    "    token = row / kv_heads;\n",
    "    h = row - token * kv_heads;\n",
    "    slot = slot_mapping[token];\n",
    "    if (slot < 0 || slot >= pool_slots) return;\n",
    "    src_off = row * MSKV_D * MSKV_ESIZE;\n",
    "    dst_off = (slot * kv_heads + h) * MSKV_D * MSKV_ESIZE;\n",
    "#if MSKV_ROPE != 0\n",
    "    mskv_copy_row((const unsigned char *)v_src + src_off, (unsigned char *)v_pool + dst_off, lane);\n",
    "    mskv_rope_row((const unsigned char *)k_src + src_off, (unsigned char *)k_pool + dst_off,\n",
    "                  positions + (MSKV_ROPE == 2 ? 3 * token : token), theta, lane);\n",
    "#else\n",
    "    {\n",
    "        /* K and V chunks in one loop, so a 256-byte row pair keeps all 32 lanes busy */\n",
    "        const int ch = MSKV_D * MSKV_ESIZE / 16;\n",
    "        (void)positions; (void)theta;\n",
    "        for (int c = lane; c < 2 * ch; c += 32) {\n",
    "            int v = c >= ch, cc = c - (v ? ch : 0);\n",
    "            const mskv_v16 *s = (const mskv_v16 *)((const unsigned char *)(v ? v_src : k_src) + src_off);\n",
    "            mskv_v16 *d = (mskv_v16 *)((unsigned char *)(v ? v_pool : k_pool) + dst_off);\n",
    "            d[cc] = s[cc];\n",
    "        }\n",
    "    }\n",
    "#endif\n",
    "}\n",
    "\n",
    "MSKV_KERNEL void mskv_rope(void *x, mskv_i64 n, int heads, const int *positions, float theta) {\n",
    "    int lane = mskv_tid() & 31;\n",
    "    mskv_i64 row = (mskv_i64)mskv_bid_x() * 4 + (mskv_tid() >> 5);\n",
    "    if (row >= n * heads) return;\n",
    "#if MSKV_ROPE != 0\n",
    "    {\n",
    "        mskv_i64 token = row / heads;\n",
    "        unsigned char *p = (unsigned char *)x + row * MSKV_D * MSKV_ESIZE;\n",
    "        mskv_rope_row(p, p, positions + (MSKV_ROPE == 2 ? 3 * token : token), theta, lane);\n",
    "    }\n",
    "#else\n",
    "    (void)x; (void)positions; (void)theta; (void)lane;\n",
    "#endif\n",
    "}\n",
    "\n",
    "/* >>page copy ------------------------------------------------------------ */\n",
    "MSKV_DEV void mskv_copy_bytes(const unsigned char *src, unsigned char *dst, mskv_i64 n, int vec) {\n",
    "    mskv_i64 chunk = (mskv_i64)mskv_bid_x() * 4096;\n",
    "    mskv_i64 step = (mskv_i64)mskv_nblk_x() * 4096;\n",
    "    for (; chunk < n; chunk += step) {\n",
    "        mskv_i64 end = chunk + 4096 < n ? chunk + 4096 : n;\n",
    "        if (vec) {\n",
    "            for (mskv_i64 i = chunk + 16 * (mskv_i64)mskv_tid(); i < end; i += 16 * 256)\n",
    "                *(mskv_v16 *)(dst + i) = *(const mskv_v16 *)(src + i);\n",
    "        } else {\n",
    "            for (mskv_i64 i = chunk + mskv_tid(); i < end; i += 256) dst[i] = src[i];\n",
    "        }\n",
    "    }\n",
    "}\n",
    "\n",
    "MSKV_KERNEL void mskv_page_gather(const unsigned char *pool, const int *pages, int n_pages,\n",
    "                                  mskv_i64 page_bytes, unsigned char *dst, mskv_i64 dst_stride) {\n",
    "    int i = mskv_bid_y();\n",
    "    const unsigned char *s;\n",
    "    unsigned char *d;\n",
    "    if (i >= n_pages) return;\n",
    "    s = pool + (mskv_i64)pages[i] * page_bytes;\n",
    "    d = dst + (mskv_i64)i * dst_stride;\n",
    "    mskv_copy_bytes(s, d, page_bytes,\n",
    "                    (((mskv_u64)pool | (mskv_u64)dst | (mskv_u64)page_bytes | (mskv_u64)dst_stride) & 15) == 0);\n",
    "}\n",
    "\n",
    "MSKV_KERNEL void mskv_page_scatter(unsigned char *pool, const int *pages, int n_pages,\n",
    "                                   mskv_i64 page_bytes, const unsigned char *src, mskv_i64 src_stride) {\n",
    "    int i = mskv_bid_y();\n",
    "    const unsigned char *s;\n",
    "    unsigned char *d;\n",
    "    if (i >= n_pages) return;\n",
    "    s = src + (mskv_i64)i * src_stride;\n",
    "    d = pool + (mskv_i64)pages[i] * page_bytes;\n",
    "    mskv_copy_bytes(s, d, page_bytes,\n",
    "                    (((mskv_u64)pool | (mskv_u64)src | (mskv_u64)page_bytes | (mskv_u64)src_stride) & 15) == 0);\n",
    "}\n",
    "\n",
    "/* >>attention ------------------------------------------------------------ */\n",
    "MSKV_DEV float mskv_neg_inf(void) { return mskv_u_as_f(0xff800000u); }\n",
    "\n",
    "/* LSE merge: one warp per row, any dtype out. */\n",
    "MSKV_KERNEL void mskv_lse_merge(const float *o_part, const float *lse_part, int n_parts, mskv_i64 part_rows,\n",
    "                                mskv_i64 rows, void *o, float *lse) {\n",
    "    int lane = mskv_tid() & 31;\n",
    "    mskv_i64 row = (mskv_i64)mskv_bid_x() * 4 + (mskv_tid() >> 5);\n",
    "    float m = mskv_neg_inf(), sum = 0.0f;\n",
    "    float acc[MSKV_D / 32];\n",
    "    if (row >= rows) return;\n",
    "    for (int p = 0; p < n_parts; p++) m = fmaxf(m, lse_part[p * part_rows + row]);\n",
    "    for (int i = 0; i < MSKV_D / 32; i++) acc[i] = 0.0f;\n",
    "    if (m != mskv_neg_inf()) {\n",
    "        for (int p = 0; p < n_parts; p++) {\n",
    "            float l = lse_part[p * part_rows + row], w;\n",
    "            if (l == mskv_neg_inf()) continue;  /* an empty part: its o may be anything */\n",
    "            w = expf(l - m);\n",
    "            sum += w;\n",
    "            for (int i = 0; i < MSKV_D / 32; i++) acc[i] += w * o_part[(p * part_rows + row) * MSKV_D + lane + 32 * i];\n",
    "        }\n",
    "    }\n",
    "    for (int i = 0; i < MSKV_D / 32; i++)\n",
    "        mskv_store_el(o, row * MSKV_D + lane + 32 * i, sum > 0.0f ? acc[i] / sum : 0.0f);\n",
    "    if (lse && lane == 0) lse[row] = sum > 0.0f ? m + logf(sum) : mskv_neg_inf();\n",
    "}\n",
    "\n",
    "/* Two partial states over disjoint keys -> their union (f32 o, any aliasing\n",
    "   of o with o_a or o_b allowed: each element is read before it is written). */\n",
    "MSKV_KERNEL void mskv_state_merge(const float *o_a, const float *lse_a, const float *o_b, const float *lse_b,\n",
    "                                  mskv_i64 rows, float *o, float *lse) {\n",
    "    int lane = mskv_tid() & 31;\n",
    "    mskv_i64 row = (mskv_i64)mskv_bid_x() * 4 + (mskv_tid() >> 5);\n",
    "    float la, lb, m, wa, wb, sum;\n",
    "    if (row >= rows) return;\n",
    "    la = lse_a[row]; lb = lse_b[row];\n",
    "    m = fmaxf(la, lb);\n",
    "    wa = la == mskv_neg_inf() ? 0.0f : expf(la - m);\n",
    "    wb = lb == mskv_neg_inf() ? 0.0f : expf(lb - m);\n",
    "    sum = wa + wb;\n",
    "    for (int d = lane; d < MSKV_D; d += 32) {\n",
    "        mskv_i64 i = row * MSKV_D + d;\n",
    "        float x = (wa > 0.0f ? wa * o_a[i] : 0.0f) + (wb > 0.0f ? wb * o_b[i] : 0.0f);\n",
    "        o[i] = sum > 0.0f ? x / sum : 0.0f;\n",
    "    }\n",
    "    mskv_syncwarp();  /* every lane has read lse_a/lse_b[row] before it may be overwritten */\n",
    "    if (lse && lane == 0) lse[row] = sum > 0.0f ? m + logf(sum) : mskv_neg_inf();\n",
    "}\n",
    "\n",
    "#if MSKV_DTYPE != 0\n",
    "/* Tiles: BM query rows per block, BN keys per K/V tile (two stages), 4 warps.\n",
    "   Prefill: warp w owns rows [16w, 16w+16) and every key of a tile.\n",
    "   Decode: the block has 16 rows; warp w takes keys [16w, 16w+16) of each tile;\n",
    "   the four partial softmax states are merged through shared memory. */\n",
    "#if MSKV_ATTN_WARP_KEYS\n",
    "#define MSKV_BM 16\n",
    "#define MSKV_BN 64\n",
    "#define MSKV_WK 16\n",
    "#else\n",
    "#define MSKV_BM 64\n",
    "#define MSKV_BN (MSKV_D >= 256 ? 32 : 64)\n",
    "#define MSKV_WK MSKV_BN\n",
    "#endif\n",
    "#define MSKV_CH (MSKV_D / 8)          /* 16-byte chunks per row */\n",
    "#define MSKV_NT (MSKV_WK / 8)         /* n-tiles of 8 keys per warp and tile */\n",
    "#define MSKV_QREG (MSKV_D <= 128)     /* keep Q fragments in registers */\n",
    "#define MSKV_ATTN_SMEM (2 * (MSKV_BM * MSKV_D + 4 * MSKV_BN * MSKV_D))\n",
    "\n",
    "/* Element offset of 16-byte chunk c of row r: XOR swizzle, so the 8 rows an\n",
    "   ldmatrix reads fall in 8 different bank groups. */\n",
    "MSKV_DEV int mskv_swz(int r, int c) { return (r * MSKV_CH + (c ^ (r & 7))) * 8; }\n",
    "\n",
    "MSKV_DEV mskv_u32 mskv_pack2(float lo, float hi) {\n",
    "#if MSKV_DTYPE == 1\n",
    "    return (mskv_u32)mskv_f2h(lo) | ((mskv_u32)mskv_f2h(hi) << 16);\n",
    "#else\n",
    "    return (mskv_u32)mskv_f2b(lo) | ((mskv_u32)mskv_f2b(hi) << 16);\n",
    "#endif\n",
    "}\n",
    "MSKV_DEV void mskv_mma(float d[4], const mskv_u32 a[4], const mskv_u32 b[2]) {\n",
    "#if MSKV_DTYPE == 1\n",
    "    mskv_mma_f16(d, a, b);\n",
    "#else\n",
    "    mskv_mma_bf16(d, a, b);\n",
    "#endif\n",
    "}\n",
    "\n",
    "/* Absolute position of compacted index j. */\n",
    "MSKV_DEV int mskv_abs_pos(int j, int split, int shift) { return j < split ? j : j + shift; }\n",
    "/* The smallest compacted index whose position is >= p (positions increase with j). */\n",
    "MSKV_DEV int mskv_first_at(int p, int split, int shift) {\n",
    "    if (p < split) return p > 0 ? p : 0;\n",
    "    return p - shift > split ? p - shift : split;\n",
    "}\n",
    "\n",
    "struct mskv_tile_ctx {\n",
    "    const unsigned char *k_pool, *v_pool;\n",
    "    const int *pages;\n",
    "    int page_size, kv_heads, kvh, n_hi;\n",
    "};\n",
    "\n",
    "/* Issues the cp.async copies of keys [n0, n0 + BN) of K and V into one stage,\n",
    "   each row found through the page table; rows past n_hi are zero-filled (a\n",
    "   page's unused slots may hold anything, NaN included). */\n",
    "MSKV_DEV void mskv_load_kv(const mskv_tile_ctx &c, mskv_u16 *sk, mskv_u16 *sv, int n0) {\n",
    "    for (int idx = mskv_tid(); idx < MSKV_BN * MSKV_CH; idx += 128) {\n",
    "        int r = idx / MSKV_CH, ch = idx % MSKV_CH, j = n0 + r, ok = j < c.n_hi;\n",
    "        mskv_i64 off = 0;\n",
    "        if (ok) {\n",
    "            mskv_i64 slot = (mskv_i64)c.pages[j / c.page_size] * c.page_size + j % c.page_size;\n",
    "            off = ((slot * c.kv_heads + c.kvh) * MSKV_D + ch * 8) * 2;\n",
    "        }\n",
    "        mskv_cp_async16(sk + mskv_swz(r, ch), c.k_pool + off, ok ? 16 : 0);\n",
    "        mskv_cp_async16(sv + mskv_swz(r, ch), c.v_pool + off, ok ? 16 : 0);\n",
    "    }\n",
    "}\n",
    "\n",
    "MSKV_KERNEL void mskv_attn(const void *q, const void *k_pool, const void *v_pool,\n",
    "                           const int *qo_indptr, const int *kv_indptr, const int *kv_indices,\n",
    "                           const int *kv_len, const int *kv_pos_split, const int *kv_pos_shift,\n",
    "                           int q_heads, int kv_heads, int page_size, float scale_log2,\n",
    "                           int mask, int window_left, int kv_chunk, int n_splits,\n",
    "                           void *o, float *lse, float *o_part, float *lse_part) {\n",
    "    MSKV_SMEM(smem);\n",
    "    mskv_u16 *sq = (mskv_u16 *)smem;\n",
    "    mskv_u16 *sk = sq + MSKV_BM * MSKV_D;       /* [2][BN][D] */\n",
    "    mskv_u16 *sv = sk + 2 * MSKV_BN * MSKV_D;   /* [2][BN][D] */\n",
    "    const int tid = mskv_tid(), warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;\n",
    "    const int b = mskv_bid_y(), kvh = mskv_bid_z() % kv_heads, split = mskv_bid_z() / kv_heads;\n",
    "    const int group = q_heads / kv_heads;\n",
    "    const int q0 = qo_indptr[b], qo_len = qo_indptr[b + 1] - q0;\n",
    "    const int rows = qo_len * group, row0 = mskv_bid_x() * MSKV_BM;\n",
    "    const int kvl = kv_len[b], psplit = kv_pos_split[b], pshift = kv_pos_shift[b];\n",
    "    const int wrow0 = MSKV_ATTN_WARP_KEYS ? 0 : warp * 16;   /* the warp's first row in the block */\n",
    "    const int wkey0 = MSKV_ATTN_WARP_KEYS ? warp * 16 : 0;   /* the warp's first key in a tile */\n",
    "    int n_lo, n_hi, n_tiles;\n",
    "    int qpos[2], rvalid[2];\n",
    "    float m[2], l[2], oacc[MSKV_D / 8][4];\n",
    "    mskv_tile_ctx tc;\n",
    "    if (row0 >= rows) return;  /* whole block: before any barrier */\n",
    "\n",
    "    /* keys this block needs: its split, cut by the mask's reach */\n",
    "    n_lo = n_splits > 1 ? split * kv_chunk : 0;\n",
    "    n_hi = n_splits > 1 ? (n_lo + kv_chunk < kvl ? n_lo + kv_chunk : kvl) : kvl;\n",
    "    {\n",
    "        int last = row0 + MSKV_BM - 1 < rows - 1 ? row0 + MSKV_BM - 1 : rows - 1;\n",
    "        int qi_first = kvl - qo_len + row0 / group, qi_last = kvl - qo_len + last / group;\n",
    "        if (mask >= 1 && qi_last + 1 < n_hi) n_hi = qi_last + 1;\n",
    "        if (mask == 2) {\n",
    "            int lo = mskv_first_at(mskv_abs_pos(qi_first, psplit, pshift) - window_left, psplit, pshift);\n",
    "            if (lo > n_lo) n_lo = lo;\n",
    "        }\n",
    "    }\n",
    "    n_tiles = n_hi > n_lo ? (n_hi - n_lo + MSKV_BN - 1) / MSKV_BN : 0;\n",
    "    tc.k_pool = (const unsigned char *)k_pool;\n",
    "    tc.v_pool = (const unsigned char *)v_pool;\n",
    "    tc.pages = kv_indices + kv_indptr[b];\n",
    "    tc.page_size = page_size; tc.kv_heads = kv_heads; tc.kvh = kvh; tc.n_hi = n_hi;\n",
    "\n",
    "    /* Q tile: row r of the block is query (row0 + r) / group, q head kvh * group + (row0 + r) % group */\n",
    "    for (int idx = tid; idx < MSKV_BM * MSKV_CH; idx += 128) {\n",
    "        int r = idx / MSKV_CH, ch = idx % MSKV_CH, R = row0 + r, ok = R < rows;\n",
    "        mskv_i64 off = 0;\n",
    "        if (ok) off = (((mskv_i64)(q0 + R / group) * q_heads + kvh * group + R % group) * MSKV_D + ch * 8) * 2;\n",
    "        mskv_cp_async16(sq + mskv_swz(r, ch), (const unsigned char *)q + off, ok ? 16 : 0);\n",
    "    }\n",
    "    mskv_cp_commit();\n",
    "    if (n_tiles > 0) mskv_load_kv(tc, sk, sv, n_lo);\n",
    "    mskv_cp_commit();\n",
    "\n",
    "    for (int h = 0; h < 2; h++) {\n",
    "        int R = row0 + wrow0 + g + 8 * h;\n",
    "        rvalid[h] = R < rows;\n",
    "        qpos[h] = mskv_abs_pos(kvl - qo_len + (rvalid[h] ? R : rows - 1) / group, psplit, pshift);\n",
    "        m[h] = mskv_neg_inf();\n",
    "        l[h] = 0.0f;\n",
    "    }\n",
    "MSKV_UNROLL\n",
    "    for (int i = 0; i < MSKV_D / 8; i++) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.0f;\n",
    "\n",
    "#if MSKV_QREG\n",
    "    mskv_u32 qf[MSKV_D / 16][4];\n",
    "#endif\n",
    "    for (int it = 0; it < n_tiles; it++) {\n",
    "        const int st = it & 1, n0 = n_lo + it * MSKV_BN;\n",
    "        const mskv_u16 *tk = sk + st * MSKV_BN * MSKV_D, *tv = sv + st * MSKV_BN * MSKV_D;\n",
    "        float s[MSKV_NT][4];\n",
    "        if (it + 1 < n_tiles) {\n",
    "            mskv_load_kv(tc, sk + (st ^ 1) * MSKV_BN * MSKV_D, sv + (st ^ 1) * MSKV_BN * MSKV_D, n0 + MSKV_BN);\n",
    "            mskv_cp_commit();\n",
    "            mskv_cp_wait<1>();\n",
    "        } else {\n",
    "            mskv_cp_wait<0>();\n",
    "        }\n",
    "        MSKV_SYNC_ID(1);  /* this stage (and Q) landed for every thread */\n",
    "#if MSKV_QREG\n",
    "        if (it == 0) {\n",
    "MSKV_UNROLL\n",
    "            for (int kk = 0; kk < MSKV_D / 16; kk++)\n",
    "                mskv_ldsm_x4(qf[kk], sq + mskv_swz(wrow0 + (lane & 15), 2 * kk + (lane >> 4)));\n",
    "        }\n",
    "#endif\n",
    "        /* S = Q K^T for the warp's 16 rows x WK keys */\n",
    "MSKV_UNROLL\n",
    "        for (int nt = 0; nt < MSKV_NT; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;\n",
    "MSKV_UNROLL\n",
    "        for (int kk = 0; kk < MSKV_D / 16; kk++) {\n",
    "#if MSKV_QREG\n",
    "            const mskv_u32 *a = qf[kk];\n",
    "#else\n",
    "            mskv_u32 a[4];\n",
    "            mskv_ldsm_x4(a, sq + mskv_swz(wrow0 + (lane & 15), 2 * kk + (lane >> 4)));\n",
    "#endif\n",
    "MSKV_UNROLL\n",
    "            for (int np = 0; np < MSKV_NT / 2; np++) {\n",
    "                mskv_u32 kb[4];\n",
    "                mskv_ldsm_x4(kb, tk + mskv_swz(wkey0 + np * 16 + (lane & 7) + (lane >> 4) * 8, 2 * kk + ((lane >> 3) & 1)));\n",
    "                mskv_mma(s[2 * np], a, kb);\n",
    "                mskv_mma(s[2 * np + 1], a, kb + 2);\n",
    "            }\n",
    "        }\n",
    "        /* mask, scale, online softmax (log2 domain) */\n",
    "        {\n",
    "            float mx[2], alpha[2];\n",
    "            mx[0] = m[0]; mx[1] = m[1];\n",
    "MSKV_UNROLL\n",
    "            for (int nt = 0; nt < MSKV_NT; nt++) {\n",
    "MSKV_UNROLL\n",
    "                for (int e = 0; e < 4; e++) {\n",
    "                    int h = e >> 1, j = n0 + wkey0 + nt * 8 + 2 * t4 + (e & 1);\n",
    "                    int kp = mskv_abs_pos(j, psplit, pshift);\n",
    "                    int ok = j >= n_lo && j < n_hi;\n",
    "                    if (mask >= 1) ok = ok && kp <= qpos[h];\n",
    "                    if (mask == 2) ok = ok && qpos[h] - kp <= window_left;\n",
    "                    s[nt][e] = ok ? s[nt][e] * scale_log2 : mskv_neg_inf();\n",
    "                    mx[h] = fmaxf(mx[h], s[nt][e]);\n",
    "                }\n",
    "            }\n",
    "MSKV_UNROLL\n",
    "            for (int h = 0; h < 2; h++) {\n",
    "                float mu;\n",
    "                mx[h] = fmaxf(mx[h], mskv_shfl_xor(mx[h], 1));\n",
    "                mx[h] = fmaxf(mx[h], mskv_shfl_xor(mx[h], 2));\n",
    "                mu = mx[h] == mskv_neg_inf() ? 0.0f : mx[h];  /* nothing seen yet: keep exp2 finite */\n",
    "                alpha[h] = mskv_exp2(m[h] - mu);\n",
    "                m[h] = mx[h];\n",
    "                l[h] *= alpha[h];\n",
    "                mx[h] = mu;\n",
    "            }\n",
    "MSKV_UNROLL\n",
    "            for (int i = 0; i < MSKV_D / 8; i++) {\n",
    "                oacc[i][0] *= alpha[0]; oacc[i][1] *= alpha[0];\n",
    "                oacc[i][2] *= alpha[1]; oacc[i][3] *= alpha[1];\n",
    "            }\n",
    "MSKV_UNROLL\n",
    "            for (int nt = 0; nt < MSKV_NT; nt++) {\n",
    "MSKV_UNROLL\n",
    "                for (int e = 0; e < 4; e++) {\n",
    "                    s[nt][e] = mskv_exp2(s[nt][e] - mx[e >> 1]);\n",
    "                    l[e >> 1] += s[nt][e];\n",
    "                }\n",
    "            }\n",
    "        }\n",
    "        /* O += P V: P from the S accumulators (C layout == A layout per 16 keys) */\n",
    "MSKV_UNROLL\n",
    "        for (int ks = 0; ks < MSKV_NT / 2; ks++) {\n",
    "            mskv_u32 pa[4];\n",
    "            pa[0] = mskv_pack2(s[2 * ks][0], s[2 * ks][1]);\n",
    "            pa[1] = mskv_pack2(s[2 * ks][2], s[2 * ks][3]);\n",
    "            pa[2] = mskv_pack2(s[2 * ks + 1][0], s[2 * ks + 1][1]);\n",
    "            pa[3] = mskv_pack2(s[2 * ks + 1][2], s[2 * ks + 1][3]);\n",
    "MSKV_UNROLL\n",
    "            for (int dp = 0; dp < MSKV_D / 16; dp++) {\n",
    "                mskv_u32 vb[4];\n",
    "                mskv_ldsm_x4_t(vb, tv + mskv_swz(wkey0 + ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, 2 * dp + (lane >> 4)));\n",
    "                mskv_mma(oacc[2 * dp], pa, vb);\n",
    "                mskv_mma(oacc[2 * dp + 1], pa, vb + 2);\n",
    "            }\n",
    "        }\n",
    "        MSKV_SYNC_ID(2);  /* everyone is done with this stage before it is refilled */\n",
    "    }\n",
    "    mskv_cp_wait<0>();\n",
    "\n",
    "    /* row sums were kept per lane; the 4 lanes of a row add them up */\n",
    "    for (int h = 0; h < 2; h++) {\n",
    "        l[h] += mskv_shfl_xor(l[h], 1);\n",
    "        l[h] += mskv_shfl_xor(l[h], 2);\n",
    "    }\n",
    "    {\n",
    "        const mskv_i64 total_q = qo_indptr[mskv_nblk_y()];\n",
    "        const float ln2 = 0.6931471805599453f;\n",
    "#if MSKV_ATTN_WARP_KEYS\n",
    "        /* merge the 4 warps' states: smem [warp][16][D] f32 o, then m and l */\n",
    "        float *mo = (float *)smem, *mm = mo + 4 * 16 * MSKV_D, *ml = mm + 4 * 16;\n",
    "        MSKV_SYNC_ID(3);  /* K/V tiles are dead: reuse shared memory */\n",
    "MSKV_UNROLL\n",
    "        for (int i = 0; i < MSKV_D / 8; i++) {\n",
    "            float *p0 = mo + (warp * 16 + g) * MSKV_D + i * 8 + 2 * t4, *p1 = p0 + 8 * MSKV_D;\n",
    "            p0[0] = oacc[i][0]; p0[1] = oacc[i][1]; p1[0] = oacc[i][2]; p1[1] = oacc[i][3];\n",
    "        }\n",
    "        if (t4 == 0) {\n",
    "            mm[warp * 16 + g] = m[0]; mm[warp * 16 + g + 8] = m[1];\n",
    "            ml[warp * 16 + g] = l[0]; ml[warp * 16 + g + 8] = l[1];\n",
    "        }\n",
    "        MSKV_SYNC_ID(4);\n",
    "        for (int idx = tid; idx < 16 * MSKV_D; idx += 128) {\n",
    "            int r = idx / MSKV_D, d = idx % MSKV_D, R = row0 + r;\n",
    "            float M = mskv_neg_inf(), L = 0.0f, acc = 0.0f;\n",
    "            mskv_i64 orow;\n",
    "            if (R >= rows) continue;\n",
    "            for (int w = 0; w < 4; w++) M = fmaxf(M, mm[w * 16 + r]);\n",
    "            if (M != mskv_neg_inf()) {\n",
    "                for (int w = 0; w < 4; w++) {\n",
    "                    float f = mskv_exp2(mm[w * 16 + r] - M);\n",
    "                    L += f * ml[w * 16 + r];\n",
    "                    acc += f * mo[(w * 16 + r) * MSKV_D + d];\n",
    "                }\n",
    "            }\n",
    "            orow = (mskv_i64)(q0 + R / group) * q_heads + kvh * group + R % group;\n",
    "            if (n_splits > 1) {\n",
    "                o_part[((mskv_i64)split * total_q * q_heads + orow) * MSKV_D + d] = L > 0.0f ? acc / L : 0.0f;\n",
    "                if (d == 0) lse_part[(mskv_i64)split * total_q * q_heads + orow] = L > 0.0f ? (M + log2f(L)) * ln2 : mskv_neg_inf();\n",
    "            } else {\n",
    "                mskv_store_el(o, orow * MSKV_D + d, L > 0.0f ? acc / L : 0.0f);\n",
    "                if (lse && d == 0) lse[orow] = L > 0.0f ? (M + log2f(L)) * ln2 : mskv_neg_inf();\n",
    "            }\n",
    "        }\n",
    "#else\n",
    "        for (int h = 0; h < 2; h++) {\n",
    "            int R = row0 + wrow0 + g + 8 * h;\n",
    "            float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;\n",
    "            float lv = l[h] > 0.0f ? (m[h] + log2f(l[h])) * ln2 : mskv_neg_inf();\n",
    "            mskv_i64 orow;\n",
    "            if (!rvalid[h]) continue;\n",
    "            orow = (mskv_i64)(q0 + R / group) * q_heads + kvh * group + R % group;\n",
    "            if (n_splits > 1) {\n",
    "                float *dst = o_part + ((mskv_i64)split * total_q * q_heads + orow) * MSKV_D + 2 * t4;\n",
    "MSKV_UNROLL\n",
    "                for (int i = 0; i < MSKV_D / 8; i++) { dst[i * 8] = oacc[i][2 * h] * inv; dst[i * 8 + 1] = oacc[i][2 * h + 1] * inv; }\n",
    "                if (t4 == 0) lse_part[(mskv_i64)split * total_q * q_heads + orow] = lv;\n",
    "            } else {\n",
    "                mskv_u32 *dst = (mskv_u32 *)((mskv_u16 *)o + orow * MSKV_D + 2 * t4);\n",
    "MSKV_UNROLL\n",
    "                for (int i = 0; i < MSKV_D / 8; i++) dst[i * 4] = mskv_pack2(oacc[i][2 * h] * inv, oacc[i][2 * h + 1] * inv);\n",
    "                if (lse && t4 == 0) lse[orow] = lv;\n",
    "            }\n",
    "        }\n",
    "#endif\n",
    "    }\n",
    "}\n",
    "#endif /* MSKV_DTYPE != 0 */\n",
    "\n",
    "/* Shared memory the attention kernel of these defines needs (host side\n",
    "   mirrors this in the launch wrapper). */\n",
    "#define MSKV_ATTN_SMEM_BYTES_OF(bm, bn, d) (2 * ((bm) * (d) + 4 * (bn) * (d)))\n",
    "\n",
    "#ifndef MSKV_GPU\n",
    "/* Host emulation: let a test include this file again with other defines. */\n",
    "#undef MSKV_DTYPE\n",
    "#undef MSKV_HEAD_DIM\n",
    "#undef MSKV_ROPE\n",
    "#undef MSKV_ROPE_STYLE\n",
    "#undef MSKV_ROPE_D0\n",
    "#undef MSKV_ROPE_D1\n",
    "#undef MSKV_ROPE_D2\n",
    "#undef MSKV_ATTN_WARP_KEYS\n",
    "#undef MSKV_D\n",
    "#undef MSKV_ESIZE\n",
    "#undef MSKV_RD0\n",
    "#undef MSKV_RD1\n",
    "#undef MSKV_RD2\n",
    "#undef MSKV_BM\n",
    "#undef MSKV_BN\n",
    "#undef MSKV_WK\n",
    "#undef MSKV_CH\n",
    "#undef MSKV_NT\n",
    "#undef MSKV_QREG\n",
    "#undef MSKV_ATTN_SMEM\n",
    "#undef MSKV_ATTN_SMEM_BYTES_OF\n",
    "#endif\n",
};
/* >>kernels-end */

/* // >>helpers ------------------------------------------------------------- */

#define MSKV__CUDA_CACHE_FORMAT 1u
#if defined(__GNUC__)
#define MSKV__CUDA_MAYBE_UNUSED __attribute__((unused))
#else
#define MSKV__CUDA_MAYBE_UNUSED
#endif
#define MSKV__CUDA_ABI_VERSION 12000

static void *mskv__cuda_alloc(const mskv_allocator *a, size_t n) {
    if (a && a->alloc) return a->alloc(a->user, n ? n : 1);
#ifdef MSKV_MALLOC
    return MSKV_MALLOC(n ? n : 1, NULL);
#else
    return malloc(n ? n : 1);
#endif
}

static void mskv__cuda_dealloc(const mskv_allocator *a, void *p) {
    if (!p) return;
    if (a && a->free) { a->free(a->user, p); return; }
#ifdef MSKV_FREE
    MSKV_FREE(p, NULL);
#else
    free(p);
#endif
}

static void *mskv__cuda_calloc(const mskv_allocator *a, size_t n) {
    void *p = mskv__cuda_alloc(a, n);
    if (p) memset(p, 0, n);
    return p;
}

/* snprintf that appends to buf and never overflows */
static void mskv__cuda_appendf(char *buf, size_t cap, const char *fmt, ...) {
    size_t len;
    va_list ap;
    if (!buf || !cap) return;
    len = strlen(buf);
    if (len + 1 >= cap) return;
    va_start(ap, fmt);
    vsnprintf(buf + len, cap - len, fmt, ap);
    va_end(ap);
}

static void mskv__cuda_copystr(char *dst, size_t cap, const char *src) {
    size_t n;
    if (!dst || !cap) return;
    n = src ? strlen(src) : 0;
    if (n >= cap) n = cap - 1;
    if (n) memcpy(dst, src, n);
    dst[n] = 0;
}

static int mskv__cuda_mul(size_t a, size_t b, size_t *out) {
    if (a && b > (size_t)-1 / a) return 0;
    *out = a * b;
    return 1;
}

/* 64-bit FNV-1a with a final mix; `h` chains calls */
static uint64_t mskv__cuda_hash(const void *data, size_t n, uint64_t h) {
    const unsigned char *p = (const unsigned char *)data;
    size_t i;
    for (i = 0; i < n; i++) { h ^= p[i]; h *= 1099511628211ull; }
    return h;
}

static uint64_t mskv__cuda_mix(uint64_t h) {
    h ^= h >> 33; h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33; h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

#ifndef MSKV_NO_THREADS
typedef pthread_mutex_t mskv__cuda_mutex;
#define MSKV__CUDA_MUTEX_INIT PTHREAD_MUTEX_INITIALIZER
static void mskv__cuda_lock(mskv__cuda_mutex *m) { pthread_mutex_lock(m); }
static void mskv__cuda_unlock(mskv__cuda_mutex *m) { pthread_mutex_unlock(m); }
#else
typedef int mskv__cuda_mutex;
#define MSKV__CUDA_MUTEX_INIT 0
static void mskv__cuda_lock(mskv__cuda_mutex *m) { (void)m; }
static void mskv__cuda_unlock(mskv__cuda_mutex *m) { (void)m; }
#endif

/* // >>loader ---------------------------------------------------------------
   The libraries are opened once per process under one lock; the table is
   written only while it is held and never changes afterwards. */

typedef mskv_cu_result (*mskv__cuda_getproc_fn)(const char *symbol, void **pfn, int version, unsigned long long flags, int *status);

typedef struct mskv__cuda_global {
    int driver_tried, nvrtc_ok;
    mskv_result driver_result;
    char driver_why[768];
    char nvrtc_why[1024];
    void *libcuda, *libnvrtc;
    mskv_cuda_functions fn;
} mskv__cuda_global;

static mskv__cuda_mutex mskv__cuda_g_lock = MSKV__CUDA_MUTEX_INIT;
static mskv__cuda_global mskv__cuda_g;   /* zero: nothing loaded */

/* dlsym returns an object pointer; going through memcpy keeps ISO C quiet */
static void *mskv__cuda_sym(void *lib, const char *name) {
    return dlsym(lib, name);
}

#define MSKV__CUDA_SET_FN(member, ptr) memcpy((void *)&(member), &(ptr), sizeof(void *))

static const char *mskv__cuda_cu_name(const mskv_cuda_functions *fn, mskv_cu_result r) {
    const char *s = NULL;
    if (fn && fn->cuGetErrorString && fn->cuGetErrorString(r, &s) == MSKV_CU_SUCCESS && s) return s;
    return "unknown CUDA error";
}

/* Opens a driver library and fills the driver part of fn. Returns
   CUDA_UNAVAILABLE with the reason in why. */
static mskv_result mskv__cuda_open_driver(const char *const *names, int n_names, void **lib_out,
                                          mskv_cuda_functions *fn, char *why, size_t cap) {
    void *lib = NULL;
    int i, version = 0, count = 0, missing = 0;
    mskv_cu_result r;
    mskv__cuda_getproc_fn getproc = NULL;
    void *p;
    const char *used = NULL;
    for (i = 0; i < n_names && !lib; i++) {
        lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            const char *e = dlerror();
            mskv__cuda_appendf(why, cap, "%s%s: %s", why[0] ? "; " : "", names[i], e ? e : "not found");
        } else {
            used = names[i];
        }
    }
    if (!lib) {
        mskv__cuda_appendf(why, cap, " (no CUDA driver)");
        return MSKV_ERROR_CUDA_UNAVAILABLE;
    }
    p = mskv__cuda_sym(lib, "cuInit");
    if (p) MSKV__CUDA_SET_FN(fn->cuInit, p);
    p = mskv__cuda_sym(lib, "cuGetErrorString");
    if (p) MSKV__CUDA_SET_FN(fn->cuGetErrorString, p);
    p = mskv__cuda_sym(lib, "cuDriverGetVersion");
    if (p) MSKV__CUDA_SET_FN(fn->cuDriverGetVersion, p);
    if (!fn->cuInit || !fn->cuDriverGetVersion) {
        mskv__cuda_appendf(why, cap, "%s%s: not a CUDA driver (no cuInit)", why[0] ? "; " : "", used);
        dlclose(lib);
        return MSKV_ERROR_CUDA_UNAVAILABLE;
    }
    r = fn->cuInit(0);
    if (r != MSKV_CU_SUCCESS) {
        mskv__cuda_appendf(why, cap, "%s%s: cuInit failed with %d (%s)%s", why[0] ? "; " : "", used, r,
                           mskv__cuda_cu_name(fn, r),
                           r == MSKV_CU_ERROR_STUB_LIBRARY ? ": the toolkit's stub, not a driver" :
                           r == MSKV_CU_ERROR_NO_DEVICE ? ": no CUDA device" : "");
        dlclose(lib);
        return MSKV_ERROR_CUDA_UNAVAILABLE;
    }
    fn->cuDriverGetVersion(&version);
    p = mskv__cuda_sym(lib, "cuGetProcAddress_v2");
    if (p && version >= MSKV__CUDA_ABI_VERSION) memcpy((void *)&getproc, &p, sizeof(p));
#define MSKV__CUDA_RESOLVE(ret, name, sym, params)                                        \
    p = NULL;                                                                             \
    if (getproc) {                                                                        \
        int status = 0;                                                                   \
        if (getproc(#name, &p, MSKV__CUDA_ABI_VERSION, 1ull /* legacy stream */, &status) \
                != MSKV_CU_SUCCESS) p = NULL;                                             \
    }                                                                                     \
    if (!p) p = mskv__cuda_sym(lib, sym);                                                 \
    if (p) MSKV__CUDA_SET_FN(fn->name, p);                                                \
    else { missing++; mskv__cuda_appendf(why, cap, "%s%s: no %s", why[0] ? "; " : "", used, sym); }
    MSKV_CUDA_DRIVER_FUNCTIONS(MSKV__CUDA_RESOLVE)
#undef MSKV__CUDA_RESOLVE
    if (missing) {
        dlclose(lib);
        return MSKV_ERROR_CUDA_UNAVAILABLE;
    }
    r = fn->cuDeviceGetCount(&count);
    if (r != MSKV_CU_SUCCESS || count <= 0) {
        mskv__cuda_appendf(why, cap, "%s%s: no CUDA device (cuDeviceGetCount: %d, %d devices)",
                           why[0] ? "; " : "", used, r, count);
        dlclose(lib);
        return MSKV_ERROR_CUDA_UNAVAILABLE;
    }
    *lib_out = lib;
    return MSKV_SUCCESS;
}

static mskv_result mskv__cuda_open_nvrtc(const char *first, void **lib_out, mskv_cuda_functions *fn,
                                         char *why, size_t cap) {
    static const char *const names[] = {
        "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so",
        "/usr/local/cuda/lib64/libnvrtc.so.13", "/usr/local/cuda/lib64/libnvrtc.so.12",
        "/usr/local/cuda/lib64/libnvrtc.so.11.2", "/usr/local/cuda/lib64/libnvrtc.so" };
    const char *env = getenv("MSKV_NVRTC_PATH");
    const char *cand[10];
    int n = 0, i, missing = 0;
    void *lib = NULL, *p;
    const char *used = NULL;
    if (first && *first) cand[n++] = first;
    if (env && *env) cand[n++] = env;
    for (i = 0; i < (int)(sizeof(names) / sizeof(names[0])); i++) cand[n++] = names[i];
    for (i = 0; i < n && !lib; i++) {
        lib = dlopen(cand[i], RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            const char *e = dlerror();
            mskv__cuda_appendf(why, cap, "%s%s: %s", why[0] ? "; " : "", cand[i], e ? e : "not found");
        } else {
            used = cand[i];
        }
    }
    if (!lib) {
        mskv__cuda_appendf(why, cap, " (no NVRTC)");
        return MSKV_ERROR_CUDA_UNAVAILABLE;
    }
#define MSKV__CUDA_RESOLVE_NVRTC(ret, name, sym, params)                                   \
    p = mskv__cuda_sym(lib, sym);                                                          \
    if (p) MSKV__CUDA_SET_FN(fn->name, p);                                                 \
    else { missing++; mskv__cuda_appendf(why, cap, "%s%s: no %s", why[0] ? "; " : "", used, sym); }
    MSKV_CUDA_NVRTC_FUNCTIONS(MSKV__CUDA_RESOLVE_NVRTC)
#undef MSKV__CUDA_RESOLVE_NVRTC
    if (missing) {
        dlclose(lib);
        return MSKV_ERROR_CUDA_UNAVAILABLE;
    }
    *lib_out = lib;
    return MSKV_SUCCESS;
}

/* Loads what is asked for (driver and/or NVRTC) into the global table, once. */
static mskv_result mskv__cuda_load(int want_driver, int want_nvrtc, const char *nvrtc_path,
                                   mskv_cuda_functions *fn_out, char *why, size_t cap) {
    mskv_result r = MSKV_SUCCESS;
    mskv__cuda_global *g = &mskv__cuda_g;
    mskv__cuda_lock(&mskv__cuda_g_lock);
    if (want_driver && !g->driver_tried) {
        static const char *const names[] = { "libcuda.so.1", "libcuda.so" };
        mskv_cuda_functions tmp;
        memset(&tmp, 0, sizeof(tmp));
        g->driver_why[0] = 0;
        g->driver_result = mskv__cuda_open_driver(names, 2, &g->libcuda, &tmp, g->driver_why, sizeof(g->driver_why));
        if (g->driver_result == MSKV_SUCCESS) {
#define MSKV__CUDA_COPY(ret, name, sym, params) g->fn.name = tmp.name;
            MSKV_CUDA_DRIVER_FUNCTIONS(MSKV__CUDA_COPY)
#undef MSKV__CUDA_COPY
        }
        g->driver_tried = 1;
    }
    if (want_driver && g->driver_result != MSKV_SUCCESS) {
        mskv__cuda_appendf(why, cap, "%s%s", why && why[0] ? "; " : "", g->driver_why);
        r = MSKV_ERROR_CUDA_UNAVAILABLE;
    }
    /* NVRTC is retried until it loads: a later desc may name a path */
    if (want_nvrtc && !g->nvrtc_ok) {
        mskv_cuda_functions tmp;
        memset(&tmp, 0, sizeof(tmp));
        g->nvrtc_why[0] = 0;
        if (mskv__cuda_open_nvrtc(nvrtc_path, &g->libnvrtc, &tmp, g->nvrtc_why, sizeof(g->nvrtc_why)) == MSKV_SUCCESS) {
#define MSKV__CUDA_COPY(ret, name, sym, params) g->fn.name = tmp.name;
            MSKV_CUDA_NVRTC_FUNCTIONS(MSKV__CUDA_COPY)
#undef MSKV__CUDA_COPY
            g->nvrtc_ok = 1;
        }
    }
    if (want_nvrtc && !g->nvrtc_ok) {
        mskv__cuda_appendf(why, cap, "%s%s", why && why[0] ? "; " : "", g->nvrtc_why);
        r = MSKV_ERROR_CUDA_UNAVAILABLE;
    }
    if (fn_out) *fn_out = g->fn;
    mskv__cuda_unlock(&mskv__cuda_g_lock);
    return r;
}

/* // >>context implementation ---------------------------------------------- */

#define MSKV__CUDA_MAX_FUNCS 24

typedef struct mskv__cuda_variant {
    char *key;                        /* options joined by '\n' + arch flag */
    mskv_cu_module module;
    int32_t nfuncs;
    struct { char name[64]; mskv_cu_function f; } funcs[MSKV__CUDA_MAX_FUNCS];
    struct mskv__cuda_variant *next;
} mskv__cuda_variant;

struct mskv_cuda {
    mskv_cuda_functions fn;
    mskv_allocator allocator;
    mskv_log_fn log;
    void *log_user;
    void *own_driver;                 /* a driver opened from desc.driver_path */
    mskv_cuda_desc desc;              /* for the JIT (paths point into the caller's strings: copied below) */
    char cache_dir[512];
    char *source;                     /* owned copy of the kernel source */
    mskv_cu_device device;
    mskv_cu_context ctx;
    mskv_cuda_info info;
    mskv__cuda_mutex lock;
    mskv__cuda_variant *variants;
    char err[4096];
};

static void mskv__cuda_log(mskv_log_fn log, void *user, mskv_log_level lvl, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    if (!log) return;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    log(user, lvl, buf);
}

/* Records a driver failure in cu->err and the logger; returns the mapped code. */
static mskv_result mskv__cuda_fail(mskv_cuda *cu, mskv_cu_result r, const char *what) {
    mskv_result code = r == MSKV_CU_ERROR_OUT_OF_MEMORY ? MSKV_ERROR_OUT_OF_MEMORY : MSKV_ERROR_CUDA;
    snprintf(cu->err, sizeof(cu->err), "%s failed: CUDA error %d (%s)", what, r, mskv__cuda_cu_name(&cu->fn, r));
    if (cu->log) cu->log(cu->log_user, MSKV_LOG_ERROR, cu->err);
    return code;
}

#define MSKV__CU_TRY(cu, call, what)                                         \
    do { mskv_cu_result mskv__r = (call);                                    \
         if (mskv__r != MSKV_CU_SUCCESS) return mskv__cuda_fail((cu), mskv__r, (what)); } while (0)

static mskv_result mskv__cuda_enter(mskv_cuda *cu) {
    mskv_cu_result r = cu->fn.cuCtxSetCurrent(cu->ctx);
    return r == MSKV_CU_SUCCESS ? MSKV_SUCCESS : mskv__cuda_fail(cu, r, "cuCtxSetCurrent");
}

static char *mskv__cuda_strdup(const mskv_allocator *a, const char *s, size_t n) {
    char *d = (char *)mskv__cuda_alloc(a, n + 1);
    if (d) { memcpy(d, s, n); d[n] = 0; }
    return d;
}

MSKV_API const char *const *mskv_cuda_embedded_lines(int32_t *count) {
    if (count) *count = (int32_t)(sizeof(mskv__cuda_kernel_lines) / sizeof(mskv__cuda_kernel_lines[0]));
    return mskv__cuda_kernel_lines;
}

MSKV_API mskv_result mskv_cuda_embedded_source(char *buf, size_t cap, size_t *size) {
    size_t i, n = 0, len;
    const size_t lines = sizeof(mskv__cuda_kernel_lines) / sizeof(mskv__cuda_kernel_lines[0]);
    for (i = 0; i < lines; i++) n += strlen(mskv__cuda_kernel_lines[i]);
    if (size) *size = n;
    if (!buf) return MSKV_SUCCESS;
    if (cap < n + 1) return MSKV_ERROR_CAPACITY;
    for (i = 0, n = 0; i < lines; i++) {
        len = strlen(mskv__cuda_kernel_lines[i]);
        memcpy(buf + n, mskv__cuda_kernel_lines[i], len);
        n += len;
    }
    buf[n] = 0;
    return MSKV_SUCCESS;
}

/* The kernel source a desc selects, in an allocated buffer. */
static char *mskv__cuda_source(const mskv_cuda_desc *d, size_t *len) {
    const mskv_allocator *a = &d->allocator;
    char *s;
    if (d->kernel_source) {
        *len = strlen(d->kernel_source);
        return mskv__cuda_strdup(a, d->kernel_source, *len);
    }
    mskv_cuda_embedded_source(NULL, 0, len);
    s = (char *)mskv__cuda_alloc(a, *len + 1);
    if (s) mskv_cuda_embedded_source(s, *len + 1, NULL);
    return s;
}

static void mskv__cuda_cache_dir(const mskv_cuda_desc *d, char *out, size_t cap) {
    const char *e;
    out[0] = 0;
    if (d->disable_disk_cache) return;
    if (d->cache_dir && *d->cache_dir) { mskv__cuda_copystr(out, cap, d->cache_dir); return; }
    e = getenv("MSKV_CACHE_DIR");
    if (e && *e) { mskv__cuda_copystr(out, cap, e); return; }
    e = getenv("XDG_CACHE_HOME");
    if (e && *e) { snprintf(out, cap, "%s/mstar_kv", e); return; }
    e = getenv("HOME");
    if (e && *e) { snprintf(out, cap, "%s/.cache/mstar_kv", e); return; }
}

MSKV_API mskv_result mskv_cuda_probe(const mskv_cuda_desc *desc, char *why, size_t why_cap) {
    mskv_cuda_desc zero;
    mskv_result r;
    if (why && why_cap) why[0] = 0;
    if (!desc) { memset(&zero, 0, sizeof(zero)); desc = &zero; }
    if (desc->functions) return MSKV_SUCCESS;
    if (desc->driver_path) {
        mskv_cuda_functions tmp;
        void *lib = NULL;
        char buf[768] = "";
        memset(&tmp, 0, sizeof(tmp));
        r = mskv__cuda_open_driver(&desc->driver_path, 1, &lib, &tmp, buf, sizeof(buf));
        mskv__cuda_appendf(why, why_cap, "%s", buf);
        if (lib) dlclose(lib);
        if (r != MSKV_SUCCESS) return r;
        return mskv__cuda_load(0, 1, desc->nvrtc_path, NULL, why, why_cap);
    }
    return mskv__cuda_load(1, 1, desc->nvrtc_path, NULL, why, why_cap);
}

MSKV_API mskv_result mskv_cuda_create(const mskv_cuda_desc *desc, mskv_cuda **out) {
    mskv_cuda_desc zero;
    mskv_cuda *cu;
    mskv_result res;
    mskv_cu_result r;
    char why[1536] = "";
    size_t len = 0;
    int major = 0, minor = 0, n = 0, i, best = 0, found = 0;
    int *archs = NULL;
    if (!out) return MSKV_ERROR_NULL_POINTER;
    *out = NULL;
    if (!desc) { memset(&zero, 0, sizeof(zero)); desc = &zero; }
    cu = (mskv_cuda *)mskv__cuda_calloc(&desc->allocator, sizeof(*cu));
    if (!cu) return MSKV_ERROR_OUT_OF_MEMORY;
    cu->allocator = desc->allocator;
    cu->log = desc->log;
    cu->log_user = desc->log_user;
    cu->desc = *desc;
    cu->desc.kernel_source = NULL;    /* the copy below replaces it */
    cu->desc.cache_dir = NULL;
    cu->desc.driver_path = NULL;
    cu->desc.nvrtc_path = NULL;
    {
        mskv__cuda_mutex m = MSKV__CUDA_MUTEX_INIT;
        cu->lock = m;
    }
    if (desc->functions) {
        cu->fn = *desc->functions;
        r = cu->fn.cuInit(0);
        if (r != MSKV_CU_SUCCESS) {
            snprintf(why, sizeof(why), "cuInit failed with %d (%s)", r, mskv__cuda_cu_name(&cu->fn, r));
            res = MSKV_ERROR_CUDA_UNAVAILABLE;
            goto unavailable;
        }
    } else if (desc->driver_path) {
        res = mskv__cuda_open_driver(&desc->driver_path, 1, &cu->own_driver, &cu->fn, why, sizeof(why));
        if (res == MSKV_SUCCESS) {
            mskv_cuda_functions g;
            res = mskv__cuda_load(0, 1, desc->nvrtc_path, &g, why, sizeof(why));
#define MSKV__CUDA_COPY(ret, name, sym, params) cu->fn.name = g.name;
            MSKV_CUDA_NVRTC_FUNCTIONS(MSKV__CUDA_COPY)
#undef MSKV__CUDA_COPY
        }
        if (res != MSKV_SUCCESS) goto unavailable;
    } else {
        res = mskv__cuda_load(1, 1, desc->nvrtc_path, &cu->fn, why, sizeof(why));
        if (res != MSKV_SUCCESS) goto unavailable;
    }
    r = cu->fn.cuDeviceGetCount(&n);
    if (r != MSKV_CU_SUCCESS || n <= 0 || desc->device < 0 || desc->device >= n) {
        snprintf(why, sizeof(why), "no CUDA device %d (cuDeviceGetCount: %d, %d devices)", (int)desc->device, r, n);
        res = MSKV_ERROR_CUDA_UNAVAILABLE;
        goto unavailable;
    }
    if ((r = cu->fn.cuDeviceGet(&cu->device, desc->device)) != MSKV_CU_SUCCESS ||
        (r = cu->fn.cuDeviceGetAttribute(&cu->info.cc_major, MSKV_CU_ATTR_CC_MAJOR, cu->device)) != MSKV_CU_SUCCESS ||
        (r = cu->fn.cuDeviceGetAttribute(&cu->info.cc_minor, MSKV_CU_ATTR_CC_MINOR, cu->device)) != MSKV_CU_SUCCESS ||
        (r = cu->fn.cuDeviceGetAttribute(&cu->info.multiprocessors, MSKV_CU_ATTR_MULTIPROCESSOR_COUNT, cu->device)) != MSKV_CU_SUCCESS ||
        (r = cu->fn.cuDeviceGetName(cu->info.name, (int)sizeof(cu->info.name), cu->device)) != MSKV_CU_SUCCESS ||
        (r = cu->fn.cuDriverGetVersion(&cu->info.driver_version)) != MSKV_CU_SUCCESS) {
        res = mskv__cuda_fail(cu, r, "querying the device");
        goto fail;
    }
    cu->info.name[sizeof(cu->info.name) - 1] = 0;
    cu->info.device = desc->device;
    if (cu->fn.nvrtcVersion(&major, &minor) != 0) {
        snprintf(why, sizeof(why), "nvrtcVersion failed");
        res = MSKV_ERROR_CUDA_UNAVAILABLE;
        goto unavailable;
    }
    cu->info.nvrtc_version = major * 1000 + minor * 10;
    /* CUBIN for the device's own arch when NVRTC knows it, else PTX for the
       newest arch NVRTC knows below it (the driver finishes the job) */
    cu->info.arch = cu->info.cc_major * 10 + cu->info.cc_minor;
    if (cu->fn.nvrtcGetNumSupportedArchs(&n) == 0 && n > 0 && n < 1024) {
        archs = (int *)mskv__cuda_alloc(&cu->allocator, (size_t)n * sizeof(int));
        if (!archs) { res = MSKV_ERROR_OUT_OF_MEMORY; goto fail; }
        if (cu->fn.nvrtcGetSupportedArchs(archs) == 0) {
            for (i = 0; i < n; i++) {
                if (archs[i] == cu->info.arch) found = 1;
                if (archs[i] <= cu->info.arch && archs[i] > best) best = archs[i];
            }
        }
        mskv__cuda_dealloc(&cu->allocator, archs);
        if (!found) {
            if (!best) {
                snprintf(why, sizeof(why), "NVRTC %d.%d supports no architecture at or below sm_%d",
                         major, minor, (int)cu->info.arch);
                res = MSKV_ERROR_CUDA_UNAVAILABLE;
                goto unavailable;
            }
            cu->info.arch = best;
            cu->info.ptx_fallback = 1;
        }
    }
    if ((r = cu->fn.cuDevicePrimaryCtxRetain(&cu->ctx, cu->device)) != MSKV_CU_SUCCESS) {
        res = mskv__cuda_fail(cu, r, "cuDevicePrimaryCtxRetain");
        goto fail;
    }
    if ((r = cu->fn.cuCtxSetCurrent(cu->ctx)) != MSKV_CU_SUCCESS) {
        res = mskv__cuda_fail(cu, r, "cuCtxSetCurrent");
        cu->fn.cuDevicePrimaryCtxRelease(cu->device);
        cu->ctx = NULL;
        goto fail;
    }
    cu->source = mskv__cuda_source(desc, &len);
    if (!cu->source) {
        cu->fn.cuDevicePrimaryCtxRelease(cu->device);
        res = MSKV_ERROR_OUT_OF_MEMORY;
        goto fail;
    }
    mskv__cuda_cache_dir(desc, cu->cache_dir, sizeof(cu->cache_dir));
    cu->desc.disable_disk_cache = cu->cache_dir[0] ? 0 : 1;
    mskv__cuda_log(cu->log, cu->log_user, MSKV_LOG_INFO, "mstar_kv cuda: %s, sm_%d%s, driver %d, NVRTC %d, cache %s",
                   cu->info.name, (int)cu->info.arch, cu->info.ptx_fallback ? " (PTX)" : "",
                   (int)cu->info.driver_version, (int)cu->info.nvrtc_version,
                   cu->cache_dir[0] ? cu->cache_dir : "off");
    *out = cu;
    return MSKV_SUCCESS;
unavailable:
    mskv__cuda_log(desc->log, desc->log_user, MSKV_LOG_ERROR, "mstar_kv cuda unavailable: %s", why);
fail:
    if (cu->own_driver) dlclose(cu->own_driver);
    mskv__cuda_dealloc(&desc->allocator, cu);
    return res;
}

MSKV_API void mskv_cuda_destroy(mskv_cuda *cu) {
    mskv__cuda_variant *v, *next;
    mskv_allocator a;
    if (!cu) return;
    a = cu->allocator;
    cu->fn.cuCtxSetCurrent(cu->ctx);
    for (v = cu->variants; v; v = next) {
        next = v->next;
        if (v->module) cu->fn.cuModuleUnload(v->module);
        mskv__cuda_dealloc(&a, v->key);
        mskv__cuda_dealloc(&a, v);
    }
    cu->fn.cuDevicePrimaryCtxRelease(cu->device);
    mskv__cuda_dealloc(&a, cu->source);
    if (cu->own_driver) dlclose(cu->own_driver);
    mskv__cuda_dealloc(&a, cu);
}

MSKV_API mskv_result mskv_cuda_info_get(mskv_cuda *cu, mskv_cuda_info *out) {
    if (!cu || !out) return MSKV_ERROR_NULL_POINTER;
    mskv__cuda_lock(&cu->lock);
    *out = cu->info;
    mskv__cuda_unlock(&cu->lock);
    return MSKV_SUCCESS;
}

MSKV_API const char *mskv_cuda_last_error(mskv_cuda *cu) {
    return cu ? cu->err : "";
}

MSKV_API mskv_result mskv_cuda_malloc(mskv_cuda *cu, size_t bytes, mskv_cu_ptr *out) {
    mskv_result res;
    if (!cu || !out) return MSKV_ERROR_NULL_POINTER;
    *out = 0;
    if ((res = mskv__cuda_enter(cu)) != MSKV_SUCCESS) return res;
    MSKV__CU_TRY(cu, cu->fn.cuMemAlloc(out, bytes ? bytes : 1), "cuMemAlloc");
    return MSKV_SUCCESS;
}

MSKV_API void mskv_cuda_free(mskv_cuda *cu, mskv_cu_ptr ptr) {
    if (!cu || !ptr) return;
    if (mskv__cuda_enter(cu) == MSKV_SUCCESS) cu->fn.cuMemFree(ptr);
}

/* // >>jit implementation ----------------------------------------------------
   Cache file <dir>/<key as 16 hex digits>.cubin|.ptx:
     "MSKVJIT\0", u32 format, u32 is_ptx, u64 key, u64 check (second hash of
     the key material), u64 image size, u64 log size, u64 payload hash,
     image bytes, log bytes.
   Written to a unique temp file and renamed, so a reader sees a whole file
   or none; every field is checked on read, and a bad file is rebuilt. */

#define MSKV__CUDA_HDR_BYTES 56

static void mskv__cuda_put64(unsigned char *p, uint64_t v) {
    int i;
    for (i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint64_t mskv__cuda_get64(const unsigned char *p) {
    uint64_t v = 0;
    int i;
    for (i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void mskv__cuda_mkdirs(const char *path) {
    char tmp[512];
    size_t i, n = strlen(path);
    if (n >= sizeof(tmp)) return;
    memcpy(tmp, path, n + 1);
    for (i = 1; i <= n; i++) {
        if (tmp[i] == '/' || tmp[i] == 0) {
            char c = tmp[i];
            tmp[i] = 0;
            mkdir(tmp, 0755);
            tmp[i] = c;
        }
    }
}

static int mskv__cuda_write_all(int fd, const void *data, size_t n) {
    const char *p = (const char *)data;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) { if (errno == EINTR) continue; return 0; }
        p += w; n -= (size_t)w;
    }
    return 1;
}

/* Reads a whole file; NULL when absent or unreadable. */
static unsigned char *mskv__cuda_read_file(const mskv_allocator *a, const char *path, size_t *size) {
    int fd = open(path, O_RDONLY);
    struct stat sb;
    unsigned char *buf;
    size_t got = 0;
    if (fd < 0) return NULL;
    if (fstat(fd, &sb) != 0 || sb.st_size < 0) { close(fd); return NULL; }
    buf = (unsigned char *)mskv__cuda_alloc(a, (size_t)sb.st_size + 1);
    if (!buf) { close(fd); return NULL; }
    while (got < (size_t)sb.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)sb.st_size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    *size = got;
    return buf;
}

typedef struct mskv__cuda_key { uint64_t key, check; } mskv__cuda_key;

static mskv__cuda_key mskv__cuda_key_of(const char *source, size_t len, const char *const *opts, int nopts,
                                        const char *target, int nvrtc_version) {
    mskv__cuda_key k;
    uint64_t h1 = 1469598103934665603ull, h2 = 0x9e3779b97f4a7c15ull;
    unsigned char tail[8];
    int i;
    h1 = mskv__cuda_hash(source, len, h1);
    h2 = mskv__cuda_hash(source, len, h2);
    for (i = 0; i < nopts; i++) {
        h1 = mskv__cuda_hash("\n", 1, mskv__cuda_hash(opts[i], strlen(opts[i]), h1));
        h2 = mskv__cuda_hash("\n", 1, mskv__cuda_hash(opts[i], strlen(opts[i]), h2));
    }
    h1 = mskv__cuda_hash(target, strlen(target), h1);
    h2 = mskv__cuda_hash(target, strlen(target), h2);
    mskv__cuda_put64(tail, ((uint64_t)(unsigned)nvrtc_version << 32) | MSKV__CUDA_CACHE_FORMAT);
    h1 = mskv__cuda_hash(tail, 8, h1);
    h2 = mskv__cuda_hash(tail, 8, h2 ^ 0x5bd1e995ull);
    k.key = mskv__cuda_mix(h1);
    k.check = mskv__cuda_mix(h2 + 0x632be59bd9b4e019ull);
    return k;
}

/* 1 and the image on a valid entry, 0 on a miss, -1 on a corrupt entry. */
static int mskv__cuda_cache_read(const mskv_allocator *a, const char *path, mskv__cuda_key k, int is_ptx,
                                 mskv_cuda_image *img) {
    size_t size = 0;
    unsigned char *buf = mskv__cuda_read_file(a, path, &size);
    uint64_t isz, lsz;
    if (!buf) return 0;
    if (size < MSKV__CUDA_HDR_BYTES || memcmp(buf, "MSKVJIT", 8) != 0 ||
        mskv__cuda_get64(buf + 8) != (((uint64_t)(unsigned)is_ptx << 32) | MSKV__CUDA_CACHE_FORMAT) ||
        mskv__cuda_get64(buf + 16) != k.key || mskv__cuda_get64(buf + 24) != k.check) goto corrupt;
    isz = mskv__cuda_get64(buf + 32);
    lsz = mskv__cuda_get64(buf + 40);
    if (isz == 0 || isz > size || lsz > size || isz + lsz != size - MSKV__CUDA_HDR_BYTES) goto corrupt;
    if (mskv__cuda_mix(mskv__cuda_hash(buf + MSKV__CUDA_HDR_BYTES, (size_t)(isz + lsz), 1469598103934665603ull)) !=
        mskv__cuda_get64(buf + 48)) goto corrupt;
    img->data = mskv__cuda_alloc(a, (size_t)isz + 1);
    img->log = (char *)mskv__cuda_alloc(a, (size_t)lsz + 1);
    if (!img->data || !img->log) {
        mskv__cuda_dealloc(a, img->data); mskv__cuda_dealloc(a, img->log);
        img->data = NULL; img->log = NULL;
        mskv__cuda_dealloc(a, buf);
        return 0;
    }
    memcpy(img->data, buf + MSKV__CUDA_HDR_BYTES, (size_t)isz);
    ((char *)img->data)[isz] = 0;
    memcpy(img->log, buf + MSKV__CUDA_HDR_BYTES + isz, (size_t)lsz);
    img->log[lsz] = 0;
    img->size = (size_t)isz;
    mskv__cuda_dealloc(a, buf);
    return 1;
corrupt:
    mskv__cuda_dealloc(a, buf);
    return -1;
}

static int mskv__cuda_cache_write(const char *dir, const char *path, mskv__cuda_key k, int is_ptx,
                                  const mskv_cuda_image *img) {
    static unsigned long counter;
    unsigned char hdr[MSKV__CUDA_HDR_BYTES];
    char tmp[600];
    size_t lsz = img->log ? strlen(img->log) : 0;
    uint64_t h = 1469598103934665603ull;
    int fd, ok;
    mskv__cuda_mkdirs(dir);
    memcpy(hdr, "MSKVJIT", 8);
    mskv__cuda_put64(hdr + 8, ((uint64_t)(unsigned)is_ptx << 32) | MSKV__CUDA_CACHE_FORMAT);
    mskv__cuda_put64(hdr + 16, k.key);
    mskv__cuda_put64(hdr + 24, k.check);
    mskv__cuda_put64(hdr + 32, (uint64_t)img->size);
    mskv__cuda_put64(hdr + 40, (uint64_t)lsz);
    h = mskv__cuda_hash(img->data, img->size, h);
    if (lsz) h = mskv__cuda_hash(img->log, lsz, h);
    mskv__cuda_put64(hdr + 48, mskv__cuda_mix(h));
    /* pid + a counter + the address of a stack object: unique across processes and threads */
    snprintf(tmp, sizeof(tmp), "%s.tmp.%ld.%lu.%lx", path, (long)getpid(), ++counter,
             (unsigned long)(size_t)&fd);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) return 0;
    ok = mskv__cuda_write_all(fd, hdr, sizeof(hdr)) && mskv__cuda_write_all(fd, img->data, img->size) &&
         (!lsz || mskv__cuda_write_all(fd, img->log, lsz));
    if (close(fd) != 0) ok = 0;
    if (!ok || rename(tmp, path) != 0) { unlink(tmp); return 0; }
    return 1;
}

typedef struct mskv__cuda_jit {
    const mskv_cuda_functions *fn;
    const mskv_allocator *allocator;
    mskv_log_fn log;
    void *log_user;
    const char *cache_dir;            /* "" = off */
    const char *source;
    size_t source_len;
    int nvrtc_version;
} mskv__cuda_jit;

static mskv_result mskv__cuda_jit_compile(const mskv__cuda_jit *j, const mskv_cuda_compile_info *info, mskv_cuda_image *img) {
    const mskv_allocator *a = j->allocator;
    const mskv_cuda_functions *fn = j->fn;
    char target[64];
    const char **opts = NULL;
    mskv_nvrtc_program prog = NULL;
    mskv_nvrtc_result nr;
    mskv__cuda_key k;
    size_t lsz = 0, isz = 0;
    int i, nopts, hit;
    mskv_result res = MSKV_SUCCESS;
    memset(img, 0, sizeof(*img));
    if (info->num_options < 0 || (info->num_options && !info->options) || info->arch <= 0)
        return MSKV_ERROR_INVALID_ARGUMENT;
    snprintf(target, sizeof(target), "--gpu-architecture=%s_%d%s", info->ptx ? "compute" : "sm",
             (int)info->arch, info->arch_specific ? "a" : "");
    k = mskv__cuda_key_of(j->source, j->source_len, info->options, info->num_options, target, j->nvrtc_version);
    img->key = k.key;
    img->is_ptx = info->ptx ? 1 : 0;
    if (j->cache_dir[0]) {
        snprintf(img->path, sizeof(img->path), "%s/%016llx.%s", j->cache_dir, (unsigned long long)k.key,
                 info->ptx ? "ptx" : "cubin");
        hit = mskv__cuda_cache_read(a, img->path, k, img->is_ptx, img);
        if (hit == 1) { img->from_disk = 1; return MSKV_SUCCESS; }
        if (hit < 0)
            mskv__cuda_log(j->log, j->log_user, MSKV_LOG_WARN, "mstar_kv cuda: corrupt cache entry %s, rebuilding", img->path);
    }
    nopts = info->num_options + 1;
    opts = (const char **)mskv__cuda_alloc(a, (size_t)nopts * sizeof(*opts));
    if (!opts) return MSKV_ERROR_OUT_OF_MEMORY;
    opts[0] = target;
    for (i = 0; i < info->num_options; i++) opts[i + 1] = info->options[i];
    nr = fn->nvrtcCreateProgram(&prog, j->source, "kernels.cu", 0, NULL, NULL);
    if (nr != 0) {
        mskv__cuda_log(j->log, j->log_user, MSKV_LOG_ERROR, "nvrtcCreateProgram failed: %s", fn->nvrtcGetErrorString(nr));
        mskv__cuda_dealloc(a, opts);
        return nr == 1 ? MSKV_ERROR_OUT_OF_MEMORY : MSKV_ERROR_NVRTC;
    }
    nr = fn->nvrtcCompileProgram(prog, nopts, opts);
    if (fn->nvrtcGetProgramLogSize(prog, &lsz) == 0) {
        img->log = (char *)mskv__cuda_alloc(a, lsz + 1);
        if (img->log) {
            img->log[0] = 0;
            if (lsz && fn->nvrtcGetProgramLog(prog, img->log) != 0) img->log[0] = 0;
            img->log[lsz] = 0;
        }
    }
    if (nr != 0) {
        mskv__cuda_log(j->log, j->log_user, MSKV_LOG_ERROR, "mstar_kv cuda: NVRTC failed (%s) for %s:\n%s",
                       fn->nvrtcGetErrorString(nr), target, img->log ? img->log : "");
        res = MSKV_ERROR_NVRTC;
        goto done;
    }
    if (img->log && img->log[0])
        mskv__cuda_log(j->log, j->log_user, MSKV_LOG_DEBUG, "NVRTC log for %s:\n%s", target, img->log);
    nr = info->ptx ? fn->nvrtcGetPTXSize(prog, &isz) : fn->nvrtcGetCUBINSize(prog, &isz);
    if (nr != 0 || isz == 0) { res = MSKV_ERROR_NVRTC; goto done; }
    img->data = mskv__cuda_alloc(a, isz + 1);
    if (!img->data) { res = MSKV_ERROR_OUT_OF_MEMORY; goto done; }
    nr = info->ptx ? fn->nvrtcGetPTX(prog, (char *)img->data) : fn->nvrtcGetCUBIN(prog, (char *)img->data);
    if (nr != 0) { res = MSKV_ERROR_NVRTC; goto done; }
    ((char *)img->data)[isz] = 0;
    img->size = isz;
    if (j->cache_dir[0] && !mskv__cuda_cache_write(j->cache_dir, img->path, k, img->is_ptx, img))
        mskv__cuda_log(j->log, j->log_user, MSKV_LOG_WARN, "mstar_kv cuda: could not write cache entry %s", img->path);
done:
    fn->nvrtcDestroyProgram(&prog);
    mskv__cuda_dealloc(a, opts);
    if (res != MSKV_SUCCESS) { mskv__cuda_dealloc(a, img->data); img->data = NULL; img->size = 0; }
    return res;
}

MSKV_API mskv_result mskv_cuda_compile(const mskv_cuda_desc *desc, const mskv_cuda_compile_info *info, mskv_cuda_image *out) {
    mskv_cuda_functions fn;
    mskv__cuda_jit j;
    char dir[512], why[1024] = "";
    int major = 0, minor = 0;
    mskv_result res;
    if (!desc || !info || !out) return MSKV_ERROR_NULL_POINTER;
    memset(out, 0, sizeof(*out));
    if (desc->functions) fn = *desc->functions;
    else if ((res = mskv__cuda_load(0, 1, desc->nvrtc_path, &fn, why, sizeof(why))) != MSKV_SUCCESS) {
        mskv__cuda_log(desc->log, desc->log_user, MSKV_LOG_ERROR, "mstar_kv cuda: %s", why);
        return res;
    }
    if (fn.nvrtcVersion(&major, &minor) != 0) return MSKV_ERROR_CUDA_UNAVAILABLE;
    mskv__cuda_cache_dir(desc, dir, sizeof(dir));
    memset(&j, 0, sizeof(j));
    j.fn = &fn;
    j.allocator = &desc->allocator;
    j.log = desc->log;
    j.log_user = desc->log_user;
    j.cache_dir = dir;
    j.nvrtc_version = major * 1000 + minor * 10;
    j.source = mskv__cuda_source(desc, &j.source_len);
    if (!j.source) return MSKV_ERROR_OUT_OF_MEMORY;
    res = mskv__cuda_jit_compile(&j, info, out);
    mskv__cuda_dealloc(&desc->allocator, (void *)(uintptr_t)j.source);
    return res;
}

MSKV_API void mskv_cuda_image_free(const mskv_cuda_desc *desc, mskv_cuda_image *img) {
    const mskv_allocator *a = desc ? &desc->allocator : NULL;
    if (!img) return;
    mskv__cuda_dealloc(a, img->data);
    mskv__cuda_dealloc(a, img->log);
    img->data = NULL;
    img->log = NULL;
    img->size = 0;
}

MSKV_API int64_t mskv_cuda_log_spills(const char *log) {
    const char *p = log;
    int64_t total = 0;
    int seen = 0;
    if (!log) return -1;
    while ((p = strstr(p, "bytes spill")) != NULL) {
        /* the number sits before " bytes spill stores|loads" */
        const char *q = p;
        int64_t v = 0, scale = 1;
        while (q > log && q[-1] == ' ') q--;
        while (q > log && q[-1] >= '0' && q[-1] <= '9') { q--; v += (int64_t)(*q - '0') * scale; scale *= 10; }
        total += v;
        seen = 1;
        p += 11;
    }
    return seen ? total : -1;
}

/* Kernel variants: a small set of -D options, built by the wrappers. Start
   from mskv__cuda_defines_base (every define kernels.cu knows, at the store's
   dtype and head_dim) and override with mskv__cuda_define, so equal variants
   get equal keys and share one module. */
typedef struct mskv__cuda_defines {
    int32_t n;
    int32_t arch_specific;            /* compile for sm_XYa */
    char opt[16][64];
} mskv__cuda_defines;

/* sets -Dname=value, replacing an earlier value of the same name */
static void mskv__cuda_define(mskv__cuda_defines *d, const char *name, long long value) {
    char opt[64];
    size_t nl;
    int i;
    snprintf(opt, sizeof(opt), "-D%s=%lld", name, value);
    nl = strlen(name);
    for (i = 0; i < d->n; i++)
        if (strncmp(d->opt[i] + 2, name, nl) == 0 && d->opt[i][2 + nl] == '=') {
            mskv__cuda_copystr(d->opt[i], sizeof(d->opt[0]), opt);
            return;
        }
    if (d->n < 16) mskv__cuda_copystr(d->opt[d->n++], sizeof(d->opt[0]), opt);
}

/* Internal API for launch wrappers (this file's and wip/mskv_cuda_attn_impl.h's);
   the names are stable:
     mskv__cuda_defines_base(st, &defs)         every define kernels.cu knows, at the store's
                                                 dtype and head_dim (RoPE off, prefill layout)
     mskv__cuda_define(&defs, "NAME", value)    override one (defs.arch_specific: sm_XYa)
     mskv__cuda_function(cu, "kernel", &defs, &f)  compiled through the memory and disk caches
     mskv__cuda_launch(st, f, grid, block, smem, args)  on the store's stream; sets the
                                                 dynamic smem attribute above 48 KiB
     mskv_cuda_plan_upload(st, plan, pos_mode, &dplan)   plan arrays in fixed device buffers
     mskv__cuda_workspace(st, bytes, &ptr)      a device scratch buffer (grows, never during a capture)
     mskv_cuda_store_pool(st, layer, kind)      a layer's K (0) or V (1) pool
   Failures go through mskv__cuda_fail (cu->err + the logger). */
static mskv_result mskv__cuda_function(mskv_cuda *cu, const char *kernel, const mskv__cuda_defines *defs, mskv_cu_function *out) {
    char key[16 * 65 + 8];
    const char *opts[16];
    mskv__cuda_variant *v;
    mskv_cuda_compile_info ci;
    mskv_cuda_image img;
    mskv__cuda_jit j;
    mskv_cu_result r;
    mskv_result res = MSKV_SUCCESS;
    int i;
    int32_t order[16], a2, b2;
    key[0] = 0;
    /* the key and the options in sorted order: the same set, the same variant */
    for (i = 0; i < defs->n && i < 16; i++) order[i] = i;
    for (a2 = 1; a2 < defs->n; a2++)
        for (b2 = a2; b2 > 0 && strcmp(defs->opt[order[b2 - 1]], defs->opt[order[b2]]) > 0; b2--) {
            int32_t t = order[b2]; order[b2] = order[b2 - 1]; order[b2 - 1] = t;
        }
    for (i = 0; i < defs->n; i++) { mskv__cuda_appendf(key, sizeof(key), "%s\n", defs->opt[order[i]]); opts[i] = defs->opt[order[i]]; }
    if (defs->arch_specific) mskv__cuda_appendf(key, sizeof(key), "arch-specific\n");
    mskv__cuda_lock(&cu->lock);
    for (v = cu->variants; v; v = v->next)
        if (strcmp(v->key, key) == 0) break;
    if (!v) {
        memset(&ci, 0, sizeof(ci));
        ci.arch = cu->info.arch;
        ci.arch_specific = defs->arch_specific;
        ci.ptx = cu->info.ptx_fallback;
        ci.options = opts;
        ci.num_options = defs->n;
        memset(&j, 0, sizeof(j));
        j.fn = &cu->fn;
        j.allocator = &cu->allocator;
        j.log = cu->log;
        j.log_user = cu->log_user;
        j.cache_dir = cu->cache_dir;
        j.source = cu->source;
        j.source_len = strlen(cu->source);
        j.nvrtc_version = cu->info.nvrtc_version;
        res = mskv__cuda_jit_compile(&j, &ci, &img);
        if (res != MSKV_SUCCESS) {
            snprintf(cu->err, sizeof(cu->err), "NVRTC failed for %s: %s", kernel, img.log ? img.log : "");
            mskv_cuda_image_free(&cu->desc, &img);
            mskv__cuda_unlock(&cu->lock);
            return res;
        }
        if (img.from_disk) cu->info.disk_hits++;
        else cu->info.compiles++;
        v = (mskv__cuda_variant *)mskv__cuda_calloc(&cu->allocator, sizeof(*v));
        if (v) v->key = mskv__cuda_strdup(&cu->allocator, key, strlen(key));
        if (!v || !v->key) {
            if (v) mskv__cuda_dealloc(&cu->allocator, v);
            mskv_cuda_image_free(&cu->desc, &img);
            mskv__cuda_unlock(&cu->lock);
            return MSKV_ERROR_OUT_OF_MEMORY;
        }
        r = cu->fn.cuCtxSetCurrent(cu->ctx);
        if (r == MSKV_CU_SUCCESS) r = cu->fn.cuModuleLoadData(&v->module, img.data);
        mskv_cuda_image_free(&cu->desc, &img);
        if (r != MSKV_CU_SUCCESS) {
            res = mskv__cuda_fail(cu, r, "cuModuleLoadData");
            mskv__cuda_dealloc(&cu->allocator, v->key);
            mskv__cuda_dealloc(&cu->allocator, v);
            mskv__cuda_unlock(&cu->lock);
            return res;
        }
        v->next = cu->variants;
        cu->variants = v;
    }
    for (i = 0; i < v->nfuncs; i++)
        if (strcmp(v->funcs[i].name, kernel) == 0) { *out = v->funcs[i].f; break; }
    if (i == v->nfuncs) {
        if (strlen(kernel) >= sizeof(v->funcs[0].name) || v->nfuncs == MSKV__CUDA_MAX_FUNCS) {
            mskv__cuda_unlock(&cu->lock);
            return MSKV_ERROR_INVALID_ARGUMENT;
        }
        r = cu->fn.cuModuleGetFunction(out, v->module, kernel);
        if (r != MSKV_CU_SUCCESS) {
            res = mskv__cuda_fail(cu, r, kernel);
        } else {
            mskv__cuda_copystr(v->funcs[v->nfuncs].name, sizeof(v->funcs[0].name), kernel);
            v->funcs[v->nfuncs++].f = *out;
        }
    }
    mskv__cuda_unlock(&cu->lock);
    return res;
}

/* // >>device store implementation -------------------------------------------- */

#define MSKV__CUDA_MAX_RING 8
#define MSKV__CUDA_MAX_FENCES 64

/* byte offsets of the plan arrays in one plan buffer (host ring and device) */
typedef struct mskv__cuda_plan_layout {
    size_t qo_indptr, kv_indptr, kv_indices, kv_last_page_len, kv_len, kv_pos_split, kv_pos_shift;
    size_t kv_token_indptr, slot_mapping, positions, total;
} mskv__cuda_plan_layout;

struct mskv_cuda_graph {
    mskv_cu_graph graph;
    mskv_cu_graph_exec exec;
};

struct mskv_cuda_store {
    mskv_cuda *cu;
    mskv_cuda_store_desc d;
    size_t page_bytes, pool_bytes, set_bytes;   /* set: one page of every layer, K and V */
    mskv_cu_ptr pools;                          /* (layer*2 + kind) * pool_bytes */
    mskv_cu_stream stream;
    mskv_store_ops ops;
    mskv_arena *arena;
    /* offload/reload staging */
    size_t stage_bytes;
    int32_t stage_pages;
    mskv_cu_ptr d_stage, d_ids;
    void *h_stage;                              /* pinned: stage_bytes, then the page ids */
    /* plans */
    mskv__cuda_plan_layout lay;
    mskv_cu_ptr d_plan;
    void *h_ring[MSKV__CUDA_MAX_RING];
    mskv_cu_event ring_ev[MSKV__CUDA_MAX_RING];
    int ring_used[MSKV__CUDA_MAX_RING];
    int32_t ring_n, ring_next;
    /* fences: FIFO of recorded events */
    mskv_cu_event fence_ev[MSKV__CUDA_MAX_FENCES];
    uint64_t fence_id[MSKV__CUDA_MAX_FENCES];
    int32_t fence_head, fence_count;
    /* workspace for kernels */
    mskv_cu_ptr d_ws;
    size_t ws_bytes;
    int capturing;
    mskv__cuda_mutex lock;
};

static size_t mskv__cuda_align16(size_t x) { return (x + 15) & ~(size_t)15; }

static void mskv__cuda_plan_layout_of(mskv__cuda_plan_layout *l, size_t b, size_t t, size_t p) {
    size_t o = 0;
    l->qo_indptr = o;        o += mskv__cuda_align16((b + 1) * 4);
    l->kv_indptr = o;        o += mskv__cuda_align16((b + 1) * 4);
    l->kv_indices = o;       o += mskv__cuda_align16(p * 4);
    l->kv_last_page_len = o; o += mskv__cuda_align16(b * 4);
    l->kv_len = o;           o += mskv__cuda_align16(b * 4);
    l->kv_pos_split = o;     o += mskv__cuda_align16(b * 4);
    l->kv_pos_shift = o;     o += mskv__cuda_align16(b * 4);
    l->kv_token_indptr = o;  o += mskv__cuda_align16((b + 1) * 8);
    l->slot_mapping = o;     o += mskv__cuda_align16(t * 8);
    l->positions = o;        o += mskv__cuda_align16(t * 3 * 4);
    l->total = o;
}

static mskv_result mskv__cuda_launch(mskv_cuda_store *st, mskv_cu_function f, const unsigned int grid[3],
                                     const unsigned int block[3], unsigned int smem, void **args) {
    mskv_cuda *cu = st->cu;
    mskv_cu_result r;
    if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0) return MSKV_SUCCESS;
    if (smem > 48 * 1024) {
        r = cu->fn.cuFuncSetAttribute(f, MSKV_CU_FUNC_ATTR_MAX_DYNAMIC_SMEM, (int)smem);
        if (r != MSKV_CU_SUCCESS) return mskv__cuda_fail(cu, r, "cuFuncSetAttribute(dynamic shared memory)");
    }
    r = cu->fn.cuLaunchKernel(f, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem, st->stream, args, NULL);
    if (r != MSKV_CU_SUCCESS) return mskv__cuda_fail(cu, r, "cuLaunchKernel");
    return MSKV_SUCCESS;
}

MSKV__CUDA_MAYBE_UNUSED static mskv_result mskv__cuda_workspace(mskv_cuda_store *st, size_t bytes, mskv_cu_ptr *out) {
    mskv_cuda *cu = st->cu;
    mskv_cu_ptr p = 0;
    mskv_cu_result r;
    if (bytes <= st->ws_bytes && st->d_ws) { *out = st->d_ws; return MSKV_SUCCESS; }
    if (st->capturing) return MSKV_ERROR_BAD_STATE;
    r = cu->fn.cuMemAlloc(&p, bytes);
    if (r != MSKV_CU_SUCCESS) return mskv__cuda_fail(cu, r, "cuMemAlloc(workspace)");
    if (st->d_ws) {
        /* the old buffer may still be read by queued kernels */
        cu->fn.cuStreamSynchronize(st->stream);
        cu->fn.cuMemFree(st->d_ws);
    }
    st->d_ws = p;
    st->ws_bytes = bytes;
    *out = p;
    return MSKV_SUCCESS;
}

/* Every define kernels.cu knows, at the store's dtype and head_dim (a head_dim
   the kernels do not specialise for compiles the 128 variant: only the page
   copies, which ignore it, run then). */
static void mskv__cuda_defines_base(const mskv_cuda_store *st, mskv__cuda_defines *d) {
    int32_t hd = st->d.head_dim;
    memset(d, 0, sizeof(*d));
    mskv__cuda_define(d, "MSKV_DTYPE", (long long)st->d.dtype);
    mskv__cuda_define(d, "MSKV_HEAD_DIM", hd == 64 || hd == 128 || hd == 256 ? hd : 128);
    mskv__cuda_define(d, "MSKV_ROPE", 0);
    mskv__cuda_define(d, "MSKV_ROPE_STYLE", 0);
    mskv__cuda_define(d, "MSKV_ROPE_D0", 0);
    mskv__cuda_define(d, "MSKV_ROPE_D1", 0);
    mskv__cuda_define(d, "MSKV_ROPE_D2", 0);
    mskv__cuda_define(d, "MSKV_ATTN_WARP_KEYS", 0);
}

/* The RoPE defines of a mskv_rope (dims of 0 mean the defaults kernels.cu
   derives itself, so they are passed as 0). */
static void mskv__cuda_defines_rope(mskv__cuda_defines *d, const mskv_rope *rope) {
    if (!rope) return;
    mskv__cuda_define(d, "MSKV_ROPE", rope->mode == MSKV_POS_3D ? 2 : 1);
    mskv__cuda_define(d, "MSKV_ROPE_STYLE", rope->style == MSKV_ROPE_INTERLEAVED ? 1 : 0);
    mskv__cuda_define(d, "MSKV_ROPE_D0", rope->dims[0]);
    mskv__cuda_define(d, "MSKV_ROPE_D1", rope->mode == MSKV_POS_3D ? rope->dims[1] : 0);
    mskv__cuda_define(d, "MSKV_ROPE_D2", rope->mode == MSKV_POS_3D ? rope->dims[2] : 0);
}

/* gather (dir 0) or scatter (dir 1) c pages (ids already in d_ids) between
   every layer's pools and the staging buffer, page-major */
static mskv_result mskv__cuda_move_pages(mskv_cuda_store *st, int dir, int32_t c) {
    mskv__cuda_defines defs;
    mskv_cu_function f;
    mskv_result res;
    long long pb = (long long)st->page_bytes, stride = (long long)st->set_bytes;
    int n = c;
    int32_t l, kind;
    unsigned int grid[3], block[3] = { 256, 1, 1 };
    size_t blocks = (st->page_bytes + 4095) / 4096;
    mskv__cuda_defines_base(st, &defs);
    res = mskv__cuda_function(st->cu, dir ? "mskv_page_scatter" : "mskv_page_gather", &defs, &f);
    if (res != MSKV_SUCCESS) return res;
    grid[0] = (unsigned int)(blocks > 65535 ? 65535 : blocks);
    grid[1] = (unsigned int)c;
    grid[2] = 1;
    for (l = 0; l < st->d.num_layers; l++) {
        for (kind = 0; kind < 2; kind++) {
            mskv_cu_ptr pool = mskv_cuda_store_pool(st, l, kind);
            mskv_cu_ptr stage = st->d_stage + (mskv_cu_ptr)(((size_t)l * 2 + (size_t)kind) * st->page_bytes);
            mskv_cu_ptr ids = st->d_ids;
            void *args[6];
            args[0] = &pool; args[1] = &ids; args[2] = &n; args[3] = &pb; args[4] = &stage; args[5] = &stride;
            res = mskv__cuda_launch(st, f, grid, block, 0, args);
            if (res != MSKV_SUCCESS) return res;
        }
    }
    return MSKV_SUCCESS;
}

static mskv_result mskv__cuda_check_pages(const mskv_cuda_store *st, const int32_t *pages, int32_t n) {
    int32_t i;
    if (n < 0 || (n && !pages)) return MSKV_ERROR_INVALID_ARGUMENT;
    for (i = 0; i < n; i++)
        if (pages[i] < 1 || pages[i] >= st->d.num_pages) return MSKV_ERROR_OUT_OF_RANGE;
    return MSKV_SUCCESS;
}

/* store_ops.read_pages: device pages -> host, [page][layer][K, V][page bytes] */
static mskv_result mskv__cuda_read_pages(void *user, const int32_t *pages, int32_t n, void *dst) {
    mskv_cuda_store *st = (mskv_cuda_store *)user;
    mskv_cuda *cu = st->cu;
    mskv_result res;
    int32_t done, c;
    if ((res = mskv__cuda_check_pages(st, pages, n)) != MSKV_SUCCESS) return res;
    if (st->capturing) return MSKV_ERROR_BAD_STATE;
    if ((res = mskv__cuda_enter(cu)) != MSKV_SUCCESS) return res;
    mskv__cuda_lock(&st->lock);
    for (done = 0; done < n; done += c) {
        int32_t *h_ids = (int32_t *)((char *)st->h_stage + st->stage_bytes);
        c = n - done < st->stage_pages ? n - done : st->stage_pages;
        memcpy(h_ids, pages + done, (size_t)c * 4);
#define MSKV__ST_TRY(call, what) do { mskv_cu_result mskv__r = (call); \
        if (mskv__r != MSKV_CU_SUCCESS) { res = mskv__cuda_fail(cu, mskv__r, what); goto fail; } } while (0)
        MSKV__ST_TRY(cu->fn.cuMemcpyHtoDAsync(st->d_ids, h_ids, (size_t)c * 4, st->stream), "cuMemcpyHtoDAsync(page ids)");
        if ((res = mskv__cuda_move_pages(st, 0, c)) != MSKV_SUCCESS) goto fail;
        MSKV__ST_TRY(cu->fn.cuMemcpyDtoHAsync(st->h_stage, st->d_stage, (size_t)c * st->set_bytes, st->stream), "cuMemcpyDtoHAsync(offload)");
        MSKV__ST_TRY(cu->fn.cuStreamSynchronize(st->stream), "cuStreamSynchronize(offload)");
        memcpy((char *)dst + (size_t)done * st->set_bytes, st->h_stage, (size_t)c * st->set_bytes);
    }
    mskv__cuda_unlock(&st->lock);
    return MSKV_SUCCESS;
fail:
    /* queued work must not touch the pinned buffer after we return */
    cu->fn.cuStreamSynchronize(st->stream);
    mskv__cuda_unlock(&st->lock);
    return res;
}

/* store_ops.write_pages: host -> device pages */
static mskv_result mskv__cuda_write_pages(void *user, const int32_t *pages, int32_t n, const void *src) {
    mskv_cuda_store *st = (mskv_cuda_store *)user;
    mskv_cuda *cu = st->cu;
    mskv_result res;
    int32_t done, c;
    if ((res = mskv__cuda_check_pages(st, pages, n)) != MSKV_SUCCESS) return res;
    if (st->capturing) return MSKV_ERROR_BAD_STATE;
    if ((res = mskv__cuda_enter(cu)) != MSKV_SUCCESS) return res;
    mskv__cuda_lock(&st->lock);
    for (done = 0; done < n; done += c) {
        int32_t *h_ids = (int32_t *)((char *)st->h_stage + st->stage_bytes);
        c = n - done < st->stage_pages ? n - done : st->stage_pages;
        memcpy(h_ids, pages + done, (size_t)c * 4);
        memcpy(st->h_stage, (const char *)src + (size_t)done * st->set_bytes, (size_t)c * st->set_bytes);
        MSKV__ST_TRY(cu->fn.cuMemcpyHtoDAsync(st->d_ids, h_ids, (size_t)c * 4, st->stream), "cuMemcpyHtoDAsync(page ids)");
        MSKV__ST_TRY(cu->fn.cuMemcpyHtoDAsync(st->d_stage, st->h_stage, (size_t)c * st->set_bytes, st->stream), "cuMemcpyHtoDAsync(reload)");
        if ((res = mskv__cuda_move_pages(st, 1, c)) != MSKV_SUCCESS) goto fail;
        MSKV__ST_TRY(cu->fn.cuStreamSynchronize(st->stream), "cuStreamSynchronize(reload)");
    }
    mskv__cuda_unlock(&st->lock);
    return MSKV_SUCCESS;
fail:
    cu->fn.cuStreamSynchronize(st->stream);
    mskv__cuda_unlock(&st->lock);
    return res;
}

/* store_ops.copy_page: stream-ordered device copies (every later use of the
   page runs on the same stream) */
static mskv_result mskv__cuda_copy_page(void *user, int32_t src, int32_t dst) {
    mskv_cuda_store *st = (mskv_cuda_store *)user;
    mskv_cuda *cu = st->cu;
    mskv_result res;
    int32_t l, kind;
    if (src < 1 || src >= st->d.num_pages || dst < 1 || dst >= st->d.num_pages) return MSKV_ERROR_OUT_OF_RANGE;
    if (st->capturing) return MSKV_ERROR_BAD_STATE;   /* a fork is not part of a replayable step */
    if ((res = mskv__cuda_enter(cu)) != MSKV_SUCCESS) return res;
    for (l = 0; l < st->d.num_layers; l++)
        for (kind = 0; kind < 2; kind++) {
            mskv_cu_ptr pool = mskv_cuda_store_pool(st, l, kind);
            MSKV__CU_TRY(cu, cu->fn.cuMemcpyDtoDAsync(pool + (mskv_cu_ptr)dst * st->page_bytes,
                                                      pool + (mskv_cu_ptr)src * st->page_bytes,
                                                      st->page_bytes, st->stream), "cuMemcpyDtoDAsync(copy page)");
        }
    return MSKV_SUCCESS;
}

static void mskv__cuda_store_release(mskv_cuda_store *st) {
    mskv_cuda *cu = st->cu;
    int i;
    if (st->stream) cu->fn.cuStreamSynchronize(st->stream);
    for (i = 0; i < MSKV__CUDA_MAX_FENCES; i++)
        if (st->fence_ev[i]) cu->fn.cuEventDestroy(st->fence_ev[i]);
    for (i = 0; i < MSKV__CUDA_MAX_RING; i++) {
        if (st->ring_ev[i]) cu->fn.cuEventDestroy(st->ring_ev[i]);
        if (st->h_ring[i]) cu->fn.cuMemFreeHost(st->h_ring[i]);
    }
    if (st->h_stage) cu->fn.cuMemFreeHost(st->h_stage);
    if (st->d_ws) cu->fn.cuMemFree(st->d_ws);
    if (st->d_plan) cu->fn.cuMemFree(st->d_plan);
    if (st->d_ids) cu->fn.cuMemFree(st->d_ids);
    if (st->d_stage) cu->fn.cuMemFree(st->d_stage);
    if (st->pools) cu->fn.cuMemFree(st->pools);
    if (st->stream) cu->fn.cuStreamDestroy(st->stream);
    mskv__cuda_dealloc(&cu->allocator, st);
}

MSKV_API mskv_result mskv_cuda_store_create(mskv_cuda *cu, const mskv_cuda_store_desc *desc, mskv_cuda_store **out) {
    mskv_cuda_store *st;
    mskv_cuda_store_desc d;
    size_t es, slot, pages_total, all, ids_bytes;
    mskv_result res;
    int i;
    if (!cu || !desc || !out) return MSKV_ERROR_NULL_POINTER;
    *out = NULL;
    d = *desc;
    es = mskv_dtype_size(d.dtype);
    if (!es || d.num_pages < 2 || d.page_size < 1 || d.num_layers < 1 || d.kv_heads < 1 || d.head_dim < 1 ||
        d.max_batch < 0 || d.max_tokens < 0 || d.max_page_ids < 0 || d.plan_ring < 0 || d.plan_ring > MSKV__CUDA_MAX_RING)
        return MSKV_ERROR_INVALID_ARGUMENT;
    if (!d.max_batch) d.max_batch = 64;
    if (!d.max_tokens) d.max_tokens = 16384;
    if (!d.max_page_ids) d.max_page_ids = 65536;
    if (!d.plan_ring) d.plan_ring = 3;
    if (!d.staging_bytes) d.staging_bytes = (size_t)16 << 20;
    st = (mskv_cuda_store *)mskv__cuda_calloc(&cu->allocator, sizeof(*st));
    if (!st) return MSKV_ERROR_OUT_OF_MEMORY;
    st->cu = cu;
    st->d = d;
    {
        mskv__cuda_mutex m = MSKV__CUDA_MUTEX_INIT;
        st->lock = m;
    }
    /* sizes: 64-bit products, and every offset a kernel forms must fit in a long long */
    if (!mskv__cuda_mul((size_t)d.kv_heads, (size_t)d.head_dim, &slot) || !mskv__cuda_mul(slot, es, &slot) ||
        !mskv__cuda_mul(slot, (size_t)d.page_size, &st->page_bytes) ||
        !mskv__cuda_mul(st->page_bytes, (size_t)d.num_pages, &st->pool_bytes) ||
        !mskv__cuda_mul(st->page_bytes, (size_t)d.num_layers * 2, &st->set_bytes) ||
        !mskv__cuda_mul(st->pool_bytes, (size_t)d.num_layers * 2, &all) ||
        !mskv__cuda_mul((size_t)d.num_pages, (size_t)d.page_size, &pages_total) ||
        all > (size_t)INT64_MAX || pages_total > (size_t)INT64_MAX) {
        mskv__cuda_dealloc(&cu->allocator, st);
        return MSKV_ERROR_OVERFLOW;
    }
    st->stage_pages = (int32_t)(d.staging_bytes / st->set_bytes);
    if (st->stage_pages < 1) st->stage_pages = 1;
    if (st->stage_pages > d.num_pages) st->stage_pages = d.num_pages;
    if (st->stage_pages > 65535) st->stage_pages = 65535;   /* the copies' grid.y is the page count */
    st->stage_bytes = (size_t)st->stage_pages * st->set_bytes;
    ids_bytes = (size_t)st->stage_pages * 4;
    mskv__cuda_plan_layout_of(&st->lay, (size_t)d.max_batch, (size_t)d.max_tokens, (size_t)d.max_page_ids);
    st->ring_n = d.plan_ring;
    if ((res = mskv__cuda_enter(cu)) != MSKV_SUCCESS) { mskv__cuda_dealloc(&cu->allocator, st); return res; }
#define MSKV__CR_TRY(call, what) do { mskv_cu_result mskv__r = (call); \
        if (mskv__r != MSKV_CU_SUCCESS) { res = mskv__cuda_fail(cu, mskv__r, what); goto fail; } } while (0)
    MSKV__CR_TRY(cu->fn.cuStreamCreate(&st->stream, MSKV_CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    MSKV__CR_TRY(cu->fn.cuMemAlloc(&st->pools, all), "cuMemAlloc(K/V pools)");
    MSKV__CR_TRY(cu->fn.cuMemAlloc(&st->d_stage, st->stage_bytes), "cuMemAlloc(staging)");
    MSKV__CR_TRY(cu->fn.cuMemAlloc(&st->d_ids, ids_bytes), "cuMemAlloc(page ids)");
    MSKV__CR_TRY(cu->fn.cuMemAlloc(&st->d_plan, st->lay.total), "cuMemAlloc(plan buffers)");
    MSKV__CR_TRY(cu->fn.cuMemAllocHost(&st->h_stage, st->stage_bytes + ids_bytes), "cuMemAllocHost(staging)");
    for (i = 0; i < st->ring_n; i++) {
        MSKV__CR_TRY(cu->fn.cuMemAllocHost(&st->h_ring[i], st->lay.total), "cuMemAllocHost(plan ring)");
        MSKV__CR_TRY(cu->fn.cuEventCreate(&st->ring_ev[i], MSKV_CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    }
    /* zeroed pools: the null page reads as zeros, and so does any unwritten slot */
    MSKV__CR_TRY(cu->fn.cuMemsetD8Async(st->pools, 0, all, st->stream), "cuMemsetD8Async(pools)");
    MSKV__CR_TRY(cu->fn.cuMemsetD8Async(st->d_plan, 0, st->lay.total, st->stream), "cuMemsetD8Async(plan)");
    MSKV__CR_TRY(cu->fn.cuStreamSynchronize(st->stream), "cuStreamSynchronize");
#undef MSKV__CR_TRY
    st->ops.user = st;
    st->ops.read_pages = mskv__cuda_read_pages;
    st->ops.write_pages = mskv__cuda_write_pages;
    st->ops.copy_page = mskv__cuda_copy_page;
    *out = st;
    return MSKV_SUCCESS;
fail:
    mskv__cuda_store_release(st);
    return res;
}

MSKV_API void mskv_cuda_store_destroy(mskv_cuda_store *st) {
    if (!st) return;
    (void)mskv__cuda_enter(st->cu);   /* release what we can even then */
    if (st->capturing) {
        mskv_cu_graph g = NULL;
        if (st->cu->fn.cuStreamEndCapture(st->stream, &g) == MSKV_CU_SUCCESS && g) st->cu->fn.cuGraphDestroy(g);
    }
    mskv__cuda_store_release(st);
}

MSKV_API mskv_result mskv_cuda_store_arena_desc(mskv_cuda_store *st, mskv_arena_desc *d) {
    if (!st || !d) return MSKV_ERROR_NULL_POINTER;
    d->num_pages = st->d.num_pages;
    d->page_size = st->d.page_size;
    d->num_layers = st->d.num_layers;
    d->kv_heads = st->d.kv_heads;
    d->head_dim = st->d.head_dim;
    d->dtype = st->d.dtype;
    d->store_ops = &st->ops;
    d->retire_mode = MSKV_RETIRE_FENCED;
    return MSKV_SUCCESS;
}

MSKV_API mskv_result mskv_cuda_store_bind(mskv_cuda_store *st, mskv_arena *arena) {
    mskv_store_info info;
    mskv_result res;
    if (!st || !arena) return MSKV_ERROR_NULL_POINTER;
    if ((res = mskv_store_info_get(arena, &info)) != MSKV_SUCCESS) return res;
    if (info.num_pages != st->d.num_pages || info.page_size != st->d.page_size ||
        (info.num_layers && (info.num_layers != st->d.num_layers || info.kv_heads != st->d.kv_heads ||
                             info.head_dim != st->d.head_dim || info.dtype != st->d.dtype)))
        return MSKV_ERROR_INVALID_ARGUMENT;
    st->arena = arena;
    return MSKV_SUCCESS;
}

MSKV_API const mskv_store_ops *mskv_cuda_store_ops(mskv_cuda_store *st) { return st ? &st->ops : NULL; }

MSKV_API mskv_cu_ptr mskv_cuda_store_pool(mskv_cuda_store *st, int32_t layer, int kind) {
    if (!st || layer < 0 || layer >= st->d.num_layers || kind < 0 || kind > 1) return 0;
    return st->pools + (mskv_cu_ptr)(((size_t)layer * 2 + (size_t)kind) * st->pool_bytes);
}

MSKV_API mskv_cu_stream mskv_cuda_store_stream(mskv_cuda_store *st) { return st ? st->stream : NULL; }

MSKV_API mskv_result mskv_cuda_upload(mskv_cuda_store *st, mskv_cu_ptr dst, const void *src, size_t bytes) {
    mskv_result res;
    if (!st || (bytes && (!src || !dst))) return MSKV_ERROR_NULL_POINTER;
    if (st->capturing) return MSKV_ERROR_BAD_STATE;
    if (!bytes) return MSKV_SUCCESS;
    if ((res = mskv__cuda_enter(st->cu)) != MSKV_SUCCESS) return res;
    MSKV__CU_TRY(st->cu, st->cu->fn.cuMemcpyHtoDAsync(dst, src, bytes, st->stream), "cuMemcpyHtoDAsync");
    MSKV__CU_TRY(st->cu, st->cu->fn.cuStreamSynchronize(st->stream), "cuStreamSynchronize");
    return MSKV_SUCCESS;
}

MSKV_API mskv_result mskv_cuda_download(mskv_cuda_store *st, void *dst, mskv_cu_ptr src, size_t bytes) {
    mskv_result res;
    if (!st || (bytes && (!src || !dst))) return MSKV_ERROR_NULL_POINTER;
    if (st->capturing) return MSKV_ERROR_BAD_STATE;
    if (!bytes) return MSKV_SUCCESS;
    if ((res = mskv__cuda_enter(st->cu)) != MSKV_SUCCESS) return res;
    MSKV__CU_TRY(st->cu, st->cu->fn.cuMemcpyDtoHAsync(dst, src, bytes, st->stream), "cuMemcpyDtoHAsync");
    MSKV__CU_TRY(st->cu, st->cu->fn.cuStreamSynchronize(st->stream), "cuStreamSynchronize");
    return MSKV_SUCCESS;
}

/* // >>fences implementation ------------------------------------------------ */

MSKV_API mskv_result mskv_cuda_retire(mskv_cuda_store *st, int wait) {
    mskv_cuda *cu;
    mskv_result res = MSKV_SUCCESS;
    uint64_t completed = 0;
    int any = 0;
    if (!st) return MSKV_ERROR_NULL_POINTER;
    cu = st->cu;
    if (st->capturing) return MSKV_SUCCESS;   /* event queries are not allowed during a capture */
    if ((res = mskv__cuda_enter(cu)) != MSKV_SUCCESS) return res;
    mskv__cuda_lock(&st->lock);
    while (st->fence_count > 0) {
        int h = st->fence_head;
        mskv_cu_result r = wait ? cu->fn.cuEventSynchronize(st->fence_ev[h]) : cu->fn.cuEventQuery(st->fence_ev[h]);
        if (r == MSKV_CU_ERROR_NOT_READY) break;
        if (r != MSKV_CU_SUCCESS) { res = mskv__cuda_fail(cu, r, "cuEventQuery(fence)"); break; }
        completed = st->fence_id[h];
        any = 1;
        st->fence_head = (h + 1) % MSKV__CUDA_MAX_FENCES;
        st->fence_count--;
    }
    mskv__cuda_unlock(&st->lock);
    if (any && st->arena) {
        mskv_result r2 = mskv_arena_retire(st->arena, completed);
        if (res == MSKV_SUCCESS) res = r2;
    }
    return res;
}

MSKV_API mskv_result mskv_cuda_fence_record(mskv_cuda_store *st, uint64_t fence) {
    mskv_cuda *cu;
    mskv_result res;
    mskv_cu_result r;
    int slot;
    if (!st) return MSKV_ERROR_NULL_POINTER;
    cu = st->cu;
    if (st->capturing) return MSKV_ERROR_BAD_STATE;
    if ((res = mskv__cuda_enter(cu)) != MSKV_SUCCESS) return res;
    if (st->fence_count == MSKV__CUDA_MAX_FENCES) {
        /* full: the oldest fence must complete before its event is reused */
        mskv__cuda_lock(&st->lock);
        r = cu->fn.cuEventSynchronize(st->fence_ev[st->fence_head]);
        mskv__cuda_unlock(&st->lock);
        if (r != MSKV_CU_SUCCESS) return mskv__cuda_fail(cu, r, "cuEventSynchronize(fence)");
        if ((res = mskv_cuda_retire(st, 0)) != MSKV_SUCCESS) return res;
    }
    mskv__cuda_lock(&st->lock);
    slot = (st->fence_head + st->fence_count) % MSKV__CUDA_MAX_FENCES;
    r = MSKV_CU_SUCCESS;
    if (!st->fence_ev[slot]) r = cu->fn.cuEventCreate(&st->fence_ev[slot], MSKV_CU_EVENT_DISABLE_TIMING);
    if (r == MSKV_CU_SUCCESS) r = cu->fn.cuEventRecord(st->fence_ev[slot], st->stream);
    if (r != MSKV_CU_SUCCESS) {
        mskv__cuda_unlock(&st->lock);
        return mskv__cuda_fail(cu, r, "cuEventRecord(fence)");
    }
    st->fence_id[slot] = fence;
    st->fence_count++;
    mskv__cuda_unlock(&st->lock);
    return MSKV_SUCCESS;
}

MSKV_API mskv_result mskv_cuda_publish(mskv_cuda_store *st, const mskv_segment *segs, int32_t n, uint64_t *step_out) {
    uint64_t step = 0;
    mskv_result res;
    if (!st) return MSKV_ERROR_NULL_POINTER;
    /* no publish inside a capture: its event could not be queried, and the
       fallback synchronisation would break the capture */
    if (!st->arena || st->capturing) return MSKV_ERROR_BAD_STATE;
    res = mskv_publish(st->arena, segs, n, &step);
    if (res != MSKV_SUCCESS) return res;
    if (step_out) *step_out = step;
    if ((res = mskv_cuda_fence_record(st, step)) != MSKV_SUCCESS) {
        /* without an event the step's pages wait for a full synchronisation */
        mskv_result r2 = mskv_cuda_store_sync(st);
        if (r2 == MSKV_SUCCESS) r2 = mskv_arena_retire(st->arena, step);
        (void)r2;
        return res;
    }
    return mskv_cuda_retire(st, 0);
}

MSKV_API mskv_result mskv_cuda_store_sync(mskv_cuda_store *st) {
    mskv_result res;
    if (!st) return MSKV_ERROR_NULL_POINTER;
    if (st->capturing) return MSKV_ERROR_BAD_STATE;
    if ((res = mskv__cuda_enter(st->cu)) != MSKV_SUCCESS) return res;
    MSKV__CU_TRY(st->cu, st->cu->fn.cuStreamSynchronize(st->stream), "cuStreamSynchronize");
    return mskv_cuda_retire(st, 1);
}

/* // >>launches implementation ---------------------------------------------- */

MSKV_API mskv_result mskv_cuda_plan_upload(mskv_cuda_store *st, const mskv_plan *plan, mskv_pos_mode pos_mode, mskv_cuda_dplan *out) {
    mskv_cuda *cu;
    mskv_result res;
    mskv_cu_result r = MSKV_CU_SUCCESS;
    char *h;
    int slot;
    size_t b, t, p, npos;
    if (!st || !plan || !out) return MSKV_ERROR_NULL_POINTER;
    cu = st->cu;
    if (st->capturing) return MSKV_ERROR_BAD_STATE;
    if (plan->batch < 0 || plan->total_q < 0 || plan->num_page_ids < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (plan->batch > st->d.max_batch || plan->total_q > st->d.max_tokens || plan->num_page_ids > st->d.max_page_ids)
        return MSKV_ERROR_CAPACITY;
    b = (size_t)plan->batch; t = (size_t)plan->total_q; p = (size_t)plan->num_page_ids;
    npos = pos_mode == MSKV_POS_3D ? 3 * t : pos_mode == MSKV_POS_1D ? t : 0;
    if (npos && !plan->positions) return MSKV_ERROR_NULL_POINTER;
    if ((res = mskv__cuda_enter(cu)) != MSKV_SUCCESS) return res;
    mskv__cuda_lock(&st->lock);
    slot = st->ring_next;
    if (st->ring_used[slot]) {
        /* the copies out of this pinned buffer must be done before it is rewritten */
        r = cu->fn.cuEventSynchronize(st->ring_ev[slot]);
        if (r != MSKV_CU_SUCCESS) { mskv__cuda_unlock(&st->lock); return mskv__cuda_fail(cu, r, "cuEventSynchronize(plan ring)"); }
    }
    h = (char *)st->h_ring[slot];
#define MSKV__UP(field, count, esize)                                                            \
    if (r == MSKV_CU_SUCCESS && plan->field && (count)) {                                       \
        memcpy(h + st->lay.field, plan->field, (count) * (esize));                              \
        r = cu->fn.cuMemcpyHtoDAsync(st->d_plan + st->lay.field, h + st->lay.field, (count) * (esize), st->stream); \
    }
    MSKV__UP(qo_indptr, b + 1, 4)
    MSKV__UP(kv_indptr, b + 1, 4)
    MSKV__UP(kv_indices, p, 4)
    MSKV__UP(kv_last_page_len, b, 4)
    MSKV__UP(kv_len, b, 4)
    MSKV__UP(kv_pos_split, b, 4)
    MSKV__UP(kv_pos_shift, b, 4)
    MSKV__UP(kv_token_indptr, b + 1, 8)
    MSKV__UP(slot_mapping, t, 8)
    MSKV__UP(positions, npos, 4)
#undef MSKV__UP
    if (r == MSKV_CU_SUCCESS) r = cu->fn.cuEventRecord(st->ring_ev[slot], st->stream);
    if (r != MSKV_CU_SUCCESS) {
        /* copies already queued read this buffer: let them finish, keep it marked in use */
        st->ring_used[slot] = 1;
        cu->fn.cuStreamSynchronize(st->stream);
        mskv__cuda_unlock(&st->lock);
        return mskv__cuda_fail(cu, r, "uploading a plan");
    }
    st->ring_used[slot] = 1;
    st->ring_next = (slot + 1) % st->ring_n;
    mskv__cuda_unlock(&st->lock);
    memset(out, 0, sizeof(*out));
    out->batch = plan->batch;
    out->total_q = plan->total_q;
    out->num_page_ids = plan->num_page_ids;
    out->page_size = plan->page_size;
    out->pos_mode = npos ? pos_mode : MSKV_POS_NONE;
    out->step = plan->step;
    out->qo_indptr = st->d_plan + st->lay.qo_indptr;
    out->kv_indptr = st->d_plan + st->lay.kv_indptr;
    out->kv_indices = st->d_plan + st->lay.kv_indices;
    out->kv_last_page_len = st->d_plan + st->lay.kv_last_page_len;
    out->kv_len = st->d_plan + st->lay.kv_len;
    out->kv_pos_split = st->d_plan + st->lay.kv_pos_split;
    out->kv_pos_shift = st->d_plan + st->lay.kv_pos_shift;
    out->kv_token_indptr = st->d_plan + st->lay.kv_token_indptr;
    out->slot_mapping = st->d_plan + st->lay.slot_mapping;
    out->positions = st->d_plan + st->lay.positions;
    return MSKV_SUCCESS;
}

MSKV_API mskv_result mskv_cuda_write_kv(mskv_cuda_store *st, int32_t layer, const mskv_cuda_dplan *plan,
                                        mskv_cu_ptr k, mskv_cu_ptr v, const mskv_rope *rope) {
    mskv__cuda_defines defs;
    mskv_cu_function f;
    mskv_result res;
    mskv_cu_ptr k_pool, v_pool, slots, pos;
    long long pool_slots;
    int n_tokens, kv_heads;
    float theta;
    size_t rows, blocks;
    unsigned int grid[3], block[3] = { 128, 1, 1 };
    void *args[10];
    if (!st || !plan) return MSKV_ERROR_NULL_POINTER;
    if (layer < 0 || layer >= st->d.num_layers) return MSKV_ERROR_OUT_OF_RANGE;
    if (st->d.head_dim != 64 && st->d.head_dim != 128 && st->d.head_dim != 256) return MSKV_ERROR_UNSUPPORTED;
    if (plan->total_q == 0) return MSKV_SUCCESS;
    if (!k || !v) return MSKV_ERROR_NULL_POINTER;
    if (rope) {
        if (rope->mode != MSKV_POS_1D && rope->mode != MSKV_POS_3D) return MSKV_ERROR_INVALID_ARGUMENT;
        if (plan->pos_mode != rope->mode) return MSKV_ERROR_INVALID_ARGUMENT;
    }
    if ((res = mskv__cuda_enter(st->cu)) != MSKV_SUCCESS) return res;
    mskv__cuda_defines_base(st, &defs);
    mskv__cuda_defines_rope(&defs, rope);
    if ((res = mskv__cuda_function(st->cu, "mskv_kv_write", &defs, &f)) != MSKV_SUCCESS) return res;
    k_pool = mskv_cuda_store_pool(st, layer, 0);
    v_pool = mskv_cuda_store_pool(st, layer, 1);
    slots = plan->slot_mapping;
    pos = rope ? plan->positions : 0;
    n_tokens = plan->total_q;
    kv_heads = st->d.kv_heads;
    pool_slots = (long long)st->d.num_pages * st->d.page_size;
    theta = rope && rope->theta > 0 ? rope->theta : 10000.0f;
    rows = (size_t)n_tokens * (size_t)kv_heads;
    blocks = (rows + 3) / 4;
    if (blocks > 0x7fffffffu) return MSKV_ERROR_OVERFLOW;
    grid[0] = (unsigned int)blocks; grid[1] = 1; grid[2] = 1;
    args[0] = &k; args[1] = &v; args[2] = &slots; args[3] = &n_tokens; args[4] = &kv_heads;
    args[5] = &k_pool; args[6] = &v_pool; args[7] = &pool_slots; args[8] = &pos; args[9] = &theta;
    return mskv__cuda_launch(st, f, grid, block, 0, args);
}

/* // >>graphs implementation ------------------------------------------------ */

MSKV_API mskv_result mskv_cuda_capture_begin(mskv_cuda_store *st) {
    mskv_result res;
    if (!st) return MSKV_ERROR_NULL_POINTER;
    if (st->capturing) return MSKV_ERROR_BAD_STATE;
    if ((res = mskv__cuda_enter(st->cu)) != MSKV_SUCCESS) return res;
    /* relaxed: the JIT may load a module while the stream is captured */
    MSKV__CU_TRY(st->cu, st->cu->fn.cuStreamBeginCapture(st->stream, MSKV_CU_CAPTURE_MODE_RELAXED), "cuStreamBeginCapture");
    st->capturing = 1;
    return MSKV_SUCCESS;
}

MSKV_API mskv_result mskv_cuda_capture_end(mskv_cuda_store *st, mskv_cuda_graph **out) {
    mskv_cuda *cu;
    mskv_cuda_graph *g;
    mskv_cu_graph graph = NULL;
    mskv_cu_result r;
    mskv_result res;
    if (!st || !out) return MSKV_ERROR_NULL_POINTER;
    *out = NULL;
    cu = st->cu;
    if (!st->capturing) return MSKV_ERROR_BAD_STATE;
    if ((res = mskv__cuda_enter(cu)) != MSKV_SUCCESS) return res;
    r = cu->fn.cuStreamEndCapture(st->stream, &graph);
    st->capturing = 0;
    if (r != MSKV_CU_SUCCESS) return mskv__cuda_fail(cu, r, "cuStreamEndCapture");
    g = (mskv_cuda_graph *)mskv__cuda_calloc(&cu->allocator, sizeof(*g));
    if (!g) { cu->fn.cuGraphDestroy(graph); return MSKV_ERROR_OUT_OF_MEMORY; }
    g->graph = graph;
    r = cu->fn.cuGraphInstantiateWithFlags(&g->exec, graph, 0);
    if (r != MSKV_CU_SUCCESS) {
        cu->fn.cuGraphDestroy(graph);
        mskv__cuda_dealloc(&cu->allocator, g);
        return mskv__cuda_fail(cu, r, "cuGraphInstantiateWithFlags");
    }
    *out = g;
    return MSKV_SUCCESS;
}

MSKV_API mskv_result mskv_cuda_graph_launch(mskv_cuda_store *st, mskv_cuda_graph *g) {
    mskv_result res;
    if (!st || !g) return MSKV_ERROR_NULL_POINTER;
    if (st->capturing) return MSKV_ERROR_BAD_STATE;
    if ((res = mskv__cuda_enter(st->cu)) != MSKV_SUCCESS) return res;
    MSKV__CU_TRY(st->cu, st->cu->fn.cuGraphLaunch(g->exec, st->stream), "cuGraphLaunch");
    return MSKV_SUCCESS;
}

MSKV_API void mskv_cuda_graph_destroy(mskv_cuda_store *st, mskv_cuda_graph *g) {
    if (!st || !g) return;
    if (mskv__cuda_enter(st->cu) == MSKV_SUCCESS) {
        st->cu->fn.cuGraphExecDestroy(g->exec);
        st->cu->fn.cuGraphDestroy(g->graph);
    }
    mskv__cuda_dealloc(&st->cu->allocator, g);
}

#undef MSKV__ST_TRY

/* // >>attention wrappers implementation ------------------------------------ */
#include "wip/mskv_cuda_attn_impl.h"

#ifdef __cplusplus
}
#endif
#endif /* MSTAR_KV_CUDA_IMPLEMENTED */
#endif /* MSTAR_KV_CUDA_IMPLEMENTATION */
