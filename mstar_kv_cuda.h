/* mstar_kv_cuda.h - v0.1.0 - the GPU layer of mstar_kv: a run-time loader for
   the CUDA driver and NVRTC, a JIT with an in-memory and on-disk kernel cache,
   a device K/V store that plugs into the arena of mstar_kv.h, fences, and the
   launch wrappers of the kernels in kernels.cu (embedded below).

   Nothing here needs the CUDA toolkit, its headers or a GPU at compile time:
   libcuda and libnvrtc (nvcuda.dll and nvrtc64_*.dll on Windows) are opened
   at run time (dlopen, LoadLibrary) when a context is created, and a machine
   without them gets MSKV_ERROR_CUDA_UNAVAILABLE (the CPU backend of
   mstar_kv.h keeps working).

   Do this in exactly one C or C++ file, after mstar_kv.h:
       #define MSTAR_KV_IMPLEMENTATION
       #include "mstar_kv.h"
       #define MSTAR_KV_CUDA_IMPLEMENTATION
       #include "mstar_kv_cuda.h"
   (this layer reuses the platform wrappers of mstar_kv.h's implementation).
   Build:
       cc -std=c99 -O2 app.c -ldl -lpthread -lm
   Windows: cl /O2 app.c, or x86_64-w64-mingw32-gcc -std=c99 -O2 app.c.

   Compile-time options (define before the implementation):
     MSKV_CUDA_VSNPRINTF  the vsnprintf every message of this layer is built
                       with (default: the C library's); only failures, logs
                       and a variant's first compile format anything

   Run-time environment:
     MSKV_NVRTC_PATH   a libnvrtc to try first (after mskv_cuda_desc.nvrtc_path);
                       then NVRTC from PyPI (nvidia-cuda-nvrtc, -cu12) in
                       $VIRTUAL_ENV, $CONDA_PREFIX or $PYTHONPATH, the system's
                       libnvrtc.so.13/.12/.11.2/.so (/usr/local/cuda/lib64 too),
                       and the wheels in the user's and system's site-packages
                       (Windows: nvrtc64_130_0.dll, nvrtc64_120_0.dll,
                       nvrtc64_112_0.dll, also under %CUDA_PATH%\bin\x64 and
                       %CUDA_PATH%\bin)
     MSKV_CACHE_DIR    the kernel cache directory (else $XDG_CACHE_HOME/mstar_kv,
                       else ~/.cache/mstar_kv; Windows: %LOCALAPPDATA%\mstar_kv);
                       mskv_cuda_desc.cache_dir wins

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
   it. K/V written on another stream must be ordered by the caller, or the
   store moved onto that stream (mskv_cuda_store_set_stream: a framework's
   current stream). mskv_cuda_store_desc.pools adopts pools the caller
   allocated (a framework's tensors) instead of allocating them.

   Thread safety: a context (mskv_cuda) may be shared by threads (loading
   and the JIT cache are locked). A store has one stream, one attention
   workspace, and an unlocked cache of the kernels it launched with their
   parameter blocks (so a call takes no lock): drive it, and the launches on
   it, from one thread at a time (its bookkeeping locks only guard against
   the arena's callbacks, whose page copies use the context's locked lookup).

   Fences: pages freed by anything (release, abort, remove, offload) are
   tagged with the current step and come back only after that step's event
   completed. Offload or remove outside a step therefore returns its pages
   when the step is ended: mskv_cuda_publish(st, NULL, 0, NULL) and then
   mskv_cuda_retire (the demo does this before a reload that needs them),
   or at once with mskv_arena_flush (the store's flush op waits for its
   stream; e.g. after mskv_arena_reset or mskv_make_room).

   CUDA graphs: mskv_cuda_capture_begin/end capture the launches of a step;
   their plan arguments live in fixed device buffers, so upload a new plan
   with mskv_cuda_plan_upload (outside the capture) and replay the graph with
   mskv_cuda_graph_launch. Kernels are compiled on first use: run a step once
   before capturing it. A replay may change a plan's contents, not its shape
   (batch, token count, the longest segment's queries, keys beyond what the
   captured split-KV launches reach): graph_launch refuses such a plan. While
   graphs exist the attention workspace cannot grow (BAD_STATE).

   The kernels: an embedded copy of kernels.cu (section >>embedded kernels),
   regenerated by `sh tools/embed_kernels.sh` whenever kernels.cu changes;
   tests/test_cuda.c fails while the copy is stale. The GPU check,
   `make gpu-check` (tests/gpu_check.sh), runs everything on a real GPU
   against the CPU backend.

   License: MIT, at the end of this file.
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
   symbol with dlsym (GetProcAddress on Windows). */
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
/* The driver and its devices alone, without NVRTC: tells "no GPU" from "a
   GPU that cannot JIT" (the GPU check fails on the second). Return value:
   MSKV_SUCCESS with *devices (> 0) and *driver_version (1000*major +
   10*minor; both optional), or MSKV_ERROR_CUDA_UNAVAILABLE with why.
   Thread safety: any thread. */
MSKV_API mskv_result mskv_cuda_probe_driver(const mskv_cuda_desc *desc, int32_t *devices, int32_t *driver_version,
                                            char *why, size_t why_cap);
/* Loads the libraries (once per process), opens the device's primary context.
   Return value: MSKV_SUCCESS, CUDA_UNAVAILABLE (details to the logger and to
   mskv_cuda_probe), OUT_OF_MEMORY, CUDA. */
MSKV_API mskv_result mskv_cuda_create(const mskv_cuda_desc *desc, mskv_cuda **out);
/* Destroy every store of the context first. */
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
    /* Pools the caller allocated (a framework's tensors, so a model keeps its
       K/V where it already lives), adopted instead of allocated: pools[layer*2
       + kind] (kind 0 = K, 1 = V), 2 * num_layers device pointers, each
       num_pages * page_size * kv_heads * head_dim elements of dtype, 16-byte
       aligned. The store zeroes them on create and never frees them: keep
       them alive until mskv_cuda_store_destroy. NULL: the store allocates. */
    const mskv_cu_ptr *pools;
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
   [page][slot][kv_head][dim] (the host store's; allocated, or the caller's
   desc->pools), a stream, staging buffers. Sizes are checked against what a
   kernel can index (64-bit offsets). Return value: SUCCESS, NULL_POINTER,
   INVALID_ARGUMENT (a geometry field, or an adopted pool that is 0 or not
   16-byte aligned), OVERFLOW, OUT_OF_MEMORY, CUDA. */
MSKV_API mskv_result mskv_cuda_store_create(mskv_cuda *cu, const mskv_cuda_store_desc *desc, mskv_cuda_store **out);
/* Waits for the stream, then frees everything. Destroy the arena bound to
   the store first: its store ops and host allocator point here. */
MSKV_API void mskv_cuda_store_destroy(mskv_cuda_store *st);
/* Fills the geometry, store_ops (offload/reload/fork through the device),
   MSKV_RETIRE_FENCED and a pinned host_allocator (offloaded requests' host
   copies, filled by one DMA each) into an arena descriptor; other fields are
   kept (set host_allocator afterwards to use your own memory). */
MSKV_API mskv_result mskv_cuda_store_arena_desc(mskv_cuda_store *st, mskv_arena_desc *desc);
/* The arena whose fences this store retires (created with the desc above). */
MSKV_API mskv_result mskv_cuda_store_bind(mskv_cuda_store *st, mskv_arena *arena);
MSKV_API const mskv_store_ops *mskv_cuda_store_ops(mskv_cuda_store *st);
MSKV_API mskv_cu_ptr mskv_cuda_store_pool(mskv_cuda_store *st, int32_t layer, int kind);
MSKV_API mskv_cu_stream mskv_cuda_store_stream(mskv_cuda_store *st);
/* The legacy default stream (handle 0 in the runtime API, e.g. PyTorch's
   default stream), for mskv_cuda_store_set_stream. */
#define MSKV_CU_STREAM_LEGACY ((mskv_cu_stream)(uintptr_t)1)
/* Runs the store's launches and copies on the caller's stream from now on
   (a framework's current stream), so they are ordered with the caller's own
   kernels without events; NULL goes back to the store's own stream. Work
   queued on the previous stream is waited for first, so fences and offloads
   stay ordered. The store never destroys a caller's stream: set another one
   before destroying it. Return value: SUCCESS, NULL_POINTER, BAD_STATE (while
   capturing), CUDA (the wait failed; the stream is unchanged). */
MSKV_API mskv_result mskv_cuda_store_set_stream(mskv_cuda_store *st, mskv_cu_stream stream);
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

/* Copies a plan into the store's fixed device buffers (through the next
   pinned ring buffer, reused only after its copies completed); pos_mode says
   how many positions to copy.
   Return value: CAPACITY (past the store's max_batch / max_tokens /
   max_page_ids), OUT_OF_RANGE (a page id outside [1, num_pages) or a slot
   in the null page or past the pools: the kernels would trust it),
   INVALID_ARGUMENT (another page size, a pos_mode it does not know, or a
   table whose indptrs do not run from 0 to total_q / num_page_ids without
   decreasing, or a kv_len past its pages: a replayed graph trusts it),
   STALE_PLAN (an arena-built plan whose pages changed since it was built:
   mskv_plan_check against the bound arena), BAD_STATE (while capturing, or
   an arena-built plan on a store bound to no arena), CUDA.
   mskv_cuda_write_kv, mskv_cuda_attention and mskv_cuda_graph_launch check
   the uploaded plan again (STALE_PLAN): they read it until the next upload. */
MSKV_API mskv_result mskv_cuda_plan_upload(mskv_cuda_store *st, const mskv_plan *plan, mskv_pos_mode pos_mode, mskv_cuda_dplan *out);
/* Scatters k, v (device, [total_q][kv_heads][head_dim], the store's dtype,
   16-byte aligned) into layer `layer` through plan->slot_mapping; rope
   (optional) rotates K on the way in at plan->positions.
   mskv_cuda_write_kv_ex takes k and v in src_dtype (F32, F16 or BF16) and
   converts them into the store's dtype on the device, rounding to nearest
   even as mskv_cpu_write_kv does (bit for bit; RoPE is computed in f32 from
   the source values and rounded once). mskv_cuda_write_kv is the _ex call
   with the store's dtype.
   Return value: SUCCESS, NULL_POINTER, OUT_OF_RANGE (layer), UNSUPPORTED
   (head_dim), INVALID_ARGUMENT (k or v not 16-byte aligned: the kernel reads
   16-byte vectors; a rope the CPU refuses or of another position mode; a
   src_dtype that is not F32, F16 or BF16),
   STALE_PLAN (the plan uploaded last is an arena-built plan whose pages
   changed since it was built), OVERFLOW, CUDA, NVRTC (first use compiles).
   Cost: the first call of a variant compiles or loads it; later calls only
   check, look the kernel up by an integer key and launch (no allocation, no
   string, one cuCtxSetCurrent). The same holds for the wrappers below. */
MSKV_API mskv_result mskv_cuda_write_kv(mskv_cuda_store *st, int32_t layer, const mskv_cuda_dplan *plan, mskv_cu_ptr k, mskv_cu_ptr v, const mskv_rope *rope);
MSKV_API mskv_result mskv_cuda_write_kv_ex(mskv_cuda_store *st, int32_t layer, const mskv_cuda_dplan *plan, mskv_cu_ptr k,
                                          mskv_cu_ptr v, mskv_dtype src_dtype, const mskv_rope *rope);

/* // >>graphs --------------------------------------------------------------- */

/* A captured step (the launches between capture_begin and capture_end)
   replays with whatever plan was uploaded last, if that plan has the
   captured batch and token count and no segment longer than the captured
   ones (queries; keys up to what its split-KV launches cover). One capture
   serves a bucket of smaller steps: plan them padded to the captured shape
   (mskv_plan_desc.pad_batch, pad_tokens, pad_qo_len, pad_kv_len), which
   gives the same launch sizes; the padding reads and writes nothing.
   mskv_cuda_graph_launch returns CAPACITY for a step larger than the
   capture ("capture again" in mskv_cuda_last_error), INVALID_ARGUMENT for a
   smaller one not padded to it, STALE_PLAN, BAD_STATE (capturing), CUDA. */
typedef struct mskv_cuda_graph mskv_cuda_graph;
MSKV_API mskv_result mskv_cuda_capture_begin(mskv_cuda_store *st);
MSKV_API mskv_result mskv_cuda_capture_end(mskv_cuda_store *st, mskv_cuda_graph **out);
MSKV_API mskv_result mskv_cuda_graph_launch(mskv_cuda_store *st, mskv_cuda_graph *g);
MSKV_API void mskv_cuda_graph_destroy(mskv_cuda_store *st, mskv_cuda_graph *g);

/* // >>attention wrappers ---------------------------------------------------- */
/* GPU attention, merge and RoPE launch wrappers. */

/* How one attention call is laid out on the device. Pure arithmetic (no
   device): the wrapper uses it, and a caller can size its workspace or check
   what a CUDA graph will launch. */
typedef struct mskv_cuda_attn_geometry {
    int32_t decode;          /* 1: decode layout (16 rows per block, warps split the keys) */
    int32_t block_rows;      /* BM: rows (query x q head of a group) per block */
    int32_t block_keys;      /* BN: keys per K/V tile */
    uint32_t grid[3];        /* row tiles, segments, kv_heads * n_splits */
    uint32_t block_threads;  /* 128 */
    uint32_t smem_bytes;     /* dynamic shared memory */
    int32_t n_splits;        /* key splits (flash-decoding); 1 = none */
    int32_t kv_chunk;        /* keys per split (a multiple of block_keys) */
    size_t workspace_bytes;  /* f32 partial o and lse when n_splits > 1, else 0 */
} mskv_cuda_attn_geometry;

/* Parameters: the plan's sizes (batch, total_q, the longest qo_len and
   kv_len of a segment), heads, head_dim (64, 128, 256), the device's SM count
   and opt-in shared memory per block (0 = 99 KiB, what every sm_80+ part has).
   Splits are chosen so that about two waves of blocks fill the SMs when the
   (segment, kv head, row tile) blocks alone would not.
   Return value: SUCCESS, INVALID_ARGUMENT (heads, head_dim), OVERFLOW. */
MSKV_API mskv_result mskv_cuda_attn_geometry_get(int32_t batch, int32_t total_q, int32_t max_qo_len,
                                                 int32_t max_kv_len, int32_t q_heads, int32_t kv_heads,
                                                 int32_t head_dim, int32_t multiprocessors,
                                                 int32_t max_smem_bytes, mskv_cuda_attn_geometry *out);

/* Paged attention over a plan for one layer of the store, on the store's
   stream (tensor cores: the store's dtype must be F16 or BF16, and
   attn->q_dtype the same; f32 q/o are UNSUPPORTED: converting them would be
   two extra passes over q and o that the caller's framework does better
   fused into the projections that make q and consume o). plan: the host plan (for its sizes); dplan: the
   same plan uploaded by mskv_cuda_plan_upload (a paged plan: the dense
   form has no page table). q (16-byte aligned), o: device
   [total_q][q_heads][head_dim]; lse (0 = none): device f32 [total_q][q_heads],
   natural log. Masked plans need kv_pos_split/shift (positions must not
   decrease along a sequence: kv_pos_shift >= 0) and no more queries than
   keys per segment. Semantics are mskv_cpu_attention's: masks on absolute
   positions, GQA, a query that sees no key gets o = 0 and lse = -inf. The
   host plan's table is checked (indptrs, kv_len within its pages): the
   kernel reads only the pages it was given.
   Return value: SUCCESS, NULL_POINTER, INVALID_ARGUMENT, OUT_OF_RANGE (layer),
   UNSUPPORTED (f32 store, f32 q, head_dim; a plan whose features ask for explicit
   query positions or visibility bounds, which these kernels do not read
   yet: the CPU backend's mskv_cpu_attention does), STALE_PLAN (plan, or the
   plan uploaded last, is an arena-built plan whose pages changed since it
   was built), CUDA, NVRTC (first use compiles). */
MSKV_API mskv_result mskv_cuda_attention(mskv_cuda_store *st, int32_t layer, const mskv_plan *plan,
                                         const mskv_cuda_dplan *dplan, const mskv_attn *attn,
                                         mskv_cu_ptr q, mskv_cu_ptr o, mskv_cu_ptr lse);

/* mskv_cpu_merge on the device: two partial states over disjoint key sets
   (f32 [n][heads][head_dim] and [n][heads]) into their union; o/lse may alias
   a or b. head_dim 64, 128 or 256. */
MSKV_API mskv_result mskv_cuda_merge(mskv_cuda_store *st, int64_t n, int32_t heads, int32_t head_dim,
                                     mskv_cu_ptr o_a, mskv_cu_ptr lse_a, mskv_cu_ptr o_b, mskv_cu_ptr lse_b,
                                     mskv_cu_ptr o, mskv_cu_ptr lse);

/* mskv_rope_apply on the device: rotates x (device [n][heads][store
   head_dim], the store's dtype) in place at positions (device int32, [n] or
   [n][3] by rope->mode). */
MSKV_API mskv_result mskv_cuda_rope(mskv_cuda_store *st, const mskv_rope *rope, mskv_cu_ptr x, int64_t n,
                                    int32_t heads, mskv_cu_ptr positions);

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

/* the >>platform section's system headers, here outside extern "C" */
#ifdef _WIN32
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>
#else
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <dirent.h>
#include <sys/stat.h>
#include <sys/types.h>
#endif

#ifndef MSTAR_KV_IMPLEMENTED
#error "define MSTAR_KV_IMPLEMENTATION and include mstar_kv.h in the same file, before MSTAR_KV_CUDA_IMPLEMENTATION (this layer reuses its platform wrappers)"
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
    "     MSKV_SRC_DTYPE  kv_write only: dtype of k_src/v_src (default MSKV_DTYPE);\n",
    "                     another one is converted on the way in, rounded to\n",
    "                     nearest even as the CPU backend rounds\n",
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
    "     MSKV_SRC_DTYPE) goes to slot slot_mapping[token], in the pool dtype;\n",
    "     slots < 0 or >= pool_slots are skipped. With MSKV_ROPE, K is rotated on\n",
    "     the way in at positions ([n] or [n][3]), in f32 from the source values,\n",
    "     rounded once into the pool; theta <= 0 means 10000.\n",
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
    "#ifndef MSKV_SRC_DTYPE\n",
    "#define MSKV_SRC_DTYPE MSKV_DTYPE\n",
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
    "/* Element i of an array of dtype dt (a compile-time constant at every call). */\n",
    "MSKV_DEV float mskv_load_dt(const void *base, mskv_i64 i, int dt) {\n",
    "    return dt == 0 ? ((const float *)base)[i]\n",
    "         : dt == 1 ? mskv_h2f(((const mskv_u16 *)base)[i]) : mskv_b2f(((const mskv_u16 *)base)[i]);\n",
    "}\n",
    "MSKV_DEV float mskv_load_el(const void *base, mskv_i64 i) { return mskv_load_dt(base, i, MSKV_DTYPE); }\n",
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
    "/* Rotates one row src (D elements of dtype src_dt) -> dst (the pool dtype;\n",
    "   may alias src when src_dt is the pool dtype). */\n",
    "MSKV_DEV void mskv_rope_row(const void *src, int src_dt, void *dst, const int *pos, float theta, int lane) {\n",
    "    float l2t = log2f(theta > 0.0f ? theta : 10000.0f);\n",
    "    for (int p = lane; p < MSKV_D / 2; p += 32) {\n",
    "        int e0, e1;\n",
    "        float c, s, x, y;\n",
    "        mskv_rope_pair(p, pos, l2t, &e0, &e1, &c, &s);\n",
    "        x = mskv_load_dt(src, e0, src_dt);\n",
    "        y = mskv_load_dt(src, e1, src_dt);\n",
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
    "/* One row of D source elements into the pool dtype, element by element: the\n",
    "   conversion of a variant whose source dtype is not the pool's. */\n",
    "MSKV_DEV void mskv_convert_row(const void *src, void *dst, int lane) {\n",
    "    for (int e = lane; e < MSKV_D; e += 32) mskv_store_el(dst, e, mskv_load_dt(src, e, MSKV_SRC_DTYPE));\n",
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
    "    src_off = row * MSKV_D * (MSKV_SRC_DTYPE == 0 ? 4 : 2);\n",
    "    dst_off = (slot * kv_heads + h) * MSKV_D * MSKV_ESIZE;\n",
    "#if MSKV_SRC_DTYPE != MSKV_DTYPE\n",
    "    mskv_convert_row((const unsigned char *)v_src + src_off, (unsigned char *)v_pool + dst_off, lane);\n",
    "#if MSKV_ROPE != 0\n",
    "    mskv_rope_row((const unsigned char *)k_src + src_off, MSKV_SRC_DTYPE, (unsigned char *)k_pool + dst_off,\n",
    "                  positions + (MSKV_ROPE == 2 ? 3 * token : token), theta, lane);\n",
    "#else\n",
    "    (void)positions; (void)theta;\n",
    "    mskv_convert_row((const unsigned char *)k_src + src_off, (unsigned char *)k_pool + dst_off, lane);\n",
    "#endif\n",
    "#elif MSKV_ROPE != 0\n",
    "    mskv_copy_row((const unsigned char *)v_src + src_off, (unsigned char *)v_pool + dst_off, lane);\n",
    "    mskv_rope_row((const unsigned char *)k_src + src_off, MSKV_DTYPE, (unsigned char *)k_pool + dst_off,\n",
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
    "        mskv_rope_row(p, MSKV_DTYPE, p, positions + (MSKV_ROPE == 2 ? 3 * token : token), theta, lane);\n",
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
    "        /* mask, online softmax: the running max m is kept unscaled, exponents in log2 units */\n",
    "        {\n",
    "            float mx[2], alpha[2];\n",
    "            /* is every key of the warp's slice visible to both of this thread's\n",
    "               rows? Then no per-element test (positions grow with the index). */\n",
    "            const int k_first = n0 + wkey0, k_last = k_first + MSKV_WK - 1;\n",
    "            int full = k_first >= n_lo && k_last < n_hi;\n",
    "            if (full && mask >= 1) {\n",
    "                int qmin = qpos[0] < qpos[1] ? qpos[0] : qpos[1], qmax = qpos[0] < qpos[1] ? qpos[1] : qpos[0];\n",
    "                full = mskv_abs_pos(k_last, psplit, pshift) <= qmin &&\n",
    "                       (mask != 2 || qmax - mskv_abs_pos(k_first, psplit, pshift) <= window_left);\n",
    "            }\n",
    "            mx[0] = m[0]; mx[1] = m[1];\n",
    "            if (full) {\n",
    "MSKV_UNROLL\n",
    "                for (int nt = 0; nt < MSKV_NT; nt++) {\n",
    "MSKV_UNROLL\n",
    "                    for (int e = 0; e < 4; e++) mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);\n",
    "                }\n",
    "            } else {\n",
    "MSKV_UNROLL\n",
    "                for (int nt = 0; nt < MSKV_NT; nt++) {\n",
    "MSKV_UNROLL\n",
    "                    for (int e = 0; e < 4; e++) {\n",
    "                        int h = e >> 1, j = k_first + nt * 8 + 2 * t4 + (e & 1);\n",
    "                        int kp = mskv_abs_pos(j, psplit, pshift);\n",
    "                        int ok = j >= n_lo && j < n_hi;\n",
    "                        if (mask >= 1) ok = ok && kp <= qpos[h];\n",
    "                        if (mask == 2) ok = ok && qpos[h] - kp <= window_left;\n",
    "                        s[nt][e] = ok ? s[nt][e] : mskv_neg_inf();\n",
    "                        mx[h] = fmaxf(mx[h], s[nt][e]);\n",
    "                    }\n",
    "                }\n",
    "            }\n",
    "MSKV_UNROLL\n",
    "            for (int h = 0; h < 2; h++) {\n",
    "                float mu;\n",
    "                mx[h] = fmaxf(mx[h], mskv_shfl_xor(mx[h], 1));\n",
    "                mx[h] = fmaxf(mx[h], mskv_shfl_xor(mx[h], 2));\n",
    "                mu = mx[h] == mskv_neg_inf() ? 0.0f : mx[h];  /* nothing seen yet: keep exp2 finite */\n",
    "                alpha[h] = mskv_exp2((m[h] - mu) * scale_log2);\n",
    "                m[h] = mx[h];\n",
    "                l[h] *= alpha[h];\n",
    "                mx[h] = mu * scale_log2;  /* p = exp2(s * scale_log2 - mx): one fma per score */\n",
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
    "                    s[nt][e] = mskv_exp2(fmaf(s[nt][e], scale_log2, -mx[e >> 1]));\n",
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
    "                    float f = mskv_exp2((mm[w * 16 + r] - M) * scale_log2);\n",
    "                    L += f * ml[w * 16 + r];\n",
    "                    acc += f * mo[(w * 16 + r) * MSKV_D + d];\n",
    "                }\n",
    "            }\n",
    "            orow = (mskv_i64)(q0 + R / group) * q_heads + kvh * group + R % group;\n",
    "            if (n_splits > 1) {\n",
    "                o_part[((mskv_i64)split * total_q * q_heads + orow) * MSKV_D + d] = L > 0.0f ? acc / L : 0.0f;\n",
    "                if (d == 0) lse_part[(mskv_i64)split * total_q * q_heads + orow] = L > 0.0f ? (M * scale_log2 + log2f(L)) * ln2 : mskv_neg_inf();\n",
    "            } else {\n",
    "                mskv_store_el(o, orow * MSKV_D + d, L > 0.0f ? acc / L : 0.0f);\n",
    "                if (lse && d == 0) lse[orow] = L > 0.0f ? (M * scale_log2 + log2f(L)) * ln2 : mskv_neg_inf();\n",
    "            }\n",
    "        }\n",
    "#else\n",
    "        for (int h = 0; h < 2; h++) {\n",
    "            int R = row0 + wrow0 + g + 8 * h;\n",
    "            float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;\n",
    "            float lv = l[h] > 0.0f ? (m[h] * scale_log2 + log2f(l[h])) * ln2 : mskv_neg_inf();\n",
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
    "#undef MSKV_SRC_DTYPE\n",
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

#ifndef MSKV_CUDA_VSNPRINTF
#define MSKV_CUDA_VSNPRINTF vsnprintf
#endif
#if defined(__MINGW32__) && defined(__MINGW_PRINTF_FORMAT)
/* MinGW's printf family is msvcrt's or its own C99 one: check against the one in use */
#define MSKV__CUDA_PRINTF(f, a) __attribute__((format(__MINGW_PRINTF_FORMAT, f, a)))
#elif defined(__GNUC__)
#define MSKV__CUDA_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define MSKV__CUDA_PRINTF(f, a)
#endif

/* Every formatted string of this file is built here (one place to swap the
   formatter, and to count it: the per-call launch path formats nothing). */
static void mskv__cuda_vformat(char *buf, size_t cap, const char *fmt, va_list ap) {
    if (buf && cap) MSKV_CUDA_VSNPRINTF(buf, cap, fmt, ap);
}
static void mskv__cuda_format(char *buf, size_t cap, const char *fmt, ...) MSKV__CUDA_PRINTF(3, 4);
static void mskv__cuda_format(char *buf, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    mskv__cuda_vformat(buf, cap, fmt, ap);
    va_end(ap);
}

/* snprintf that appends to buf and never overflows */
static void mskv__cuda_appendf(char *buf, size_t cap, const char *fmt, ...) MSKV__CUDA_PRINTF(3, 4);
static void mskv__cuda_appendf(char *buf, size_t cap, const char *fmt, ...) {
    size_t len;
    va_list ap;
    if (!buf || !cap) return;
    len = strlen(buf);
    if (len + 1 >= cap) return;
    va_start(ap, fmt);
    mskv__cuda_vformat(buf + len, cap - len, fmt, ap);
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

/* // >>platform -------------------------------------------------------------
   What this layer needs from the operating system beyond mstar_kv.h's
   platform section, whose mutex it reuses (the implementation of mstar_kv.h
   is in the same file): loading a library, the driver's and NVRTC's names,
   the environment, the cache directory, and for the disk cache whole-file
   reads and a temp file renamed over the entry. LoadLibrary and Win32 files
   on _WIN32, dlopen and POSIX files elsewhere. */

#ifdef _WIN32
#define MSKV__CUDA_SEP "\\"
/* the driver ships with the display driver (System32); NVRTC's DLL is named
   after its ABI: 13.x, 12.x, and 11.2-11.8 */
static const char *const mskv__cuda_driver_names[] = { "nvcuda.dll" };
static const char *const mskv__cuda_nvrtc_names[] = { "nvrtc64_130_0.dll", "nvrtc64_120_0.dll", "nvrtc64_112_0.dll" };
#else
#define MSKV__CUDA_SEP "/"
/* libcuda.so.1 first: the unversioned name may be the toolkit's stub */
static const char *const mskv__cuda_driver_names[] = { "libcuda.so.1", "libcuda.so" };
static const char *const mskv__cuda_nvrtc_names[] = { "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so" };
#endif
#define MSKV__CUDA_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

typedef mskv__mutex mskv__cuda_mutex;
#define MSKV__CUDA_MUTEX_INIT MSKV__MUTEX_INIT
static void mskv__cuda_lock(mskv__cuda_mutex *m) { mskv__mutex_lock(m); }
static void mskv__cuda_unlock(mskv__cuda_mutex *m) { mskv__mutex_unlock(m); }

/* 1 and the value (cut to cap) when the variable is set and not empty */
static int mskv__cuda_getenv(const char *name, char *out, size_t cap) {
#ifdef _WIN32
    /* the process environment itself: no CRT copy, no deprecation warning */
    char tmp[32768];
    DWORD n = GetEnvironmentVariableA(name, tmp, (DWORD)sizeof(tmp));
    if (n == 0 || n >= sizeof(tmp)) return 0;
    mskv__cuda_copystr(out, cap, tmp);
    return 1;
#else
    const char *e = getenv(name);
    if (!e || !*e) return 0;
    mskv__cuda_copystr(out, cap, e);
    return 1;
#endif
}

/* The default cache directory, "" when there is none; one too long for out
   comes back cut to the brim, which the caller's length check turns off. */
static void mskv__cuda_default_cache_dir(char *out, size_t cap) {
    out[0] = 0;
#ifdef _WIN32
    if (mskv__cuda_getenv("LOCALAPPDATA", out, cap)) mskv__cuda_appendf(out, cap, "\\mstar_kv");
#else
    if (mskv__cuda_getenv("XDG_CACHE_HOME", out, cap)) mskv__cuda_appendf(out, cap, "/mstar_kv");
    else if (mskv__cuda_getenv("HOME", out, cap)) mskv__cuda_appendf(out, cap, "/.cache/mstar_kv");
#endif
}

/* NVRTC's names after the caller's choices (at most MSKV__CUDA_NVRTC_MAX).
   Windows: the bare DLL names (the loader's search: PATH), then the
   toolkit's folders. POSIX: PyPI's wheels in the active Python environment
   ($VIRTUAL_ENV, $CONDA_PREFIX, $PYTHONPATH: what that environment's other
   CUDA code runs with), the bare names (the loader's search path), the
   toolkit's default place, then the wheels in the user's and the system's
   site-packages. Only wheel files that exist are listed, so absent wheels
   add nothing to the reasons. */
#define MSKV__CUDA_NVRTC_MAX 24
#ifdef _WIN32
#define MSKV__CUDA_NVRTC_NOT_FOUND " (no NVRTC)"
static int mskv__cuda_nvrtc_candidates(char (*paths)[512], int max) {
    /* CUDA 13 keeps its DLLs in bin\x64, earlier releases in bin; the
       installer puts them on PATH, but not every environment keeps it */
    static const char *const sub[2] = { "\\bin\\x64", "\\bin" };
    char root[400];
    int n = 0, i, s, have_root = mskv__cuda_getenv("CUDA_PATH", root, sizeof(root));
    for (i = 0; i < MSKV__CUDA_COUNT(mskv__cuda_nvrtc_names) && n < max; i++)
        mskv__cuda_copystr(paths[n++], sizeof(paths[0]), mskv__cuda_nvrtc_names[i]);
    for (s = 0; s < 2 && have_root; s++)
        for (i = 0; i < MSKV__CUDA_COUNT(mskv__cuda_nvrtc_names) && n < max; i++)
            mskv__cuda_format(paths[n++], sizeof(paths[0]), "%s%s\\%s", root, sub[s], mskv__cuda_nvrtc_names[i]);
    return n;
}
#else
#define MSKV__CUDA_NVRTC_NOT_FOUND \
    "; no NVRTC wheel (nvidia/cu13/lib/libnvrtc.so.13, nvidia/cuda_nvrtc/lib/libnvrtc.so.12) in " \
    "$VIRTUAL_ENV, $CONDA_PREFIX, $PYTHONPATH or the user and system site-packages (no NVRTC)"
/* Where PyPI's NVRTC wheels put the library below a site-packages
   directory: nvidia-cuda-nvrtc 13.x, then nvidia-cuda-nvrtc-cu12 (each
   library finds its builtins beside it through its $ORIGIN run path). */
static const char *const mskv__cuda_nvrtc_wheels[2] = {
    "nvidia/cu13/lib/libnvrtc.so.13", "nvidia/cuda_nvrtc/lib/libnvrtc.so.12" };

typedef struct mskv__cuda_paths { char (*p)[512]; int n, max; } mskv__cuda_paths;

static void mskv__cuda_paths_add(mskv__cuda_paths *ps, const char *path) {
    if (ps->n < ps->max && strlen(path) < sizeof(ps->p[0])) mskv__cuda_copystr(ps->p[ps->n++], sizeof(ps->p[0]), path);
}

/* The wheels' libraries that exist in one site-packages directory (len bytes of site). */
static void mskv__cuda_paths_site(mskv__cuda_paths *ps, const char *site, size_t len) {
    char path[512];
    int i;
    for (i = 0; i < 2; i++) {
        size_t w = strlen(mskv__cuda_nvrtc_wheels[i]);
        if (len == 0 || len + w + 2 > sizeof(path)) continue;
        memcpy(path, site, len);
        path[len] = '/';
        memcpy(path + len + 1, mskv__cuda_nvrtc_wheels[i], w + 1);
        if (access(path, F_OK) == 0) mskv__cuda_paths_add(ps, path);
    }
}

/* <prefix>/lib/python3.X/<leaf> for each Python version X present: a venv, a
   conda environment, ~/.local, /usr/local, /usr. One directory read per prefix. */
static void mskv__cuda_paths_prefix(mskv__cuda_paths *ps, const char *prefix, const char *leaf) {
    char dir[512], site[512];
    DIR *d;
    struct dirent *e;
    if (!prefix || !*prefix || strlen(prefix) + 5 >= sizeof(dir)) return;
    mskv__cuda_format(dir, sizeof(dir), "%s/lib", prefix);
    if ((d = opendir(dir)) == NULL) return;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "python3", 7) != 0) continue;
        if (strlen(dir) + strlen(e->d_name) + strlen(leaf) + 3 > sizeof(site)) continue;
        mskv__cuda_format(site, sizeof(site), "%s/%s/%s", dir, e->d_name, leaf);
        mskv__cuda_paths_site(ps, site, strlen(site));
    }
    closedir(d);
}

static int mskv__cuda_nvrtc_candidates(char (*paths)[512], int max) {
    mskv__cuda_paths ps;
    char env[1024], home[512];
    const char *e;
    int i;
    ps.p = paths; ps.n = 0; ps.max = max;
    if (mskv__cuda_getenv("VIRTUAL_ENV", env, sizeof(env))) mskv__cuda_paths_prefix(&ps, env, "site-packages");
    if (mskv__cuda_getenv("CONDA_PREFIX", env, sizeof(env))) mskv__cuda_paths_prefix(&ps, env, "site-packages");
    if (mskv__cuda_getenv("PYTHONPATH", env, sizeof(env))) {
        for (e = env; *e; e += *e == ':') {
            size_t n = strcspn(e, ":");
            mskv__cuda_paths_site(&ps, e, n);
            e += n;
        }
    }
    for (i = 0; i < MSKV__CUDA_COUNT(mskv__cuda_nvrtc_names); i++) mskv__cuda_paths_add(&ps, mskv__cuda_nvrtc_names[i]);
    for (i = 0; i < MSKV__CUDA_COUNT(mskv__cuda_nvrtc_names) && ps.n < max; i++)
        mskv__cuda_format(paths[ps.n++], sizeof(paths[0]), "/usr/local/cuda/lib64/%s", mskv__cuda_nvrtc_names[i]);
    if (mskv__cuda_getenv("HOME", env, sizeof(env)) && strlen(env) < 400) {
        mskv__cuda_format(home, sizeof(home), "%s/.local", env);
        mskv__cuda_paths_prefix(&ps, home, "site-packages");
    }
    mskv__cuda_paths_prefix(&ps, "/usr/local", "dist-packages");
    mskv__cuda_paths_prefix(&ps, "/usr/local", "site-packages");
    mskv__cuda_paths_prefix(&ps, "/usr", "dist-packages");
    mskv__cuda_paths_prefix(&ps, "/usr", "site-packages");
    return ps.n;
}
#endif

/* Opens a library; NULL and the loader's reason in err otherwise. */
static void *mskv__cuda_lib_open(const char *name, char *err, size_t cap) {
#ifdef _WIN32
    /* an absolute path (the only kind the flag allows): its own folder first
       for the DLLs it needs */
    int absolute = (name[0] && name[1] == ':' && (name[2] == '\\' || name[2] == '/')) ||
                   (name[0] == '\\' && name[1] == '\\');
    HMODULE h = LoadLibraryExA(name, NULL, absolute ? LOAD_WITH_ALTERED_SEARCH_PATH : 0);
    if (!h) {
        DWORD code = GetLastError();
        char msg[256];
        DWORD len = FormatMessageA(FORMAT_MESSAGE_FROM_SYSTEM | FORMAT_MESSAGE_IGNORE_INSERTS, NULL, code, 0, msg,
                                   (DWORD)sizeof(msg), NULL);
        while (len > 0 && (msg[len - 1] == '\r' || msg[len - 1] == '\n' || msg[len - 1] == ' ')) len--;
        msg[len] = 0;
        mskv__cuda_format(err, cap, "%s (Windows error %lu)", len ? msg : "LoadLibrary failed", (unsigned long)code);
    }
    return (void *)h;
#else
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        mskv__cuda_copystr(err, cap, e ? e : "not found");
    }
    return lib;
#endif
}

/* A function's address; dlsym and GetProcAddress disagree on its type, and
   going through memcpy keeps ISO C quiet either way. */
static void *mskv__cuda_sym(void *lib, const char *name) {
#ifdef _WIN32
    FARPROC f = GetProcAddress((HMODULE)lib, name);
    void *p = NULL;
    memcpy(&p, &f, sizeof(p) < sizeof(f) ? sizeof(p) : sizeof(f));
    return p;
#else
    return dlsym(lib, name);
#endif
}

static void mskv__cuda_lib_close(void *lib) {
#ifdef _WIN32
    FreeLibrary((HMODULE)lib);
#else
    dlclose(lib);
#endif
}

static unsigned long mskv__cuda_pid(void) {
#ifdef _WIN32
    return (unsigned long)GetCurrentProcessId();
#else
    return (unsigned long)getpid();
#endif
}

static int mskv__cuda_is_sep(char c) {
#ifdef _WIN32
    return c == '\\' || c == '/';
#else
    return c == '/';
#endif
}

/* One directory; an existing one (or a failure) is for the caller's next step to find out. */
static void mskv__cuda_mkdir(const char *path) {
#ifdef _WIN32
    CreateDirectoryA(path, NULL);
#else
    mkdir(path, 0755);
#endif
}

/* Reads a whole file; NULL when absent or unreadable. */
static unsigned char *mskv__cuda_read_file(const mskv_allocator *a, const char *path, size_t *size) {
    unsigned char *buf;
    size_t got = 0, want;
#ifdef _WIN32
    /* FILE_SHARE_DELETE: a writer may rename a new entry over this one meanwhile */
    HANDLE h = CreateFileA(path, GENERIC_READ, FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, NULL,
                           OPEN_EXISTING, FILE_ATTRIBUTE_NORMAL, NULL);
    LARGE_INTEGER sz;
    if (h == INVALID_HANDLE_VALUE) return NULL;
    if (!GetFileSizeEx(h, &sz) || sz.QuadPart < 0 || (uint64_t)sz.QuadPart >= (uint64_t)SIZE_MAX) { CloseHandle(h); return NULL; }
    want = (size_t)sz.QuadPart;
    buf = (unsigned char *)mskv__cuda_alloc(a, want + 1);
    if (!buf) { CloseHandle(h); return NULL; }
    while (got < want) {
        DWORD r = 0, ask = want - got > 0x40000000u ? 0x40000000u : (DWORD)(want - got);
        if (!ReadFile(h, buf + got, ask, &r, NULL) || r == 0) break;
        got += r;
    }
    CloseHandle(h);
#else
    int fd = open(path, O_RDONLY);
    struct stat sb;
    if (fd < 0) return NULL;
    if (fstat(fd, &sb) != 0 || sb.st_size < 0) { close(fd); return NULL; }
    want = (size_t)sb.st_size;
    buf = (unsigned char *)mskv__cuda_alloc(a, want + 1);
    if (!buf) { close(fd); return NULL; }
    while (got < want) {
        ssize_t r = read(fd, buf + got, want - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
#endif
    *size = got;
    return buf;
}

/* Writes the parts to a new file tmp (failing if it exists), then renames it
   over path in one step, so a reader sees the old entry or the new one,
   never half of one. Nothing is left behind on failure. */
static int mskv__cuda_write_replace(const char *tmp, const char *path, const void *const *part, const size_t *len, int nparts) {
    int i, ok = 1;
#ifdef _WIN32
    HANDLE h = CreateFileA(tmp, GENERIC_WRITE, 0, NULL, CREATE_NEW, FILE_ATTRIBUTE_NORMAL, NULL);
    if (h == INVALID_HANDLE_VALUE) return 0;
    for (i = 0; i < nparts && ok; i++) {
        const char *p = (const char *)part[i];
        size_t n = len[i];
        while (n && ok) {
            DWORD w = 0, ask = n > 0x40000000u ? 0x40000000u : (DWORD)n;
            if (!WriteFile(h, p, ask, &w, NULL) || w == 0) ok = 0;
            p += w; n -= w;
        }
    }
    if (!CloseHandle(h)) ok = 0;
    if (!ok || !MoveFileExA(tmp, path, MOVEFILE_REPLACE_EXISTING)) { DeleteFileA(tmp); return 0; }
#else
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) return 0;
    for (i = 0; i < nparts && ok; i++) {
        const char *p = (const char *)part[i];
        size_t n = len[i];
        while (n && ok) {
            ssize_t w = write(fd, p, n);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) ok = 0;
            else { p += w; n -= (size_t)w; }
        }
    }
    if (close(fd) != 0) ok = 0;
    if (!ok || rename(tmp, path) != 0) { unlink(tmp); return 0; }
#endif
    return 1;
}

/* // >>loader ---------------------------------------------------------------
   The libraries are opened once per process under one lock; the table is
   written only while it is held and never changes afterwards. */

typedef mskv_cu_result (*mskv__cuda_getproc_fn)(const char *symbol, void **pfn, int version, unsigned long long flags, int *status);

typedef struct mskv__cuda_global {
    int driver_tried, nvrtc_ok;
    mskv_result driver_result;
    char driver_why[768];
    char nvrtc_why[2048];      /* every candidate tried, each with the loader's reason */
    char nvrtc_used[512];      /* the libnvrtc that loaded */
    void *libcuda, *libnvrtc;
    mskv_cuda_functions fn;
} mskv__cuda_global;

static mskv__cuda_mutex mskv__cuda_g_lock = MSKV__CUDA_MUTEX_INIT;
static mskv__cuda_global mskv__cuda_g;   /* zero: nothing loaded */

#define MSKV__CUDA_SET_FN(member, ptr) memcpy((void *)&(member), &(ptr), sizeof(void *))

static const char *mskv__cuda_cu_name(const mskv_cuda_functions *fn, mskv_cu_result r) {
    const char *s = NULL;
    if (fn && fn->cuGetErrorString && fn->cuGetErrorString(r, &s) == MSKV_CU_SUCCESS && s) return s;
    return "unknown CUDA error";
}

/* Opens the first of names that loads; every failure is appended to why. */
static void *mskv__cuda_open_first(const char *const *names, int n, const char **used, char *why, size_t cap) {
    int i;
    for (i = 0; i < n; i++) {
        char err[512] = "";
        void *lib = mskv__cuda_lib_open(names[i], err, sizeof(err));
        if (lib) { *used = names[i]; return lib; }
        mskv__cuda_appendf(why, cap, "%s%s: %s", why[0] ? "; " : "", names[i], err);
    }
    return NULL;
}

/* Opens a driver library and fills the driver part of fn. Returns
   CUDA_UNAVAILABLE with the reason in why. */
static mskv_result mskv__cuda_open_driver(const char *const *names, int n_names, void **lib_out,
                                          mskv_cuda_functions *fn, char *why, size_t cap) {
    void *lib = NULL;
    int version = 0, count = 0, missing = 0;
    mskv_cu_result r;
    mskv__cuda_getproc_fn getproc = NULL;
    void *p;
    const char *used = NULL;
    lib = mskv__cuda_open_first(names, n_names, &used, why, cap);
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
        mskv__cuda_lib_close(lib);
        return MSKV_ERROR_CUDA_UNAVAILABLE;
    }
    r = fn->cuInit(0);
    if (r != MSKV_CU_SUCCESS) {
        mskv__cuda_appendf(why, cap, "%s%s: cuInit failed with %d (%s)%s", why[0] ? "; " : "", used, r,
                           mskv__cuda_cu_name(fn, r),
                           r == MSKV_CU_ERROR_STUB_LIBRARY ? ": the toolkit's stub, not a driver" :
                           r == MSKV_CU_ERROR_NO_DEVICE ? ": no CUDA device" : "");
        mskv__cuda_lib_close(lib);
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
        mskv__cuda_lib_close(lib);
        return MSKV_ERROR_CUDA_UNAVAILABLE;
    }
    r = fn->cuDeviceGetCount(&count);
    if (r != MSKV_CU_SUCCESS || count <= 0) {
        mskv__cuda_appendf(why, cap, "%s%s: no CUDA device (cuDeviceGetCount: %d, %d devices)",
                           why[0] ? "; " : "", used, r, count);
        mskv__cuda_lib_close(lib);
        return MSKV_ERROR_CUDA_UNAVAILABLE;
    }
    *lib_out = lib;
    return MSKV_SUCCESS;
}

static mskv_result mskv__cuda_open_nvrtc(const char *first, void **lib_out, char *used_out, size_t used_cap,
                                         mskv_cuda_functions *fn, char *why, size_t cap) {
    char env[1024], paths[MSKV__CUDA_NVRTC_MAX][512];
    const char *cand[MSKV__CUDA_NVRTC_MAX + 2];
    int n = 0, i, np, missing = 0;
    void *lib = NULL, *p;
    const char *used = NULL;
    if (first && *first) cand[n++] = first;
    if (mskv__cuda_getenv("MSKV_NVRTC_PATH", env, sizeof(env))) cand[n++] = env;
    np = mskv__cuda_nvrtc_candidates(paths, MSKV__CUDA_NVRTC_MAX);
    for (i = 0; i < np; i++) cand[n++] = paths[i];
    lib = mskv__cuda_open_first(cand, n, &used, why, cap);
    if (!lib) {
        mskv__cuda_appendf(why, cap, "%s", MSKV__CUDA_NVRTC_NOT_FOUND);
        return MSKV_ERROR_CUDA_UNAVAILABLE;
    }
    if (used_out) mskv__cuda_copystr(used_out, used_cap, used);
#define MSKV__CUDA_RESOLVE_NVRTC(ret, name, sym, params)                                   \
    p = mskv__cuda_sym(lib, sym);                                                          \
    if (p) MSKV__CUDA_SET_FN(fn->name, p);                                                 \
    else { missing++; mskv__cuda_appendf(why, cap, "%s%s: no %s", why[0] ? "; " : "", used, sym); }
    MSKV_CUDA_NVRTC_FUNCTIONS(MSKV__CUDA_RESOLVE_NVRTC)
#undef MSKV__CUDA_RESOLVE_NVRTC
    if (missing) {
        mskv__cuda_lib_close(lib);
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
        mskv_cuda_functions tmp;
        memset(&tmp, 0, sizeof(tmp));
        g->driver_why[0] = 0;
        g->driver_result = mskv__cuda_open_driver(mskv__cuda_driver_names, MSKV__CUDA_COUNT(mskv__cuda_driver_names),
                                                  &g->libcuda, &tmp, g->driver_why, sizeof(g->driver_why));
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
        if (mskv__cuda_open_nvrtc(nvrtc_path, &g->libnvrtc, g->nvrtc_used, sizeof(g->nvrtc_used), &tmp, g->nvrtc_why,
                                  sizeof(g->nvrtc_why)) == MSKV_SUCCESS) {
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

/* Kernel variants. A variant is one value for each -D switch of kernels.cu
   (the list below, with the bits its value may take) plus the arch flag,
   packed into a 64-bit key; a function is one kernel of a variant. The
   per-call path compares integers only: each store keeps a lock-free cache
   of the functions it launches (a store is driven by one thread at a time),
   and a miss goes to the context's list under its lock. Option strings are
   made only when a variant is compiled, the first time it is used.
   X(id, name, bits); values are >= 0. */
#define MSKV__CUDA_DEFINE_LIST(X)                   \
    X(DTYPE, "MSKV_DTYPE", 2)                       \
    X(HEAD_DIM, "MSKV_HEAD_DIM", 9)                 \
    X(ROPE, "MSKV_ROPE", 2)                         \
    X(ROPE_STYLE, "MSKV_ROPE_STYLE", 1)             \
    X(ROPE_D0, "MSKV_ROPE_D0", 9)                   \
    X(ROPE_D1, "MSKV_ROPE_D1", 9)                   \
    X(ROPE_D2, "MSKV_ROPE_D2", 9)                   \
    X(ATTN_WARP_KEYS, "MSKV_ATTN_WARP_KEYS", 1)    \
    X(SRC_DTYPE, "MSKV_SRC_DTYPE", 2)

/* The kernels the wrappers launch: X(id, name in kernels.cu). */
#define MSKV__CUDA_KERNEL_LIST(X)                   \
    X(KV_WRITE, "mskv_kv_write")                    \
    X(PAGE_GATHER, "mskv_page_gather")              \
    X(PAGE_SCATTER, "mskv_page_scatter")            \
    X(ATTN, "mskv_attn")                            \
    X(LSE_MERGE, "mskv_lse_merge")                  \
    X(STATE_MERGE, "mskv_state_merge")              \
    X(ROPE, "mskv_rope")

enum {
#define MSKV__CUDA_DEF_ID(id, name, bits) MSKV__D_##id,
    MSKV__CUDA_DEFINE_LIST(MSKV__CUDA_DEF_ID)
#undef MSKV__CUDA_DEF_ID
    MSKV__CUDA_NDEFS
};
enum {
#define MSKV__CUDA_KERNEL_ID(id, name) MSKV__K_##id,
    MSKV__CUDA_KERNEL_LIST(MSKV__CUDA_KERNEL_ID)
#undef MSKV__CUDA_KERNEL_ID
    MSKV__CUDA_NKERNELS
};
/* key bits: the defines from bit 0, the arch flag, the kernel (6 bits); bit 63 marks a used cache slot */
enum {
    MSKV__CUDA_DEF_BITS = 0
#define MSKV__CUDA_DEF_SUM(id, name, bits) + bits
    MSKV__CUDA_DEFINE_LIST(MSKV__CUDA_DEF_SUM)
#undef MSKV__CUDA_DEF_SUM
    , MSKV__CUDA_KEY_KERNEL_SHIFT = MSKV__CUDA_DEF_BITS + 1
};
typedef char mskv__cuda_key_fits[MSKV__CUDA_KEY_KERNEL_SHIFT + 6 <= 63 && MSKV__CUDA_NKERNELS <= 64 ? 1 : -1];

typedef struct mskv__cuda_variant {
    uint64_t key;                     /* mskv__cuda_variant_key of its defines */
    mskv_cu_module module;
    mskv_cu_function funcs[MSKV__CUDA_NKERNELS];    /* by kernel id, fetched on first use */
    unsigned int smem_limit[MSKV__CUDA_NKERNELS];   /* dynamic smem allowed so far (0: the default 48 KiB) */
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
    int32_t smem_optin;               /* shared memory a block may opt in to (0: unknown) */
    mskv__cuda_mutex lock;
    mskv__cuda_variant *variants;
    char err[4096];
};

static void mskv__cuda_log(mskv_log_fn log, void *user, mskv_log_level lvl, const char *fmt, ...) MSKV__CUDA_PRINTF(4, 5);
static void mskv__cuda_log(mskv_log_fn log, void *user, mskv_log_level lvl, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    if (!log) return;
    va_start(ap, fmt);
    mskv__cuda_vformat(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    log(user, lvl, buf);
}

/* Records a driver failure in cu->err and the logger; returns the mapped code. */
static mskv_result mskv__cuda_fail(mskv_cuda *cu, mskv_cu_result r, const char *what) {
    mskv_result code = r == MSKV_CU_ERROR_OUT_OF_MEMORY ? MSKV_ERROR_OUT_OF_MEMORY : MSKV_ERROR_CUDA;
    mskv__cuda_format(cu->err, sizeof(cu->err), "%s failed: CUDA error %d (%s)", what, r, mskv__cuda_cu_name(&cu->fn, r));
    if (cu->log) cu->log(cu->log_user, MSKV_LOG_ERROR, cu->err);
    return code;
}

/* Records a refusal (not a driver error) in cu->err and the logger. */
static void mskv__cuda_failf(mskv_cuda *cu, const char *fmt, ...) MSKV__CUDA_PRINTF(2, 3);
static void mskv__cuda_failf(mskv_cuda *cu, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    mskv__cuda_vformat(cu->err, sizeof(cu->err), fmt, ap);
    va_end(ap);
    if (cu->log) cu->log(cu->log_user, MSKV_LOG_ERROR, cu->err);
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
    out[0] = 0;
    if (d->disable_disk_cache) return;
    if (d->cache_dir && *d->cache_dir) { mskv__cuda_copystr(out, cap, d->cache_dir); return; }
    if (mskv__cuda_getenv("MSKV_CACHE_DIR", out, cap)) return;
    mskv__cuda_default_cache_dir(out, cap);
}

/* A directory too long for "<dir>/<16 hex>.cubin" in the same buffer size
   would be cut short: no disk cache then (said by the caller), never a
   truncated path. */
static void mskv__cuda_cache_dir_checked(const mskv_cuda_desc *d, char *out, size_t cap, int *too_long) {
    mskv__cuda_cache_dir(d, out, cap);
    *too_long = out[0] && strlen(out) + 24 >= cap;
    if (*too_long) out[0] = 0;
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
        if (lib) mskv__cuda_lib_close(lib);
        if (r != MSKV_SUCCESS) return r;
        return mskv__cuda_load(0, 1, desc->nvrtc_path, NULL, why, why_cap);
    }
    return mskv__cuda_load(1, 1, desc->nvrtc_path, NULL, why, why_cap);
}

MSKV_API mskv_result mskv_cuda_probe_driver(const mskv_cuda_desc *desc, int32_t *devices, int32_t *driver_version,
                                            char *why, size_t why_cap) {
    mskv_cuda_desc zero;
    mskv_cuda_functions fn;
    void *lib = NULL;
    int count = 0, version = 0;
    mskv_result r = MSKV_SUCCESS;
    if (why && why_cap) why[0] = 0;
    if (devices) *devices = 0;
    if (driver_version) *driver_version = 0;
    if (!desc) { memset(&zero, 0, sizeof(zero)); desc = &zero; }
    memset(&fn, 0, sizeof(fn));
    if (desc->functions) {
        fn = *desc->functions;
        if (fn.cuInit(0) != MSKV_CU_SUCCESS) r = MSKV_ERROR_CUDA_UNAVAILABLE;
    } else if (desc->driver_path) {
        char buf[768] = "";
        r = mskv__cuda_open_driver(&desc->driver_path, 1, &lib, &fn, buf, sizeof(buf));
        mskv__cuda_appendf(why, why_cap, "%s", buf);
    } else {
        r = mskv__cuda_load(1, 0, NULL, &fn, why, why_cap);
    }
    if (r == MSKV_SUCCESS && (fn.cuDeviceGetCount(&count) != MSKV_CU_SUCCESS || count <= 0)) {
        mskv__cuda_appendf(why, why_cap, "%sno CUDA device", why && why[0] ? "; " : "");
        r = MSKV_ERROR_CUDA_UNAVAILABLE;
    }
    if (r == MSKV_SUCCESS && fn.cuDriverGetVersion(&version) != MSKV_CU_SUCCESS) version = 0;
    if (lib) mskv__cuda_lib_close(lib);
    if (r != MSKV_SUCCESS) return r;
    if (devices) *devices = count;
    if (driver_version) *driver_version = version;
    return MSKV_SUCCESS;
}

MSKV_API mskv_result mskv_cuda_create(const mskv_cuda_desc *desc, mskv_cuda **out) {
    mskv_cuda_desc zero;
    mskv_cuda *cu;
    mskv_result res;
    mskv_cu_result r;
    char why[3072] = "";
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
            mskv__cuda_format(why, sizeof(why), "cuInit failed with %d (%s)", r, mskv__cuda_cu_name(&cu->fn, r));
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
        mskv__cuda_format(why, sizeof(why), "no CUDA device %d (cuDeviceGetCount: %d, %d devices)", (int)desc->device, r, n);
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
    /* asked once here, not per attention call (0 = unknown: the geometry assumes 99 KiB) */
    if (cu->fn.cuDeviceGetAttribute(&cu->smem_optin, MSKV_CU_ATTR_MAX_SMEM_OPTIN, cu->device) != MSKV_CU_SUCCESS)
        cu->smem_optin = 0;
    cu->info.device = desc->device;
    if (cu->fn.nvrtcVersion(&major, &minor) != 0) {
        mskv__cuda_format(why, sizeof(why), "nvrtcVersion failed");
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
                mskv__cuda_format(why, sizeof(why), "NVRTC %d.%d supports no architecture at or below sm_%d",
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
    {
        int too_long;
        mskv__cuda_cache_dir_checked(desc, cu->cache_dir, sizeof(cu->cache_dir), &too_long);
        if (too_long)
            mskv__cuda_log(cu->log, cu->log_user, MSKV_LOG_WARN,
                           "mstar_kv cuda: the cache directory path is too long (%d bytes at most): disk cache off",
                           (int)sizeof(cu->cache_dir) - 25);
    }
    cu->desc.disable_disk_cache = cu->cache_dir[0] ? 0 : 1;
    {
        char nvrtc[512] = "injected";
        if (!desc->functions) {
            mskv__cuda_lock(&mskv__cuda_g_lock);
            mskv__cuda_copystr(nvrtc, sizeof(nvrtc), mskv__cuda_g.nvrtc_used);
            mskv__cuda_unlock(&mskv__cuda_g_lock);
        }
        mskv__cuda_log(cu->log, cu->log_user, MSKV_LOG_INFO, "mstar_kv cuda: %s, sm_%d%s, driver %d, NVRTC %d (%s), cache %s",
                       cu->info.name, (int)cu->info.arch, cu->info.ptx_fallback ? " (PTX)" : "",
                       (int)cu->info.driver_version, (int)cu->info.nvrtc_version, nvrtc,
                       cu->cache_dir[0] ? cu->cache_dir : "off");
    }
    *out = cu;
    return MSKV_SUCCESS;
unavailable:
    mskv__cuda_log(desc->log, desc->log_user, MSKV_LOG_ERROR, "mstar_kv cuda unavailable: %s", why);
fail:
    if (cu->own_driver) mskv__cuda_lib_close(cu->own_driver);
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
        mskv__cuda_dealloc(&a, v);
    }
    cu->fn.cuDevicePrimaryCtxRelease(cu->device);
    mskv__cuda_dealloc(&a, cu->source);
    if (cu->own_driver) mskv__cuda_lib_close(cu->own_driver);
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
        if (mskv__cuda_is_sep(tmp[i]) || tmp[i] == 0) {
            char c = tmp[i];
            tmp[i] = 0;
            mskv__cuda_mkdir(tmp);
            tmp[i] = c;
        }
    }
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
    static unsigned long counter;     /* under the loader's lock: threads may compile at once */
    unsigned long serial;
    unsigned char hdr[MSKV__CUDA_HDR_BYTES];
    char tmp[600];
    size_t lsz = img->log ? strlen(img->log) : 0, len[3];
    const void *part[3];
    uint64_t h = 1469598103934665603ull;
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
    mskv__cuda_lock(&mskv__cuda_g_lock);
    serial = ++counter;
    mskv__cuda_unlock(&mskv__cuda_g_lock);
    mskv__cuda_format(tmp, sizeof(tmp), "%s.tmp.%lu.%lu.%lx", path, mskv__cuda_pid(), serial,
             (unsigned long)(size_t)&h);
    part[0] = hdr; len[0] = sizeof(hdr);
    part[1] = img->data; len[1] = img->size;
    part[2] = img->log; len[2] = lsz;
    return mskv__cuda_write_replace(tmp, path, part, len, lsz ? 3 : 2);
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
    mskv__cuda_format(target, sizeof(target), "--gpu-architecture=%s_%d%s", info->ptx ? "compute" : "sm",
             (int)info->arch, info->arch_specific ? "a" : "");
    k = mskv__cuda_key_of(j->source, j->source_len, info->options, info->num_options, target, j->nvrtc_version);
    img->key = k.key;
    img->is_ptx = info->ptx ? 1 : 0;
    if (j->cache_dir[0]) {
        mskv__cuda_format(img->path, sizeof(img->path), "%s" MSKV__CUDA_SEP "%016llx.%s", j->cache_dir, (unsigned long long)k.key,
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
        /* no memory for the log: say so, rather than a success that hid a failed allocation */
        if (!img->log) { res = MSKV_ERROR_OUT_OF_MEMORY; goto done; }
        img->log[0] = 0;
        if (lsz && fn->nvrtcGetProgramLog(prog, img->log) != 0) img->log[0] = 0;
        img->log[lsz] = 0;
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
    {
        int too_long;
        mskv__cuda_cache_dir_checked(desc, dir, sizeof(dir), &too_long);
        if (too_long)
            mskv__cuda_log(desc->log, desc->log_user, MSKV_LOG_WARN,
                           "mstar_kv cuda: the cache directory path is too long: disk cache off");
    }
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

static const char *const mskv__cuda_define_names[MSKV__CUDA_NDEFS] = {
#define MSKV__CUDA_DEF_NAME(id, name, bits) name,
    MSKV__CUDA_DEFINE_LIST(MSKV__CUDA_DEF_NAME)
#undef MSKV__CUDA_DEF_NAME
};
static const unsigned char mskv__cuda_define_bits[MSKV__CUDA_NDEFS] = {
#define MSKV__CUDA_DEF_WIDTH(id, name, bits) bits,
    MSKV__CUDA_DEFINE_LIST(MSKV__CUDA_DEF_WIDTH)
#undef MSKV__CUDA_DEF_WIDTH
};
static const char *const mskv__cuda_kernel_names[MSKV__CUDA_NKERNELS] = {
#define MSKV__CUDA_KERNEL_NAME(id, name) name,
    MSKV__CUDA_KERNEL_LIST(MSKV__CUDA_KERNEL_NAME)
#undef MSKV__CUDA_KERNEL_NAME
};

typedef struct mskv__cuda_defines {
    int32_t value[MSKV__CUDA_NDEFS];
    int32_t arch_specific;            /* compile for sm_XYa */
    int32_t bad;                      /* a value did not fit its bits: no such variant */
} mskv__cuda_defines;

/* sets -D<name of id>=value */
static void mskv__cuda_define(mskv__cuda_defines *d, int id, int32_t value) {
    if (value < 0 || value >= (1 << mskv__cuda_define_bits[id])) d->bad = 1;
    else d->value[id] = value;
}

static uint64_t mskv__cuda_variant_key(const mskv__cuda_defines *d) {
    uint64_t k = 0;
    int i, shift = 0;
    for (i = 0; i < MSKV__CUDA_NDEFS; i++) {
        k |= (uint64_t)(uint32_t)d->value[i] << shift;
        shift += mskv__cuda_define_bits[i];
    }
    return k | (uint64_t)(d->arch_specific ? 1 : 0) << MSKV__CUDA_DEF_BITS;
}

/* The -D options of a variant, sorted by their text as the string-keyed
   versions did (so their disk-cache entries stay valid). Compile time only. */
typedef struct mskv__cuda_options {
    char text[MSKV__CUDA_NDEFS][48];
    const char *opts[MSKV__CUDA_NDEFS];
} mskv__cuda_options;

static void mskv__cuda_options_of(const mskv__cuda_defines *d, mskv__cuda_options *o) {
    int i, j;
    for (i = 0; i < MSKV__CUDA_NDEFS; i++) {
        mskv__cuda_format(o->text[i], sizeof(o->text[i]), "-D%s=%d", mskv__cuda_define_names[i], (int)d->value[i]);
        o->opts[i] = o->text[i];
    }
    for (i = 1; i < MSKV__CUDA_NDEFS; i++)
        for (j = i; j > 0 && strcmp(o->opts[j - 1], o->opts[j]) > 0; j--) {
            const char *t = o->opts[j]; o->opts[j] = o->opts[j - 1]; o->opts[j - 1] = t;
        }
}

/* Compiles (through the disk cache) and loads a new variant. Under cu->lock. */
static mskv_result mskv__cuda_variant_load(mskv_cuda *cu, const mskv__cuda_defines *defs, uint64_t key, int kernel,
                                           mskv__cuda_variant **out) {
    mskv__cuda_options o;
    mskv_cuda_compile_info ci;
    mskv_cuda_image img;
    mskv__cuda_jit j;
    mskv__cuda_variant *v;
    mskv_cu_result r;
    mskv_result res;
    mskv__cuda_options_of(defs, &o);
    memset(&ci, 0, sizeof(ci));
    ci.arch = cu->info.arch;
    ci.arch_specific = defs->arch_specific;
    ci.ptx = cu->info.ptx_fallback;
    ci.options = o.opts;
    ci.num_options = MSKV__CUDA_NDEFS;
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
        mskv__cuda_format(cu->err, sizeof(cu->err), "NVRTC failed for %s: %s", mskv__cuda_kernel_names[kernel],
                          img.log ? img.log : "");
        mskv_cuda_image_free(&cu->desc, &img);
        return res;
    }
    v = (mskv__cuda_variant *)mskv__cuda_calloc(&cu->allocator, sizeof(*v));
    if (!v) {
        mskv_cuda_image_free(&cu->desc, &img);
        return MSKV_ERROR_OUT_OF_MEMORY;
    }
    r = cu->fn.cuCtxSetCurrent(cu->ctx);
    if (r == MSKV_CU_SUCCESS) r = cu->fn.cuModuleLoadData(&v->module, img.data);
    if (r != MSKV_CU_SUCCESS) {
        mskv_cuda_image_free(&cu->desc, &img);
        mskv__cuda_dealloc(&cu->allocator, v);
        return mskv__cuda_fail(cu, r, "cuModuleLoadData");
    }
    if (img.from_disk) cu->info.disk_hits++;
    else cu->info.compiles++;
    mskv_cuda_image_free(&cu->desc, &img);
    v->key = key;
    v->next = cu->variants;
    cu->variants = v;
    *out = v;
    return MSKV_SUCCESS;
}

/* Internal API for launch wrappers (this file's and the attention wrappers'):
     st->defs                                   every define kernels.cu knows, at the store's
                                                 dtype and head_dim (RoPE off, prefill layout):
                                                 copy it, then override
     mskv__cuda_define(&defs, MSKV__D_X, value) override one (defs.arch_specific: sm_XYa)
     mskv__cuda_store_function(st, MSKV__K_X, &defs, &f)  the function, from the store's
                                                 lock-free cache (the store's own thread), else
                                                 compiled / fetched through the context
     mskv__cuda_function(cu, MSKV__K_X, &defs, &f)  the same through the context alone
                                                 (locked: for callers on other threads)
     st->args[MSKV__K_X], mskv__cuda_arg_*      the store's parameter block of a kernel
                                                 (pointers prepared once; write the values)
     mskv__cuda_launch(st, f, grid, block, smem, args)  on the store's stream; raises the
                                                 dynamic smem limit above 48 KiB once
     mskv_cuda_plan_upload(st, plan, pos_mode, &dplan)   plan arrays in fixed device buffers
     mskv__cuda_workspace(st, bytes, &ptr)      a device scratch buffer (grows, never during a capture)
     mskv_cuda_store_pool(st, layer, kind)      a layer's K (0) or V (1) pool
   A new -D switch or kernel goes into MSKV__CUDA_DEFINE_LIST / _KERNEL_LIST.
   Failures go through mskv__cuda_fail (cu->err + the logger). */
static mskv_result mskv__cuda_function(mskv_cuda *cu, int kernel, const mskv__cuda_defines *defs, mskv_cu_function *out) {
    uint64_t key;
    mskv__cuda_variant *v;
    mskv_result res = MSKV_SUCCESS;
    *out = NULL;
    if (defs->bad || kernel < 0 || kernel >= MSKV__CUDA_NKERNELS) return MSKV_ERROR_INVALID_ARGUMENT;
    key = mskv__cuda_variant_key(defs);
    mskv__cuda_lock(&cu->lock);
    for (v = cu->variants; v && v->key != key; v = v->next) {}
    if (!v) res = mskv__cuda_variant_load(cu, defs, key, kernel, &v);
    if (res == MSKV_SUCCESS && !v->funcs[kernel]) {
        mskv_cu_result r = cu->fn.cuModuleGetFunction(&v->funcs[kernel], v->module, mskv__cuda_kernel_names[kernel]);
        if (r != MSKV_CU_SUCCESS) {
            v->funcs[kernel] = NULL;
            res = mskv__cuda_fail(cu, r, mskv__cuda_kernel_names[kernel]);
        }
    }
    if (res == MSKV_SUCCESS) *out = v->funcs[kernel];
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

/* What a replay may change: plan contents, never the launch sizes captured
   with it (batch and tokens are launch arguments, the grid covers the
   captured rows, split-KV covers kv_cover keys). */
typedef struct mskv__cuda_shape {
    int32_t batch, total_q, max_qo;
    int64_t max_kv;
} mskv__cuda_shape;

struct mskv_cuda_graph {
    mskv_cu_graph graph;
    mskv_cu_graph_exec exec;
    mskv__cuda_shape shape;     /* of the plan uploaded when it was captured */
    int64_t kv_cover;           /* keys its split-KV launches reach (INT64_MAX: no split) */
};

#define MSKV__CUDA_FCACHE 32        /* a power of two; a store launches a handful of functions */
#define MSKV__CUDA_SMEM_SEEN 8
#define MSKV__CUDA_MAX_ARGS 24

typedef struct mskv__cuda_fslot {
    uint64_t key;                   /* variant key | kernel << MSKV__CUDA_KEY_KERNEL_SHIFT | 1 << 63; 0 = empty */
    mskv_cu_function f;
} mskv__cuda_fslot;

/* A kernel's launch parameters: ptr[i] points at val[i] from the store's
   creation on, so a call writes only values (cuLaunchKernel copies them). */
typedef struct mskv__cuda_args {
    void *ptr[MSKV__CUDA_MAX_ARGS];
    union { uint64_t u; double d; void *p; } val[MSKV__CUDA_MAX_ARGS];
    int32_t once;                   /* the values fixed for the store's life are written */
} mskv__cuda_args;

static void mskv__cuda_arg_ptr(mskv__cuda_args *a, int i, mskv_cu_ptr v) { memcpy(&a->val[i], &v, sizeof(v)); }
static void mskv__cuda_arg_i32(mskv__cuda_args *a, int i, int32_t v) { memcpy(&a->val[i], &v, sizeof(v)); }
static void mskv__cuda_arg_i64(mskv__cuda_args *a, int i, int64_t v) { memcpy(&a->val[i], &v, sizeof(v)); }
static void mskv__cuda_arg_f32(mskv__cuda_args *a, int i, float v) { memcpy(&a->val[i], &v, sizeof(v)); }

struct mskv_cuda_store {
    mskv_cuda *cu;
    mskv_cuda_store_desc d;
    size_t page_bytes, pool_bytes, set_bytes;   /* set: one page of every layer, K and V */
    mskv_cu_ptr pools;                          /* own pools, (layer*2 + kind) * pool_bytes; 0 when adopted */
    mskv_cu_ptr *pool_at;                       /* [layer*2 + kind]: own or adopted */
    mskv_cu_stream stream;                      /* where launches and copies go */
    mskv_cu_stream own_stream;
    mskv_store_ops ops;
    mskv_arena *arena;
    /* offload/reload staging */
    size_t stage_bytes;
    int32_t stage_pages;
    mskv_cu_ptr d_stage, d_ids;
    void *h_stage;                              /* pinned: the page ids of one chunk */
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
    int32_t graphs;             /* live graphs: the workspace they captured must stay */
    mskv__cuda_shape cur;       /* the plan uploaded last */
    mskv_plan up_check;         /* what mskv_plan_check needs of the plan uploaded last (generation 0: none) */
    mskv_request *up_requests;  /* [max_batch]: its requests */
    int64_t cap_kv_cover;       /* during a capture: the smallest split-KV key reach */
    mskv__cuda_mutex lock;
    /* the per-call launch path (the store's own thread only) */
    mskv__cuda_defines defs;                    /* the base variant: store dtype and head_dim */
    mskv__cuda_fslot fcache[MSKV__CUDA_FCACHE]; /* functions by key, open addressing */
    struct { mskv_cu_function f; unsigned int limit; } smem_seen[MSKV__CUDA_SMEM_SEEN];
    int32_t smem_next;
    mskv__cuda_args args[MSKV__CUDA_NKERNELS];  /* one parameter block per kernel */
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

/* The function from the store's cache, else through the context (and then
   cached). The store's own thread only. */
static mskv_result mskv__cuda_store_function(mskv_cuda_store *st, int kernel, const mskv__cuda_defines *defs,
                                             mskv_cu_function *out) {
    uint64_t key;
    uint32_t h, i;
    mskv__cuda_fslot *slot = NULL;
    mskv_result res;
    if (defs->bad || kernel < 0 || kernel >= MSKV__CUDA_NKERNELS) return MSKV_ERROR_INVALID_ARGUMENT;
    key = mskv__cuda_variant_key(defs) | (uint64_t)kernel << MSKV__CUDA_KEY_KERNEL_SHIFT | (uint64_t)1 << 63;
    h = (uint32_t)((key * 0x9e3779b97f4a7c15ull) >> 59);
    for (i = 0; i < MSKV__CUDA_FCACHE; i++) {
        slot = &st->fcache[(h + i) & (MSKV__CUDA_FCACHE - 1)];
        if (slot->key == key) { *out = slot->f; return MSKV_SUCCESS; }
        if (!slot->key) break;
    }
    res = mskv__cuda_function(st->cu, kernel, defs, out);
    if (res == MSKV_SUCCESS && i < MSKV__CUDA_FCACHE) { slot->key = key; slot->f = *out; }
    return res;
}

/* Allows f `smem` bytes of dynamic shared memory. The limit is the
   function's, shared by every store: it is only ever raised (under the
   context lock), and each store remembers what it saw, so a launch asks the
   driver once per function and size. */
static mskv_result mskv__cuda_smem_allow(mskv_cuda_store *st, mskv_cu_function f, unsigned int smem) {
    mskv_cuda *cu = st->cu;
    mskv__cuda_variant *v;
    mskv_cu_result r = MSKV_CU_SUCCESS;
    unsigned int limit = 0;
    int i, k = 0;
    for (i = 0; i < MSKV__CUDA_SMEM_SEEN; i++)
        if (st->smem_seen[i].f == f && st->smem_seen[i].limit >= smem) return MSKV_SUCCESS;
    mskv__cuda_lock(&cu->lock);
    for (v = cu->variants; v; v = v->next) {
        for (k = 0; k < MSKV__CUDA_NKERNELS && v->funcs[k] != f; k++) {}
        if (k < MSKV__CUDA_NKERNELS) break;
    }
    if (v && v->smem_limit[k] >= smem) limit = v->smem_limit[k];
    else {
        r = cu->fn.cuFuncSetAttribute(f, MSKV_CU_FUNC_ATTR_MAX_DYNAMIC_SMEM, (int)smem);
        if (r == MSKV_CU_SUCCESS && v) limit = v->smem_limit[k] = smem;
    }
    mskv__cuda_unlock(&cu->lock);
    if (r != MSKV_CU_SUCCESS) return mskv__cuda_fail(cu, r, "cuFuncSetAttribute(dynamic shared memory)");
    if (limit) {
        i = st->smem_next;
        st->smem_next = (i + 1) % MSKV__CUDA_SMEM_SEEN;
        st->smem_seen[i].f = f;
        st->smem_seen[i].limit = limit;
    }
    return MSKV_SUCCESS;
}

static mskv_result mskv__cuda_launch(mskv_cuda_store *st, mskv_cu_function f, const unsigned int grid[3],
                                     const unsigned int block[3], unsigned int smem, void **args) {
    mskv_cuda *cu = st->cu;
    mskv_cu_result r;
    mskv_result res;
    if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0) return MSKV_SUCCESS;
    if (smem > 48 * 1024 && (res = mskv__cuda_smem_allow(st, f, smem)) != MSKV_SUCCESS) return res;
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
    /* a captured graph holds the current buffer's address: it must not move */
    if (st->graphs > 0 && st->d_ws) {
        mskv__cuda_failf(cu, "the workspace must grow to %zu bytes but %d captured graph(s) use it: destroy them first",
                         bytes, (int)st->graphs);
        return MSKV_ERROR_BAD_STATE;
    }
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
    memset(d, 0, sizeof(*d));      /* every other define 0 */
    mskv__cuda_define(d, MSKV__D_DTYPE, (int32_t)st->d.dtype);
    /* K/V sources in the pool dtype: the kv_write variant shares the module of the others */
    mskv__cuda_define(d, MSKV__D_SRC_DTYPE, (int32_t)st->d.dtype);
    mskv__cuda_define(d, MSKV__D_HEAD_DIM, hd == 64 || hd == 128 || hd == 256 ? hd : 128);
}

/* The RoPE defines of a mskv_rope (dims of 0 mean the defaults kernels.cu
   derives itself, so they are passed as 0). */
static void mskv__cuda_defines_rope(mskv__cuda_defines *d, const mskv_rope *rope) {
    if (!rope) return;
    mskv__cuda_define(d, MSKV__D_ROPE, rope->mode == MSKV_POS_3D ? 2 : 1);
    mskv__cuda_define(d, MSKV__D_ROPE_STYLE, rope->style == MSKV_ROPE_INTERLEAVED ? 1 : 0);
    mskv__cuda_define(d, MSKV__D_ROPE_D0, rope->dims[0]);
    mskv__cuda_define(d, MSKV__D_ROPE_D1, rope->mode == MSKV_POS_3D ? rope->dims[1] : 0);
    mskv__cuda_define(d, MSKV__D_ROPE_D2, rope->mode == MSKV_POS_3D ? rope->dims[2] : 0);
}

/* gather (dir 0) or scatter (dir 1) c pages (ids already in d_ids) between
   every layer's pools and the staging buffer, page-major */
static mskv_result mskv__cuda_move_pages(mskv_cuda_store *st, int dir, int32_t c) {
    mskv_cu_function f;
    mskv_result res;
    long long pb = (long long)st->page_bytes, stride = (long long)st->set_bytes;
    int n = c;
    int32_t l, kind;
    unsigned int grid[3], block[3] = { 256, 1, 1 };
    size_t blocks = (st->page_bytes + 4095) / 4096;
    /* the arena's callbacks may run beside the store's thread: the context's locked lookup */
    res = mskv__cuda_function(st->cu, dir ? MSKV__K_PAGE_SCATTER : MSKV__K_PAGE_GATHER, &st->defs, &f);
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
        int32_t *h_ids = (int32_t *)st->h_stage;
        c = n - done < st->stage_pages ? n - done : st->stage_pages;
        memcpy(h_ids, pages + done, (size_t)c * 4);
#define MSKV__ST_TRY(call, what) do { mskv_cu_result mskv__r = (call); \
        if (mskv__r != MSKV_CU_SUCCESS) { res = mskv__cuda_fail(cu, mskv__r, what); goto fail; } } while (0)
        MSKV__ST_TRY(cu->fn.cuMemcpyHtoDAsync(st->d_ids, h_ids, (size_t)c * 4, st->stream), "cuMemcpyHtoDAsync(page ids)");
        if ((res = mskv__cuda_move_pages(st, 0, c)) != MSKV_SUCCESS) goto fail;
        /* straight into the host copy: pinned (the store's host allocator) it is
           a DMA at full speed; a pageable buffer (an export) the driver stages */
        MSKV__ST_TRY(cu->fn.cuMemcpyDtoHAsync((char *)dst + (size_t)done * st->set_bytes, st->d_stage,
                                              (size_t)c * st->set_bytes, st->stream), "cuMemcpyDtoHAsync(offload)");
        MSKV__ST_TRY(cu->fn.cuStreamSynchronize(st->stream), "cuStreamSynchronize(offload)");
    }
    mskv__cuda_unlock(&st->lock);
    return MSKV_SUCCESS;
fail:
    /* queued copies must not touch the ids buffer or the host copy after we return */
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
        int32_t *h_ids = (int32_t *)st->h_stage;
        c = n - done < st->stage_pages ? n - done : st->stage_pages;
        memcpy(h_ids, pages + done, (size_t)c * 4);
        MSKV__ST_TRY(cu->fn.cuMemcpyHtoDAsync(st->d_ids, h_ids, (size_t)c * 4, st->stream), "cuMemcpyHtoDAsync(page ids)");
        MSKV__ST_TRY(cu->fn.cuMemcpyHtoDAsync(st->d_stage, (const char *)src + (size_t)done * st->set_bytes,
                                              (size_t)c * st->set_bytes, st->stream), "cuMemcpyHtoDAsync(reload)");
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

/* store_ops.flush (mskv_arena_flush): everything queued on the store's
   stream has finished, so no kernel reads a pending page any more */
static mskv_result mskv__cuda_flush(void *user) {
    mskv_cuda_store *st = (mskv_cuda_store *)user;
    mskv_cuda *cu = st->cu;
    mskv_result res;
    if (st->capturing) return MSKV_ERROR_BAD_STATE;   /* a capture cannot be waited for */
    if ((res = mskv__cuda_enter(cu)) != MSKV_SUCCESS) return res;
    MSKV__CU_TRY(cu, cu->fn.cuStreamSynchronize(st->stream), "cuStreamSynchronize(flush)");
    return MSKV_SUCCESS;
}

/* store_ops.fill_pages (the arena's debug poisoning of pages that became
   free): every byte of the pages, every layer, K and V, on the store's
   stream, so after everything that used them and before their next owner. */
static mskv_result mskv__cuda_fill_pages(void *user, const int32_t *pages, int32_t n, unsigned char byte) {
    mskv_cuda_store *st = (mskv_cuda_store *)user;
    mskv_cuda *cu = st->cu;
    mskv_result res;
    int32_t i, l, kind;
    if ((res = mskv__cuda_check_pages(st, pages, n)) != MSKV_SUCCESS) return res;
    if (st->capturing) return MSKV_ERROR_BAD_STATE;   /* the memsets would join the graph */
    if ((res = mskv__cuda_enter(cu)) != MSKV_SUCCESS) return res;
    for (i = 0; i < n; i++)
        for (l = 0; l < st->d.num_layers; l++)
            for (kind = 0; kind < 2; kind++) {
                mskv_cu_ptr pool = mskv_cuda_store_pool(st, l, kind);
                MSKV__CU_TRY(cu, cu->fn.cuMemsetD8Async(pool + (mskv_cu_ptr)pages[i] * st->page_bytes, byte, st->page_bytes,
                                                        st->stream), "cuMemsetD8Async(poison)");
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
    if (st->own_stream) cu->fn.cuStreamDestroy(st->own_stream);
    if (st->pool_at) mskv__cuda_dealloc(&cu->allocator, st->pool_at);
    mskv__cuda_dealloc(&cu->allocator, st->up_requests);
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
    if (d.pools) {
        /* the kernels read 16-byte vectors from the pools */
        for (i = 0; i < 2 * d.num_layers; i++)
            if (!d.pools[i] || (d.pools[i] & 15u) != 0) return MSKV_ERROR_INVALID_ARGUMENT;
    }
    if (!d.max_batch) d.max_batch = 64;
    if (!d.max_tokens) d.max_tokens = 16384;
    if (!d.max_page_ids) d.max_page_ids = 65536;
    if (!d.plan_ring) d.plan_ring = 3;
    if (!d.staging_bytes) d.staging_bytes = (size_t)16 << 20;
    st = (mskv_cuda_store *)mskv__cuda_calloc(&cu->allocator, sizeof(*st));
    if (!st) return MSKV_ERROR_OUT_OF_MEMORY;
    st->cu = cu;
    st->d = d;
    st->d.pools = NULL;   /* the caller's array need not outlive this call */
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
    {
        /* clamped while still a size_t: narrowed first, 2^32 + 2 pages would become 2 */
        size_t pages = d.staging_bytes / st->set_bytes;
        if (pages < 1) pages = 1;
        if (pages > (size_t)d.num_pages) pages = (size_t)d.num_pages;
        if (pages > 65535) pages = 65535;   /* the copies' grid.y is the page count */
        st->stage_pages = (int32_t)pages;
    }
    st->stage_bytes = (size_t)st->stage_pages * st->set_bytes;
    ids_bytes = (size_t)st->stage_pages * 4;
    st->pool_at = (mskv_cu_ptr *)mskv__cuda_calloc(&cu->allocator, sizeof(mskv_cu_ptr) * 2 * (size_t)d.num_layers);
    if (!st->pool_at) { mskv__cuda_dealloc(&cu->allocator, st); return MSKV_ERROR_OUT_OF_MEMORY; }
    mskv__cuda_plan_layout_of(&st->lay, (size_t)d.max_batch, (size_t)d.max_tokens, (size_t)d.max_page_ids);
    st->ring_n = d.plan_ring;
    if ((res = mskv__cuda_enter(cu)) != MSKV_SUCCESS) {
        mskv__cuda_dealloc(&cu->allocator, st->pool_at);
        mskv__cuda_dealloc(&cu->allocator, st);
        return res;
    }
#define MSKV__CR_TRY(call, what) do { mskv_cu_result mskv__r = (call); \
        if (mskv__r != MSKV_CU_SUCCESS) { res = mskv__cuda_fail(cu, mskv__r, what); goto fail; } } while (0)
    st->up_requests = (mskv_request *)mskv__cuda_calloc(&cu->allocator, (size_t)d.max_batch * sizeof(mskv_request));
    if (!st->up_requests) { res = MSKV_ERROR_OUT_OF_MEMORY; goto fail; }
    MSKV__CR_TRY(cu->fn.cuStreamCreate(&st->own_stream, MSKV_CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    st->stream = st->own_stream;
    if (!d.pools) MSKV__CR_TRY(cu->fn.cuMemAlloc(&st->pools, all), "cuMemAlloc(K/V pools)");
    for (i = 0; i < 2 * d.num_layers; i++)
        st->pool_at[i] = d.pools ? d.pools[i] : st->pools + (mskv_cu_ptr)((size_t)i * st->pool_bytes);
    MSKV__CR_TRY(cu->fn.cuMemAlloc(&st->d_stage, st->stage_bytes), "cuMemAlloc(staging)");
    MSKV__CR_TRY(cu->fn.cuMemAlloc(&st->d_ids, ids_bytes), "cuMemAlloc(page ids)");
    MSKV__CR_TRY(cu->fn.cuMemAlloc(&st->d_plan, st->lay.total), "cuMemAlloc(plan buffers)");
    MSKV__CR_TRY(cu->fn.cuMemAllocHost(&st->h_stage, ids_bytes), "cuMemAllocHost(staging ids)");
    for (i = 0; i < st->ring_n; i++) {
        MSKV__CR_TRY(cu->fn.cuMemAllocHost(&st->h_ring[i], st->lay.total), "cuMemAllocHost(plan ring)");
        MSKV__CR_TRY(cu->fn.cuEventCreate(&st->ring_ev[i], MSKV_CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    }
    /* zeroed pools: the null page reads as zeros, and so does any unwritten slot */
    for (i = 0; i < 2 * d.num_layers; i++)
        MSKV__CR_TRY(cu->fn.cuMemsetD8Async(st->pool_at[i], 0, st->pool_bytes, st->stream), "cuMemsetD8Async(pools)");
    MSKV__CR_TRY(cu->fn.cuMemsetD8Async(st->d_plan, 0, st->lay.total, st->stream), "cuMemsetD8Async(plan)");
    MSKV__CR_TRY(cu->fn.cuStreamSynchronize(st->stream), "cuStreamSynchronize");
#undef MSKV__CR_TRY
    mskv__cuda_defines_base(st, &st->defs);
    {
        int k, a;
        for (k = 0; k < MSKV__CUDA_NKERNELS; k++)
            for (a = 0; a < MSKV__CUDA_MAX_ARGS; a++) st->args[k].ptr[a] = &st->args[k].val[a];
    }
    st->ops.user = st;
    st->ops.read_pages = mskv__cuda_read_pages;
    st->ops.write_pages = mskv__cuda_write_pages;
    st->ops.copy_page = mskv__cuda_copy_page;
    st->ops.flush = mskv__cuda_flush;
    st->ops.fill_pages = mskv__cuda_fill_pages;
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

/* The arena's host allocator for offloaded requests: pinned memory, so an
   offload is one gather kernel and one DMA into the host copy. A 16-byte
   header keeps the size (realloc needs it). The arena keeps the buffer a
   reload frees for the next offload, so pinning is paid once, not per offload. */
static void *mskv__cuda_pinned_alloc(void *user, size_t n) {
    mskv_cuda_store *st = (mskv_cuda_store *)user;
    void *p = NULL;
    if (n > (size_t)-1 - 16 || mskv__cuda_enter(st->cu) != MSKV_SUCCESS) return NULL;
    if (st->cu->fn.cuMemAllocHost(&p, n + 16) != MSKV_CU_SUCCESS || !p) return NULL;
    memcpy(p, &n, sizeof n);
    return (char *)p + 16;
}
static void mskv__cuda_pinned_free(void *user, void *p) {
    mskv_cuda_store *st = (mskv_cuda_store *)user;
    if (!p || mskv__cuda_enter(st->cu) != MSKV_SUCCESS) return;
    st->cu->fn.cuMemFreeHost((char *)p - 16);
}
static void *mskv__cuda_pinned_realloc(void *user, void *p, size_t n) {
    size_t old;
    void *q = mskv__cuda_pinned_alloc(user, n);
    if (!p || !q) return q;
    memcpy(&old, (char *)p - 16, sizeof old);
    memcpy(q, p, old < n ? old : n);
    mskv__cuda_pinned_free(user, p);
    return q;
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
    d->host_allocator.user = st;
    d->host_allocator.alloc = mskv__cuda_pinned_alloc;
    d->host_allocator.realloc = mskv__cuda_pinned_realloc;
    d->host_allocator.free = mskv__cuda_pinned_free;
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
    return st->pool_at[layer * 2 + kind];
}

MSKV_API mskv_cu_stream mskv_cuda_store_stream(mskv_cuda_store *st) { return st ? st->stream : NULL; }

MSKV_API mskv_result mskv_cuda_store_set_stream(mskv_cuda_store *st, mskv_cu_stream stream) {
    mskv_result res;
    if (!st) return MSKV_ERROR_NULL_POINTER;
    if (st->capturing) return MSKV_ERROR_BAD_STATE;   /* the capture belongs to the current stream */
    if (!stream) stream = st->own_stream;
    if (stream == st->stream) return MSKV_SUCCESS;
    if ((res = mskv__cuda_enter(st->cu)) != MSKV_SUCCESS) return res;
    /* what is queued on the old stream (kernels writing pages, offload copies)
       must be done before the new stream reuses the same pages and buffers */
    MSKV__CU_TRY(st->cu, st->cu->fn.cuStreamSynchronize(st->stream), "cuStreamSynchronize(set stream)");
    st->stream = stream;
    return MSKV_SUCCESS;
}

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
    mskv__cuda_lock(&st->lock);
    while (st->fence_count == MSKV__CUDA_MAX_FENCES) {
        /* full: the oldest fence must complete before its event is reused
           (checked under the lock: two recorders cannot both take the last slot) */
        r = cu->fn.cuEventSynchronize(st->fence_ev[st->fence_head]);
        mskv__cuda_unlock(&st->lock);
        if (r != MSKV_CU_SUCCESS) return mskv__cuda_fail(cu, r, "cuEventSynchronize(fence)");
        if ((res = mskv_cuda_retire(st, 0)) != MSKV_SUCCESS) return res;
        mskv__cuda_lock(&st->lock);
    }
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

/* The table arrays a plan carries, checked as the kernels (and the graphs
   that replay them with whatever was uploaded) will index them: indptrs
   from 0, never decreasing, ending at total_q and num_page_ids (they index
   q, o and the page ids), and no kv_len past its pages. Missing arrays are
   not checked (nor uploaded). */
static mskv_result mskv__cuda_check_table(const mskv_plan *plan, int32_t page_size) {
    int32_t b;
    /* padding segments (the launch shape leaves them out) hold no keys */
    if (plan->pad_segments < 0 || plan->pad_segments > plan->batch) return MSKV_ERROR_INVALID_ARGUMENT;
    for (b = plan->batch - plan->pad_segments; plan->kv_len && b < plan->batch; b++)
        if (plan->kv_len[b] != 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (plan->qo_indptr) {
        if (plan->qo_indptr[0] != 0 || plan->qo_indptr[plan->batch] != plan->total_q) return MSKV_ERROR_INVALID_ARGUMENT;
        for (b = 0; b < plan->batch; b++)
            if (plan->qo_indptr[b + 1] < plan->qo_indptr[b]) return MSKV_ERROR_INVALID_ARGUMENT;
    }
    if (plan->kv_indptr) {
        if (plan->kv_indptr[0] != 0 || plan->kv_indptr[plan->batch] != plan->num_page_ids) return MSKV_ERROR_INVALID_ARGUMENT;
        for (b = 0; b < plan->batch; b++) {
            int64_t np = (int64_t)plan->kv_indptr[b + 1] - plan->kv_indptr[b];
            if (np < 0 || (plan->kv_len && (plan->kv_len[b] < 0 || plan->kv_len[b] > np * page_size)))
                return MSKV_ERROR_INVALID_ARGUMENT;
        }
    }
    return MSKV_SUCCESS;
}

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
    if ((unsigned)pos_mode > 2u) return MSKV_ERROR_INVALID_ARGUMENT;
    b = (size_t)plan->batch; t = (size_t)plan->total_q; p = (size_t)plan->num_page_ids;
    npos = pos_mode == MSKV_POS_3D ? 3 * t : pos_mode == MSKV_POS_1D ? t : 0;
    if (npos && !plan->positions) return MSKV_ERROR_NULL_POINTER;
    if ((res = mskv__cuda_check_table(plan, st->d.page_size)) != MSKV_SUCCESS) return res;
    /* an arena's plan is checked against that arena: the one the store is bound to */
    if (plan->generation && !st->arena) return MSKV_ERROR_BAD_STATE;
    if (plan->generation && (res = mskv_plan_check(st->arena, plan)) != MSKV_SUCCESS) return res;
    /* the kernels trust these: a page id or slot outside the pools, or in the
       null page, is refused here as the CPU backend refuses it */
    if (p && plan->page_size != st->d.page_size) return MSKV_ERROR_INVALID_ARGUMENT;
    if (plan->kv_indices) {
        size_t i;
        for (i = 0; i < p; i++)
            if (plan->kv_indices[i] < 1 || plan->kv_indices[i] >= st->d.num_pages) return MSKV_ERROR_OUT_OF_RANGE;
    }
    if (plan->slot_mapping) {
        size_t i;
        long long lo = st->d.page_size, hi = (long long)st->d.num_pages * st->d.page_size;
        for (i = 0; i < t; i++)
            if (plan->slot_mapping[i] >= 0 && (plan->slot_mapping[i] < lo || plan->slot_mapping[i] >= hi))
                return MSKV_ERROR_OUT_OF_RANGE;
    }
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
    /* launches read these buffers until the next upload: remember what to check them by */
    memset(&st->up_check, 0, sizeof st->up_check);
    st->up_check.batch = plan->batch;
    st->up_check.generation = plan->generation;
    st->up_check.cross = plan->cross;
    st->up_check.group = plan->group;
    if (plan->requests && plan->batch > 0) {
        memcpy(st->up_requests, plan->requests, b * sizeof(mskv_request));
        st->up_check.requests = st->up_requests;
    }
    st->cur.batch = plan->batch;
    st->cur.total_q = plan->total_q;
    st->cur.max_qo = 0;
    st->cur.max_kv = 0;
    if (plan->qo_indptr) {
        int32_t i;
        for (i = 0; i < plan->batch - plan->pad_segments; i++) {   /* padding is not part of the launch shape */
            int32_t qo = plan->qo_indptr[i + 1] - plan->qo_indptr[i];   /* checked: 0 <= qo <= total_q */
            if (qo > st->cur.max_qo) st->cur.max_qo = qo;
            if (plan->kv_len && plan->kv_len[i] > st->cur.max_kv) st->cur.max_kv = plan->kv_len[i];
        }
    }
    /* the launch shape of a padded plan (what a capture over it is sized for) */
    if (plan->pad_qo_len > st->cur.max_qo) st->cur.max_qo = plan->pad_qo_len;
    if (plan->pad_kv_len > st->cur.max_kv) st->cur.max_kv = plan->pad_kv_len;
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
    /* arrays the plan did not have are not in the device buffers either: 0,
       so a launch that needs them is refused instead of reading the last plan's */
    out->slot_mapping = plan->slot_mapping ? st->d_plan + st->lay.slot_mapping : 0;
    out->positions = npos ? st->d_plan + st->lay.positions : 0;
    return MSKV_SUCCESS;
}

/* The plan in the device buffers (the last upload) still describes the
   bound arena's pages: a launch over a stale one would read pages that may
   hold another request's tokens now. */
static mskv_result mskv__cuda_uploaded_current(const mskv_cuda_store *st) {
    if (!st->up_check.generation) return MSKV_SUCCESS;   /* a caller-made plan */
    if (!st->arena) return MSKV_ERROR_BAD_STATE;
    return mskv_plan_check(st->arena, &st->up_check);
}

/* The rotated parts become -D defines the kernels trust: refuse what
   mskv_rope_apply refuses (odd or negative widths, parts wider than the head,
   a bad style, mode or theta). */
static mskv_result mskv__cuda_check_rope(const mskv_rope *rope, int32_t head_dim) {
    int32_t i, parts, sum = 0;
    if (rope->mode != MSKV_POS_1D && rope->mode != MSKV_POS_3D) return MSKV_ERROR_INVALID_ARGUMENT;
    if (rope->style != MSKV_ROPE_HALF && rope->style != MSKV_ROPE_INTERLEAVED) return MSKV_ERROR_INVALID_ARGUMENT;
    if (!(rope->theta >= 0.0f) || rope->theta > 3.0e38f) return MSKV_ERROR_INVALID_ARGUMENT;
    parts = rope->mode == MSKV_POS_3D ? 3 : 1;
    for (i = 0; i < parts; i++) {
        if (rope->dims[i] < 0 || rope->dims[i] % 2 != 0 || rope->dims[i] > head_dim) return MSKV_ERROR_INVALID_ARGUMENT;
        sum += rope->dims[i];
    }
    if (sum > head_dim) return MSKV_ERROR_INVALID_ARGUMENT;
    return MSKV_SUCCESS;
}

MSKV_API mskv_result mskv_cuda_write_kv(mskv_cuda_store *st, int32_t layer, const mskv_cuda_dplan *plan,
                                        mskv_cu_ptr k, mskv_cu_ptr v, const mskv_rope *rope) {
    if (!st) return MSKV_ERROR_NULL_POINTER;
    return mskv_cuda_write_kv_ex(st, layer, plan, k, v, st->d.dtype, rope);
}

MSKV_API mskv_result mskv_cuda_write_kv_ex(mskv_cuda_store *st, int32_t layer, const mskv_cuda_dplan *plan, mskv_cu_ptr k,
                                           mskv_cu_ptr v, mskv_dtype src_dtype, const mskv_rope *rope) {
    static const unsigned int block[3] = { 128, 1, 1 };
    mskv__cuda_defines defs;
    mskv__cuda_args *a;
    mskv_cu_function f;
    mskv_result res;
    size_t blocks;
    unsigned int grid[3];
    if (!st || !plan) return MSKV_ERROR_NULL_POINTER;
    if (layer < 0 || layer >= st->d.num_layers) return MSKV_ERROR_OUT_OF_RANGE;
    if (st->d.head_dim != 64 && st->d.head_dim != 128 && st->d.head_dim != 256) return MSKV_ERROR_UNSUPPORTED;
    if (src_dtype != MSKV_DTYPE_F32 && src_dtype != MSKV_DTYPE_F16 && src_dtype != MSKV_DTYPE_BF16)
        return MSKV_ERROR_INVALID_ARGUMENT;
    if (plan->total_q == 0) return MSKV_SUCCESS;
    if (!k || !v || !plan->slot_mapping) return MSKV_ERROR_NULL_POINTER;
    if ((k | v) & 15) {
        /* the kernel reads rows as 16-byte vectors: a misaligned address would
           fault on the device and leave the context unusable */
        mskv__cuda_failf(st->cu, "mskv_cuda_write_kv: k (0x%llx) and v (0x%llx) must be 16-byte aligned",
                         (unsigned long long)k, (unsigned long long)v);
        return MSKV_ERROR_INVALID_ARGUMENT;
    }
    if (rope) {
        if ((res = mskv__cuda_check_rope(rope, st->d.head_dim)) != MSKV_SUCCESS) return res;
        if (plan->pos_mode != rope->mode) return MSKV_ERROR_INVALID_ARGUMENT;
        if (!plan->positions) return MSKV_ERROR_NULL_POINTER;
    }
    if ((res = mskv__cuda_uploaded_current(st)) != MSKV_SUCCESS) return res;
    blocks = ((size_t)plan->total_q * (size_t)st->d.kv_heads + 3) / 4;
    if (blocks > 0x7fffffffu) return MSKV_ERROR_OVERFLOW;
    if ((res = mskv__cuda_enter(st->cu)) != MSKV_SUCCESS) return res;
    defs = st->defs;
    mskv__cuda_defines_rope(&defs, rope);
    mskv__cuda_define(&defs, MSKV__D_SRC_DTYPE, (int32_t)src_dtype);
    if ((res = mskv__cuda_store_function(st, MSKV__K_KV_WRITE, &defs, &f)) != MSKV_SUCCESS) return res;
    grid[0] = (unsigned int)blocks; grid[1] = 1; grid[2] = 1;
    /* kernels.cu: mskv_kv_write(k_src, v_src, slot_mapping, n_tokens, kv_heads, k_pool, v_pool,
       pool_slots, positions, theta) */
    a = &st->args[MSKV__K_KV_WRITE];
    if (!a->once) {
        mskv__cuda_arg_i32(a, 4, st->d.kv_heads);
        mskv__cuda_arg_i64(a, 7, (int64_t)st->d.num_pages * st->d.page_size);
        a->once = 1;
    }
    mskv__cuda_arg_ptr(a, 0, k);
    mskv__cuda_arg_ptr(a, 1, v);
    mskv__cuda_arg_ptr(a, 2, plan->slot_mapping);
    mskv__cuda_arg_i32(a, 3, plan->total_q);
    mskv__cuda_arg_ptr(a, 5, mskv_cuda_store_pool(st, layer, 0));
    mskv__cuda_arg_ptr(a, 6, mskv_cuda_store_pool(st, layer, 1));
    mskv__cuda_arg_ptr(a, 8, rope ? plan->positions : 0);
    mskv__cuda_arg_f32(a, 9, rope && rope->theta > 0 ? rope->theta : 10000.0f);
    return mskv__cuda_launch(st, f, grid, block, 0, a->ptr);
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
    st->cap_kv_cover = INT64_MAX;
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
    g->shape = st->cur;
    g->kv_cover = st->cap_kv_cover;
    r = cu->fn.cuGraphInstantiateWithFlags(&g->exec, graph, 0);
    if (r != MSKV_CU_SUCCESS) {
        cu->fn.cuGraphDestroy(graph);
        mskv__cuda_dealloc(&cu->allocator, g);
        return mskv__cuda_fail(cu, r, "cuGraphInstantiateWithFlags");
    }
    st->graphs++;
    *out = g;
    return MSKV_SUCCESS;
}

MSKV_API mskv_result mskv_cuda_graph_launch(mskv_cuda_store *st, mskv_cuda_graph *g) {
    mskv_result res;
    if (!st || !g) return MSKV_ERROR_NULL_POINTER;
    if (st->capturing) return MSKV_ERROR_BAD_STATE;
    /* batch and token counts are launch arguments and the grid was sized for
       the captured plan: a larger step needs a new capture, a smaller one
       its plan padded to the captured shape (mskv_plan_desc.pad_*) */
    if (st->cur.batch > g->shape.batch || st->cur.total_q > g->shape.total_q || st->cur.max_qo > g->shape.max_qo ||
        st->cur.max_kv > g->kv_cover) {
        mskv__cuda_failf(st->cu, "graph replay: the uploaded plan (batch %d, tokens %d, longest %d queries / %lld keys) "
                         "is larger than the captured one (batch %d, tokens %d, %d queries, keys up to %lld): capture again",
                         (int)st->cur.batch, (int)st->cur.total_q, (int)st->cur.max_qo, (long long)st->cur.max_kv,
                         (int)g->shape.batch, (int)g->shape.total_q, (int)g->shape.max_qo, (long long)g->kv_cover);
        return MSKV_ERROR_CAPACITY;
    }
    if (st->cur.batch != g->shape.batch || st->cur.total_q != g->shape.total_q) {
        mskv__cuda_failf(st->cu, "graph replay: the uploaded plan (batch %d, tokens %d) is smaller than the captured one "
                         "(batch %d, tokens %d): pad it to that shape (mskv_plan_desc.pad_batch, pad_tokens) or capture again",
                         (int)st->cur.batch, (int)st->cur.total_q, (int)g->shape.batch, (int)g->shape.total_q);
        return MSKV_ERROR_INVALID_ARGUMENT;
    }
    if ((res = mskv__cuda_uploaded_current(st)) != MSKV_SUCCESS) return res;   /* the replay reads the last upload */
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
    st->graphs--;
    mskv__cuda_dealloc(&st->cu->allocator, g);
}

#undef MSKV__ST_TRY

/* // >>attention wrappers implementation ------------------------------------ */
/* GPU attention, merge and RoPE launch wrappers (they use the internal launch
   API above: st->defs, mskv__cuda_define, mskv__cuda_store_function,
   st->args + mskv__cuda_arg_*, mskv__cuda_launch, mskv__cuda_workspace). */

/* must match kernels.cu: MSKV_BM, MSKV_BN and MSKV_ATTN_SMEM */
static uint32_t mskv__attn_smem(int32_t bm, int32_t bn, int32_t d) {
    return (uint32_t)(2 * (bm * d + 4 * bn * d));
}

MSKV_API mskv_result mskv_cuda_attn_geometry_get(int32_t batch, int32_t total_q, int32_t max_qo_len,
                                                 int32_t max_kv_len, int32_t q_heads, int32_t kv_heads,
                                                 int32_t head_dim, int32_t multiprocessors,
                                                 int32_t max_smem_bytes, mskv_cuda_attn_geometry *out) {
    mskv_cuda_attn_geometry g;
    int64_t rows, tiles, blocks, splits, chunk, target;
    if (!out) return MSKV_ERROR_NULL_POINTER;
    if (batch < 0 || total_q < 0 || max_qo_len < 0 || max_kv_len < 0 || q_heads <= 0 || kv_heads <= 0 ||
        q_heads % kv_heads != 0 || (head_dim != 64 && head_dim != 128 && head_dim != 256))
        return MSKV_ERROR_INVALID_ARGUMENT;
    if (multiprocessors <= 0) multiprocessors = 1;
    if (max_smem_bytes <= 0) max_smem_bytes = 99 * 1024;
    memset(&g, 0, sizeof(g));
    rows = (int64_t)max_qo_len * (q_heads / kv_heads);
    /* few rows per (segment, kv head): 16-row blocks whose warps split the keys */
    g.decode = rows <= 16 && mskv__attn_smem(16, 64, head_dim) <= (uint32_t)max_smem_bytes;
    g.block_rows = g.decode ? 16 : 64;
    g.block_keys = g.decode ? 64 : (head_dim >= 256 ? 32 : 64);
    g.block_threads = 128;
    g.smem_bytes = mskv__attn_smem(g.block_rows, g.block_keys, head_dim);
    if (g.smem_bytes > (uint32_t)max_smem_bytes) return MSKV_ERROR_UNSUPPORTED;
    tiles = (rows + g.block_rows - 1) / g.block_rows;
    blocks = tiles * batch * kv_heads;
    /* split the keys when the blocks would not fill two waves and each split
       keeps at least 4 tiles of work */
    splits = 1;
    target = 2 * (int64_t)multiprocessors;
    if (blocks > 0 && blocks < target && max_kv_len > 0) {
        int64_t by_work = ((int64_t)max_kv_len + 4 * g.block_keys - 1) / (4 * g.block_keys);
        splits = (target + blocks - 1) / blocks;
        if (splits > by_work) splits = by_work;
        if (splits < 1) splits = 1;
    }
    chunk = max_kv_len;
    if (splits > 1) {
        chunk = ((int64_t)max_kv_len + splits - 1) / splits;
        chunk = (chunk + g.block_keys - 1) / g.block_keys * g.block_keys;
        splits = ((int64_t)max_kv_len + chunk - 1) / chunk;
    }
    if (tiles > 0x7fffffff || (int64_t)kv_heads * splits > 65535 || batch > 65535) return MSKV_ERROR_OVERFLOW;
    g.n_splits = (int32_t)splits;
    g.kv_chunk = splits > 1 ? (int32_t)chunk : 0;
    g.grid[0] = (uint32_t)tiles;
    g.grid[1] = (uint32_t)batch;
    g.grid[2] = (uint32_t)(kv_heads * splits);
    if (splits > 1) {
        size_t per = 0, all = 0;
        if (!mskv__cuda_mul((size_t)total_q * (size_t)q_heads, (size_t)head_dim + 1, &per) ||
            !mskv__cuda_mul(per, (size_t)splits * 4, &all))
            return MSKV_ERROR_OVERFLOW;
        g.workspace_bytes = all;
    }
    *out = g;
    return MSKV_SUCCESS;
}

/* The host-side checks of mskv_cuda_attention, kernel-independent: the
   kernel trusts the table, so refuse what mskv_cpu_attention refuses and no
   block reads past the pages it was given (O(batch)). *empty: nothing to do.
   Gives the longest segment's queries and keys. */
static mskv_result mskv__attn_check(const mskv_cuda_store *st, int32_t layer, const mskv_plan *plan,
                                    const mskv_cuda_dplan *dplan, const mskv_attn *attn, mskv_cu_ptr q,
                                    mskv_cu_ptr o, mskv_cu_ptr lse, int *empty, int32_t *max_qo, int32_t *max_kv) {
    int32_t b;
    mskv_result res;
    *empty = 0;
    if (!st || !plan || !dplan || !attn) return MSKV_ERROR_NULL_POINTER;
    if (layer < 0 || layer >= st->d.num_layers) return MSKV_ERROR_OUT_OF_RANGE;
    if (st->d.dtype != MSKV_DTYPE_F16 && st->d.dtype != MSKV_DTYPE_BF16) return MSKV_ERROR_UNSUPPORTED;
    if (attn->q_dtype == MSKV_DTYPE_F32) {
        /* a conversion pass over q and o is the caller's framework's to fuse with its projections */
        mskv__cuda_failf(st->cu, "mskv_cuda_attention: q and o are in the store's dtype; convert f32 q where it is produced");
        return MSKV_ERROR_UNSUPPORTED;
    }
    if (attn->q_dtype != st->d.dtype) return MSKV_ERROR_INVALID_ARGUMENT;
    if ((int)attn->mask < 0 || (int)attn->mask > 2 || attn->window_left < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (!(attn->scale >= 0.0f) || attn->scale > 3.0e38f) return MSKV_ERROR_INVALID_ARGUMENT;  /* the kernel needs scale > 0 */
    if (plan->batch != dplan->batch || plan->total_q != dplan->total_q) return MSKV_ERROR_INVALID_ARGUMENT;
    if (plan->page_size != st->d.page_size) return MSKV_ERROR_INVALID_ARGUMENT;
    /* q_pos and the visibility bounds are not read by these kernels yet: a
       plan that needs them would attend to other keys than the CPU's */
    if (plan->features & (MSKV_PLAN_Q_POS | MSKV_PLAN_VISIBILITY)) return MSKV_ERROR_UNSUPPORTED;
    if (plan->total_q == 0 || plan->batch == 0) { *empty = 1; return MSKV_SUCCESS; }
    if (!q || !o) return MSKV_ERROR_NULL_POINTER;
    /* the kernel reads q with 16-byte copies and writes o in 4-byte pairs */
    if ((q & 15) || (o & 3) || (lse & 3)) return MSKV_ERROR_INVALID_ARGUMENT;
    if (!plan->qo_indptr || !plan->kv_indptr || !plan->kv_len || (plan->num_page_ids > 0 && !plan->kv_indices))
        return MSKV_ERROR_NULL_POINTER;   /* an array missing at upload would leave the previous plan's there */
    /* masks need positions; the device buffers would hold a previous plan's */
    if (attn->mask != MSKV_MASK_NONE && (!plan->kv_pos_split || !plan->kv_pos_shift)) return MSKV_ERROR_INVALID_ARGUMENT;
    if (plan->pad_segments < 0 || plan->pad_segments > plan->batch) return MSKV_ERROR_INVALID_ARGUMENT;
    if (plan->num_page_ids != dplan->num_page_ids || plan->qo_indptr[0] != 0 || plan->kv_indptr[0] != 0 ||
        plan->qo_indptr[plan->batch] != plan->total_q || plan->kv_indptr[plan->batch] != plan->num_page_ids)
        return MSKV_ERROR_INVALID_ARGUMENT;
    *max_qo = 0;
    *max_kv = 0;
    for (b = 0; b < plan->batch; b++) {
        int64_t qo64 = (int64_t)plan->qo_indptr[b + 1] - plan->qo_indptr[b];
        int64_t np = (int64_t)plan->kv_indptr[b + 1] - plan->kv_indptr[b];
        int32_t qo = (int32_t)qo64, kv = plan->kv_len[b];
        if (qo64 < 0 || qo64 > plan->total_q || np < 0) return MSKV_ERROR_INVALID_ARGUMENT;
        if (np == 0 ? kv != 0 : (kv <= (int64_t)(np - 1) * st->d.page_size || kv > (int64_t)np * st->d.page_size))
            return MSKV_ERROR_INVALID_ARGUMENT;
        if (attn->mask != MSKV_MASK_NONE &&
            ((qo > kv && kv > 0) || plan->kv_pos_shift[b] < 0 || plan->kv_pos_split[b] < 0 || plan->kv_pos_split[b] > kv))
            return MSKV_ERROR_INVALID_ARGUMENT;
        if (b >= plan->batch - plan->pad_segments) {   /* padding: no keys, not part of the launch shape */
            if (kv != 0) return MSKV_ERROR_INVALID_ARGUMENT;
            continue;
        }
        if (qo > *max_qo) *max_qo = qo;
        if (kv > *max_kv) *max_kv = kv;
    }
    /* a padded plan launches as the shape it was padded to (a captured graph's) */
    if (plan->pad_qo_len > *max_qo) *max_qo = plan->pad_qo_len;
    if (plan->pad_kv_len > *max_kv) *max_kv = plan->pad_kv_len;
    /* both the host plan and the uploaded one the kernel reads must be current
       (no driver call, no formatting unless stale) */
    if (plan->generation && !st->arena) return MSKV_ERROR_BAD_STATE;
    if (plan->generation && (res = mskv_plan_check(st->arena, plan)) != MSKV_SUCCESS) return res;
    return mskv__cuda_uploaded_current(st);
}

MSKV_API mskv_result mskv_cuda_attention(mskv_cuda_store *st, int32_t layer, const mskv_plan *plan,
                                         const mskv_cuda_dplan *dplan, const mskv_attn *attn,
                                         mskv_cu_ptr q, mskv_cu_ptr o, mskv_cu_ptr lse) {
    static const unsigned int block[3] = {128, 1, 1};
    mskv_cuda_attn_geometry g;
    mskv__cuda_defines defs;
    mskv__cuda_args *a, *m;
    mskv_cu_function f, fm = NULL;
    mskv_result res;
    mskv_cu_ptr ws = 0, o_part = 0, lse_part = 0;
    int32_t max_qo = 0, max_kv = 0;
    int empty;
    float scale;
    res = mskv__attn_check(st, layer, plan, dplan, attn, q, o, lse, &empty, &max_qo, &max_kv);
    if (res != MSKV_SUCCESS || empty) return res;
    if ((res = mskv__cuda_enter(st->cu)) != MSKV_SUCCESS) return res;

    /* ---- the part that follows kernels.cu: geometry, variants, workspace,
       then each kernel's parameter values in its parameter order ---------- */
    res = mskv_cuda_attn_geometry_get(plan->batch, plan->total_q, max_qo, max_kv, attn->q_heads, st->d.kv_heads,
                                      st->d.head_dim, st->cu->info.multiprocessors, st->cu->smem_optin, &g);
    if (res != MSKV_SUCCESS) return res;
    defs = st->defs;
    mskv__cuda_define(&defs, MSKV__D_ATTN_WARP_KEYS, g.decode);
    /* both functions before any launch: a compile failure launches nothing */
    if ((res = mskv__cuda_store_function(st, MSKV__K_ATTN, &defs, &f)) != MSKV_SUCCESS) return res;
    if (g.n_splits > 1 && (res = mskv__cuda_store_function(st, MSKV__K_LSE_MERGE, &defs, &fm)) != MSKV_SUCCESS)
        return res;
    if (g.n_splits > 1) {
        int64_t cover = (int64_t)g.n_splits * g.kv_chunk;
        if ((res = mskv__cuda_workspace(st, g.workspace_bytes, &ws)) != MSKV_SUCCESS) return res;
        if (st->capturing && cover < st->cap_kv_cover) st->cap_kv_cover = cover;
        o_part = ws;
        lse_part = ws + (mskv_cu_ptr)((size_t)g.n_splits * (size_t)plan->total_q * (size_t)attn->q_heads * (size_t)st->d.head_dim * 4);
    }
    scale = attn->scale > 0.0f ? attn->scale : 1.0f / sqrtf((float)st->d.head_dim);
    /* mskv_attn(q, k_pool, v_pool, qo_indptr, kv_indptr, kv_indices, kv_len, kv_pos_split,
       kv_pos_shift, q_heads, kv_heads, page_size, scale_log2, mask, window_left, kv_chunk,
       n_splits, o, lse, o_part, lse_part) */
    a = &st->args[MSKV__K_ATTN];
    if (!a->once) {
        mskv__cuda_arg_i32(a, 10, st->d.kv_heads);
        mskv__cuda_arg_i32(a, 11, st->d.page_size);
        a->once = 1;
    }
    mskv__cuda_arg_ptr(a, 0, q);
    mskv__cuda_arg_ptr(a, 1, mskv_cuda_store_pool(st, layer, 0));
    mskv__cuda_arg_ptr(a, 2, mskv_cuda_store_pool(st, layer, 1));
    mskv__cuda_arg_ptr(a, 3, dplan->qo_indptr);
    mskv__cuda_arg_ptr(a, 4, dplan->kv_indptr);
    mskv__cuda_arg_ptr(a, 5, dplan->kv_indices);
    mskv__cuda_arg_ptr(a, 6, dplan->kv_len);
    mskv__cuda_arg_ptr(a, 7, dplan->kv_pos_split);
    mskv__cuda_arg_ptr(a, 8, dplan->kv_pos_shift);
    mskv__cuda_arg_i32(a, 9, attn->q_heads);
    mskv__cuda_arg_f32(a, 12, scale * 1.44269504088896341f);
    mskv__cuda_arg_i32(a, 13, (int32_t)attn->mask);
    mskv__cuda_arg_i32(a, 14, attn->window_left);
    mskv__cuda_arg_i32(a, 15, g.kv_chunk);
    mskv__cuda_arg_i32(a, 16, g.n_splits);
    mskv__cuda_arg_ptr(a, 17, o);
    mskv__cuda_arg_ptr(a, 18, lse);
    mskv__cuda_arg_ptr(a, 19, o_part);
    mskv__cuda_arg_ptr(a, 20, lse_part);
    res = mskv__cuda_launch(st, f, g.grid, block, g.smem_bytes, a->ptr);
    if (res != MSKV_SUCCESS || g.n_splits == 1) return res;
    {
        /* mskv_lse_merge(o_part, lse_part, n_splits, part_rows, rows, o, lse) */
        int64_t rows = (int64_t)plan->total_q * attn->q_heads;
        unsigned int grid[3];
        grid[0] = (unsigned int)((rows + 3) / 4); grid[1] = 1; grid[2] = 1;
        m = &st->args[MSKV__K_LSE_MERGE];
        mskv__cuda_arg_ptr(m, 0, o_part);
        mskv__cuda_arg_ptr(m, 1, lse_part);
        mskv__cuda_arg_i32(m, 2, g.n_splits);
        mskv__cuda_arg_i64(m, 3, rows);
        mskv__cuda_arg_i64(m, 4, rows);
        mskv__cuda_arg_ptr(m, 5, o);
        mskv__cuda_arg_ptr(m, 6, lse);
        return mskv__cuda_launch(st, fm, grid, block, 0, m->ptr);
    }
    /* ---- end of the kernel-specific part -------------------------------- */
}

MSKV_API mskv_result mskv_cuda_merge(mskv_cuda_store *st, int64_t n, int32_t heads, int32_t head_dim,
                                     mskv_cu_ptr o_a, mskv_cu_ptr lse_a, mskv_cu_ptr o_b, mskv_cu_ptr lse_b,
                                     mskv_cu_ptr o, mskv_cu_ptr lse) {
    static const unsigned int block[3] = {128, 1, 1};
    mskv__cuda_defines defs;
    mskv__cuda_args *a;
    mskv_cu_function f;
    mskv_result res;
    int64_t rows;
    unsigned int grid[3];
    if (!st) return MSKV_ERROR_NULL_POINTER;
    if (n < 0 || heads <= 0 || (head_dim != 64 && head_dim != 128 && head_dim != 256)) return MSKV_ERROR_INVALID_ARGUMENT;
    if (n == 0) return MSKV_SUCCESS;
    if (!o_a || !lse_a || !o_b || !lse_b || !o || !lse) return MSKV_ERROR_NULL_POINTER;
    if (n > (int64_t)0x7fffffff * 4 / heads) return MSKV_ERROR_OVERFLOW;
    if ((res = mskv__cuda_enter(st->cu)) != MSKV_SUCCESS) return res;
    defs = st->defs;
    mskv__cuda_define(&defs, MSKV__D_DTYPE, 0);
    mskv__cuda_define(&defs, MSKV__D_HEAD_DIM, head_dim);
    if ((res = mskv__cuda_store_function(st, MSKV__K_STATE_MERGE, &defs, &f)) != MSKV_SUCCESS) return res;
    rows = n * heads;
    grid[0] = (unsigned int)((rows + 3) / 4); grid[1] = 1; grid[2] = 1;
    /* mskv_state_merge(o_a, lse_a, o_b, lse_b, rows, o, lse) */
    a = &st->args[MSKV__K_STATE_MERGE];
    mskv__cuda_arg_ptr(a, 0, o_a);
    mskv__cuda_arg_ptr(a, 1, lse_a);
    mskv__cuda_arg_ptr(a, 2, o_b);
    mskv__cuda_arg_ptr(a, 3, lse_b);
    mskv__cuda_arg_i64(a, 4, rows);
    mskv__cuda_arg_ptr(a, 5, o);
    mskv__cuda_arg_ptr(a, 6, lse);
    return mskv__cuda_launch(st, f, grid, block, 0, a->ptr);
}

MSKV_API mskv_result mskv_cuda_rope(mskv_cuda_store *st, const mskv_rope *rope, mskv_cu_ptr x, int64_t n,
                                    int32_t heads, mskv_cu_ptr positions) {
    static const unsigned int block[3] = {128, 1, 1};
    mskv__cuda_defines defs;
    mskv__cuda_args *a;
    mskv_cu_function f;
    mskv_result res;
    unsigned int grid[3];
    if (!st || !rope) return MSKV_ERROR_NULL_POINTER;
    if (n < 0 || heads <= 0 || (rope->mode != MSKV_POS_1D && rope->mode != MSKV_POS_3D)) return MSKV_ERROR_INVALID_ARGUMENT;
    if (st->d.head_dim != 64 && st->d.head_dim != 128 && st->d.head_dim != 256) return MSKV_ERROR_UNSUPPORTED;
    if ((res = mskv__cuda_check_rope(rope, st->d.head_dim)) != MSKV_SUCCESS) return res;
    if (n == 0) return MSKV_SUCCESS;
    if (!x || !positions) return MSKV_ERROR_NULL_POINTER;
    if (n > (int64_t)0x7fffffff * 4 / heads) return MSKV_ERROR_OVERFLOW;
    if ((res = mskv__cuda_enter(st->cu)) != MSKV_SUCCESS) return res;
    defs = st->defs;
    mskv__cuda_defines_rope(&defs, rope);
    if ((res = mskv__cuda_store_function(st, MSKV__K_ROPE, &defs, &f)) != MSKV_SUCCESS) return res;
    grid[0] = (unsigned int)((n * heads + 3) / 4); grid[1] = 1; grid[2] = 1;
    /* mskv_rope(x, n, heads, positions, theta) */
    a = &st->args[MSKV__K_ROPE];
    mskv__cuda_arg_ptr(a, 0, x);
    mskv__cuda_arg_i64(a, 1, n);
    mskv__cuda_arg_i32(a, 2, heads);
    mskv__cuda_arg_ptr(a, 3, positions);
    mskv__cuda_arg_f32(a, 4, rope->theta > 0.0f ? rope->theta : 10000.0f);
    return mskv__cuda_launch(st, f, grid, block, 0, a->ptr);
}

#ifdef __cplusplus
}
#endif
#endif /* MSTAR_KV_CUDA_IMPLEMENTED */
#endif /* MSTAR_KV_CUDA_IMPLEMENTATION */

/*
------------------------------------------------------------------------------
MIT License

Copyright (c) 2026 the mstar_kv developers

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
------------------------------------------------------------------------------
*/
