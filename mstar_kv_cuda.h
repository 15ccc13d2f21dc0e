/* mstar_kv_cuda.h - v0.2.0 - the GPU layer of mstar_kv: a run-time loader for
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
   Its functions carry mstar_kv.h's MSKV_API (MSKV_STATIC, MSKV_DLL for a
   shared library or Windows DLL, or your own MSKV_API: see mstar_kv.h).

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
                       (Windows: the wheels' nvidia\cu13\bin\x86_64 and
                       nvidia\cuda_nvrtc\bin in %VIRTUAL_ENV%, %CONDA_PREFIX%
                       (each \Lib\site-packages) or %PYTHONPATH%, then
                       nvrtc64_130_0.dll, nvrtc64_120_0.dll, nvrtc64_112_0.dll
                       on PATH, under %CUDA_PATH%\bin\x64 and %CUDA_PATH%\bin,
                       then the wheels in %APPDATA%\Python\Python3X\site-packages
                       and the installer's Python3X\Lib\site-packages in
                       %LOCALAPPDATA%\Programs\Python and %ProgramFiles%).
                       A context takes the newest NVRTC whose CUDA major is
                       not above the driver's
                       (cuDriverGetVersion / 1000), the first found among
                       equals: what a newer NVRTC compiles that driver does not
                       load (CUDA 13's CUBINs need R580 or newer). A named one
                       (nvrtc_path, MSKV_NVRTC_PATH) is taken or refused, never
                       replaced; none that fits: mskv_cuda_create fails with
                       MSKV_ERROR_UNSUPPORTED and both fixes. mskv_cuda_info's
                       nvrtc_path and nvrtc_choice say what was taken and why.
     MSKV_CACHE_DIR    the kernel cache directory (else $XDG_CACHE_HOME/mstar_kv,
                       else ~/.cache/mstar_kv; Windows: %LOCALAPPDATA%\mstar_kv);
                       mskv_cuda_desc.cache_dir wins

   Example:
       mskv_cuda_desc cd = MSKV_ZERO_INIT;
       mskv_cuda *cu;
       if (mskv_cuda_create(&cd, &cu) != MSKV_SUCCESS) ... use the CPU backend;
       mskv_cuda_store_desc sd = MSKV_ZERO_INIT;
       sd.num_pages = 4096; sd.page_size = 16; sd.num_layers = 32;
       sd.kv_heads = 8; sd.head_dim = 128; sd.dtype = MSKV_DTYPE_BF16;
       mskv_cuda_store *st;  mskv_cuda_store_create(cu, &sd, &st);
       mskv_arena_desc ad = MSKV_ZERO_INIT;
       mskv_cuda_store_arena_desc(st, &ad);   // geometry, store_ops (so no host
                                              // pools: the K/V live on the device), FENCED retire
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
   captured split-KV launches reach, plan features beyond the captured plan's
   or without the q_pos / bounds arrays it read): graph_launch refuses such a
   plan. While
   graphs exist the attention workspace cannot grow (BAD_STATE).

   Hopper: on compute capability 9.0 prefill attention runs mskv_attn_sm90
   (wgmma, TMA, warp-specialised; NVRTC compiles it for sm_90a), falling back
   to mskv_attn for the context's life, logged once, if it does not compile
   or load; mskv_cuda_desc.attn_path forces either kernel.

   The kernels: an embedded copy of kernels.cu, fenced at the very end of
   this file after all of its code (section >>embedded kernels), regenerated
   by `sh tools/embed_kernels.sh` whenever kernels.cu changes;
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
#define MSKV_CU_ERROR_STREAM_CAPTURE_UNSUPPORTED 900
#define MSKV_CU_ATTR_MULTIPROCESSOR_COUNT 16
#define MSKV_CU_ATTR_CC_MAJOR 75
#define MSKV_CU_ATTR_CC_MINOR 76
#define MSKV_CU_ATTR_MAX_SMEM_OPTIN 97
#define MSKV_CU_FUNC_ATTR_MAX_DYNAMIC_SMEM 8
#define MSKV_CU_STREAM_NON_BLOCKING 1
#define MSKV_CU_EVENT_DISABLE_TIMING 2
#define MSKV_CU_CAPTURE_MODE_RELAXED 2
#define MSKV_CU_GET_PROC_ADDRESS_LEGACY_STREAM 1
/* cuTensorMapEncodeTiled's arguments (the sm_90a kernel's K/V maps), and
   CUtensorMap: 128 opaque bytes at the 64-byte alignment that call asks of
   its address (CUDA 13's cuda.h aligns the type itself to 128) */
#define MSKV_CU_TENSOR_MAP_DATA_TYPE_FLOAT16 6
#define MSKV_CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 9
#define MSKV_CU_TENSOR_MAP_INTERLEAVE_NONE 0
#define MSKV_CU_TENSOR_MAP_SWIZZLE_128B 3
#define MSKV_CU_TENSOR_MAP_L2_PROMOTION_L2_256B 3
#define MSKV_CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE 0
#define MSKV_CU_TENSOR_MAP_BYTES 128
#define MSKV_CU_TENSOR_MAP_ALIGN 64
#define MSKV_NVRTC_SUCCESS 0
#define MSKV_NVRTC_ERROR_OUT_OF_MEMORY 1
#define MSKV_NVRTC_ERROR_COMPILATION 6

/* The one list of every driver and NVRTC function the layer calls:
   X(return type, name, versioned symbol exported by the library, parameters).
   Driver functions are resolved through cuGetProcAddress_v2 by their base
   name at ABI version 12.0 when the driver has it, else by the versioned
   symbol with dlsym (GetProcAddress on Windows). cuTensorMapEncodeTiled (drivers
   from CUDA 12.0) may be missing: it is left NULL and the sm_90a attention
   kernel loads K/V with cp.async instead of TMA. */
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
    X(mskv_cu_result, cuOccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor", (int *blocks, mskv_cu_function f, int block_size, size_t smem)) \
    X(mskv_cu_result, cuLaunchKernel, "cuLaunchKernel", (mskv_cu_function f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz, unsigned int smem, mskv_cu_stream s, void **params, void **extra)) \
    X(mskv_cu_result, cuStreamBeginCapture, "cuStreamBeginCapture_v2", (mskv_cu_stream s, int mode)) \
    X(mskv_cu_result, cuStreamEndCapture, "cuStreamEndCapture", (mskv_cu_stream s, mskv_cu_graph *g)) \
    X(mskv_cu_result, cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", (mskv_cu_graph_exec *e, mskv_cu_graph g, unsigned long long flags)) \
    X(mskv_cu_result, cuGraphLaunch, "cuGraphLaunch", (mskv_cu_graph_exec e, mskv_cu_stream s)) \
    X(mskv_cu_result, cuGraphExecDestroy, "cuGraphExecDestroy", (mskv_cu_graph_exec e))        \
    X(mskv_cu_result, cuGraphDestroy, "cuGraphDestroy", (mskv_cu_graph g))                    \
    X(mskv_cu_result, cuTensorMapEncodeTiled, "cuTensorMapEncodeTiled", (void *map, int dtype, unsigned int rank, void *gaddr, const unsigned long long *dims, const unsigned long long *strides, const unsigned int *box, const unsigned int *element_strides, int interleave, int swizzle, int l2_promotion, int oob_fill))

/* The NVRTC functions, in the same X form. */
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
   inject failures. Every member must be set, except cuTensorMapEncodeTiled
   (NULL: a driver without it). */
typedef struct mskv_cuda_functions {
#define MSKV__CUDA_MEMBER(ret, name, sym, params) ret (*name) params;
    MSKV_CUDA_DRIVER_FUNCTIONS(MSKV__CUDA_MEMBER)
    MSKV_CUDA_NVRTC_FUNCTIONS(MSKV__CUDA_MEMBER)
#undef MSKV__CUDA_MEMBER
} mskv_cuda_functions;

/* // >>context ------------------------------------------------------------- */

/* A GPU context: one device, the loaded libraries and kernels (opaque; mskv_cuda_create). */
typedef struct mskv_cuda mskv_cuda;

/* Which kernel computes attention. The sm_90a kernel (mskv_attn_sm90:
   wgmma, TMA, warp-specialised) needs compute capability 9.0 (H100, H200). */
typedef enum mskv_cuda_attn_path {
    MSKV_CUDA_ATTN_AUTO = 0,    /* sm_90a for prefill on compute capability 9.0 (if it fails to compile or
                                   load: mma.sync from then on, logged once), decode and other devices mma.sync */
    MSKV_CUDA_ATTN_MMA = 1,     /* mskv_attn (mma.sync) for every call */
    MSKV_CUDA_ATTN_WGMMA = 2    /* mskv_attn_sm90 for every call, decode shapes too; UNSUPPORTED on other
                                   devices, its compile or load errors returned */
} mskv_cuda_attn_path;

/* What mskv_cuda_create opens: device, libraries, kernel source, cache, logger, kernel path. */
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
    mskv_cuda_attn_path attn_path;  /* 0 = AUTO */
    int32_t selftest;               /* MSKV_CUDA_SELFTEST_ON (0, the default): the first time a device loads an
                                       attention or K/V write variant it runs a small known-answer problem
                                       against the CPU backend, and a variant that fails is not used;
                                       MSKV_CUDA_SELFTEST_OFF skips the check */
} mskv_cuda_desc;

enum { MSKV_CUDA_SELFTEST_ON = 0, MSKV_CUDA_SELFTEST_OFF = 1 };   /* mskv_cuda_desc.selftest: check each variant on first load, or not */

/* What a context runs on and what it compiled (mskv_cuda_info_get). */
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
    int32_t wgmma;                  /* 1: prefill attention runs the sm_90a kernel (compute capability 9.0,
                                       not forced off, and it has not failed to compile or load) */
    char nvrtc_path[512];           /* the libnvrtc in use ("injected" with mskv_cuda_desc.functions) */
    char nvrtc_choice[512];         /* why that one: the candidates' CUDA majors against the driver's */
    int32_t selftests_passed;       /* kernel variants whose known-answer self-test passed (this context) */
    int32_t selftests_failed;       /* variants that failed it: marked bad, the fallback taken */
    double selftest_ms;             /* wall time of those self-tests, in milliseconds */
    char selftest_report[1024];     /* one line per variant tested: name, pass or FAIL, worst error, ms */
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
   mskv_cuda_probe), UNSUPPORTED (every NVRTC found is of a newer CUDA major
   than the driver: the logger gets both versions and the fixes, a driver for
   that CUDA or `pip install nvidia-cuda-nvrtc-cu12`), OUT_OF_MEMORY, CUDA. */
MSKV_API mskv_result mskv_cuda_create(const mskv_cuda_desc *desc, mskv_cuda **out);
/* Destroy every store of the context first. */
MSKV_API void mskv_cuda_destroy(mskv_cuda *cu);
/* Fills out with the device, versions, kernel path and self-test results. */
MSKV_API mskv_result mskv_cuda_info_get(mskv_cuda *cu, mskv_cuda_info *out);
/* Details of the last failure of a call on this context (NVRTC log, driver
   error name); "" when none. Valid until the next call. */
MSKV_API const char *mskv_cuda_last_error(mskv_cuda *cu);

/* Device memory for the caller's own tensors (q, k, v, o, ...). */
MSKV_API mskv_result mskv_cuda_malloc(mskv_cuda *cu, size_t bytes, mskv_cu_ptr *out);
/* Frees memory from mskv_cuda_malloc. */
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

/* A compiled kernel image (mskv_cuda_compile). */
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
/* Frees an image's data and log. */
MSKV_API void mskv_cuda_image_free(const mskv_cuda_desc *desc, mskv_cuda_image *img);
/* Register spills reported by ptxas (--ptxas-options=-v) in a log: the sum of
   "bytes spill stores" and "bytes spill loads"; -1 when the log has no report. */
MSKV_API int64_t mskv_cuda_log_spills(const char *log);
/* The embedded copy of kernels.cu. */
MSKV_API const char *const *mskv_cuda_embedded_lines(int32_t *count);
/* Joins it into buf; *size (optional) gets the length without the NUL. */
MSKV_API mskv_result mskv_cuda_embedded_source(char *buf, size_t cap, size_t *size);

/* // >>device store --------------------------------------------------------- */

/* One device's K/V pools with their stream, plan buffers and fences (opaque; mskv_cuda_store_create). */
typedef struct mskv_cuda_store mskv_cuda_store;

/* What mskv_cuda_store_create allocates or adopts: geometry, plan capacities, staging. */
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
    /* the plan's optional arrays (0 when it had none): query positions and
       visibility bounds, read by mskv_cuda_attention when plan->features asks */
    mskv_cu_ptr q_pos, vis_sink_end, vis_window_start;
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
/* The store ops mskv_cuda_store_arena_desc puts into a descriptor. */
MSKV_API const mskv_store_ops *mskv_cuda_store_ops(mskv_cuda_store *st);
/* The device address of one layer's pool (kind 0 = K, 1 = V); 0 for a bad argument. */
MSKV_API mskv_cu_ptr mskv_cuda_store_pool(mskv_cuda_store *st, int32_t layer, int kind);
/* The stream the store's launches and copies run on now. */
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
/* The same from the device into host memory. */
MSKV_API mskv_result mskv_cuda_download(mskv_cuda_store *st, void *dst, mskv_cu_ptr src, size_t bytes);
/* Waits until the store's stream has run everything queued on it. */
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
/* mskv_cuda_write_kv with k and v in src_dtype (see above). */
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
   smaller one not padded to it, STALE_PLAN, BAD_STATE (capturing), CUDA.
   Dense attention (mskv_cuda_attention_dense) is captured with its buffers:
   a replay is refused with INVALID_ARGUMENT when the uploaded plan's rows
   reach past the fewest rows a captured dense K/V had, and with STALE_VIEW
   when a captured view's epoch is no longer its request's (a gather after
   the capture, even in place, needs a new capture; at most 8 views per
   graph, CAPACITY at the capture otherwise). */
typedef struct mskv_cuda_graph mskv_cuda_graph;
/* Begins capturing the store's launches into a graph. */
MSKV_API mskv_result mskv_cuda_capture_begin(mskv_cuda_store *st);
/* Ends the capture; *out gets the graph. */
MSKV_API mskv_result mskv_cuda_capture_end(mskv_cuda_store *st, mskv_cuda_graph **out);
/* Replays a graph over the plan uploaded last (see above). */
MSKV_API mskv_result mskv_cuda_graph_launch(mskv_cuda_store *st, mskv_cuda_graph *g);
/* Frees a graph. */
MSKV_API void mskv_cuda_graph_destroy(mskv_cuda_store *st, mskv_cuda_graph *g);

/* // >>attention wrappers ---------------------------------------------------- */
/* GPU attention, merge and RoPE launch wrappers. */

/* How one attention call is laid out on the device. Pure arithmetic (no
   device): the wrapper uses it, and a caller can size its workspace or check
   what a CUDA graph will launch. */
typedef struct mskv_cuda_attn_geometry {
    int32_t decode;          /* 1: decode layout (16 rows per block, warps split the keys, 3 stages) */
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
   kv_len of a segment), heads, head_dim (64, 128, 256), the device's SM count,
   opt-in shared memory per block (0 = 99 KiB, what every sm_80+ part has) and
   resident_blocks: how many blocks of the chosen layout's kernel fit on one SM
   at once (cuOccupancyMaxActiveBlocksPerMultiprocessor at smem_bytes; the
   wrapper asks the driver; 0 = unknown, taken as 1).
   The layout (decode or prefill, so smem_bytes) does not depend on
   resident_blocks: call once with 0 to learn it, then again with the count.
   Keys are split (flash-decoding) only when the (row tile, segment, kv head)
   blocks fill less than one wave of multiprocessors * resident_blocks, and
   never below 512 keys per split (so a 512-key decode is one launch, no
   merge); among the allowed counts the one with the least estimated time
   (waves x keys per split, plus the merge) wins: whole waves, not a tail.
   Return value: SUCCESS, INVALID_ARGUMENT (heads, head_dim), OVERFLOW. */
MSKV_API mskv_result mskv_cuda_attn_geometry_get(int32_t batch, int32_t total_q, int32_t max_qo_len,
                                                 int32_t max_kv_len, int32_t q_heads, int32_t kv_heads,
                                                 int32_t head_dim, int32_t multiprocessors,
                                                 int32_t max_smem_bytes, int32_t resident_blocks,
                                                 mskv_cuda_attn_geometry *out);
/* The page of a compacted key index j without a division, as the attention
   kernel computes it: page = (j * magic) >> shift for every 0 <= j < 2^31,
   magic = ceil(2^(31 + l) / page_size), shift = 31 + l, l = ceil(log2(page_size)).
   page_size >= 1. */
MSKV_API void mskv_cuda_page_divisor(int32_t page_size, uint32_t *magic, int32_t *shift);

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
   On compute capability 9.0 prefill shapes (more than 16 rows of a segment)
   run mskv_attn_sm90 (mskv_cuda_desc.attn_path, mskv_cuda_info.wgmma).
   Return value: SUCCESS, NULL_POINTER, INVALID_ARGUMENT, OUT_OF_RANGE (layer;
   for a masked call, an uploaded plan whose mask positions the kernels'
   32-bit arithmetic cannot hold: a key at kv_len - 1 + kv_pos_shift or a
   q_pos of 2^31 - 1, or a q_pos - window_left below -2^31; the CPU takes
   them; graph replays check the same),
   UNSUPPORTED (f32 store, f32 q, head_dim; WGMMA forced on another device;
   a plan whose features hold a bit other than MSKV_PLAN_Q_POS and
   MSKV_PLAN_VISIBILITY, which both kernels honour as the mskv_plan comment
   says: q_pos and the bounds are read from the uploaded plan, so the plan
   needs those arrays at upload, else NULL_POINTER), STALE_PLAN (plan, or
   the plan uploaded last, is an arena-built plan whose pages changed since
   it was built), CUDA, NVRTC (first use compiles). */
MSKV_API mskv_result mskv_cuda_attention(mskv_cuda_store *st, int32_t layer, const mskv_plan *plan,
                                         const mskv_cuda_dplan *dplan, const mskv_attn *attn,
                                         mskv_cu_ptr q, mskv_cu_ptr o, mskv_cu_ptr lse);

/* Attention over dense K/V in device memory (kv->device = 1): a prefix
   view's layer (mskv_prefix_view_layer of a view mskv_cuda_prefix_view_gather
   filled) or any caller buffer of rows [kv_heads][head_dim] in the store's
   dtype, under a MSKV_PLAN_PREFIX or DENSE plan (or any plan whose keys
   the caller gathered) uploaded by mskv_cuda_plan_upload: segment b's key j
   is row kv_token_indptr[b] + j. The same kernels, masks, positions,
   visibility bounds, splits, graphs and results as mskv_cuda_attention;
   the keys are found without a page table (each row is its own "page"), and
   on compute capability 9.0 the sm_90a kernel loads them by TMA through a
   map of the buffer (made on a buffer pair's first use and kept, so a loop
   over a view's layers encodes nothing after its first step). With
   kv->arena set the call first checks kv->epoch against the request's
   prefix_epoch.
   Return value: those of mskv_cuda_attention, and STALE_VIEW (the prefix
   changed since the gather: gather again), INVALID_HANDLE (the request was
   removed), INVALID_ARGUMENT (host K/V (device 0), another dtype, head_dim
   or kv_heads than the store's, k or v not 16-byte aligned, a plan without
   uploaded rows: kv_token_indptr past int32), OUT_OF_RANGE (a segment's
   rows past kv->tokens, in the host plan or the uploaded one), UNSUPPORTED
   (strides other than the row layout:
   the CPU's mskv_cpu_attention_dense takes those). */
MSKV_API mskv_result mskv_cuda_attention_dense(mskv_cuda_store *st, const mskv_dense_kv *kv, const mskv_plan *plan,
                                               const mskv_cuda_dplan *dplan, const mskv_attn *attn,
                                               mskv_cu_ptr q, mskv_cu_ptr o, mskv_cu_ptr lse);
/* The device side of mskv_prefix_view_gather: gathers (or refreshes, in
   place) the protected prefix of view->request in view->group, every layer,
   K and V, from the store's pools into the view's device buffers (view->k,
   view->v: device addresses, 16-byte aligned, [num_layers][cap_tokens]
   [kv_heads][head_dim] each) on the store's stream, and tags the view with
   the prefix_epoch its pages were read at (device = 1). Returns once the
   copies completed. The store must be bound to the arena. A prefix that
   changes while the copies run moves the epoch, so the view is refused.
   Return value: SUCCESS, NULL_POINTER, BAD_STATE (no bound arena, while
   capturing), INVALID_ARGUMENT (group, cap_tokens < 0, a buffer not 16-byte
   aligned), INVALID_HANDLE, OFFLOADED, CAPACITY (the prefix is longer than
   cap_tokens), OVERFLOW, OUT_OF_MEMORY, CUDA, NVRTC (the copy kernel's first
   use); after a failure once copies began, the view says epoch 0 (stale).
   Nothing is written for any other failure. */
MSKV_API mskv_result mskv_cuda_prefix_view_gather(mskv_cuda_store *st, mskv_prefix_view *view);

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

/* // >>shards ----------------------------------------------------------------
   One arena over several GPUs: head shards. Tensor-parallel and
   Ulysses-style sequence-parallel models give each of N devices kv_heads / N
   of the K/V heads of every layer (and the q heads that read them). One
   arena keeps the books for all of them: one admit / plan / commit /
   publish per step, the same page ids on every device. Under it, N device
   stores, one per device (each its own context, stream, fences and pools of
   kv_heads / N heads), behind one set of store ops:
     - read/write (offload, reload, export, import, the byte audit) gather
       and scatter every shard: the host layout stays the arena's
       [page][layer][K then V][slot][kv_head][dim] with the heads of shard 0,
       then shard 1, ... in each slot, so a blob of a sharded arena is the
       blob of the same request in an unsharded one, and imports anywhere
       (into another shard count too). Each device's share goes through its
       own pinned staging buffer, all devices' copies in flight together;
       host copies are ordinary memory (mskv_arena_desc.host_allocator).
     - copy (fork), fill (debug poisoning) and flush go to every device.
     - a failure on one device changes nothing anywhere: reads write no
       device, and the pages a failed write, copy or reload had taken are
       the arena's to give back (poisoned again with MSKV_DEBUG_POISON).
   Per step: mskv_cuda_shards_plan_upload puts the plan on every device;
   mskv_cuda_shards_write_kv and mskv_cuda_shards_attention run on one
   device with that device's slice of the tensors (launch them for every
   shard, on each device's stream); mskv_cuda_shards_publish records an
   event on every device, and a fence retires only when every device's
   event for it completed. Stale plans are refused on every device as on one.
   Tensor slices: the caller hands device s its own heads, contiguous:
   k and v [total_q][kv_heads / N][head_dim] (kv heads s*kv_heads/N ...),
   q, o [total_q][q_heads / N][head_dim] and lse [total_q][q_heads / N] (q
   heads s*q_heads/N ...): a GQA group never straddles two devices, so
   kv_heads and q_heads must divide by N (refused otherwise).
   A shard's store (mskv_cuda_shards_store) is a normal store for
   everything else: its pools, stream, set_stream, graphs, merge, rope. It
   cannot be bound to an arena of its own or published alone (BAD_STATE).
   Streamed export/import (mskv_request_export_begin) is unsupported, as for
   any store_ops arena: blobs go through mskv_request_export/import.
   One process per GPU instead (each rank its own arena, the same
   decisions): see mskv_rank_check in mstar_kv.h. */
#define MSKV_CUDA_MAX_SHARDS 16   /* devices one sharded arena may span */

/* N device stores behind one arena's store ops (opaque; mskv_cuda_shards_create). */
typedef struct mskv_cuda_shards mskv_cuda_shards;

/* What mskv_cuda_shards_create builds: the devices and the whole model's geometry. */
typedef struct mskv_cuda_shard_desc {
    int32_t num_shards;             /* N: 1 ... MSKV_CUDA_MAX_SHARDS */
    mskv_cuda *const *devices;      /* N contexts, shard s on devices[s] (one per device, or shared for tests) */
    /* The geometry of the whole model: kv_heads is every shard's heads
       together (divisible by N; each device's store gets kv_heads / N).
       The other fields as for mskv_cuda_store_create, for every device;
       store.pools must be NULL (adopted pools: pools below). */
    mskv_cuda_store_desc store;
    const mskv_cu_ptr *const *pools; /* optional: pools[s] = shard s's adopted pools (mskv_cuda_store_desc.pools) */
} mskv_cuda_shard_desc;

/* Creates the N stores and the shared staging. Return value: SUCCESS,
   NULL_POINTER, INVALID_ARGUMENT (num_shards, a missing device, kv_heads
   not divisible by N, store.pools set), or mskv_cuda_store_create's error
   on a device (then nothing is left on any). */
MSKV_API mskv_result mskv_cuda_shards_create(const mskv_cuda_shard_desc *desc, mskv_cuda_shards **out);
/* Destroy the arena bound to it first. */
MSKV_API void mskv_cuda_shards_destroy(mskv_cuda_shards *sh);
/* Fills the full geometry (kv_heads of all shards), the sharded store ops
   and MSKV_RETIRE_FENCED into an arena descriptor; other fields are kept. */
MSKV_API mskv_result mskv_cuda_shards_arena_desc(mskv_cuda_shards *sh, mskv_arena_desc *desc);
/* The arena whose fences the shards retire and whose plans they check
   (created with the desc above). INVALID_ARGUMENT: another geometry. */
MSKV_API mskv_result mskv_cuda_shards_bind(mskv_cuda_shards *sh, mskv_arena *arena);
/* The number of shards, N. */
MSKV_API int32_t mskv_cuda_shards_count(const mskv_cuda_shards *sh);
/* Shard s's device store (NULL past the count). */
MSKV_API mskv_cuda_store *mskv_cuda_shards_store(mskv_cuda_shards *sh, int32_t shard);
/* mskv_cuda_plan_upload on every device: out[s] (num_shards entries) is
   device s's copy. All or nothing as far as launches go: when one device
   fails, no device's launches take the plan of that upload (nor the one
   before it: they answer BAD_STATE until an upload succeeds).
   Return value: as mskv_cuda_plan_upload. */
MSKV_API mskv_result mskv_cuda_shards_plan_upload(mskv_cuda_shards *sh, const mskv_plan *plan, mskv_pos_mode pos_mode,
                                                  mskv_cuda_dplan *out);
/* mskv_cuda_write_kv on device `shard` with its slice: k, v [total_q][kv_heads
   / N][head_dim]; dplan is out[shard] of the upload. OUT_OF_RANGE: shard. */
MSKV_API mskv_result mskv_cuda_shards_write_kv(mskv_cuda_shards *sh, int32_t shard, int32_t layer, const mskv_cuda_dplan *dplan,
                                               mskv_cu_ptr k, mskv_cu_ptr v, const mskv_rope *rope);
/* mskv_cuda_attention on device `shard`: attn describes the whole model
   (attn->q_heads: every shard's q heads together, divisible by N); q, o and
   lse are the shard's slices (above). INVALID_ARGUMENT: q_heads not
   divisible by N; OUT_OF_RANGE: shard; else as mskv_cuda_attention. */
MSKV_API mskv_result mskv_cuda_shards_attention(mskv_cuda_shards *sh, int32_t shard, int32_t layer, const mskv_plan *plan,
                                                const mskv_cuda_dplan *dplan, const mskv_attn *attn,
                                                mskv_cu_ptr q, mskv_cu_ptr o, mskv_cu_ptr lse);
/* mskv_publish, an event on every device, then a retire poll. A device
   whose event cannot be recorded is waited for instead (its stream
   synchronised; the step's pages still wait for the other devices' events).
   Return value: as mskv_cuda_publish (the first device's error). */
MSKV_API mskv_result mskv_cuda_shards_publish(mskv_cuda_shards *sh, const mskv_segment *segs, int32_t n, uint64_t *step_out);
/* Retires every fence whose events completed on every device (wait: wait
   for all). Also what mskv_cuda_retire on a shard's store does. */
MSKV_API mskv_result mskv_cuda_shards_retire(mskv_cuda_shards *sh, int wait);
/* Waits for every device's stream. */
MSKV_API mskv_result mskv_cuda_shards_sync(mskv_cuda_shards *sh);

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
#include <math.h>
#include <time.h>

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
   The generated copy of kernels.cu is the last thing in this file (fenced by
   >>kernels-begin / >>kernels-end, written by tools/embed_kernels.sh); this
   accessor, defined beside it, is the only way in. */
static const char *const *mskv__cuda_kernels(size_t *lines);

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

/* NVRTC's names after the caller's choices (at most MSKV__CUDA_NVRTC_MAX):
   PyPI's wheels in the active Python environment ($VIRTUAL_ENV,
   $CONDA_PREFIX, $PYTHONPATH: what that environment's other CUDA code runs
   with), the bare names (the loader's search: PATH on Windows, the loader's
   path elsewhere), the toolkit's folders, then the wheels in the user's and
   the system's site-packages. Only wheel files that exist are listed, so
   absent wheels add nothing to the reasons. */
#define MSKV__CUDA_NVRTC_MAX 24
/* Where PyPI's NVRTC wheels put the library below a site-packages
   directory: nvidia-cuda-nvrtc 13.x, then nvidia-cuda-nvrtc-cu12 (each
   library finds its builtins beside it: $ORIGIN run path; on Windows the
   folder of a DLL opened by its full path). */
#ifdef _WIN32
#define MSKV__CUDA_PATH_LIST_SEP ';'
static const char *const mskv__cuda_nvrtc_wheels[2] = {
    "nvidia\\cu13\\bin\\x86_64\\nvrtc64_130_0.dll", "nvidia\\cuda_nvrtc\\bin\\nvrtc64_120_0.dll" };
#define MSKV__CUDA_NVRTC_NOT_FOUND \
    "; no NVRTC wheel (nvidia\\cu13\\bin\\x86_64\\nvrtc64_130_0.dll, nvidia\\cuda_nvrtc\\bin\\nvrtc64_120_0.dll) in " \
    "%VIRTUAL_ENV%, %CONDA_PREFIX%, %PYTHONPATH% or the user and system site-packages (no NVRTC)"
#else
#define MSKV__CUDA_PATH_LIST_SEP ':'
static const char *const mskv__cuda_nvrtc_wheels[2] = {
    "nvidia/cu13/lib/libnvrtc.so.13", "nvidia/cuda_nvrtc/lib/libnvrtc.so.12" };
#define MSKV__CUDA_NVRTC_NOT_FOUND \
    "; no NVRTC wheel (nvidia/cu13/lib/libnvrtc.so.13, nvidia/cuda_nvrtc/lib/libnvrtc.so.12) in " \
    "$VIRTUAL_ENV, $CONDA_PREFIX, $PYTHONPATH or the user and system site-packages (no NVRTC)"
#endif

typedef struct mskv__cuda_paths { char (*p)[512]; int n, max; } mskv__cuda_paths;

static void mskv__cuda_paths_add(mskv__cuda_paths *ps, const char *path) {
    if (ps->n < ps->max && strlen(path) < sizeof(ps->p[0])) mskv__cuda_copystr(ps->p[ps->n++], sizeof(ps->p[0]), path);
}

static int mskv__cuda_file_exists(const char *path) {
#ifdef _WIN32
    DWORD at = GetFileAttributesA(path);
    return at != INVALID_FILE_ATTRIBUTES && !(at & FILE_ATTRIBUTE_DIRECTORY);
#else
    return access(path, F_OK) == 0;
#endif
}

/* The wheels' libraries that exist in one site-packages directory (len bytes of site). */
static void mskv__cuda_paths_site(mskv__cuda_paths *ps, const char *site, size_t len) {
    char path[512];
    int i;
    for (i = 0; i < 2; i++) {
        size_t w = strlen(mskv__cuda_nvrtc_wheels[i]);
        if (len == 0 || len + w + 2 > sizeof(path)) continue;
        memcpy(path, site, len);
        path[len] = MSKV__CUDA_SEP[0];
        memcpy(path + len + 1, mskv__cuda_nvrtc_wheels[i], w + 1);
        if (mskv__cuda_file_exists(path)) mskv__cuda_paths_add(ps, path);
    }
}

/* Each entry of a PATH-like list (':' or ';' between entries) as a site-packages directory. */
static void mskv__cuda_paths_list(mskv__cuda_paths *ps, const char *list) {
    const char *e;
    for (e = list; *e; e += *e == MSKV__CUDA_PATH_LIST_SEP) {
        size_t n = 0;
        while (e[n] && e[n] != MSKV__CUDA_PATH_LIST_SEP) n++;
        mskv__cuda_paths_site(ps, e, n);
        e += n;
    }
}

#ifdef _WIN32
/* <dir>\<Python3X><leaf> for each Python version X present: the user's
   site-packages (%APPDATA%\Python\Python3X\site-packages) and the
   installer's per-user and all-users places (...\Python3X\Lib\site-packages).
   One directory read per folder. */
static void mskv__cuda_paths_pythons(mskv__cuda_paths *ps, const char *dir, const char *leaf) {
    char pattern[512], site[512];
    WIN32_FIND_DATAA fd;
    HANDLE h;
    if (!dir || !*dir || strlen(dir) + 10 >= sizeof(pattern)) return;
    mskv__cuda_format(pattern, sizeof(pattern), "%s\\Python3*", dir);
    if ((h = FindFirstFileA(pattern, &fd)) == INVALID_HANDLE_VALUE) return;
    do {
        if (!(fd.dwFileAttributes & FILE_ATTRIBUTE_DIRECTORY)) continue;
        if (strlen(dir) + strlen(fd.cFileName) + strlen(leaf) + 3 > sizeof(site)) continue;
        mskv__cuda_format(site, sizeof(site), "%s\\%s%s", dir, fd.cFileName, leaf);
        mskv__cuda_paths_site(ps, site, strlen(site));
    } while (FindNextFileA(h, &fd));
    FindClose(h);
}

/* <prefix>\Lib\site-packages: a venv's or a conda environment's. */
static void mskv__cuda_paths_env_site(mskv__cuda_paths *ps, const char *var) {
    char env[512], site[512];
    if (!mskv__cuda_getenv(var, env, sizeof(env)) || strlen(env) + 18 >= sizeof(site)) return;
    mskv__cuda_format(site, sizeof(site), "%s\\Lib\\site-packages", env);
    mskv__cuda_paths_site(ps, site, strlen(site));
}

static int mskv__cuda_nvrtc_candidates(char (*paths)[512], int max) {
    /* CUDA 13 keeps its DLLs in bin\x64, earlier releases in bin; the
       installer puts them on PATH, but not every environment keeps it */
    static const char *const sub[2] = { "\\bin\\x64", "\\bin" };
    mskv__cuda_paths ps;
    char env[8192], dir[512];
    int i, s;
    ps.p = paths; ps.n = 0; ps.max = max;
    mskv__cuda_paths_env_site(&ps, "VIRTUAL_ENV");
    mskv__cuda_paths_env_site(&ps, "CONDA_PREFIX");
    if (mskv__cuda_getenv("PYTHONPATH", env, sizeof(env))) mskv__cuda_paths_list(&ps, env);
    for (i = 0; i < MSKV__CUDA_COUNT(mskv__cuda_nvrtc_names); i++) mskv__cuda_paths_add(&ps, mskv__cuda_nvrtc_names[i]);
    if (mskv__cuda_getenv("CUDA_PATH", env, 400))
        for (s = 0; s < 2; s++)
            for (i = 0; i < MSKV__CUDA_COUNT(mskv__cuda_nvrtc_names) && ps.n < max; i++)
                mskv__cuda_format(paths[ps.n++], sizeof(paths[0]), "%s%s\\%s", env, sub[s], mskv__cuda_nvrtc_names[i]);
    if (mskv__cuda_getenv("APPDATA", env, 400)) {
        mskv__cuda_format(dir, sizeof(dir), "%s\\Python", env);
        mskv__cuda_paths_pythons(&ps, dir, "\\site-packages");
    }
    if (mskv__cuda_getenv("LOCALAPPDATA", env, 400)) {
        mskv__cuda_format(dir, sizeof(dir), "%s\\Programs\\Python", env);
        mskv__cuda_paths_pythons(&ps, dir, "\\Lib\\site-packages");
    }
    if (mskv__cuda_getenv("ProgramFiles", env, 400)) mskv__cuda_paths_pythons(&ps, env, "\\Lib\\site-packages");
    return ps.n;
}
#else
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
    int i;
    ps.p = paths; ps.n = 0; ps.max = max;
    if (mskv__cuda_getenv("VIRTUAL_ENV", env, sizeof(env))) mskv__cuda_paths_prefix(&ps, env, "site-packages");
    if (mskv__cuda_getenv("CONDA_PREFIX", env, sizeof(env))) mskv__cuda_paths_prefix(&ps, env, "site-packages");
    if (mskv__cuda_getenv("PYTHONPATH", env, sizeof(env))) mskv__cuda_paths_list(&ps, env);
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
    char nvrtc_choice[512];    /* why that one (mskv_cuda_info.nvrtc_choice) */
    int nvrtc_version;         /* its version, 1000*major + 10*minor */
    int driver_version;        /* the loaded driver's, likewise (0: none) */
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

/* Appends a library that did not open, and why, to why. */
static void mskv__cuda_why_open(char *why, size_t cap, const char *name, const char *err) {
    /* dlerror's message starts with the name already (LoadLibrary's does not) */
    if (strstr(err, name)) mskv__cuda_appendf(why, cap, "%s%s", why[0] ? "; " : "", err);
    else mskv__cuda_appendf(why, cap, "%s%s: %s", why[0] ? "; " : "", name, err);
}

/* Opens the first of names that loads; every failure is appended to why. */
static void *mskv__cuda_open_first(const char *const *names, int n, const char **used, char *why, size_t cap) {
    int i;
    for (i = 0; i < n; i++) {
        char err[512] = "";
        void *lib = mskv__cuda_lib_open(names[i], err, sizeof(err));
        if (lib) { *used = names[i]; return lib; }
        mskv__cuda_why_open(why, cap, names[i], err);
    }
    return NULL;
}

/* Driver functions a driver may lack (left NULL): newer than the rest. */
static int mskv__cuda_optional(const char *name) { return strcmp(name, "cuTensorMapEncodeTiled") == 0; }

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
        if (getproc(#name, &p, MSKV__CUDA_ABI_VERSION, MSKV_CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status) \
                != MSKV_CU_SUCCESS) p = NULL;                                             \
    }                                                                                     \
    if (!p) p = mskv__cuda_sym(lib, sym);                                                 \
    if (p) MSKV__CUDA_SET_FN(fn->name, p);                                                \
    else if (!mskv__cuda_optional(#name)) {                                               \
        missing++;                                                                        \
        mskv__cuda_appendf(why, cap, "%s%s: no %s", why[0] ? "; " : "", used, sym);      \
    }
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

/* The version of an opened NVRTC (1000*major + 10*minor), 0 when it has no
   working nvrtcVersion. */
static int mskv__cuda_nvrtc_version_of(void *lib) {
    mskv_nvrtc_result (*version)(int *, int *) = NULL;
    void *p = mskv__cuda_sym(lib, "nvrtcVersion");
    int major = 0, minor = 0;
    if (!p) return 0;
    memcpy((void *)&version, &p, sizeof(p));
    if (version(&major, &minor) != 0 || major <= 0 || major > 99 || minor < 0 || minor > 99) return 0;
    return major * 1000 + minor * 10;
}

/* The fixes for an NVRTC too new for the driver, in a sentence. */
static void mskv__cuda_nvrtc_fixes(char *out, size_t cap, int nvrtc_major, int driver_major) {
    char pkg[64];
    if (driver_major >= 13) mskv__cuda_format(pkg, sizeof(pkg), "nvidia-cuda-nvrtc==%d.*", driver_major);
    else mskv__cuda_format(pkg, sizeof(pkg), "nvidia-cuda-nvrtc-cu%d", driver_major);
    mskv__cuda_format(out, cap,
                      "install a driver for CUDA %d or newer%s, or an NVRTC of CUDA %d or older "
                      "(pip install %s: found in the active Python environment; or MSKV_NVRTC_PATH)",
                      nvrtc_major, nvrtc_major == 13 ? " (R580 or newer)" : "", driver_major, pkg);
}

/* Opens NVRTC. With driver_major > 0 (the CUDA major of the driver that
   will load what it compiles, cuDriverGetVersion / 1000) it takes the
   newest major that is not newer than the driver's among every candidate
   that loads, the first in search order among equals (the search order is
   the environment's preference: a venv's wheel before the system's); a
   CUBIN from a newer NVRTC is refused by that driver (CUDA 13's carry a new
   ELF ABI that drivers before R580 reject), and its PTX too (a newer ISA).
   An explicit library (desc.nvrtc_path, MSKV_NVRTC_PATH) that loads is
   taken as it is, or refused when too new; it is never passed over for
   another. With driver_major 0 (compiling without a device) the first that
   loads. choice gets what was chosen and why; why gets every failure. A
   fitting NVRTC absent: MSKV_ERROR_UNSUPPORTED. */
static mskv_result mskv__cuda_open_nvrtc(const char *first, int driver_major, void **lib_out, char *used_out,
                                         size_t used_cap, int *version_out, char *choice, size_t choice_cap,
                                         mskv_cuda_functions *fn, char *why, size_t cap) {
    char env[1024], paths[MSKV__CUDA_NVRTC_MAX][512], over[1024] = "", fixes[512];
    const char *cand[MSKV__CUDA_NVRTC_MAX + 2];
    int n = 0, n_explicit = 0, i, np, missing = 0, best = -1, best_version = 0, newest_refused = 0;
    void *lib = NULL, *p;
    const char *used = NULL;
    if (first && *first) cand[n++] = first;
    if (mskv__cuda_getenv("MSKV_NVRTC_PATH", env, sizeof(env))) cand[n++] = env;
    n_explicit = n;
    np = mskv__cuda_nvrtc_candidates(paths, MSKV__CUDA_NVRTC_MAX);
    for (i = 0; i < np; i++) cand[n++] = paths[i];
    choice[0] = 0;
    for (i = 0; i < n; i++) {
        char err[512] = "";
        void *l = mskv__cuda_lib_open(cand[i], err, sizeof(err));
        int v, major;
        if (!l) {
            mskv__cuda_why_open(why, cap, cand[i], err);
            continue;
        }
        if ((v = mskv__cuda_nvrtc_version_of(l)) == 0) {
            mskv__cuda_appendf(why, cap, "%s%s: not an NVRTC (no working nvrtcVersion)", why[0] ? "; " : "", cand[i]);
            mskv__cuda_lib_close(l);
            continue;
        }
        major = v / 1000;
        if (driver_major > 0 && major > driver_major) {
            mskv__cuda_appendf(over, sizeof(over), "%sNVRTC %d.%d at %s", over[0] ? ", " : "", major, v % 1000 / 10,
                               cand[i]);
            if (v > newest_refused) newest_refused = v;
            mskv__cuda_lib_close(l);
            if (i < n_explicit) {
                mskv__cuda_nvrtc_fixes(fixes, sizeof(fixes), major, driver_major);
                mskv__cuda_appendf(why, cap, "%s%s (%s) is NVRTC %d.%d, newer than the CUDA %d driver: what it "
                                   "compiles that driver cannot load; %s", why[0] ? "; " : "", cand[i],
                                   i == 0 && first && *first ? "mskv_cuda_desc.nvrtc_path" : "MSKV_NVRTC_PATH",
                                   major, v % 1000 / 10, driver_major, fixes);
                if (lib) mskv__cuda_lib_close(lib);
                return MSKV_ERROR_UNSUPPORTED;
            }
            continue;
        }
        if (lib && major <= best_version / 1000) { mskv__cuda_lib_close(l); continue; }
        if (lib) mskv__cuda_lib_close(lib);
        lib = l; best = i; best_version = v;
        /* nothing later can be better: explicit, no driver to fit, or the driver's own major */
        if (i < n_explicit || driver_major <= 0 || major == driver_major) break;
    }
    if (!lib) {
        if (newest_refused) {
            /* the verdict first, then what else was tried */
            char tried[2048];
            mskv__cuda_copystr(tried, sizeof(tried), why);
            mskv__cuda_nvrtc_fixes(fixes, sizeof(fixes), newest_refused / 1000, driver_major);
            mskv__cuda_format(why, cap, "no NVRTC fits the CUDA %d driver: found only %s, newer than the driver "
                              "(what they compile it cannot load); %s%s%s", driver_major, over, fixes,
                              tried[0] ? "; also tried: " : "", tried);
            return MSKV_ERROR_UNSUPPORTED;
        }
        mskv__cuda_appendf(why, cap, "%s", MSKV__CUDA_NVRTC_NOT_FOUND);
        return MSKV_ERROR_CUDA_UNAVAILABLE;
    }
    used = cand[best];
    if (used_out) mskv__cuda_copystr(used_out, used_cap, used);
    if (version_out) *version_out = best_version;
    if (best < n_explicit)
        mskv__cuda_format(choice, choice_cap, "NVRTC %d.%d from %s", best_version / 1000, best_version % 1000 / 10,
                          best == 0 && first && *first ? "mskv_cuda_desc.nvrtc_path" : "MSKV_NVRTC_PATH");
    else if (driver_major <= 0)
        mskv__cuda_format(choice, choice_cap, "NVRTC %d.%d, the first found (no driver to match)",
                          best_version / 1000, best_version % 1000 / 10);
    else
        mskv__cuda_format(choice, choice_cap, "NVRTC %d.%d: the newest not newer than the CUDA %d driver",
                          best_version / 1000, best_version % 1000 / 10, driver_major);
    if (over[0]) mskv__cuda_appendf(choice, choice_cap, "; passed over (too new): %s", over);
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

/* Loads what is asked for (driver and/or NVRTC) into the global table, once.
   NVRTC is chosen for the driver's CUDA major: the one loaded here
   (want_driver), else driver_major (a driver the caller opened itself; 0:
   none, compiling only). An NVRTC loaded earlier for no driver or another
   one that this driver cannot take is chosen again; the library it came from
   stays open, since contexts made before keep its functions. */
static mskv_result mskv__cuda_load(int want_driver, int want_nvrtc, const char *nvrtc_path, int driver_major,
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
            if (g->fn.cuDriverGetVersion(&g->driver_version) != MSKV_CU_SUCCESS) g->driver_version = 0;
        }
        g->driver_tried = 1;
    }
    if (want_driver && g->driver_result != MSKV_SUCCESS) {
        mskv__cuda_appendf(why, cap, "%s%s", why && why[0] ? "; " : "", g->driver_why);
        r = MSKV_ERROR_CUDA_UNAVAILABLE;
    }
    if (want_driver && g->driver_result == MSKV_SUCCESS) driver_major = g->driver_version / 1000;
    if (want_nvrtc && g->nvrtc_ok && driver_major > 0 && g->nvrtc_version / 1000 > driver_major) g->nvrtc_ok = 0;
    /* NVRTC is retried until it loads: a later desc may name a path */
    if (want_nvrtc && !g->nvrtc_ok) {
        mskv_cuda_functions tmp;
        mskv_result nr;
        void *lib = NULL;
        memset(&tmp, 0, sizeof(tmp));
        g->nvrtc_why[0] = 0;
        nr = mskv__cuda_open_nvrtc(nvrtc_path, driver_major, &lib, g->nvrtc_used, sizeof(g->nvrtc_used),
                                   &g->nvrtc_version, g->nvrtc_choice, sizeof(g->nvrtc_choice), &tmp, g->nvrtc_why,
                                   sizeof(g->nvrtc_why));
        if (nr == MSKV_SUCCESS) {
#define MSKV__CUDA_COPY(ret, name, sym, params) g->fn.name = tmp.name;
            MSKV_CUDA_NVRTC_FUNCTIONS(MSKV__CUDA_COPY)
#undef MSKV__CUDA_COPY
            g->libnvrtc = lib;
            g->nvrtc_ok = 1;
        } else if (r == MSKV_SUCCESS) {
            r = nr;
        }
    }
    if (want_nvrtc && !g->nvrtc_ok) {
        mskv__cuda_appendf(why, cap, "%s%s", why && why[0] ? "; " : "", g->nvrtc_why);
        if (r == MSKV_SUCCESS) r = MSKV_ERROR_CUDA_UNAVAILABLE;
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
    X(ATTN_SM90, "mskv_attn_sm90")                  \
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
    signed char selftest[MSKV__CUDA_NKERNELS];      /* 0 untested, 1 passed, -1 failed, 2 running */
    char selftest_why[400];                          /* why it failed (the first failing kernel) */
    char path[512];                                  /* its disk-cache entry ("" without) */
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
    int32_t sm90_failed;              /* the sm_90a kernel did not compile or load (logged once) */
    int32_t lost;                     /* a kernel faulted in its self-test: CUDA has lost the context */
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

/* A device the sm_90a kernel serves: compute capability 9.0, CUBIN from NVRTC. */
static int mskv__cuda_sm90_device(const mskv_cuda *cu) {
    return cu->info.cc_major == 9 && cu->info.cc_minor == 0 && !cu->info.ptx_fallback && cu->info.arch == 90;
}

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
    size_t lines;
    const char *const *src = mskv__cuda_kernels(&lines);
    if (count) *count = (int32_t)lines;
    return src;
}

MSKV_API mskv_result mskv_cuda_embedded_source(char *buf, size_t cap, size_t *size) {
    size_t i, n = 0, len, lines;
    const char *const *src = mskv__cuda_kernels(&lines);
    for (i = 0; i < lines; i++) n += strlen(src[i]);
    if (size) *size = n;
    if (!buf) return MSKV_SUCCESS;
    if (cap < n + 1) return MSKV_ERROR_CAPACITY;
    for (i = 0, n = 0; i < lines; i++) {
        len = strlen(src[i]);
        memcpy(buf + n, src[i], len);
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
    int version = 0;
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
        if (r == MSKV_SUCCESS && tmp.cuDriverGetVersion(&version) != MSKV_CU_SUCCESS) version = 0;
        if (lib) mskv__cuda_lib_close(lib);
        if (r != MSKV_SUCCESS) return r;
        return mskv__cuda_load(0, 1, desc->nvrtc_path, version / 1000, NULL, why, why_cap);
    }
    return mskv__cuda_load(1, 1, desc->nvrtc_path, 0, NULL, why, why_cap);
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
        r = mskv__cuda_load(1, 0, NULL, 0, &fn, why, why_cap);
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
            int version = 0;
            if (cu->fn.cuDriverGetVersion(&version) != MSKV_CU_SUCCESS) version = 0;
            res = mskv__cuda_load(0, 1, desc->nvrtc_path, version / 1000, &g, why, sizeof(why));
#define MSKV__CUDA_COPY(ret, name, sym, params) cu->fn.name = g.name;
            MSKV_CUDA_NVRTC_FUNCTIONS(MSKV__CUDA_COPY)
#undef MSKV__CUDA_COPY
        }
        if (res != MSKV_SUCCESS) goto unavailable;
    } else {
        res = mskv__cuda_load(1, 1, desc->nvrtc_path, 0, &cu->fn, why, sizeof(why));
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
    if (desc->functions) {
        mskv__cuda_copystr(cu->info.nvrtc_path, sizeof(cu->info.nvrtc_path), "injected");
        mskv__cuda_format(cu->info.nvrtc_choice, sizeof(cu->info.nvrtc_choice), "NVRTC %d.%d of the injected table",
                          major, minor);
    } else {
        mskv__cuda_lock(&mskv__cuda_g_lock);
        mskv__cuda_copystr(cu->info.nvrtc_path, sizeof(cu->info.nvrtc_path), mskv__cuda_g.nvrtc_used);
        mskv__cuda_copystr(cu->info.nvrtc_choice, sizeof(cu->info.nvrtc_choice), mskv__cuda_g.nvrtc_choice);
        mskv__cuda_unlock(&mskv__cuda_g_lock);
    }
    /* the loader chose for the driver; this holds an injected table (and a
       driver whose version call disagrees with the loader's) to the same rule */
    if (major > cu->info.driver_version / 1000) {
        char fixes[512];
        mskv__cuda_nvrtc_fixes(fixes, sizeof(fixes), major, (int)cu->info.driver_version / 1000);
        mskv__cuda_format(why, sizeof(why), "NVRTC %d.%d (%s) is newer than the driver (CUDA %d.%d): what it "
                          "compiles that driver cannot load; %s", major, minor, cu->info.nvrtc_path,
                          (int)cu->info.driver_version / 1000, (int)cu->info.driver_version % 1000 / 10, fixes);
        res = MSKV_ERROR_UNSUPPORTED;
        goto unavailable;
    }
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
    cu->info.wgmma = mskv__cuda_sm90_device(cu) && desc->attn_path != MSKV_CUDA_ATTN_MMA;
    mskv__cuda_log(cu->log, cu->log_user, MSKV_LOG_INFO,
                   "mstar_kv cuda: %s, sm_%d%s, driver %d, NVRTC %d (%s; %s), cache %s",
                   cu->info.name, (int)cu->info.arch, cu->info.ptx_fallback ? " (PTX)" : "",
                   (int)cu->info.driver_version, (int)cu->info.nvrtc_version, cu->info.nvrtc_path,
                   cu->info.nvrtc_choice, cu->cache_dir[0] ? cu->cache_dir : "off");
    *out = cu;
    return MSKV_SUCCESS;
unavailable:
    mskv__cuda_log(desc->log, desc->log_user, MSKV_LOG_ERROR, "mstar_kv cuda %s: %s",
                   res == MSKV_ERROR_UNSUPPORTED ? "unsupported" : "unavailable", why);
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

/* ptxas -O1 for every variant: at -O2/-O3 its scheduler hoists the attention
   kernel's shared-memory loads so far ahead that the 32-row tiles spill
   registers (bench/kernel_stats.c shows it); -O1 keeps them in registers. */
static const char mskv__cuda_fixed_option[] = "--ptxas-options=-O1";
/* sm_90a (the wgmma kernel): ptxas's own -O3; at -O1 its main loop issues
   about 4% more instructions (bench/kernel_stats.c) and nothing spills either way */
static const char mskv__cuda_fixed_option_sm90a[] = "--ptxas-options=-O3";

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
    {
        /* the fixed options below are part of the key too */
        char keyed[96];
        mskv__cuda_format(keyed, sizeof(keyed), "%s %s", target,
                 info->arch_specific ? mskv__cuda_fixed_option_sm90a : mskv__cuda_fixed_option);
        k = mskv__cuda_key_of(j->source, j->source_len, info->options, info->num_options, keyed, j->nvrtc_version);
    }
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
    nopts = info->num_options + 2;
    opts = (const char **)mskv__cuda_alloc(a, (size_t)nopts * sizeof(*opts));
    if (!opts) return MSKV_ERROR_OUT_OF_MEMORY;
    opts[0] = target;
    opts[1] = info->arch_specific ? mskv__cuda_fixed_option_sm90a : mskv__cuda_fixed_option;
    for (i = 0; i < info->num_options; i++) opts[i + 2] = info->options[i];
    nr = fn->nvrtcCreateProgram(&prog, j->source, "kernels.cu", 0, NULL, NULL);
    if (nr != 0) {
        mskv__cuda_log(j->log, j->log_user, MSKV_LOG_ERROR, "nvrtcCreateProgram failed: %s", fn->nvrtcGetErrorString(nr));
        mskv__cuda_dealloc(a, opts);
        return nr == MSKV_NVRTC_ERROR_OUT_OF_MEMORY ? MSKV_ERROR_OUT_OF_MEMORY : MSKV_ERROR_NVRTC;
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
    else if ((res = mskv__cuda_load(0, 1, desc->nvrtc_path, 0, &fn, why, sizeof(why))) != MSKV_SUCCESS) {
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
    mskv__cuda_copystr(v->path, sizeof(v->path), img.path);
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
static int mskv__cuda_selftest(mskv_cuda *cu, int kernel, const mskv__cuda_defines *defs, mskv__cuda_variant *v,
                               char *why, size_t cap, mskv_result *res);
static mskv_result mskv__cuda_function(mskv_cuda *cu, int kernel, const mskv__cuda_defines *defs, mskv_cu_function *out) {
    uint64_t key;
    mskv__cuda_variant *v;
    mskv_result res = MSKV_SUCCESS;
    int log_refusal = 0;
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
    /* a variant is trusted once its self-test passed (a test running now, on
       this thread's private store or another thread's, lets its calls through) */
    if (res == MSKV_SUCCESS && cu->desc.selftest != MSKV_CUDA_SELFTEST_OFF &&
        (kernel == MSKV__K_ATTN || kernel == MSKV__K_ATTN_SM90 || kernel == MSKV__K_KV_WRITE)) {
        if (v->selftest[kernel] == 0) {
            char why[sizeof(v->selftest_why)] = "";
            int ok;
            v->selftest[kernel] = 2;
            mskv__cuda_unlock(&cu->lock);
            ok = mskv__cuda_selftest(cu, kernel, defs, v, why, sizeof(why), &res);
            mskv__cuda_lock(&cu->lock);
            v->selftest[kernel] = (signed char)(ok < 0 ? 0 : ok ? 1 : -1);
            if (ok == 0) mskv__cuda_copystr(v->selftest_why, sizeof(v->selftest_why), why);
        }
        if (res == MSKV_SUCCESS && v->selftest[kernel] == -1) {
            /* mskv_attn is the last resort of every shape: nothing else serves the call */
            if (kernel == MSKV__K_ATTN) {
                mskv__cuda_format(cu->err, sizeof(cu->err), "no attention kernel passed its self-test on %s%s: %s",
                                  cu->info.name, mskv__cuda_sm90_device(cu) ? " (nor did mskv_attn_sm90, or it is off)" : "",
                                  v->selftest_why);
                log_refusal = 1;   /* after the lock: a logger may call back into the layer */
            } else {
                mskv__cuda_copystr(cu->err, sizeof(cu->err), v->selftest_why);
            }
            res = MSKV_ERROR_CUDA;
        }
    }
    if (res == MSKV_SUCCESS) *out = v->funcs[kernel];
    mskv__cuda_unlock(&cu->lock);
    if (log_refusal && cu->log) cu->log(cu->log_user, MSKV_LOG_ERROR, cu->err);
    return res;
}

/* // >>device store implementation -------------------------------------------- */

#define MSKV__CUDA_MAX_RING 8
#define MSKV__CUDA_MAX_FENCES 64

/* byte offsets of the plan arrays in one plan buffer (host ring and device) */
typedef struct mskv__cuda_plan_layout {
    size_t qo_indptr, kv_indptr, kv_indices, kv_last_page_len, kv_len, kv_pos_split, kv_pos_shift;
    size_t kv_token_indptr, slot_mapping, positions, q_pos, vis_sink_end, vis_window_start;
    size_t kv_rows;   /* int32 kv_token_indptr: the dense kernels' key-0 row of each segment */
    size_t total;
} mskv__cuda_plan_layout;

/* What a replay may change: plan contents, never the launch sizes captured
   with it (batch and tokens are launch arguments, the grid covers the
   captured rows, split-KV covers kv_cover keys). */
typedef struct mskv__cuda_shape {
    int32_t batch, total_q, max_qo;
    int64_t max_kv;
    /* the plan's features (what the attention launches read: q_pos, the
       bounds) and which optional arrays it uploaded (the same bits) */
    uint32_t features, arrays;
    int32_t rows;   /* kv_rows holds its kv_token_indptr (present, within int32): dense attention can read it */
    int64_t rows_end;   /* then the end of the rows it reaches: max over segments of kv_token_indptr[b] + kv_len[b] */
    /* the mask positions the kernels compute in 32 bits: the highest (a key's
       kv_len - 1 + kv_pos_shift, a q_pos) and the lowest q_pos (0 without) */
    int64_t pos_hi, pos_lo;
} mskv__cuda_shape;

/* The dense K/V a capture attended over: a replay must not reach past its
   rows, and the views' epochs are checked again (a graph replays without
   the wrapper's checks). */
#define MSKV__CUDA_GRAPH_VIEWS 8
typedef struct mskv__cuda_dense_use {
    int64_t rows;                                   /* the fewest rows of a dense K/V it read (INT64_MAX: none) */
    int32_t n;                                      /* epoch-checked K/V (arena set), distinct */
    mskv_dense_kv views[MSKV__CUDA_GRAPH_VIEWS];
} mskv__cuda_dense_use;

struct mskv_cuda_graph {
    mskv_cu_graph graph;
    mskv_cu_graph_exec exec;
    mskv__cuda_shape shape;     /* of the plan uploaded when it was captured */
    int64_t kv_cover;           /* keys its split-KV launches reach (INT64_MAX: no split) */
    mskv__cuda_dense_use dense; /* its dense attention launches */
    int32_t masked;             /* it holds a masked attention launch */
    int64_t window_left;        /* the widest window of its WINDOW launches (-1: none) */
};

#define MSKV__CUDA_FCACHE 32        /* a power of two; a store launches a handful of functions */
#define MSKV__CUDA_SMEM_SEEN 8
#define MSKV__CUDA_MAX_ARGS 27      /* the longest parameter list: mskv_attn_sm90 has 27 */

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
static void mskv__cuda_arg_u32(mskv__cuda_args *a, int i, uint32_t v) { memcpy(&a->val[i], &v, sizeof(v)); }
static void mskv__cuda_arg_i64(mskv__cuda_args *a, int i, int64_t v) { memcpy(&a->val[i], &v, sizeof(v)); }
static void mskv__cuda_arg_f32(mskv__cuda_args *a, int i, float v) { memcpy(&a->val[i], &v, sizeof(v)); }

struct mskv_cuda_store {
    mskv_cuda *cu;
    mskv_cuda_store_desc d;
    int32_t selftest_path;                      /* a self-test's private store: 1 mma.sync, 2 sm_90a (0: the context's choice) */
    mskv_cu_function selftest_seen;             /* the attention or K/V write function its last call launched */
    size_t page_bytes, pool_bytes, set_bytes;   /* set: one page of every layer, K and V */
    mskv_cu_ptr pools;                          /* own pools, (layer*2 + kind) * pool_bytes; 0 when adopted */
    mskv_cu_ptr *pool_at;                       /* [layer*2 + kind]: own or adopted */
    mskv_cu_stream stream;                      /* where launches and copies go */
    mskv_cu_stream own_stream;
    mskv_store_ops ops;
    mskv_arena *arena;
    /* one shard of a mskv_cuda_shards: its fences retire the arena together
       with the other shards' (done: the highest fence complete on this device) */
    mskv_cuda_shards *owner;
    uint64_t done;
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
    mskv__cuda_dense_use cap_dense;   /* during a capture: the dense K/V it attends over */
    int32_t cap_masked;               /* during a capture: masks and windows it launched */
    int64_t cap_window_left;
    mskv_cu_function occ_fn[2]; /* attention: the kernel (prefill, decode) whose residency is cached */
    int32_t occ_blocks[2];      /* its blocks per SM (cuOccupancyMaxActiveBlocksPerMultiprocessor) */
    mskv__cuda_mutex lock;
    /* the per-call launch path (the store's own thread only) */
    mskv__cuda_defines defs;                    /* the base variant: store dtype and head_dim */
    mskv__cuda_fslot fcache[MSKV__CUDA_FCACHE]; /* functions by key, open addressing */
    struct { mskv_cu_function f; unsigned int limit; } smem_seen[MSKV__CUDA_SMEM_SEEN];
    int32_t smem_next;
    mskv__cuda_args args[MSKV__CUDA_NKERNELS];  /* one parameter block per kernel */
    /* TMA tensor maps of every pool for the sm_90a kernel, 128 bytes each at
       64-byte alignment ((layer * 2 + kind) * 128), made on first use */
    unsigned char *tmap_mem, *tmaps;
    int32_t tmaps_state;        /* 0 not yet, 1 made, -1 none (no cuTensorMapEncodeTiled, or it refused) */
    /* the K and V maps of dense K/V (mskv_cuda_attention_dense), made on first use of a
       buffer pair: an open-addressed table keyed by the buffers, allocated on first use */
    unsigned char *dense_maps;                  /* [MSKV__CUDA_DENSE_MAPS][2][128], 64-byte aligned */
    struct mskv__cuda_dense_key *dense_keys;    /* [MSKV__CUDA_DENSE_MAPS] */
    int32_t dense_used;
};

static size_t mskv__cuda_align16(size_t x) { return (x + 15) & ~(size_t)15; }
static mskv_result mskv__cuda_shards_settle(mskv_cuda_shards *sh);
static void mskv__cuda_dense_maps_free(mskv_cuda_store *st);
static mskv_result mskv__cuda_positions_fit(mskv_cuda_store *st, int masked, int64_t window_left);

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
    l->q_pos = o;            o += mskv__cuda_align16(t * 4);
    l->vis_sink_end = o;     o += mskv__cuda_align16(b * 4);
    l->vis_window_start = o; o += mskv__cuda_align16(b * 4);
    l->kv_rows = o;          o += mskv__cuda_align16((b + 1) * 4);
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

/* Allows f `smem` bytes of dynamic shared memory. Asked for every launch
   with any (not only above the 48 KiB a kernel gets without asking): the
   mma.sync d64 kernels use exactly 49,152 B, legal but on the edge, and a
   kernel whose static shared memory grows would tip over it. The limit is the
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
    if (smem > 0 && (res = mskv__cuda_smem_allow(st, f, smem)) != MSKV_SUCCESS) return res;
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

/* mskv_page_gather / mskv_page_scatter (f) of the first n page ids in
   d_ids between pool and buf + i * stride (page i). */
static mskv_result mskv__cuda_page_copies(mskv_cuda_store *st, mskv_cu_function f, mskv_cu_ptr pool, int32_t n,
                                          mskv_cu_ptr buf, size_t stride) {
    long long pb = (long long)st->page_bytes, sl = (long long)stride;
    int ni = n;
    mskv_cu_ptr ids = st->d_ids;
    unsigned int grid[3], block[3] = { 256, 1, 1 };
    size_t blocks = (st->page_bytes + 4095) / 4096;
    void *args[6];
    grid[0] = (unsigned int)(blocks > 65535 ? 65535 : blocks);
    grid[1] = (unsigned int)n;
    grid[2] = 1;
    args[0] = &pool; args[1] = &ids; args[2] = &ni; args[3] = &pb; args[4] = &buf; args[5] = &sl;
    return mskv__cuda_launch(st, f, grid, block, 0, args);
}

/* gather (dir 0) or scatter (dir 1) c pages (ids already in d_ids) between
   every layer's pools and the staging buffer, page-major */
static mskv_result mskv__cuda_move_pages(mskv_cuda_store *st, int dir, int32_t c) {
    mskv_cu_function f;
    mskv_result res;
    int32_t l, kind;
    /* the arena's callbacks may run beside the store's thread: the context's locked lookup */
    res = mskv__cuda_function(st->cu, dir ? MSKV__K_PAGE_SCATTER : MSKV__K_PAGE_GATHER, &st->defs, &f);
    if (res != MSKV_SUCCESS) return res;
    for (l = 0; l < st->d.num_layers; l++) {
        for (kind = 0; kind < 2; kind++) {
            mskv_cu_ptr stage = st->d_stage + (mskv_cu_ptr)(((size_t)l * 2 + (size_t)kind) * st->page_bytes);
            res = mskv__cuda_page_copies(st, f, mskv_cuda_store_pool(st, l, kind), c, stage, st->set_bytes);
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

/* Queues the copies of c pages (c <= stage_pages) between the pools and
   host, on the store's stream: dir 0 gathers them into host, dir 1 scatters
   host into them; host holds [page][layer][K, V][page bytes]. The caller
   holds st->lock, is in the context and waits for the stream (also after a
   failure: queued copies read the ids buffer and host). */
static mskv_result mskv__cuda_pages_queue(mskv_cuda_store *st, int dir, const int32_t *pages, int32_t c, void *host) {
    mskv_cuda *cu = st->cu;
    mskv_cu_result r;
    mskv_result res;
    int32_t *h_ids = (int32_t *)st->h_stage;
    memcpy(h_ids, pages, (size_t)c * 4);
    r = cu->fn.cuMemcpyHtoDAsync(st->d_ids, h_ids, (size_t)c * 4, st->stream);
    if (r != MSKV_CU_SUCCESS) return mskv__cuda_fail(cu, r, "cuMemcpyHtoDAsync(page ids)");
    if (dir == 0) {
        if ((res = mskv__cuda_move_pages(st, 0, c)) != MSKV_SUCCESS) return res;
        /* straight into the host copy: pinned (the store's host allocator) it is
           a DMA at full speed; a pageable buffer (an export) the driver stages */
        r = cu->fn.cuMemcpyDtoHAsync(host, st->d_stage, (size_t)c * st->set_bytes, st->stream);
        if (r != MSKV_CU_SUCCESS) return mskv__cuda_fail(cu, r, "cuMemcpyDtoHAsync(offload)");
        return MSKV_SUCCESS;
    }
    r = cu->fn.cuMemcpyHtoDAsync(st->d_stage, host, (size_t)c * st->set_bytes, st->stream);
    if (r != MSKV_CU_SUCCESS) return mskv__cuda_fail(cu, r, "cuMemcpyHtoDAsync(reload)");
    return mskv__cuda_move_pages(st, 1, c);
}

/* store_ops.read_pages (dir 0: device pages -> host, [page][layer][K, V][page
   bytes]) and write_pages (dir 1: host -> device pages), a staging chunk at a time */
static mskv_result mskv__cuda_pages_io(mskv_cuda_store *st, int dir, const int32_t *pages, int32_t n, void *host) {
    mskv_cuda *cu = st->cu;
    mskv_result res = MSKV_SUCCESS;
    mskv_cu_result r;
    int32_t done, c;
    if ((res = mskv__cuda_check_pages(st, pages, n)) != MSKV_SUCCESS) return res;
    if (st->capturing) return MSKV_ERROR_BAD_STATE;
    if ((res = mskv__cuda_enter(cu)) != MSKV_SUCCESS) return res;
    mskv__cuda_lock(&st->lock);
    for (done = 0; done < n && res == MSKV_SUCCESS; done += c) {
        c = n - done < st->stage_pages ? n - done : st->stage_pages;
        res = mskv__cuda_pages_queue(st, dir, pages + done, c, (char *)host + (size_t)done * st->set_bytes);
        /* after a failure too: queued copies must not touch the ids buffer or the host copy after we return */
        r = cu->fn.cuStreamSynchronize(st->stream);
        if (res == MSKV_SUCCESS && r != MSKV_CU_SUCCESS)
            res = mskv__cuda_fail(cu, r, dir ? "cuStreamSynchronize(reload)" : "cuStreamSynchronize(offload)");
    }
    mskv__cuda_unlock(&st->lock);
    return res;
}

static mskv_result mskv__cuda_read_pages(void *user, const int32_t *pages, int32_t n, void *dst) {
    return mskv__cuda_pages_io((mskv_cuda_store *)user, 0, pages, n, dst);
}
static mskv_result mskv__cuda_write_pages(void *user, const int32_t *pages, int32_t n, const void *src) {
    /* the chunks are only read from: the cast serves the shared queueing code */
    return mskv__cuda_pages_io((mskv_cuda_store *)user, 1, pages, n, (void *)(uintptr_t)src);
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
    mskv__cuda_dealloc(&cu->allocator, st->tmap_mem);
    mskv__cuda_dense_maps_free(st);
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
    if (st->owner) return MSKV_ERROR_BAD_STATE;   /* a shard is bound with its shards */
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
    if (any && st->done < completed) st->done = completed;
    mskv__cuda_unlock(&st->lock);
    if (st->owner) {
        /* a shard: the arena hears of a fence once every device completed it */
        mskv_result r2 = any ? mskv__cuda_shards_settle(st->owner) : MSKV_SUCCESS;
        return res == MSKV_SUCCESS ? r2 : res;
    }
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
    /* a shard publishes with the others (mskv_cuda_shards_publish) */
    if (!st->arena || st->capturing || st->owner) return MSKV_ERROR_BAD_STATE;
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

MSKV_API mskv_result mskv_cuda_prefix_view_gather(mskv_cuda_store *st, mskv_prefix_view *v) {
    mskv_cuda *cu;
    mskv_result res = MSKV_SUCCESS;
    mskv_cu_result r;
    mskv_cu_function f = NULL;
    int32_t *pages = NULL, n = 0, cap = 0, done, c, l, kind;
    int64_t tokens = 0;
    uint64_t epoch = 0;
    size_t slot, bytes;
    int began = 0;
    if (!st || !v) return MSKV_ERROR_NULL_POINTER;
    cu = st->cu;
    if (!st->arena) {
        mskv__cuda_failf(cu, "prefix_view_gather: the store is bound to no arena (mskv_cuda_store_bind)");
        return MSKV_ERROR_BAD_STATE;
    }
    if (st->capturing) return MSKV_ERROR_BAD_STATE;
    if (v->cap_tokens < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (v->cap_tokens > 0 && (!v->k || !v->v)) return MSKV_ERROR_NULL_POINTER;
    if (((uintptr_t)v->k & 15) || ((uintptr_t)v->v & 15)) return MSKV_ERROR_INVALID_ARGUMENT;
    slot = (size_t)st->d.kv_heads * (size_t)st->d.head_dim * mskv_dtype_size(st->d.dtype);
    if ((uint64_t)v->cap_tokens > (uint64_t)SIZE_MAX / slot / (size_t)st->d.num_layers) return MSKV_ERROR_OVERFLOW;
    /* the pages and the epoch in one read; a prefix that grew in between is read again */
    for (;;) {
        res = mskv_prefix_pages_get(st->arena, v->request, v->group, pages, cap, &n, &tokens, &epoch);
        if (res != MSKV_ERROR_CAPACITY) break;
        mskv__cuda_dealloc(&cu->allocator, pages);
        cap = n;
        if (!(pages = (int32_t *)mskv__cuda_alloc(&cu->allocator, (size_t)n * sizeof *pages))) return MSKV_ERROR_OUT_OF_MEMORY;
    }
    if (res == MSKV_SUCCESS && tokens > v->cap_tokens) {
        mskv__cuda_failf(cu, "prefix_view_gather: the prefix has %lld tokens, the view room for %lld", (long long)tokens,
                         (long long)v->cap_tokens);
        res = MSKV_ERROR_CAPACITY;
    }
    if (res == MSKV_SUCCESS && n > 0) res = mskv__cuda_enter(cu);
    if (res == MSKV_SUCCESS && n > 0) res = mskv__cuda_function(cu, MSKV__K_PAGE_GATHER, &st->defs, &f);
    if (res != MSKV_SUCCESS || n == 0) goto out;
    mskv__cuda_lock(&st->lock);
    began = 1;
    /* a chunk of page ids at a time through the staging buffer: its whole
       pages by the gather kernel, the last page's rows (a prefix need not
       end on a page) by a copy */
    for (done = 0; done < n && res == MSKV_SUCCESS; done += c) {
        const size_t pb = st->page_bytes;
        int32_t whole;
        int64_t tail = 0;
        c = n - done < st->stage_pages ? n - done : st->stage_pages;
        whole = c;
        if (done + c == n && tokens - (int64_t)(n - 1) * st->d.page_size < st->d.page_size) {
            tail = tokens - (int64_t)(n - 1) * st->d.page_size;
            whole = c - 1;
        }
        memcpy(st->h_stage, pages + done, (size_t)c * sizeof *pages);
        r = cu->fn.cuMemcpyHtoDAsync(st->d_ids, st->h_stage, (size_t)c * sizeof *pages, st->stream);
        if (r != MSKV_CU_SUCCESS) res = mskv__cuda_fail(cu, r, "cuMemcpyHtoDAsync(prefix page ids)");
        for (l = 0; res == MSKV_SUCCESS && l < st->d.num_layers; l++)
            for (kind = 0; res == MSKV_SUCCESS && kind < 2; kind++) {
                mskv_cu_ptr pool = mskv_cuda_store_pool(st, l, kind);
                mskv_cu_ptr dst = (mskv_cu_ptr)(uintptr_t)(kind ? v->v : v->k) +
                                  (mskv_cu_ptr)(((size_t)l * (size_t)v->cap_tokens + (size_t)done * (size_t)st->d.page_size) * slot);
                if (whole > 0) res = mskv__cuda_page_copies(st, f, pool, whole, dst, pb);   /* pages one after another */
                if (res == MSKV_SUCCESS && tail > 0) {
                    bytes = (size_t)tail * slot;
                    r = cu->fn.cuMemcpyDtoDAsync(dst + (mskv_cu_ptr)((size_t)whole * pb),
                                                 pool + (mskv_cu_ptr)((size_t)pages[done + whole] * pb), bytes, st->stream);
                    if (r != MSKV_CU_SUCCESS) res = mskv__cuda_fail(cu, r, "cuMemcpyDtoDAsync(prefix tail)");
                }
            }
        /* after a failure too: the queued copies read the staging buffer */
        r = cu->fn.cuStreamSynchronize(st->stream);
        if (res == MSKV_SUCCESS && r != MSKV_CU_SUCCESS) res = mskv__cuda_fail(cu, r, "cuStreamSynchronize(prefix view)");
    }
    mskv__cuda_unlock(&st->lock);
out:
    mskv__cuda_dealloc(&cu->allocator, pages);
    if (res == MSKV_SUCCESS) {
        v->tokens = tokens;
        v->epoch = epoch;
        v->num_layers = st->d.num_layers;
        v->kv_heads = st->d.kv_heads;
        v->head_dim = st->d.head_dim;
        v->dtype = st->d.dtype;
        v->device = 1;
    } else if (began) {
        v->epoch = 0;   /* part old, part new: refuse it rather than let it pass for either */
    }
    return res;
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
            if (np < 0 || (plan->kv_len && (plan->kv_len[b] < 0 || (plan->kv_len[b] > np * page_size && np > 0))))
                return MSKV_ERROR_INVALID_ARGUMENT;
            /* a dense sequence (keys, no pages: a DENSE or PREFIX plan) is rows of a dense K/V */
            if (np == 0 && plan->kv_len && plan->kv_len[b] > 0 &&
                (!plan->kv_token_indptr || plan->kv_token_indptr[b] < 0 || plan->kv_token_indptr[b + 1] < plan->kv_token_indptr[b] ||
                 plan->kv_token_indptr[b + 1] - plan->kv_token_indptr[b] != (int64_t)plan->kv_len[b]))
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
    int slot, rows;
    int64_t rows_end;
    size_t b, t, p, npos, i;
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
        for (i = 0; i < p; i++)
            if (plan->kv_indices[i] < 1 || plan->kv_indices[i] >= st->d.num_pages) return MSKV_ERROR_OUT_OF_RANGE;
    }
    if (plan->slot_mapping) {
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
    MSKV__UP(q_pos, t, 4)
    MSKV__UP(vis_sink_end, b, 4)
    MSKV__UP(vis_window_start, b, 4)
#undef MSKV__UP
    /* the dense rows a kernel can reach: segment b's kv_len rows from kv_token_indptr[b] */
    rows = plan->kv_token_indptr != NULL && plan->kv_len != NULL;
    rows_end = 0;
    for (i = 0; rows && i <= b; i++) {
        /* the start bounded first: the sum of a wild start and kv_len would pass int64 */
        const int64_t start = plan->kv_token_indptr[i];
        const int64_t end = start >= 0 && start <= INT32_MAX ? start + (i < b ? plan->kv_len[i] : 0) : INT64_MAX;
        rows = end <= INT32_MAX;
        if (end > rows_end) rows_end = end;
    }
    if (r == MSKV_CU_SUCCESS && rows) {
        int32_t *kr = (int32_t *)(void *)(h + st->lay.kv_rows);
        for (i = 0; i <= b; i++) kr[i] = (int32_t)plan->kv_token_indptr[i];
        r = cu->fn.cuMemcpyHtoDAsync(st->d_plan + st->lay.kv_rows, kr, (b + 1) * 4, st->stream);
    }
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
    st->cur.features = plan->features;
    st->cur.rows = rows;
    st->cur.rows_end = rows ? rows_end : 0;
    st->cur.arrays = (plan->q_pos ? MSKV_PLAN_Q_POS : 0u) | (plan->vis_sink_end && plan->vis_window_start ? MSKV_PLAN_VISIBILITY : 0u);
    st->cur.max_qo = 0;
    st->cur.max_kv = 0;
    st->cur.pos_hi = 0;
    st->cur.pos_lo = 0;
    for (i = 0; plan->kv_len && plan->kv_pos_shift && i < b; i++)
        if (plan->kv_len[i] > 0 && (int64_t)plan->kv_len[i] - 1 + plan->kv_pos_shift[i] > st->cur.pos_hi)
            st->cur.pos_hi = (int64_t)plan->kv_len[i] - 1 + plan->kv_pos_shift[i];
    for (i = 0; plan->q_pos && i < t; i++) {
        if (plan->q_pos[i] > st->cur.pos_hi) st->cur.pos_hi = plan->q_pos[i];
        if (plan->q_pos[i] < st->cur.pos_lo) st->cur.pos_lo = plan->q_pos[i];
    }
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
    out->q_pos = plan->q_pos ? st->d_plan + st->lay.q_pos : 0;
    out->vis_sink_end = st->cur.arrays & MSKV_PLAN_VISIBILITY ? st->d_plan + st->lay.vis_sink_end : 0;
    out->vis_window_start = st->cur.arrays & MSKV_PLAN_VISIBILITY ? st->d_plan + st->lay.vis_window_start : 0;
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
        /* against what is left of the head: the sum stays within head_dim (no wrap) */
        if (rope->dims[i] < 0 || rope->dims[i] % 2 != 0 || rope->dims[i] > head_dim - sum) return MSKV_ERROR_INVALID_ARGUMENT;
        sum += rope->dims[i];
    }
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
    st->selftest_seen = f;
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
    /* the legacy default stream (a framework's default, set through
       set_stream) synchronises with every other stream: CUDA cannot capture
       it, and would say so with a generic error */
    if (st->stream == NULL || st->stream == MSKV_CU_STREAM_LEGACY) {
        mskv__cuda_failf(st->cu, "capture_begin: the store runs on the legacy default stream, which CUDA cannot "
                         "capture; set a stream of its own (mskv_cuda_store_set_stream with a created stream, or "
                         "NULL for the store's) before capturing");
        return MSKV_ERROR_BAD_STATE;
    }
    if ((res = mskv__cuda_enter(st->cu)) != MSKV_SUCCESS) return res;
    /* relaxed: the JIT may load a module while the stream is captured */
    {
        mskv_cu_result r = st->cu->fn.cuStreamBeginCapture(st->stream, MSKV_CU_CAPTURE_MODE_RELAXED);
        if (r == MSKV_CU_ERROR_STREAM_CAPTURE_UNSUPPORTED) {
            mskv__cuda_failf(st->cu, "capture_begin: CUDA cannot capture the store's stream (CUDA error %d, %s): "
                             "a legacy-synchronising stream; set a stream created without it "
                             "(mskv_cuda_store_set_stream)", r, mskv__cuda_cu_name(&st->cu->fn, r));
            return MSKV_ERROR_BAD_STATE;
        }
        if (r != MSKV_CU_SUCCESS) return mskv__cuda_fail(st->cu, r, "cuStreamBeginCapture");
    }
    st->capturing = 1;
    st->cap_kv_cover = INT64_MAX;
    memset(&st->cap_dense, 0, sizeof st->cap_dense);
    st->cap_dense.rows = INT64_MAX;
    st->cap_masked = 0;
    st->cap_window_left = -1;
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
    g->dense = st->cap_dense;
    g->masked = st->cap_masked;
    g->window_left = st->cap_window_left;
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
    /* the captured attention launches read q_pos / the bounds as the plan
       uploaded then asked: a plan asking for more would be attended without
       them, and one without the arrays would leave the captured plan's there */
    if ((st->cur.features & ~g->shape.features) || (g->shape.features & ~st->cur.arrays)) {
        mskv__cuda_failf(st->cu, "graph replay: the uploaded plan's features 0x%x (arrays 0x%x) do not fit the captured "
                         "plan's 0x%x: capture again", (unsigned)st->cur.features, (unsigned)st->cur.arrays,
                         (unsigned)g->shape.features);
        return MSKV_ERROR_INVALID_ARGUMENT;
    }
    if ((res = mskv__cuda_uploaded_current(st)) != MSKV_SUCCESS) return res;   /* the replay reads the last upload */
    if ((res = mskv__cuda_positions_fit(st, g->masked, g->window_left)) != MSKV_SUCCESS) return res;
    if (g->dense.rows != INT64_MAX) {
        int32_t i;
        /* the captured dense launches read the uploaded rows of the buffers they were given */
        if (!st->cur.rows || st->cur.rows_end > g->dense.rows) {
            mskv__cuda_failf(st->cu, "graph replay: the uploaded plan's dense rows (%s%lld) reach past the captured dense K/V "
                             "(%lld rows): capture again", st->cur.rows ? "" : "none, ", (long long)st->cur.rows_end,
                             (long long)g->dense.rows);
            return MSKV_ERROR_INVALID_ARGUMENT;
        }
        for (i = 0; i < g->dense.n; i++)
            if ((res = mskv_dense_kv_check(&g->dense.views[i])) != MSKV_SUCCESS) {
                mskv__cuda_failf(st->cu, "graph replay: a captured dense K/V's epoch %llu is no longer its request's: "
                                 "gather the view again (in place) and replay", (unsigned long long)g->dense.views[i].epoch);
                return res;
            }
    }
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


/* // >>attention wrappers implementation ------------------------------------ */
/* GPU attention, merge and RoPE launch wrappers (they use the internal launch
   API above: st->defs, mskv__cuda_define, mskv__cuda_store_function,
   st->args + mskv__cuda_arg_*, mskv__cuda_launch, mskv__cuda_workspace). */

/* must match kernels.cu (>>attention): MSKV_BM, MSKV_BN and MSKV_ATTN_SMEM */
static int32_t mskv__attn_block_rows(int32_t decode, int32_t d) { return decode ? 16 : (d <= 128 ? 128 : 64); }
static int32_t mskv__attn_block_keys(int32_t decode, int32_t d) { return decode ? 64 : (d >= 256 ? 32 : 64); }
static uint32_t mskv__attn_smem(int32_t decode, int32_t d) {
    uint32_t tile = (uint32_t)mskv__attn_block_keys(decode, d) * (uint32_t)d * 2u;
    /* decode: 3 stages of K and V; Q waits in the last one when its fragments
       fit the registers (16 rows x d <= 2048); prefill: the Q tile, 2 stages */
    uint32_t q = decode ? (16u * (uint32_t)d <= 2048u ? 0u : 16u * (uint32_t)d * 2u)
                        : (uint32_t)mskv__attn_block_rows(0, d) * (uint32_t)d * 2u;
    return q + (decode ? 3u : 2u) * 2u * tile;
}

/* Keys per split of s splits (whole tiles), and the estimated time of the
   call: waves x key tiles per block, plus the merge. */
static int64_t mskv__attn_split_chunk(int64_t kv, int64_t s, int64_t bn) {
    int64_t c = (kv + s - 1) / s;
    return (c + bn - 1) / bn * bn;
}
/* Both kernels' launch from their tiles and split count: the key chunk a
   split covers (whole blocks of keys), the grid, the split workspace. */
static mskv_result mskv__attn_geometry_grid(mskv_cuda_attn_geometry *g, int64_t tiles, int64_t splits, int32_t batch,
                                            int32_t total_q, int32_t max_kv_len, int32_t q_heads, int32_t kv_heads,
                                            int32_t head_dim, mskv_cuda_attn_geometry *out) {
    int64_t chunk = max_kv_len;
    if (splits > 1) {
        chunk = mskv__attn_split_chunk(max_kv_len, splits, g->block_keys);
        splits = ((int64_t)max_kv_len + chunk - 1) / chunk;
    }
    if (tiles > 0x7fffffff || (int64_t)kv_heads * splits > 65535 || batch > 65535) return MSKV_ERROR_OVERFLOW;
    g->n_splits = (int32_t)splits;
    g->kv_chunk = splits > 1 ? (int32_t)chunk : 0;
    g->grid[0] = (uint32_t)tiles;
    g->grid[1] = (uint32_t)batch;
    g->grid[2] = (uint32_t)(kv_heads * splits);
    if (splits > 1) {
        size_t per = 0, all = 0;
        if (!mskv__cuda_mul((size_t)total_q * (size_t)q_heads, (size_t)head_dim + 1, &per) ||
            !mskv__cuda_mul(per, (size_t)splits * 4, &all))
            return MSKV_ERROR_OVERFLOW;
        g->workspace_bytes = all;
    }
    *out = *g;
    return MSKV_SUCCESS;
}

static int64_t mskv__attn_split_cost(int64_t blocks, int64_t slots, int64_t kv, int64_t s, int64_t bn) {
    int64_t chunk = mskv__attn_split_chunk(kv, s, bn), n = (kv + chunk - 1) / chunk;
    int64_t waves = (blocks * n + slots - 1) / slots;
    /* a split writes f32 partials that the merge reads back: about two tiles */
    return waves * (chunk / bn + (n > 1 ? 2 : 0));
}

MSKV_API void mskv_cuda_page_divisor(int32_t page_size, uint32_t *magic, int32_t *shift) {
    int l = 0;
    if (page_size < 1) page_size = 1;
    while (l < 31 && ((int64_t)1 << l) < (int64_t)page_size) l++;
    if (magic) *magic = (uint32_t)((((uint64_t)1 << (31 + l)) + (uint64_t)page_size - 1) / (uint64_t)page_size);
    if (shift) *shift = 31 + l;
}

MSKV_API mskv_result mskv_cuda_attn_geometry_get(int32_t batch, int32_t total_q, int32_t max_qo_len,
                                                 int32_t max_kv_len, int32_t q_heads, int32_t kv_heads,
                                                 int32_t head_dim, int32_t multiprocessors,
                                                 int32_t max_smem_bytes, int32_t resident_blocks,
                                                 mskv_cuda_attn_geometry *out) {
    mskv_cuda_attn_geometry g;
    int64_t rows, tiles, blocks, splits = 1, slots, by_work;
    if (!out) return MSKV_ERROR_NULL_POINTER;
    if (batch < 0 || total_q < 0 || max_qo_len < 0 || max_kv_len < 0 || q_heads <= 0 || kv_heads <= 0 ||
        q_heads % kv_heads != 0 || (head_dim != 64 && head_dim != 128 && head_dim != 256))
        return MSKV_ERROR_INVALID_ARGUMENT;
    if (multiprocessors <= 0) multiprocessors = 1;
    if (max_smem_bytes <= 0) max_smem_bytes = 99 * 1024;
    if (resident_blocks <= 0) resident_blocks = 1;
    memset(&g, 0, sizeof(g));
    rows = (int64_t)max_qo_len * (q_heads / kv_heads);
    /* few rows per (segment, kv head): 16-row blocks whose warps split the keys */
    g.decode = rows <= 16 && mskv__attn_smem(1, head_dim) <= (uint32_t)max_smem_bytes;
    g.block_rows = mskv__attn_block_rows(g.decode, head_dim);
    g.block_keys = mskv__attn_block_keys(g.decode, head_dim);
    g.block_threads = 128;
    g.smem_bytes = mskv__attn_smem(g.decode, head_dim);
    if (g.smem_bytes > (uint32_t)max_smem_bytes) return MSKV_ERROR_UNSUPPORTED;
    tiles = (rows + g.block_rows - 1) / g.block_rows;
    blocks = tiles * batch * kv_heads;
    /* split the keys only when the blocks leave part of one wave idle, into
       splits of at least 512 keys; the count of least estimated time wins */
    slots = (int64_t)multiprocessors * resident_blocks;
    by_work = (int64_t)max_kv_len / 512;
    if (blocks > 0 && blocks < slots && by_work > 1) {
        int64_t s, lim = 4 * slots / blocks, best = mskv__attn_split_cost(blocks, slots, max_kv_len, 1, g.block_keys);
        if (lim > by_work) lim = by_work;
        for (s = 2; s <= lim; s++) {
            int64_t c = mskv__attn_split_cost(blocks, slots, max_kv_len, s, g.block_keys);
            if (c < best) { best = c; splits = s; }
        }
    }
    return mskv__attn_geometry_grid(&g, tiles, splits, batch, total_q, max_kv_len, q_heads, kv_heads, head_dim, out);
}

/* Blocks of attention kernel f (layout decode) that fit on one SM with smem
   bytes of shared memory, asked of the driver once per kernel; 0 when it
   cannot say (the geometry then assumes 1). */
static int32_t mskv__attn_resident(mskv_cuda_store *st, mskv_cu_function f, int32_t decode, uint32_t smem) {
    mskv_cuda *cu = st->cu;
    int n = 0;
    if (st->occ_fn[decode] == f) return st->occ_blocks[decode];
    /* the launch needs the raised limit anyway; the count is 0 without it */
    if (smem > 0 && mskv__cuda_smem_allow(st, f, smem) != MSKV_SUCCESS) return 0;
    if (cu->fn.cuOccupancyMaxActiveBlocksPerMultiprocessor(&n, f, 128, (size_t)smem) != MSKV_CU_SUCCESS || n < 0) n = 0;
    st->occ_fn[decode] = f;
    st->occ_blocks[decode] = n;
    return n;
}

/* ---- the sm_90a kernel (mskv_attn_sm90) ---- */

/* must match kernels.cu: MSKV_H_BN, MSKV_H_STAGES, MSKV_H_SB (K, V, a block
   of ones up to head_dim 128) and MSKV_H_SMEM */
static int32_t mskv__attn_sm90_keys(int32_t d) { return d >= 256 ? 64 : 128; }
static uint32_t mskv__attn_sm90_smem(int32_t d) {
    const int32_t stages = d <= 64 ? 3 : 2, bn = mskv__attn_sm90_keys(d);
    const int32_t stage = 2 * bn * d * 2 + (d <= 128 ? bn * 128 : 0);
    return (uint32_t)(1024 + 2 * 64 * d * 2 + stages * stage + 16 * stages);
}

/* Its launch: 384 threads (a producer warpgroup and two consumers of 64
   rows), 128 rows per block, one block per SM (its shared memory); the keys
   are split when the blocks would not fill one wave, into no more splits
   than there are runs of 4 tiles. */
static mskv_result mskv__cuda_attn_geometry_sm90(int32_t batch, int32_t total_q, int32_t max_qo_len, int32_t max_kv_len,
                                                 int32_t q_heads, int32_t kv_heads, int32_t head_dim,
                                                 int32_t multiprocessors, int32_t max_smem_bytes,
                                                 mskv_cuda_attn_geometry *out) {
    mskv_cuda_attn_geometry g;
    int64_t rows, tiles, blocks, splits = 1;
    const int64_t sms = multiprocessors > 0 ? multiprocessors : 1;
    if (!out) return MSKV_ERROR_NULL_POINTER;
    if (batch < 0 || total_q < 0 || max_qo_len < 0 || max_kv_len < 0 || q_heads <= 0 || kv_heads <= 0 ||
        q_heads % kv_heads != 0 || (head_dim != 64 && head_dim != 128 && head_dim != 256))
        return MSKV_ERROR_INVALID_ARGUMENT;
    memset(&g, 0, sizeof(g));
    g.block_rows = 128;
    g.block_keys = mskv__attn_sm90_keys(head_dim);
    g.block_threads = 384;
    g.smem_bytes = mskv__attn_sm90_smem(head_dim);
    if (g.smem_bytes > (uint32_t)(max_smem_bytes > 0 ? max_smem_bytes : 99 * 1024)) return MSKV_ERROR_UNSUPPORTED;
    rows = (int64_t)max_qo_len * (q_heads / kv_heads);
    tiles = (rows + 127) / 128;
    blocks = tiles * batch * kv_heads;
    if (blocks > 0 && blocks < sms && max_kv_len > 0) {
        int64_t by_work = ((int64_t)max_kv_len + 4 * g.block_keys - 1) / (4 * g.block_keys);
        splits = (sms + blocks - 1) / blocks;
        if (splits > by_work) splits = by_work;
        if (splits < 1) splits = 1;
    }
    return mskv__attn_geometry_grid(&g, tiles, splits, batch, total_q, max_kv_len, q_heads, kv_heads, head_dim, out);
}

/* The TMA tensor maps of every pool, made once per store (on its first
   sm_90a call): the pool as [pages][page_size][kv_heads][D] (dims D,
   kv_heads, page_size, num_pages), a box of 64 elements of one head over
   min(page_size, BN) slots of one page, the 128-byte swizzle of the
   kernel's tiles. Without cuTensorMapEncodeTiled (or when it refuses) the
   kernel copies with cp.async. OUT_OF_MEMORY (nothing made; the next call
   tries again) is the only failure. */
/* One tensor map of the sm_90a kernel's K/V layout at base: pages of
   `rows` slots of [kv_heads][D] 16-bit elements (dims D, kv_heads, rows,
   pages), a box of 64 elements of one head over box_rows slots of one page,
   the 128-byte swizzle of the kernel's tiles. The pools are num_pages pages
   of page_size rows; a dense K/V is one page of all its rows. */
static mskv_cu_result mskv__cuda_tmap_encode(const mskv_cuda_store *st, unsigned char *map, mskv_cu_ptr base,
                                             unsigned long long rows, unsigned long long pages, unsigned int box_rows) {
    unsigned long long dims[4], strides[3];
    unsigned int box[4], es[4] = { 1, 1, 1, 1 };
    dims[0] = (unsigned long long)st->d.head_dim; dims[1] = (unsigned long long)st->d.kv_heads; dims[2] = rows;
    dims[3] = pages;
    strides[0] = dims[0] * 2; strides[1] = strides[0] * dims[1]; strides[2] = strides[1] * rows;
    box[0] = 64; box[1] = 1; box[2] = box_rows; box[3] = 1;
    return st->cu->fn.cuTensorMapEncodeTiled(map, st->d.dtype == MSKV_DTYPE_F16 ? MSKV_CU_TENSOR_MAP_DATA_TYPE_FLOAT16 :
                                             MSKV_CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, (void *)(uintptr_t)base, dims,
                                             strides, box, es, MSKV_CU_TENSOR_MAP_INTERLEAVE_NONE,
                                             MSKV_CU_TENSOR_MAP_SWIZZLE_128B, MSKV_CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                             MSKV_CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

static mskv_result mskv__cuda_store_tmaps(mskv_cuda_store *st) {
    mskv_cuda *cu = st->cu;
    const int32_t P = st->d.page_size, bn = mskv__attn_sm90_keys(st->d.head_dim);
    int32_t i;
    if (st->tmaps_state != 0) return MSKV_SUCCESS;
    if (!cu->fn.cuTensorMapEncodeTiled) { st->tmaps_state = -1; return MSKV_SUCCESS; }
    st->tmap_mem = (unsigned char *)mskv__cuda_alloc(&cu->allocator, (size_t)st->d.num_layers * 256 + 64);
    if (!st->tmap_mem) return MSKV_ERROR_OUT_OF_MEMORY;
    st->tmaps = st->tmap_mem + ((64 - ((uintptr_t)st->tmap_mem & 63)) & 63);
    for (i = 0; i < 2 * st->d.num_layers; i++) {
        mskv_cu_result r = mskv__cuda_tmap_encode(st, st->tmaps + (size_t)i * 128, mskv_cuda_store_pool(st, i / 2, i % 2),
                                                  (unsigned long long)P, (unsigned long long)st->d.num_pages,
                                                  (unsigned int)(P < bn ? P : bn));
        if (r != MSKV_CU_SUCCESS) {
            mskv__cuda_log(cu->log, cu->log_user, MSKV_LOG_WARN,
                           "mstar_kv cuda: cuTensorMapEncodeTiled refused the pools (CUDA error %d): K/V by cp.async", r);
            mskv__cuda_dealloc(&cu->allocator, st->tmap_mem);
            st->tmap_mem = st->tmaps = NULL;
            st->tmaps_state = -1;
            return MSKV_SUCCESS;
        }
    }
    st->tmaps_state = 1;
    return MSKV_SUCCESS;
}

/* The sm_90a kernel's maps of a dense K/V (a prefix view's layer): the
   buffer as one page of all its rows (dims D, kv_heads, rows, 1; box 64 x 1
   x BN x 1, the pools' swizzle). A model attends over one view layer after
   another, so the maps are kept per buffer pair (rows and BN in the key)
   in an open-addressed table of MSKV__CUDA_DENSE_MAPS slots, emptied when
   3/4 full: a steady loop over up to 96 layers' buffers encodes nothing.
   Returns the K map (the V map follows it), or NULL: the kernel copies with
   cp.async (no cuTensorMapEncodeTiled, no rows, a buffer the driver
   refuses, no memory for the table). */
#define MSKV__CUDA_DENSE_MAPS 128
struct mskv__cuda_dense_key {
    const void *k, *v;               /* k NULL: an empty slot */
    int64_t rows;
    int32_t bn;
};
static const unsigned char *mskv__cuda_dense_tmaps(mskv_cuda_store *st, const mskv_dense_kv *dk, int32_t bn) {
    mskv_cuda *cu = st->cu;
    const unsigned long long rows = (unsigned long long)dk->tokens;
    const size_t table = (size_t)256 * MSKV__CUDA_DENSE_MAPS + sizeof(struct mskv__cuda_dense_key) * MSKV__CUDA_DENSE_MAPS;
    struct mskv__cuda_dense_key *e = NULL;
    unsigned char *maps;
    uint32_t h;
    int32_t i;
    if (!cu->fn.cuTensorMapEncodeTiled || rows == 0 || rows > 0xffffffffull) return NULL;
    if (!st->dense_maps) {
        /* 64-byte alignment for the maps: over-allocate, keep the allocation's address just below the table */
        unsigned char *mem = (unsigned char *)mskv__cuda_alloc(&cu->allocator, table + 64 + sizeof(void *)), *at;
        if (!mem) return NULL;
        at = mem + sizeof(void *);
        at += (64 - ((uintptr_t)at & 63)) & 63;
        memcpy(at - sizeof(void *), &mem, sizeof(void *));
        memset(at, 0, table);
        st->dense_maps = at;
        st->dense_keys = (struct mskv__cuda_dense_key *)(void *)(at + (size_t)256 * MSKV__CUDA_DENSE_MAPS);
        st->dense_used = 0;
    }
    h = (uint32_t)(((uint64_t)((uintptr_t)dk->k >> 4) * 0x9E3779B97F4A7C15ull) >> 57) & (MSKV__CUDA_DENSE_MAPS - 1);
    for (i = 0; i < MSKV__CUDA_DENSE_MAPS; i++) {
        e = &st->dense_keys[(h + (uint32_t)i) & (MSKV__CUDA_DENSE_MAPS - 1)];
        if (!e->k) break;
        if (e->k == dk->k && e->v == dk->v && e->rows == dk->tokens && e->bn == bn) return st->dense_maps + (size_t)(e - st->dense_keys) * 256;
    }
    if (st->dense_used >= MSKV__CUDA_DENSE_MAPS * 3 / 4) {
        memset(st->dense_maps, 0, table);
        st->dense_used = 0;
        e = &st->dense_keys[h];
    }
    maps = st->dense_maps + (size_t)(e - st->dense_keys) * 256;
    /* kv_heads is the store's (checked): one page of all the rows */
    if ((unsigned long long)st->d.head_dim * 2 * (unsigned long long)st->d.kv_heads * rows >= (1ull << 40)) return NULL;
    for (i = 0; i < 2; i++)
        if (mskv__cuda_tmap_encode(st, maps + (size_t)i * 128, (mskv_cu_ptr)(uintptr_t)(i ? dk->v : dk->k), rows, 1,
                                   (unsigned int)bn) != MSKV_CU_SUCCESS)
            return NULL;   /* the slot stays empty */
    e->k = dk->k; e->v = dk->v; e->rows = dk->tokens; e->bn = bn;
    st->dense_used++;
    return maps;
}

static void mskv__cuda_dense_maps_free(mskv_cuda_store *st) {
    unsigned char *mem;
    if (!st->dense_maps) return;
    memcpy(&mem, (unsigned char *)st->dense_maps - sizeof(void *), sizeof(void *));
    mskv__cuda_dealloc(&st->cu->allocator, mem);
    st->dense_maps = NULL;
    st->dense_keys = NULL;
}

/* AUTO gives up on the sm_90a kernel for the context's life, saying so once. */
static void mskv__cuda_sm90_off(mskv_cuda *cu, mskv_result why) {
    mskv__cuda_lock(&cu->lock);
    if (!cu->sm90_failed) {
        cu->sm90_failed = 1;
        cu->info.wgmma = 0;
        mskv__cuda_log(cu->log, cu->log_user, MSKV_LOG_WARN,
                       "mstar_kv cuda: the sm_90a attention kernel is unavailable (%s%s%.300s): using mskv_attn (mma.sync)",
                       mskv_result_string(why), cu->err[0] ? ": " : "", cu->err);
    }
    mskv__cuda_unlock(&cu->lock);
}

/* The kernels compute mask positions in 32 bits (a query's position + 1,
   position - window_left): the uploaded plan's must leave room, which the
   CPU (64 bits) does not need; refused, not wrapped. */
static mskv_result mskv__cuda_positions_fit(mskv_cuda_store *st, int masked, int64_t window_left) {
    if (masked && st->cur.pos_hi >= INT32_MAX) {
        mskv__cuda_failf(st->cu, "attention: a mask position of %lld: the kernels take positions up to 2^31 - 2",
                         (long long)st->cur.pos_hi);
        return MSKV_ERROR_OUT_OF_RANGE;
    }
    if (window_left >= 0 && st->cur.pos_lo - window_left < INT32_MIN) {
        mskv__cuda_failf(st->cu, "attention: q_pos %lld with window_left %lld reaches below -2^31",
                         (long long)st->cur.pos_lo, (long long)window_left);
        return MSKV_ERROR_OUT_OF_RANGE;
    }
    return MSKV_SUCCESS;
}

/* The dense K/V of mskv_cuda_attention_dense: device addresses in the
   store's dtype and head_dim, rows of [kv_heads][head_dim] one after another
   (the layout the kernels read), 16-byte aligned, and a current epoch. */
static mskv_result mskv__attn_check_dense(mskv_cuda_store *st, const mskv_dense_kv *kv) {
    mskv_result res;
    if (!kv->device) {
        mskv__cuda_failf(st->cu, "attention_dense: k and v are host memory (device = 0): mskv_cpu_attention_dense reads those");
        return MSKV_ERROR_INVALID_ARGUMENT;
    }
    /* the variant (dtype, head_dim) and the grid (kv_heads) are the store's */
    if (kv->dtype != st->d.dtype || kv->head_dim != st->d.head_dim || kv->kv_heads != st->d.kv_heads || kv->tokens < 0)
        return MSKV_ERROR_INVALID_ARGUMENT;
    if (kv->tokens > 0 && (!kv->k || !kv->v)) return MSKV_ERROR_NULL_POINTER;
    if ((kv->token_stride != 0 && kv->token_stride != (int64_t)kv->kv_heads * kv->head_dim) ||
        (kv->head_stride != 0 && kv->head_stride != kv->head_dim)) {
        mskv__cuda_failf(st->cu, "attention_dense: the kernels read rows of [kv_heads][head_dim] (token_stride %d, head_stride %d); "
                         "strides %lld, %lld are the CPU's only", kv->kv_heads * kv->head_dim, kv->head_dim,
                         (long long)kv->token_stride, (long long)kv->head_stride);
        return MSKV_ERROR_UNSUPPORTED;
    }
    /* 16-byte copies of rows; the row offset is computed in 64 bits */
    if (((uintptr_t)kv->k & 15) || ((uintptr_t)kv->v & 15)) return MSKV_ERROR_INVALID_ARGUMENT;
    if ((int64_t)kv->kv_heads * kv->head_dim * 2 > (int64_t)0xffffffff) return MSKV_ERROR_UNSUPPORTED;
    /* a stale view first: it explains the rest */
    if ((res = mskv_dense_kv_check(kv)) != MSKV_SUCCESS) {
        if (res == MSKV_ERROR_STALE_VIEW)
            mskv__cuda_failf(st->cu, "attention_dense: epoch %llu is no longer the request's prefix_epoch: gather the view again",
                             (unsigned long long)kv->epoch);
        return res;
    }
    return MSKV_SUCCESS;
}

/* The host-side checks of mskv_cuda_attention, kernel-independent: the
   kernel trusts the table, so refuse what mskv_cpu_attention refuses and no
   block reads past the pages it was given (O(batch)); for dense K/V (dk),
   past the rows it holds. *empty: nothing to do. Gives the longest
   segment's queries and keys. */
static mskv_result mskv__attn_check(mskv_cuda_store *st, int32_t layer, const mskv_dense_kv *dk, const mskv_plan *plan,
                                    const mskv_cuda_dplan *dplan, const mskv_attn *attn, mskv_cu_ptr q,
                                    mskv_cu_ptr o, mskv_cu_ptr lse, int *empty, int32_t *max_qo, int32_t *max_kv) {
    int32_t b;
    mskv_result res;
    *empty = 0;
    if (!st || !plan || !dplan || !attn) return MSKV_ERROR_NULL_POINTER;
    if (!dk && (layer < 0 || layer >= st->d.num_layers)) return MSKV_ERROR_OUT_OF_RANGE;
    if (st->d.dtype != MSKV_DTYPE_F16 && st->d.dtype != MSKV_DTYPE_BF16) return MSKV_ERROR_UNSUPPORTED;
    if (dk && (res = mskv__attn_check_dense(st, dk)) != MSKV_SUCCESS) return res;
    if (attn->q_dtype == MSKV_DTYPE_F32) {
        /* a conversion pass over q and o is the caller's framework's to fuse with its projections */
        mskv__cuda_failf(st->cu, "mskv_cuda_attention: q and o are in the store's dtype; convert f32 q where it is produced");
        return MSKV_ERROR_UNSUPPORTED;
    }
    if (attn->q_dtype != st->d.dtype) return MSKV_ERROR_INVALID_ARGUMENT;
    if ((int)attn->mask < 0 || (int)attn->mask > 2 || attn->window_left < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (!(attn->scale >= 0.0f) || attn->scale > 3.0e38f) return MSKV_ERROR_INVALID_ARGUMENT;  /* the kernel needs scale > 0 */
    if (plan->batch != dplan->batch || plan->total_q != dplan->total_q) return MSKV_ERROR_INVALID_ARGUMENT;
    if (!dk && plan->page_size != st->d.page_size) return MSKV_ERROR_INVALID_ARGUMENT;
    /* the kernel finds a key's bytes as page id x page bytes + slot x slot bytes in 32 bits */
    if ((int64_t)st->d.page_size * st->d.kv_heads * st->d.head_dim * 2 > (int64_t)0xffffffff) return MSKV_ERROR_UNSUPPORTED;
    /* both kernels read q_pos and the visibility bounds; a feature they do
       not know would be attended over other keys than the CPU's */
    if (plan->features & ~(MSKV_PLAN_Q_POS | MSKV_PLAN_VISIBILITY)) {
        mskv__cuda_failf(st->cu, "attention: plan features 0x%x: the kernels honour q_pos (0x%x) and visibility bounds (0x%x) only",
                         (unsigned)plan->features, MSKV_PLAN_Q_POS, MSKV_PLAN_VISIBILITY);
        return MSKV_ERROR_UNSUPPORTED;
    }
    /* what the features ask for must be in the plan and in the device buffers
       (else they hold an earlier plan's) */
    if ((plan->features & MSKV_PLAN_Q_POS) && (!plan->q_pos || !dplan->q_pos)) return MSKV_ERROR_NULL_POINTER;
    if ((plan->features & MSKV_PLAN_VISIBILITY) &&
        (!plan->vis_sink_end || !plan->vis_window_start || !dplan->vis_sink_end || !dplan->vis_window_start))
        return MSKV_ERROR_NULL_POINTER;
    if (plan->total_q == 0 || plan->batch == 0) { *empty = 1; return MSKV_SUCCESS; }
    if (!q || !o) return MSKV_ERROR_NULL_POINTER;
    /* the kernel reads q with 16-byte copies and writes o in 4-byte pairs */
    if ((q & 15) || (o & 3) || (lse & 3)) return MSKV_ERROR_INVALID_ARGUMENT;
    if (!plan->qo_indptr || !plan->kv_len) return MSKV_ERROR_NULL_POINTER;
    if (dk) {
        /* the rows: in the host plan, and uploaded with it (else the device holds an earlier plan's) */
        if (!plan->kv_token_indptr) return MSKV_ERROR_NULL_POINTER;
        if (!st->cur.rows) return MSKV_ERROR_INVALID_ARGUMENT;
        if (st->cur.rows_end > dk->tokens) return MSKV_ERROR_OUT_OF_RANGE;   /* what the uploaded plan reaches */
    } else if (!plan->kv_indptr || (plan->num_page_ids > 0 && !plan->kv_indices)) {
        return MSKV_ERROR_NULL_POINTER;   /* an array missing at upload would leave the previous plan's there */
    }
    /* masks need positions; the device buffers would hold a previous plan's */
    if (attn->mask != MSKV_MASK_NONE && (!plan->kv_pos_split || !plan->kv_pos_shift)) return MSKV_ERROR_INVALID_ARGUMENT;
    if ((res = mskv__cuda_positions_fit(st, attn->mask != MSKV_MASK_NONE,
                                        attn->mask == MSKV_MASK_WINDOW ? attn->window_left : -1)) != MSKV_SUCCESS)
        return res;
    if (plan->pad_segments < 0 || plan->pad_segments > plan->batch) return MSKV_ERROR_INVALID_ARGUMENT;
    if (plan->qo_indptr[0] != 0 || plan->qo_indptr[plan->batch] != plan->total_q) return MSKV_ERROR_INVALID_ARGUMENT;
    if (!dk && (plan->num_page_ids != dplan->num_page_ids || plan->kv_indptr[0] != 0 ||
                plan->kv_indptr[plan->batch] != plan->num_page_ids))
        return MSKV_ERROR_INVALID_ARGUMENT;
    *max_qo = 0;
    *max_kv = 0;
    for (b = 0; b < plan->batch; b++) {
        int64_t qo64 = (int64_t)plan->qo_indptr[b + 1] - plan->qo_indptr[b];
        int64_t np = dk ? 0 : (int64_t)plan->kv_indptr[b + 1] - plan->kv_indptr[b];
        int32_t qo = (int32_t)qo64, kv = plan->kv_len[b];
        if (qo64 < 0 || qo64 > plan->total_q || np < 0) return MSKV_ERROR_INVALID_ARGUMENT;
        if (dk) {
            /* rows [t0, t0 + kv_len) of the buffer, whose row index the kernel holds in 32 bits */
            const int64_t t0 = plan->kv_token_indptr[b], t1 = plan->kv_token_indptr[b + 1];
            if (kv < 0 || t0 < 0 || t1 < t0 /* then t1 - t0 fits */ || t1 - t0 != (int64_t)kv) return MSKV_ERROR_INVALID_ARGUMENT;
            if (t1 > dk->tokens) return MSKV_ERROR_OUT_OF_RANGE;
        } else if (np == 0 ? kv != 0 : (kv <= (int64_t)(np - 1) * st->d.page_size || kv > (int64_t)np * st->d.page_size)) {
            return MSKV_ERROR_INVALID_ARGUMENT;
        }
        /* without q_pos the queries are the tail of their keys; a segment with no keys (padding) sees nothing */
        if (attn->mask != MSKV_MASK_NONE && ((qo > kv && kv > 0 && !(plan->features & MSKV_PLAN_Q_POS)) ||
                                             plan->kv_pos_shift[b] < 0 || plan->kv_pos_split[b] < 0 || plan->kv_pos_split[b] > kv))
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

/* What one call launches: the attention kernel and its geometry, and the
   merge when the keys are split. */
typedef struct mskv__attn_launch {
    mskv_cuda_attn_geometry g;
    mskv_cu_function f, fm;
    int32_t sm90;                   /* f is mskv_attn_sm90 (else mskv_attn) */
} mskv__attn_launch;

/* Picks the kernel and looks up every function the call launches (a
   compile failure launches nothing). The sm_90a kernel serves prefill
   shapes on compute capability 9.0 (every shape when forced); AUTO falls
   back to mma.sync for good when it does not compile or load. mskv_attn's
   layout (decode or prefill) comes first, then its splits from how many of
   its blocks an SM holds (asked of the driver once per store and layout). */
static mskv_result mskv__attn_pick(mskv_cuda_store *st, const mskv_plan *plan, const mskv_attn *attn, int32_t max_qo,
                                   int32_t max_kv, mskv__attn_launch *L) {
    mskv_cuda *cu = st->cu;
    const int forced = cu->desc.attn_path == MSKV_CUDA_ATTN_WGMMA || st->selftest_path == 2;
    mskv__cuda_defines defs = st->defs;
    mskv_result res;
    L->fm = NULL;
    res = mskv_cuda_attn_geometry_get(plan->batch, plan->total_q, max_qo, max_kv, attn->q_heads, st->d.kv_heads,
                                      st->d.head_dim, cu->info.multiprocessors, cu->smem_optin, 0, &L->g);
    if (res != MSKV_SUCCESS && !forced) return res;
    L->sm90 = st->selftest_path ? st->selftest_path == 2 : forced || (cu->info.wgmma && !L->g.decode);
    if (L->sm90) {
        if (!mskv__cuda_sm90_device(cu)) return MSKV_ERROR_UNSUPPORTED;
        mskv__cuda_define(&defs, MSKV__D_ATTN_WARP_KEYS, 0);
        defs.arch_specific = 1;
        res = mskv__cuda_store_function(st, MSKV__K_ATTN_SM90, &defs, &L->f);
        if (res == MSKV_SUCCESS) {
            mskv_cuda_attn_geometry g;
            res = mskv__cuda_attn_geometry_sm90(plan->batch, plan->total_q, max_qo, max_kv, attn->q_heads,
                                                st->d.kv_heads, st->d.head_dim, cu->info.multiprocessors,
                                                cu->smem_optin, &g);
            /* the merge from the same (sm_90a) module */
            if (res == MSKV_SUCCESS && g.n_splits > 1)
                res = mskv__cuda_store_function(st, MSKV__K_LSE_MERGE, &defs, &L->fm);
            if (res == MSKV_SUCCESS) L->g = g;
            /* AUTO: a device that does not say it has the shared memory gets mma.sync */
            if (res != MSKV_ERROR_UNSUPPORTED || forced) return res;
        } else {
            int lost;
            /* out of memory is this call's failure, not the kernel's; after
               a fault in its self-test the context is gone: nothing to fall back on */
            if (forced || res == MSKV_ERROR_OUT_OF_MEMORY) return res;
            mskv__cuda_lock(&cu->lock);
            lost = cu->lost;
            mskv__cuda_unlock(&cu->lock);
            if (lost) return res;
            mskv__cuda_sm90_off(cu, res);
        }
        L->sm90 = 0;
        defs = st->defs;
    }
    mskv__cuda_define(&defs, MSKV__D_ATTN_WARP_KEYS, L->g.decode);
    if ((res = mskv__cuda_store_function(st, MSKV__K_ATTN, &defs, &L->f)) != MSKV_SUCCESS) return res;
    res = mskv_cuda_attn_geometry_get(plan->batch, plan->total_q, max_qo, max_kv, attn->q_heads, st->d.kv_heads,
                                      st->d.head_dim, cu->info.multiprocessors, cu->smem_optin,
                                      mskv__attn_resident(st, L->f, L->g.decode, L->g.smem_bytes), &L->g);
    if (res == MSKV_SUCCESS && L->g.n_splits > 1)
        res = mskv__cuda_store_function(st, MSKV__K_LSE_MERGE, &defs, &L->fm);
    return res;
}

/* Both kernels' last three parameters, q_pos, vis_sink_end, vis_window_start
   from parameter i on: the uploaded arrays where the plan's features ask for
   them, else 0 (the tail rule, nothing hidden: the kernels then read
   nothing more). */
static void mskv__attn_args_vis(mskv__cuda_args *a, int i, const mskv_plan *plan, const mskv_cuda_dplan *dplan) {
    const int vis = (plan->features & MSKV_PLAN_VISIBILITY) != 0;
    mskv__cuda_arg_ptr(a, i, plan->features & MSKV_PLAN_Q_POS ? dplan->q_pos : 0);
    mskv__cuda_arg_ptr(a, i + 1, vis ? dplan->vis_sink_end : 0);
    mskv__cuda_arg_ptr(a, i + 2, vis ? dplan->vis_window_start : 0);
}

/* mskv_attn(q, k_pool, v_pool, qo_indptr, kv_indptr, kv_indices, kv_len, kv_pos_split,
   kv_pos_shift, q_heads, kv_heads, page_size, page_magic, page_shift, scale_log2, mask,
   window_left, kv_chunk, n_splits, o, lse, o_part, lse_part, q_pos, vis_sink_end,
   vis_window_start) */
/* The K/V a launch reads: layer's pools and the page table, or dense K/V
   (dk) as pages of one row (kv_indices 0, the uploaded int32 rows) */
static void mskv__attn_kv(const mskv_cuda_store *st, int32_t layer, const mskv_dense_kv *dk, const mskv_cuda_dplan *dplan,
                          mskv_cu_ptr *k, mskv_cu_ptr *v, mskv_cu_ptr *indptr, mskv_cu_ptr *indices) {
    *k = dk ? (mskv_cu_ptr)(uintptr_t)dk->k : mskv_cuda_store_pool((mskv_cuda_store *)(uintptr_t)st, layer, 0);
    *v = dk ? (mskv_cu_ptr)(uintptr_t)dk->v : mskv_cuda_store_pool((mskv_cuda_store *)(uintptr_t)st, layer, 1);
    *indptr = dk ? st->d_plan + st->lay.kv_rows : dplan->kv_indptr;
    *indices = dk ? 0 : dplan->kv_indices;
}

static mskv__cuda_args *mskv__attn_args(mskv_cuda_store *st, int32_t layer, const mskv_dense_kv *dk, const mskv_plan *plan,
                                        const mskv_cuda_dplan *dplan,
                                        const mskv_attn *attn, const mskv_cuda_attn_geometry *g, float scale_log2,
                                        mskv_cu_ptr q, mskv_cu_ptr o, mskv_cu_ptr lse, mskv_cu_ptr o_part,
                                        mskv_cu_ptr lse_part) {
    mskv__cuda_args *a = &st->args[MSKV__K_ATTN];
    mskv_cu_ptr k, v, indptr, indices;
    /* once: 1 the pools' geometry is written, 2 a dense K/V's (rewritten each call) */
    if (a->once != 1 || dk) {
        uint32_t magic;
        int32_t shift;
        mskv_cuda_page_divisor(dk ? 1 : st->d.page_size, &magic, &shift);
        mskv__cuda_arg_i32(a, 10, dk ? dk->kv_heads : st->d.kv_heads);
        mskv__cuda_arg_i32(a, 11, dk ? 1 : st->d.page_size);
        mskv__cuda_arg_u32(a, 12, magic);
        mskv__cuda_arg_i32(a, 13, shift);
        a->once = dk ? 2 : 1;
    }
    mskv__attn_kv(st, layer, dk, dplan, &k, &v, &indptr, &indices);
    mskv__cuda_arg_ptr(a, 0, q);
    mskv__cuda_arg_ptr(a, 1, k);
    mskv__cuda_arg_ptr(a, 2, v);
    mskv__cuda_arg_ptr(a, 3, dplan->qo_indptr);
    mskv__cuda_arg_ptr(a, 4, indptr);
    mskv__cuda_arg_ptr(a, 5, indices);
    mskv__cuda_arg_ptr(a, 6, dplan->kv_len);
    mskv__cuda_arg_ptr(a, 7, dplan->kv_pos_split);
    mskv__cuda_arg_ptr(a, 8, dplan->kv_pos_shift);
    mskv__cuda_arg_i32(a, 9, attn->q_heads);
    mskv__cuda_arg_f32(a, 14, scale_log2);
    mskv__cuda_arg_i32(a, 15, (int32_t)attn->mask);
    mskv__cuda_arg_i32(a, 16, attn->window_left);
    mskv__cuda_arg_i32(a, 17, g->kv_chunk);
    mskv__cuda_arg_i32(a, 18, g->n_splits);
    mskv__cuda_arg_ptr(a, 19, o);
    mskv__cuda_arg_ptr(a, 20, lse);
    mskv__cuda_arg_ptr(a, 21, o_part);
    mskv__cuda_arg_ptr(a, 22, lse_part);
    mskv__attn_args_vis(a, 23, plan, dplan);
    return a;
}

/* mskv_attn_sm90(k_map, v_map, use_tma, q, k_pool, v_pool, qo_indptr, kv_indptr, kv_indices,
   kv_len, kv_pos_split, kv_pos_shift, q_heads, kv_heads, page_size, scale_log2, mask,
   window_left, kv_chunk, n_splits, o, lse, o_part, lse_part, q_pos, vis_sink_end,
   vis_window_start)
   The maps are 128-byte CUtensorMaps passed by value: their parameter
   pointers go to the store's maps of the layer (or to zeros when the kernel
   copies with cp.async) instead of to a value slot. */
static mskv__cuda_args *mskv__attn_args_sm90(mskv_cuda_store *st, int32_t layer, const mskv_dense_kv *dk,
                                             const mskv_plan *plan, const mskv_cuda_dplan *dplan,
                                             const mskv_attn *attn, const mskv_cuda_attn_geometry *g,
                                             float scale_log2, mskv_cu_ptr q, mskv_cu_ptr o, mskv_cu_ptr lse,
                                             mskv_cu_ptr o_part, mskv_cu_ptr lse_part) {
    static const unsigned char no_map[128] = { 0 };
    mskv__cuda_args *a = &st->args[MSKV__K_ATTN_SM90];
    const int32_t P = st->d.page_size, bn = g->block_keys;
    /* TMA when a tile holds whole pages: page_size a multiple of BN, or BN a
       multiple of a page of 16+ rows; dense K/V when its maps were made */
    const unsigned char *maps = dk ? mskv__cuda_dense_tmaps(st, dk, bn) : st->tmaps + (size_t)layer * 256;
    const int32_t use_tma = dk ? maps != NULL : st->tmaps_state == 1 && (P % bn == 0 || (bn % P == 0 && P >= 16));
    mskv_cu_ptr k, v, indptr, indices;
    if (a->once != 1 || dk) {
        mskv__cuda_arg_i32(a, 13, dk ? dk->kv_heads : st->d.kv_heads);
        mskv__cuda_arg_i32(a, 14, dk ? 1 : st->d.page_size);
        a->once = dk ? 2 : 1;
    }
    mskv__attn_kv(st, layer, dk, dplan, &k, &v, &indptr, &indices);
    a->ptr[0] = use_tma ? (void *)(uintptr_t)maps : (void *)(uintptr_t)no_map;
    a->ptr[1] = use_tma ? (void *)(uintptr_t)(maps + 128) : (void *)(uintptr_t)no_map;
    mskv__cuda_arg_i32(a, 2, use_tma);
    mskv__cuda_arg_ptr(a, 3, q);
    mskv__cuda_arg_ptr(a, 4, k);
    mskv__cuda_arg_ptr(a, 5, v);
    mskv__cuda_arg_ptr(a, 6, dplan->qo_indptr);
    mskv__cuda_arg_ptr(a, 7, indptr);
    mskv__cuda_arg_ptr(a, 8, indices);
    mskv__cuda_arg_ptr(a, 9, dplan->kv_len);
    mskv__cuda_arg_ptr(a, 10, dplan->kv_pos_split);
    mskv__cuda_arg_ptr(a, 11, dplan->kv_pos_shift);
    mskv__cuda_arg_i32(a, 12, attn->q_heads);
    mskv__cuda_arg_f32(a, 15, scale_log2);
    mskv__cuda_arg_i32(a, 16, (int32_t)attn->mask);
    mskv__cuda_arg_i32(a, 17, attn->window_left);
    mskv__cuda_arg_i32(a, 18, g->kv_chunk);
    mskv__cuda_arg_i32(a, 19, g->n_splits);
    mskv__cuda_arg_ptr(a, 20, o);
    mskv__cuda_arg_ptr(a, 21, lse);
    mskv__cuda_arg_ptr(a, 22, o_part);
    mskv__cuda_arg_ptr(a, 23, lse_part);
    mskv__attn_args_vis(a, 24, plan, dplan);
    return a;
}

/* A dense launch being captured: the replay's checks need its rows and,
   for an epoch-checked K/V, its (request, group, epoch). */
static mskv_result mskv__cuda_capture_dense(mskv_cuda_store *st, const mskv_dense_kv *dk) {
    mskv__cuda_dense_use *u = &st->cap_dense;
    int32_t i;
    if (dk->arena) {
        for (i = 0; i < u->n; i++)
            if (u->views[i].arena == dk->arena && u->views[i].request.id == dk->request.id &&
                u->views[i].group == dk->group && u->views[i].epoch == dk->epoch)
                break;
        if (i == u->n) {
            if (u->n == MSKV__CUDA_GRAPH_VIEWS) {
                mskv__cuda_failf(st->cu, "capture: a graph checks the epochs of %d prefix views at most", MSKV__CUDA_GRAPH_VIEWS);
                return MSKV_ERROR_CAPACITY;
            }
            u->views[u->n++] = *dk;
        }
    }
    if (dk->tokens < u->rows) u->rows = dk->tokens;
    return MSKV_SUCCESS;
}

/* mskv_cuda_attention (dk NULL: layer's pools) and mskv_cuda_attention_dense (dk) */
static mskv_result mskv__cuda_attend(mskv_cuda_store *st, int32_t layer, const mskv_dense_kv *dk, const mskv_plan *plan,
                                     const mskv_cuda_dplan *dplan, const mskv_attn *attn,
                                     mskv_cu_ptr q, mskv_cu_ptr o, mskv_cu_ptr lse) {
    static const unsigned int merge_block[3] = {128, 1, 1};
    mskv__attn_launch L;
    mskv__cuda_args *a, *m;
    mskv_result res;
    mskv_cu_ptr ws = 0, o_part = 0, lse_part = 0;
    int32_t max_qo = 0, max_kv = 0;
    int empty;
    unsigned int block[3];
    float scale, scale_log2;
    res = mskv__attn_check(st, layer, dk, plan, dplan, attn, q, o, lse, &empty, &max_qo, &max_kv);
    if (res != MSKV_SUCCESS || empty) return res;
    if ((res = mskv__cuda_enter(st->cu)) != MSKV_SUCCESS) return res;
    if (dk && st->capturing && (res = mskv__cuda_capture_dense(st, dk)) != MSKV_SUCCESS) return res;
    if (st->capturing && attn->mask != MSKV_MASK_NONE) {
        st->cap_masked = 1;
        if (attn->mask == MSKV_MASK_WINDOW && attn->window_left > st->cap_window_left) st->cap_window_left = attn->window_left;
    }

    /* ---- the part that follows kernels.cu: geometry, variants, workspace,
       then each kernel's parameter values in its parameter order ---------- */
    if ((res = mskv__attn_pick(st, plan, attn, max_qo, max_kv, &L)) != MSKV_SUCCESS) return res;
    st->selftest_seen = L.f;
    if (L.sm90 && !dk && (res = mskv__cuda_store_tmaps(st)) != MSKV_SUCCESS) return res;
    if (L.g.n_splits > 1) {
        int64_t cover = (int64_t)L.g.n_splits * L.g.kv_chunk;
        if ((res = mskv__cuda_workspace(st, L.g.workspace_bytes, &ws)) != MSKV_SUCCESS) return res;
        if (st->capturing && cover < st->cap_kv_cover) st->cap_kv_cover = cover;
        o_part = ws;
        lse_part = ws + (mskv_cu_ptr)((size_t)L.g.n_splits * (size_t)plan->total_q * (size_t)attn->q_heads * (size_t)st->d.head_dim * 4);
    }
    scale = attn->scale > 0.0f ? attn->scale : 1.0f / sqrtf((float)st->d.head_dim);
    scale_log2 = scale * 1.44269504088896341f;
    a = L.sm90 ? mskv__attn_args_sm90(st, layer, dk, plan, dplan, attn, &L.g, scale_log2, q, o, lse, o_part, lse_part)
               : mskv__attn_args(st, layer, dk, plan, dplan, attn, &L.g, scale_log2, q, o, lse, o_part, lse_part);
    block[0] = L.g.block_threads; block[1] = 1; block[2] = 1;
    res = mskv__cuda_launch(st, L.f, L.g.grid, block, L.g.smem_bytes, a->ptr);
    if (res != MSKV_SUCCESS || L.g.n_splits == 1) return res;
    {
        /* mskv_lse_merge(o_part, lse_part, n_splits, part_rows, rows, o, lse) */
        int64_t rows = (int64_t)plan->total_q * attn->q_heads;
        unsigned int grid[3];
        grid[0] = (unsigned int)((rows + 3) / 4); grid[1] = 1; grid[2] = 1;
        m = &st->args[MSKV__K_LSE_MERGE];
        mskv__cuda_arg_ptr(m, 0, o_part);
        mskv__cuda_arg_ptr(m, 1, lse_part);
        mskv__cuda_arg_i32(m, 2, L.g.n_splits);
        mskv__cuda_arg_i64(m, 3, rows);
        mskv__cuda_arg_i64(m, 4, rows);
        mskv__cuda_arg_ptr(m, 5, o);
        mskv__cuda_arg_ptr(m, 6, lse);
        return mskv__cuda_launch(st, L.fm, grid, merge_block, 0, m->ptr);
    }
    /* ---- end of the kernel-specific part -------------------------------- */
}

MSKV_API mskv_result mskv_cuda_attention(mskv_cuda_store *st, int32_t layer, const mskv_plan *plan,
                                         const mskv_cuda_dplan *dplan, const mskv_attn *attn,
                                         mskv_cu_ptr q, mskv_cu_ptr o, mskv_cu_ptr lse) {
    return mskv__cuda_attend(st, layer, NULL, plan, dplan, attn, q, o, lse);
}

MSKV_API mskv_result mskv_cuda_attention_dense(mskv_cuda_store *st, const mskv_dense_kv *kv, const mskv_plan *plan,
                                               const mskv_cuda_dplan *dplan, const mskv_attn *attn,
                                               mskv_cu_ptr q, mskv_cu_ptr o, mskv_cu_ptr lse) {
    if (!kv) return MSKV_ERROR_NULL_POINTER;
    return mskv__cuda_attend(st, 0, kv, plan, dplan, attn, q, o, lse);
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

/* // >>shards implementation ------------------------------------------------ */
/* One arena over N device stores: everything below calls the stores' own
   code per shard; what is new is the head interleave of host copies, the
   all-devices fences and the all-or-nothing plan upload. */

struct mskv_cuda_shards {
    int32_t n;
    mskv_cuda *cu[MSKV_CUDA_MAX_SHARDS];
    mskv_cuda_store *st[MSKV_CUDA_MAX_SHARDS];
    void *h_stage[MSKV_CUDA_MAX_SHARDS];   /* pinned, in shard s's context: its share of one chunk */
    mskv_cuda_store_desc d;                /* the whole model's geometry (kv_heads of every shard) */
    int32_t chunk;                         /* pages per staging round (every store's stage_pages) */
    size_t row_bytes;                      /* one slot's heads of one shard: kv_heads / N * head_dim * dtype */
    size_t shard_set, full_set;            /* one page of every layer, K and V: of a shard, of the arena */
    mskv_store_ops ops;
    mskv_arena *arena;
    uint64_t retired;                      /* the highest fence handed to the arena */
    int plan_ok;                           /* the last upload reached every device */
    mskv__cuda_mutex lock;                 /* retired */
};

/* The arena's record of c pages (full heads) <-> each shard's staging:
   dir 0 gathers the shards into host, dir 1 splits host into the shards.
   Within a slot, shard s's heads follow shard s - 1's. */
static void mskv__cuda_shards_interleave(mskv_cuda_shards *sh, int dir, int32_t c, void *host) {
    size_t rows = (size_t)sh->d.num_layers * 2 * (size_t)sh->d.page_size, r, full_row = sh->row_bytes * (size_t)sh->n;
    int32_t i, s;
    for (i = 0; i < c; i++)
        for (s = 0; s < sh->n; s++) {
            char *a = (char *)host + (size_t)i * sh->full_set + (size_t)s * sh->row_bytes;
            char *b = (char *)sh->h_stage[s] + (size_t)i * sh->shard_set;
            for (r = 0; r < rows; r++, a += full_row, b += sh->row_bytes) {
                if (dir) memcpy(b, a, sh->row_bytes);
                else memcpy(a, b, sh->row_bytes);
            }
        }
}

/* store_ops.read_pages / write_pages of the sharded arena: a chunk at a
   time, every device's copies queued before any is waited for. A failure
   on any device fails the call; reads have written no device, and the
   pages of a failed write are the arena's to give back. */
static mskv_result mskv__cuda_shards_io(mskv_cuda_shards *sh, int dir, const int32_t *pages, int32_t n, void *host) {
    mskv_result res;
    int32_t done, c, s, queued;
    if ((res = mskv__cuda_check_pages(sh->st[0], pages, n)) != MSKV_SUCCESS) return res;
    for (s = 0; s < sh->n; s++)
        if (sh->st[s]->capturing) return MSKV_ERROR_BAD_STATE;
    for (s = 0; s < sh->n; s++) mskv__cuda_lock(&sh->st[s]->lock);   /* always in shard order */
    for (done = 0; done < n && res == MSKV_SUCCESS; done += c) {
        c = n - done < sh->chunk ? n - done : sh->chunk;
        if (dir) mskv__cuda_shards_interleave(sh, 1, c, (char *)host + (size_t)done * sh->full_set);
        for (queued = 0; queued < sh->n && res == MSKV_SUCCESS; queued++) {
            mskv_cuda_store *st = sh->st[queued];
            res = mskv__cuda_enter(st->cu);
            if (res == MSKV_SUCCESS) res = mskv__cuda_pages_queue(st, dir, pages + done, c, sh->h_stage[queued]);
        }
        /* every device that queued anything is waited for, after a failure too:
           its copies read the ids and staging buffers */
        for (s = 0; s < queued; s++) {
            mskv_cuda_store *st = sh->st[s];
            mskv_result e = mskv__cuda_enter(st->cu);
            mskv_cu_result r = e == MSKV_SUCCESS ? st->cu->fn.cuStreamSynchronize(st->stream) : MSKV_CU_SUCCESS;
            if (e == MSKV_SUCCESS && r != MSKV_CU_SUCCESS)
                e = mskv__cuda_fail(st->cu, r, dir ? "cuStreamSynchronize(reload)" : "cuStreamSynchronize(offload)");
            if (res == MSKV_SUCCESS) res = e;
        }
        if (!dir && res == MSKV_SUCCESS) mskv__cuda_shards_interleave(sh, 0, c, (char *)host + (size_t)done * sh->full_set);
    }
    for (s = sh->n - 1; s >= 0; s--) mskv__cuda_unlock(&sh->st[s]->lock);
    return res;
}

static mskv_result mskv__cuda_shards_read(void *user, const int32_t *pages, int32_t n, void *dst) {
    return mskv__cuda_shards_io((mskv_cuda_shards *)user, 0, pages, n, dst);
}
static mskv_result mskv__cuda_shards_write(void *user, const int32_t *pages, int32_t n, const void *src) {
    /* only read from: the cast serves the shared code */
    return mskv__cuda_shards_io((mskv_cuda_shards *)user, 1, pages, n, (void *)(uintptr_t)src);
}
/* fork, flush and poisoning: the store's op on every device (a failed fork's
   destination page goes back to the arena, whatever a device holds in it) */
static mskv_result mskv__cuda_shards_copy(void *user, int32_t src, int32_t dst) {
    mskv_cuda_shards *sh = (mskv_cuda_shards *)user;
    mskv_result res = MSKV_SUCCESS;
    int32_t s;
    for (s = 0; s < sh->n && res == MSKV_SUCCESS; s++) res = mskv__cuda_copy_page(sh->st[s], src, dst);
    return res;
}
static mskv_result mskv__cuda_shards_flush(void *user) {
    mskv_cuda_shards *sh = (mskv_cuda_shards *)user;
    mskv_result res = MSKV_SUCCESS, e;
    int32_t s;
    for (s = 0; s < sh->n; s++)   /* every device, even after one failed */
        if ((e = mskv__cuda_flush(sh->st[s])) != MSKV_SUCCESS && res == MSKV_SUCCESS) res = e;
    return res;
}
static mskv_result mskv__cuda_shards_fill(void *user, const int32_t *pages, int32_t n, unsigned char byte) {
    mskv_cuda_shards *sh = (mskv_cuda_shards *)user;
    mskv_result res = MSKV_SUCCESS;
    int32_t s;
    for (s = 0; s < sh->n && res == MSKV_SUCCESS; s++) res = mskv__cuda_fill_pages(sh->st[s], pages, n, byte);
    return res;
}

/* Hands the arena every fence that completed on all devices: the lowest of
   the shards' highest completed fences. */
static mskv_result mskv__cuda_shards_settle(mskv_cuda_shards *sh) {
    uint64_t low = UINT64_MAX;
    int32_t s;
    for (s = 0; s < sh->n; s++) {
        mskv_cuda_store *st = sh->st[s];
        uint64_t d;
        mskv__cuda_lock(&st->lock);
        d = st->done;
        mskv__cuda_unlock(&st->lock);
        if (d < low) low = d;
    }
    mskv__cuda_lock(&sh->lock);
    if (low <= sh->retired || !sh->arena) low = 0;
    else sh->retired = low;
    mskv__cuda_unlock(&sh->lock);
    return low ? mskv_arena_retire(sh->arena, low) : MSKV_SUCCESS;
}

static void mskv__cuda_shards_release(mskv_cuda_shards *sh) {
    const mskv_allocator al = sh->cu[0]->allocator;   /* create set it before anything could fail */
    int32_t s;
    for (s = 0; s < sh->n; s++) {
        if (sh->h_stage[s] && mskv__cuda_enter(sh->cu[s]) == MSKV_SUCCESS) sh->cu[s]->fn.cuMemFreeHost(sh->h_stage[s]);
        if (sh->st[s]) mskv_cuda_store_destroy(sh->st[s]);
    }
    mskv__cuda_dealloc(&al, sh);
}

MSKV_API mskv_result mskv_cuda_shards_create(const mskv_cuda_shard_desc *desc, mskv_cuda_shards **out) {
    mskv_cuda_shards *sh;
    mskv_cuda_store_desc sd;
    mskv_result res = MSKV_SUCCESS;
    int32_t s, n;
    if (!desc || !out) return MSKV_ERROR_NULL_POINTER;
    *out = NULL;
    n = desc->num_shards;
    if (n < 1 || n > MSKV_CUDA_MAX_SHARDS || !desc->devices || desc->store.pools || desc->store.kv_heads < 1 ||
        desc->store.kv_heads % n != 0)
        return MSKV_ERROR_INVALID_ARGUMENT;
    for (s = 0; s < n; s++)
        if (!desc->devices[s] || (desc->pools && !desc->pools[s])) return MSKV_ERROR_INVALID_ARGUMENT;
    sh = (mskv_cuda_shards *)mskv__cuda_calloc(&desc->devices[0]->allocator, sizeof(*sh));
    if (!sh) return MSKV_ERROR_OUT_OF_MEMORY;
    {
        mskv__cuda_mutex m = MSKV__CUDA_MUTEX_INIT;
        sh->lock = m;
    }
    sh->n = n;
    sh->d = desc->store;
    for (s = 0; s < n; s++) sh->cu[s] = desc->devices[s];
    sd = desc->store;
    sd.kv_heads = desc->store.kv_heads / n;
    for (s = 0; s < n && res == MSKV_SUCCESS; s++) {
        sd.pools = desc->pools ? desc->pools[s] : NULL;
        res = mskv_cuda_store_create(sh->cu[s], &sd, &sh->st[s]);
        if (res == MSKV_SUCCESS) res = mskv__cuda_enter(sh->cu[s]);
        if (res == MSKV_SUCCESS) {
            mskv_cu_result r = sh->cu[s]->fn.cuMemAllocHost(&sh->h_stage[s], sh->st[s]->stage_bytes);
            if (r != MSKV_CU_SUCCESS) { sh->h_stage[s] = NULL; res = mskv__cuda_fail(sh->cu[s], r, "cuMemAllocHost(shard staging)"); }
        }
    }
    if (res != MSKV_SUCCESS) {
        mskv__cuda_shards_release(sh);
        return res;
    }
    /* same geometry on every device, so the same chunk; the arena's record
       is N shard records side by side (the products fit: each store checked its own) */
    sh->chunk = sh->st[0]->stage_pages;
    sh->row_bytes = (size_t)sd.kv_heads * (size_t)sd.head_dim * mskv_dtype_size(sd.dtype);
    sh->shard_set = sh->st[0]->set_bytes;
    if (!mskv__cuda_mul(sh->shard_set, (size_t)n, &sh->full_set)) {
        mskv__cuda_shards_release(sh);
        return MSKV_ERROR_OVERFLOW;
    }
    sh->ops.user = sh;
    sh->ops.read_pages = mskv__cuda_shards_read;
    sh->ops.write_pages = mskv__cuda_shards_write;
    sh->ops.copy_page = mskv__cuda_shards_copy;
    sh->ops.flush = mskv__cuda_shards_flush;
    sh->ops.fill_pages = mskv__cuda_shards_fill;
    *out = sh;
    return MSKV_SUCCESS;
}

MSKV_API void mskv_cuda_shards_destroy(mskv_cuda_shards *sh) {
    if (sh) mskv__cuda_shards_release(sh);
}

MSKV_API mskv_result mskv_cuda_shards_arena_desc(mskv_cuda_shards *sh, mskv_arena_desc *d) {
    if (!sh || !d) return MSKV_ERROR_NULL_POINTER;
    d->num_pages = sh->d.num_pages;
    d->page_size = sh->d.page_size;
    d->num_layers = sh->d.num_layers;
    d->kv_heads = sh->d.kv_heads;
    d->head_dim = sh->d.head_dim;
    d->dtype = sh->d.dtype;
    d->store_ops = &sh->ops;
    d->retire_mode = MSKV_RETIRE_FENCED;
    return MSKV_SUCCESS;
}

MSKV_API mskv_result mskv_cuda_shards_bind(mskv_cuda_shards *sh, mskv_arena *arena) {
    mskv_store_info info;
    mskv_result res;
    int32_t s;
    if (!sh || !arena) return MSKV_ERROR_NULL_POINTER;
    if ((res = mskv_store_info_get(arena, &info)) != MSKV_SUCCESS) return res;
    if (info.num_pages != sh->d.num_pages || info.page_size != sh->d.page_size || info.num_layers != sh->d.num_layers ||
        info.kv_heads != sh->d.kv_heads || info.head_dim != sh->d.head_dim || info.dtype != sh->d.dtype)
        return MSKV_ERROR_INVALID_ARGUMENT;
    sh->arena = arena;
    /* the stores check plans against it; their fences retire through the shards */
    for (s = 0; s < sh->n; s++) {
        sh->st[s]->arena = arena;
        sh->st[s]->owner = sh;
    }
    return MSKV_SUCCESS;
}

MSKV_API int32_t mskv_cuda_shards_count(const mskv_cuda_shards *sh) { return sh ? sh->n : 0; }

MSKV_API mskv_cuda_store *mskv_cuda_shards_store(mskv_cuda_shards *sh, int32_t shard) {
    return sh && shard >= 0 && shard < sh->n ? sh->st[shard] : NULL;
}

MSKV_API mskv_result mskv_cuda_shards_plan_upload(mskv_cuda_shards *sh, const mskv_plan *plan, mskv_pos_mode pos_mode,
                                                  mskv_cuda_dplan *out) {
    mskv_result res = MSKV_SUCCESS;
    int32_t s;
    if (!sh || !plan || !out) return MSKV_ERROR_NULL_POINTER;
    sh->plan_ok = 0;
    for (s = 0; s < sh->n && res == MSKV_SUCCESS; s++) res = mskv_cuda_plan_upload(sh->st[s], plan, pos_mode, &out[s]);
    sh->plan_ok = res == MSKV_SUCCESS;
    return res;
}

static mskv_result mskv__cuda_shards_launchable(const mskv_cuda_shards *sh, int32_t shard, const mskv_cuda_dplan *dplan) {
    if (!sh || !dplan) return MSKV_ERROR_NULL_POINTER;
    if (shard < 0 || shard >= sh->n) return MSKV_ERROR_OUT_OF_RANGE;
    /* a device whose upload failed holds the plan before it: no device runs either */
    return sh->plan_ok ? MSKV_SUCCESS : MSKV_ERROR_BAD_STATE;
}

MSKV_API mskv_result mskv_cuda_shards_write_kv(mskv_cuda_shards *sh, int32_t shard, int32_t layer, const mskv_cuda_dplan *dplan,
                                               mskv_cu_ptr k, mskv_cu_ptr v, const mskv_rope *rope) {
    mskv_result res = mskv__cuda_shards_launchable(sh, shard, dplan);
    return res == MSKV_SUCCESS ? mskv_cuda_write_kv(sh->st[shard], layer, dplan, k, v, rope) : res;
}

MSKV_API mskv_result mskv_cuda_shards_attention(mskv_cuda_shards *sh, int32_t shard, int32_t layer, const mskv_plan *plan,
                                                const mskv_cuda_dplan *dplan, const mskv_attn *attn,
                                                mskv_cu_ptr q, mskv_cu_ptr o, mskv_cu_ptr lse) {
    mskv_attn part;
    mskv_result res = mskv__cuda_shards_launchable(sh, shard, dplan);
    if (res != MSKV_SUCCESS) return res;
    if (!attn) return MSKV_ERROR_NULL_POINTER;
    /* a GQA group must not straddle devices: each gets q_heads / N whole groups */
    if (attn->q_heads < 1 || attn->q_heads % sh->n != 0) return MSKV_ERROR_INVALID_ARGUMENT;
    part = *attn;
    part.q_heads = attn->q_heads / sh->n;
    return mskv_cuda_attention(sh->st[shard], layer, plan, dplan, &part, q, o, lse);
}

MSKV_API mskv_result mskv_cuda_shards_retire(mskv_cuda_shards *sh, int wait) {
    mskv_result res = MSKV_SUCCESS, e;
    int32_t s;
    if (!sh) return MSKV_ERROR_NULL_POINTER;
    for (s = 0; s < sh->n; s++)   /* each settles the shards as it finishes */
        if ((e = mskv_cuda_retire(sh->st[s], wait)) != MSKV_SUCCESS && res == MSKV_SUCCESS) res = e;
    return res;
}

MSKV_API mskv_result mskv_cuda_shards_publish(mskv_cuda_shards *sh, const mskv_segment *segs, int32_t n, uint64_t *step_out) {
    uint64_t step = 0;
    mskv_result res, first = MSKV_SUCCESS;
    int32_t s;
    if (!sh) return MSKV_ERROR_NULL_POINTER;
    if (!sh->arena) return MSKV_ERROR_BAD_STATE;
    for (s = 0; s < sh->n; s++)
        if (sh->st[s]->capturing) return MSKV_ERROR_BAD_STATE;
    if ((res = mskv_publish(sh->arena, segs, n, &step)) != MSKV_SUCCESS) return res;
    if (step_out) *step_out = step;
    for (s = 0; s < sh->n; s++) {
        mskv_cuda_store *st = sh->st[s];
        if ((res = mskv_cuda_fence_record(st, step)) == MSKV_SUCCESS) continue;
        /* no event on this device: it counts as done with the step once its
           stream is idle (until then the step's pages wait, on every device) */
        if (first == MSKV_SUCCESS) first = res;
        if (mskv__cuda_enter(st->cu) == MSKV_SUCCESS && st->cu->fn.cuStreamSynchronize(st->stream) == MSKV_CU_SUCCESS) {
            mskv__cuda_lock(&st->lock);
            if (st->done < step) st->done = step;
            mskv__cuda_unlock(&st->lock);
        }
    }
    res = mskv_cuda_shards_retire(sh, 0);
    return first != MSKV_SUCCESS ? first : res;
}

MSKV_API mskv_result mskv_cuda_shards_sync(mskv_cuda_shards *sh) {
    mskv_result res = MSKV_SUCCESS, e;
    int32_t s;
    if (!sh) return MSKV_ERROR_NULL_POINTER;
    for (s = 0; s < sh->n; s++)
        if ((e = mskv_cuda_store_sync(sh->st[s])) != MSKV_SUCCESS && res == MSKV_SUCCESS) res = e;
    return res;
}

/* // >>self-test implementation ---------------------------------------------
   The first time a context loads an attention or K/V write variant it runs
   the variant once on a small fixed problem and compares with the CPU
   backend (mstar_kv.h) at the GPU check's parity tolerances, before any
   caller's data goes through it. The attention problem: GQA 4:2, pages of
   16 slots in scattered order, a causal mask, two sequences of 150 and 37
   keys (both end mid-page and mid-tile; the 150 holds a whole 128-key tile
   and page edges inside every tile), prefill (40 and 9 queries) or decode
   (one each) as the variant's layout; the variant is forced (a private
   store on its own stream). The K/V write problem: 37 tokens scattered over
   three pages, the variant's RoPE and source dtype, every slot of the pool
   compared (a write to a wrong slot shows). A variant that does not match
   is marked bad for the context (and beside its disk-cache entry, for this
   device), logged with its worst error, and not used: sm_90a falls back to
   mma.sync, and a kernel with nothing to fall back to fails its call with
   MSKV_ERROR_CUDA. A kernel that faults cannot be recovered from in-process
   (the CUDA context is lost): the GPU check runs each path in a process of
   its own. */

#define MSKV__ST_PAGES 16
#define MSKV__ST_P 16
#define MSKV__ST_KVH 2
#define MSKV__ST_QH 4

static uint32_t mskv__st_rand(uint32_t *s) {
    *s ^= *s << 13; *s ^= *s >> 17; *s ^= *s << 5;
    return *s;
}
/* uniform in [-1, 1) */
static float mskv__st_uniform(uint32_t *s) { return (float)((int32_t)(mskv__st_rand(s) >> 8) - (1 << 23)) / (float)(1 << 23); }

static void mskv__st_put(void *buf, mskv_dtype dt, size_t i, float x) {
    if (dt == MSKV_DTYPE_F32) ((float *)buf)[i] = x;
    else ((uint16_t *)buf)[i] = dt == MSKV_DTYPE_BF16 ? mskv_f32_to_bf16(x) : mskv_f32_to_f16(x);
}
static float mskv__st_get(const void *buf, mskv_dtype dt, size_t i) {
    if (dt == MSKV_DTYPE_F32) return ((const float *)buf)[i];
    return dt == MSKV_DTYPE_BF16 ? mskv_bf16_to_f32(((const uint16_t *)buf)[i]) : mskv_f16_to_f32(((const uint16_t *)buf)[i]);
}

static double mskv__st_now_ms(void) {
#ifdef _WIN32
    LARGE_INTEGER f, c;
    if (!QueryPerformanceFrequency(&f) || !QueryPerformanceCounter(&c) || f.QuadPart == 0) return 0;
    return (double)c.QuadPart * 1000.0 / (double)f.QuadPart;
#elif defined(CLOCK_MONOTONIC)
    struct timespec t;
    if (clock_gettime(CLOCK_MONOTONIC, &t) != 0) return 0;
    return (double)t.tv_sec * 1000.0 + (double)t.tv_nsec / 1e6;
#else
    return 0;   /* <time.h> without POSIX clocks (strict C without feature macros): no figure */
#endif
}

/* The private store a problem runs on: one layer of MSKV__ST_PAGES pages,
   the smallest staging and plan buffers, its own stream. */
static mskv_result mskv__st_store(mskv_cuda *cu, mskv_dtype dt, int32_t D, mskv_cuda_store **out) {
    mskv_cuda_store_desc sd;
    memset(&sd, 0, sizeof(sd));
    sd.num_pages = MSKV__ST_PAGES; sd.page_size = MSKV__ST_P; sd.num_layers = 1; sd.kv_heads = MSKV__ST_KVH;
    sd.head_dim = D; sd.dtype = dt; sd.max_batch = 2; sd.max_tokens = 64; sd.max_page_ids = 16; sd.plan_ring = 1;
    sd.staging_bytes = (size_t)MSKV__ST_P * MSKV__ST_KVH * (size_t)D * mskv_dtype_size(dt) * 2;
    return mskv_cuda_store_create(cu, &sd, out);
}

/* 1 and the detail when r is the launch or its wait failing after f ran:
   the kernel faulted (CUDA has lost the context) */
static int mskv__st_faulted(mskv_cuda *cu, const mskv_cuda_store *st, mskv_cu_function f, mskv_result r, char *detail,
                            size_t cap) {
    if (r != MSKV_ERROR_CUDA || st->selftest_seen != f) return 0;
    mskv__cuda_format(detail, cap, "faulted: %.300s", cu->err);
    return 1;
}

/* The plan of the problem: two sequences over scattered pages. */
typedef struct mskv__st_plan {
    mskv_plan p;
    int32_t qo[3], kvp[3], ids[13], last[2], kvl[2], split[2], shift[2];
} mskv__st_plan;

static void mskv__st_plan_make(mskv__st_plan *s, int decode) {
    static const int32_t ids[13] = { 7, 2, 11, 4, 13, 9, 1, 6, 12, 3, 10, 5, 8 };
    memset(s, 0, sizeof(*s));
    memcpy(s->ids, ids, sizeof(ids));
    s->kvl[0] = 150; s->kvl[1] = 37;
    s->qo[0] = 0; s->qo[1] = decode ? 1 : 40; s->qo[2] = s->qo[1] + (decode ? 1 : 9);
    s->kvp[0] = 0; s->kvp[1] = 10; s->kvp[2] = 13;
    s->last[0] = 150 - 9 * MSKV__ST_P; s->last[1] = 37 - 2 * MSKV__ST_P;
    s->split[0] = s->kvl[0]; s->split[1] = s->kvl[1];
    s->p.batch = 2; s->p.total_q = s->qo[2]; s->p.num_page_ids = 13; s->p.page_size = MSKV__ST_P;
    s->p.qo_indptr = s->qo; s->p.kv_indptr = s->kvp; s->p.kv_indices = s->ids; s->p.kv_last_page_len = s->last;
    s->p.kv_len = s->kvl; s->p.kv_pos_split = s->split; s->p.kv_pos_shift = s->shift;
    s->p.cap_batch = 2; s->p.cap_tokens = s->p.total_q; s->p.cap_page_ids = 13;
}

/* worst |gpu - cpu| over n values, and over the relative form */
typedef struct mskv__st_err { double abs_err, rel_err; int bad; } mskv__st_err;

static void mskv__st_compare(mskv__st_err *e, float gpu, float cpu, double tol_abs, double tol_rel) {
    double d = fabs((double)gpu - (double)cpu);
    if (gpu != gpu || (d > tol_abs + tol_rel * fabs((double)cpu))) e->bad++;
    if (gpu != gpu) d = 1e30;
    if (d > e->abs_err) e->abs_err = d;
    if (fabs((double)cpu) > 1e-3 && d / fabs((double)cpu) > e->rel_err) e->rel_err = d / fabs((double)cpu);
}

/* -1: could not run (res says why: the caller's failure, nothing known of
   the kernel), 0: mismatch, 1: passed, 2: not applicable (the wrappers do
   not take this variant's dtype or shape) */
static int mskv__st_attention(mskv_cuda *cu, int kernel, const mskv__cuda_defines *defs, mskv_cu_function f,
                              char *detail, size_t cap, mskv_result *res_out) {
    const mskv_dtype dt = (mskv_dtype)defs->value[MSKV__D_DTYPE];
    const int32_t D = defs->value[MSKV__D_HEAD_DIM];
    const int decode = kernel == MSKV__K_ATTN && defs->value[MSKV__D_ATTN_WARP_KEYS];
    const size_t es = mskv_dtype_size(dt);
    mskv_cuda_store *st = NULL;
    mskv__st_plan sp;
    mskv_cuda_dplan dp;
    mskv_pools pools;
    mskv_attn at;
    mskv_cu_ptr dq = 0, dout = 0, dlse = 0;
    size_t pool_elems = (size_t)MSKV__ST_PAGES * MSKV__ST_P * MSKV__ST_KVH * (size_t)D, q_elems, rows, i;
    unsigned char *hk = NULL, *hv = NULL, *hq = NULL, *ho = NULL, *ref = NULL;
    float *hl = NULL, *lref = NULL;
    mskv__st_err eo, el;
    uint32_t seed = 0x9e3779b9u ^ (uint32_t)D ^ ((uint32_t)dt << 12) ^ ((uint32_t)decode << 16);
    double tol = dt == MSKV_DTYPE_F16 ? 4e-3 : dt == MSKV_DTYPE_BF16 ? 2.5e-2 : 1e-4;
    int verdict = -1;
    mskv_result r;
    memset(&eo, 0, sizeof(eo));
    memset(&el, 0, sizeof(el));
    mskv__st_plan_make(&sp, decode);
    q_elems = (size_t)sp.p.total_q * MSKV__ST_QH * (size_t)D;
    rows = (size_t)sp.p.total_q * MSKV__ST_QH;
    if ((r = mskv__st_store(cu, dt, D, &st)) != MSKV_SUCCESS) goto done;
    st->selftest_path = kernel == MSKV__K_ATTN_SM90 ? 2 : 1;
    hk = (unsigned char *)mskv__cuda_alloc(&cu->allocator, pool_elems * es);
    hv = (unsigned char *)mskv__cuda_alloc(&cu->allocator, pool_elems * es);
    hq = (unsigned char *)mskv__cuda_alloc(&cu->allocator, q_elems * es);
    ho = (unsigned char *)mskv__cuda_calloc(&cu->allocator, q_elems * es);
    ref = (unsigned char *)mskv__cuda_alloc(&cu->allocator, q_elems * es);
    hl = (float *)mskv__cuda_calloc(&cu->allocator, rows * sizeof(float));
    lref = (float *)mskv__cuda_alloc(&cu->allocator, rows * sizeof(float));
    r = MSKV_ERROR_OUT_OF_MEMORY;
    if (!hk || !hv || !hq || !ho || !ref || !hl || !lref) goto done;
    /* every slot holds data, the unused ones too: a read outside the plan shows */
    for (i = 0; i < pool_elems; i++) { mskv__st_put(hk, dt, i, mskv__st_uniform(&seed)); mskv__st_put(hv, dt, i, mskv__st_uniform(&seed)); }
    for (i = 0; i < q_elems; i++) mskv__st_put(hq, dt, i, 2.0f * mskv__st_uniform(&seed));
    pools.k = hk; pools.v = hv; pools.dtype = dt; pools.num_pages = MSKV__ST_PAGES; pools.page_size = MSKV__ST_P;
    pools.kv_heads = MSKV__ST_KVH; pools.head_dim = D;
    memset(&at, 0, sizeof(at));
    at.q_heads = MSKV__ST_QH; at.mask = MSKV_MASK_CAUSAL; at.q_dtype = dt;
    if ((r = mskv_cpu_attention_pools(NULL, &pools, &sp.p, &at, hq, ref, lref)) != MSKV_SUCCESS) goto done;
    if ((r = mskv_cuda_malloc(cu, q_elems * es, &dq)) != MSKV_SUCCESS ||
        (r = mskv_cuda_malloc(cu, q_elems * es, &dout)) != MSKV_SUCCESS ||
        (r = mskv_cuda_malloc(cu, rows * sizeof(float), &dlse)) != MSKV_SUCCESS ||
        (r = mskv_cuda_upload(st, mskv_cuda_store_pool(st, 0, 0), hk, pool_elems * es)) != MSKV_SUCCESS ||
        (r = mskv_cuda_upload(st, mskv_cuda_store_pool(st, 0, 1), hv, pool_elems * es)) != MSKV_SUCCESS ||
        (r = mskv_cuda_upload(st, dq, hq, q_elems * es)) != MSKV_SUCCESS ||
        (r = mskv_cuda_plan_upload(st, &sp.p, MSKV_POS_NONE, &dp)) != MSKV_SUCCESS)
        goto done;
    r = mskv_cuda_attention(st, 0, &sp.p, &dp, &at, dq, dout, dlse);
    if (r == MSKV_SUCCESS) r = mskv_cuda_download(st, ho, dout, q_elems * es);
    if (r == MSKV_SUCCESS) r = mskv_cuda_download(st, hl, dlse, rows * sizeof(float));
    if (mskv__st_faulted(cu, st, f, r, detail, cap)) { verdict = 3; goto done; }
    if (r == MSKV_ERROR_UNSUPPORTED || r == MSKV_ERROR_INVALID_ARGUMENT) {
        /* a dtype or head_dim the attention wrappers do not take */
        verdict = 2;
        r = MSKV_SUCCESS;
        goto done;
    }
    if (r != MSKV_SUCCESS) goto done;
    if (st->selftest_seen != f) {
        /* the wrappers chose another kernel for this shape: nothing learnt of f */
        verdict = 2;
        goto done;
    }
    for (i = 0; i < q_elems; i++) mskv__st_compare(&eo, mskv__st_get(ho, dt, i), mskv__st_get(ref, dt, i), tol, 0);
    for (i = 0; i < rows; i++) mskv__st_compare(&el, hl[i], lref[i], 2e-3, 0);
    verdict = eo.bad == 0 && el.bad == 0;
    mskv__cuda_format(detail, cap, "o err %.2g (tol %.2g), lse err %.2g (tol 2e-3)", eo.abs_err, tol, el.abs_err);
done:
    if (dq) mskv_cuda_free(cu, dq);
    if (dout) mskv_cuda_free(cu, dout);
    if (dlse) mskv_cuda_free(cu, dlse);
    if (st) mskv_cuda_store_destroy(st);
    mskv__cuda_dealloc(&cu->allocator, hk); mskv__cuda_dealloc(&cu->allocator, hv);
    mskv__cuda_dealloc(&cu->allocator, hq); mskv__cuda_dealloc(&cu->allocator, ho);
    mskv__cuda_dealloc(&cu->allocator, ref); mskv__cuda_dealloc(&cu->allocator, hl);
    mskv__cuda_dealloc(&cu->allocator, lref);
    *res_out = r;
    return verdict;
}

/* The K/V write variant's problem: 37 tokens of the variant's source dtype
   and RoPE into three scattered pages; every pool element compared. */
static int mskv__st_kv_write(mskv_cuda *cu, const mskv__cuda_defines *defs, mskv_cu_function f, char *detail,
                             size_t cap, mskv_result *res_out) {
    const mskv_dtype dt = (mskv_dtype)defs->value[MSKV__D_DTYPE], src = (mskv_dtype)defs->value[MSKV__D_SRC_DTYPE];
    const int32_t D = defs->value[MSKV__D_HEAD_DIM], n = 37;
    const size_t es = mskv_dtype_size(dt), ss = mskv_dtype_size(src);
    static const int32_t pages[3] = { 5, 9, 2 };
    mskv_cuda_store *st = NULL;
    mskv__st_plan sp;
    mskv_cuda_dplan dp;
    mskv_pools pools;
    mskv_rope rope, *rp = NULL;
    mskv_cu_ptr dk = 0, dv = 0;
    size_t pool_elems = (size_t)MSKV__ST_PAGES * MSKV__ST_P * MSKV__ST_KVH * (size_t)D, src_elems = (size_t)n * MSKV__ST_KVH * (size_t)D, i;
    unsigned char *hk = NULL, *hv = NULL, *gk = NULL, *gv = NULL, *sk = NULL, *sv = NULL;
    int64_t slots[37];
    int32_t pos[3 * 37];
    mskv__st_err e;
    uint32_t seed = 0x85ebca6bu ^ (uint32_t)D ^ ((uint32_t)dt << 12) ^ ((uint32_t)src << 14);
    double tol_rel = dt == MSKV_DTYPE_BF16 ? 1.6e-2 : dt == MSKV_DTYPE_F16 ? 2e-3 : 1e-5;
    int verdict = -1;
    mskv_result r;
    memset(&e, 0, sizeof(e));
    mskv__st_plan_make(&sp, 0);
    /* one sequence of 48 keys on pages 5, 9, 2; the 37 new tokens land one page after another */
    sp.p.batch = 1; sp.p.total_q = n; sp.p.num_page_ids = 3;
    sp.qo[1] = n; sp.kvp[1] = 3; sp.kvl[0] = 48; sp.split[0] = 48; sp.last[0] = MSKV__ST_P;
    memcpy(sp.ids, pages, sizeof(pages));
    for (i = 0; i < (size_t)n; i++) {
        slots[i] = (int64_t)pages[i % 3] * MSKV__ST_P + (int64_t)(i / 3);
        if (defs->value[MSKV__D_ROPE] == 2) {   /* (frame, row, col) on a 3 x 4 grid */
            pos[3 * i] = (int32_t)(i / 12); pos[3 * i + 1] = (int32_t)(i / 4 % 3); pos[3 * i + 2] = (int32_t)(i % 4);
        } else {
            pos[i] = (int32_t)(3 * i + 1);
        }
    }
    sp.p.slot_mapping = slots;
    sp.p.positions = pos;
    memset(&rope, 0, sizeof(rope));
    if (defs->value[MSKV__D_ROPE]) {
        rope.mode = defs->value[MSKV__D_ROPE] == 2 ? MSKV_POS_3D : MSKV_POS_1D;
        rope.style = defs->value[MSKV__D_ROPE_STYLE] ? MSKV_ROPE_INTERLEAVED : MSKV_ROPE_HALF;
        rope.dims[0] = defs->value[MSKV__D_ROPE_D0];
        rope.dims[1] = defs->value[MSKV__D_ROPE_D1];
        rope.dims[2] = defs->value[MSKV__D_ROPE_D2];
        rp = &rope;
    }
    if ((r = mskv__st_store(cu, dt, D, &st)) != MSKV_SUCCESS) goto done;
    hk = (unsigned char *)mskv__cuda_calloc(&cu->allocator, pool_elems * es);
    hv = (unsigned char *)mskv__cuda_calloc(&cu->allocator, pool_elems * es);
    gk = (unsigned char *)mskv__cuda_alloc(&cu->allocator, pool_elems * es);
    gv = (unsigned char *)mskv__cuda_calloc(&cu->allocator, pool_elems * es);
    sk = (unsigned char *)mskv__cuda_alloc(&cu->allocator, src_elems * ss);
    sv = (unsigned char *)mskv__cuda_alloc(&cu->allocator, src_elems * ss);
    r = MSKV_ERROR_OUT_OF_MEMORY;
    if (!hk || !hv || !gk || !gv || !sk || !sv) goto done;
    for (i = 0; i < src_elems; i++) { mskv__st_put(sk, src, i, mskv__st_uniform(&seed)); mskv__st_put(sv, src, i, mskv__st_uniform(&seed)); }
    pools.k = hk; pools.v = hv; pools.dtype = dt; pools.num_pages = MSKV__ST_PAGES; pools.page_size = MSKV__ST_P;
    pools.kv_heads = MSKV__ST_KVH; pools.head_dim = D;
    if ((r = mskv_cpu_write_kv_pools(&pools, &sp.p, sk, sv, src, rp)) != MSKV_SUCCESS) goto done;
    if ((r = mskv_cuda_malloc(cu, src_elems * ss, &dk)) != MSKV_SUCCESS ||
        (r = mskv_cuda_malloc(cu, src_elems * ss, &dv)) != MSKV_SUCCESS ||
        (r = mskv_cuda_upload(st, dk, sk, src_elems * ss)) != MSKV_SUCCESS ||
        (r = mskv_cuda_upload(st, dv, sv, src_elems * ss)) != MSKV_SUCCESS ||
        (r = mskv_cuda_plan_upload(st, &sp.p, rp ? rope.mode : MSKV_POS_NONE, &dp)) != MSKV_SUCCESS)
        goto done;
    /* the pools start zeroed, as the host copy */
    memset(gk, 0, pool_elems * es);
    if ((r = mskv_cuda_upload(st, mskv_cuda_store_pool(st, 0, 0), gk, pool_elems * es)) != MSKV_SUCCESS ||
        (r = mskv_cuda_upload(st, mskv_cuda_store_pool(st, 0, 1), gk, pool_elems * es)) != MSKV_SUCCESS)
        goto done;
    r = mskv_cuda_write_kv_ex(st, 0, &dp, dk, dv, src, rp);
    if (r == MSKV_SUCCESS) r = mskv_cuda_download(st, gk, mskv_cuda_store_pool(st, 0, 0), pool_elems * es);
    if (r == MSKV_SUCCESS) r = mskv_cuda_download(st, gv, mskv_cuda_store_pool(st, 0, 1), pool_elems * es);
    if (mskv__st_faulted(cu, st, f, r, detail, cap)) { verdict = 3; goto done; }
    if (r != MSKV_SUCCESS) goto done;
    if (st->selftest_seen != f) { verdict = 2; goto done; }
    for (i = 0; i < pool_elems; i++) {
        /* K within a pool ulp or two plus the angles' f32 error (RoPE), V likewise (a plain conversion: exact) */
        mskv__st_compare(&e, mskv__st_get(gk, dt, i), mskv__st_get(hk, dt, i), 1e-3, tol_rel);
        mskv__st_compare(&e, mskv__st_get(gv, dt, i), mskv__st_get(hv, dt, i), 1e-3, tol_rel);
    }
    verdict = e.bad == 0;
    mskv__cuda_format(detail, cap, "%d of %d values off, worst err %.2g (tol %.2g relative)", e.bad,
                      (int)(2 * pool_elems), e.abs_err, tol_rel);
done:
    if (dk) mskv_cuda_free(cu, dk);
    if (dv) mskv_cuda_free(cu, dv);
    if (st) mskv_cuda_store_destroy(st);
    mskv__cuda_dealloc(&cu->allocator, hk); mskv__cuda_dealloc(&cu->allocator, hv);
    mskv__cuda_dealloc(&cu->allocator, gk); mskv__cuda_dealloc(&cu->allocator, gv);
    mskv__cuda_dealloc(&cu->allocator, sk); mskv__cuda_dealloc(&cu->allocator, sv);
    *res_out = r;
    return verdict;
}

/* A name for a variant in logs and the report: "mskv_attn_sm90 bf16 d128". */
static void mskv__st_name(char *out, size_t cap, int kernel, const mskv__cuda_defines *d) {
    static const char *const dts[3] = { "f32", "f16", "bf16" };
    int dt = d->value[MSKV__D_DTYPE];
    mskv__cuda_format(out, cap, "%s %s d%d", mskv__cuda_kernel_names[kernel], dt >= 0 && dt < 3 ? dts[dt] : "?",
                      (int)d->value[MSKV__D_HEAD_DIM]);
    if (kernel == MSKV__K_ATTN) mskv__cuda_appendf(out, cap, d->value[MSKV__D_ATTN_WARP_KEYS] ? " decode" : " prefill");
    if (kernel == MSKV__K_KV_WRITE) {
        int s = d->value[MSKV__D_SRC_DTYPE];
        mskv__cuda_appendf(out, cap, " from %s", s >= 0 && s < 3 ? dts[s] : "?");
        if (d->value[MSKV__D_ROPE])
            mskv__cuda_appendf(out, cap, " rope %s%s (%d,%d,%d)", d->value[MSKV__D_ROPE] == 2 ? "3d" : "1d",
                               d->value[MSKV__D_ROPE_STYLE] ? " interleaved" : "", (int)d->value[MSKV__D_ROPE_D0],
                               (int)d->value[MSKV__D_ROPE_D1], (int)d->value[MSKV__D_ROPE_D2]);
    }
}

/* The sidecar of a variant's disk-cache entry that records a failed self-test per device. */
static void mskv__st_mark_path(char *out, size_t cap, const char *entry) { mskv__cuda_format(out, cap, "%s.selftest-failed", entry); }

static void mskv__st_mark(mskv_cuda *cu, const char *entry, const char *line) {
    char path[600], tmp[640];
    size_t size = 0, n;
    unsigned char *old;
    const void *parts[2];
    size_t len[2];
    static unsigned long serial;
    if (!entry[0]) return;
    mskv__st_mark_path(path, sizeof(path), entry);
    old = mskv__cuda_read_file(&cu->allocator, path, &size);
    parts[0] = old ? (const void *)old : (const void *)""; len[0] = old ? size : 0;
    parts[1] = line; len[1] = strlen(line);
    mskv__cuda_format(tmp, sizeof(tmp), "%s.%lu.%lu.tmp", path, mskv__cuda_pid(), ++serial);
    n = mskv__cuda_write_replace(tmp, path, parts, len, 2);
    (void)n;
    mskv__cuda_dealloc(&cu->allocator, old);
}

/* 1 and the reason when the sidecar says this variant failed on this device */
static int mskv__st_marked(mskv_cuda *cu, const char *entry, const char *key, char *why, size_t cap) {
    char path[600];
    size_t size = 0, klen = strlen(key);
    unsigned char *buf;
    const char *at, *end;
    int found = 0;
    if (!entry[0]) return 0;
    mskv__st_mark_path(path, sizeof(path), entry);
    if ((buf = mskv__cuda_read_file(&cu->allocator, path, &size)) == NULL) return 0;
    buf[size] = 0;
    for (at = (const char *)buf; *at && !found; at = *end ? end + 1 : end) {
        end = strchr(at, '\n');
        if (!end) end = at + strlen(at);
        if ((size_t)(end - at) > klen && memcmp(at, key, klen) == 0 && at[klen] == '\t') {
            size_t n = (size_t)(end - at) - klen - 1;
            if (n >= cap) n = cap - 1;
            memcpy(why, at + klen + 1, n);
            why[n] = 0;
            found = 1;
        }
    }
    mskv__cuda_dealloc(&cu->allocator, buf);
    return found;
}

/* Runs the self-test of one kernel of variant v (not under cu->lock).
   Returns 1 passed (or nothing to test), 0 failed (why set), -1 could not
   run (res: the error to return to the caller; the variant stays untested). */
static int mskv__cuda_selftest(mskv_cuda *cu, int kernel, const mskv__cuda_defines *defs, mskv__cuda_variant *v,
                               char *why, size_t cap, mskv_result *res) {
    char name[160], detail[200] = "", key[220], line[600];
    double t0 = mskv__st_now_ms(), ms;
    int verdict;
    mskv__st_name(name, sizeof(name), kernel, defs);
    mskv__cuda_format(key, sizeof(key), "%s on %s", name, cu->info.name);
    *res = MSKV_SUCCESS;
    if (cu->lost) {
        mskv__cuda_failf(cu, "%s is not self-tested: a kernel faulted in its self-test before, and CUDA lost the "
                         "context (create a new process)", name);
        *res = MSKV_ERROR_CUDA;
        return -1;
    }
    if (mskv__st_marked(cu, v->path, key, detail, sizeof(detail))) {
        mskv__cuda_format(why, cap, "%s failed its self-test on %s (recorded beside its cache entry %s: %s)", name,
                          cu->info.name, v->path, detail);
        verdict = 0;
    } else {
        verdict = kernel == MSKV__K_KV_WRITE ? mskv__st_kv_write(cu, defs, v->funcs[kernel], detail, sizeof(detail), res)
                                             : mskv__st_attention(cu, kernel, defs, v->funcs[kernel], detail, sizeof(detail), res);
        if (verdict < 0) return -1;
        if (verdict == 3) {
            /* recorded (the next process refuses it without running it), then the caller gets the fault */
            mskv__cuda_format(line, sizeof(line), "%s\t%s\n", key, detail);
            mskv__st_mark(cu, v->path, line);
            mskv__cuda_lock(&cu->lock);
            cu->lost = 1;
            cu->info.selftests_failed++;
            mskv__cuda_appendf(cu->info.selftest_report, sizeof(cu->info.selftest_report), "%s: FAULT, %s\n", name, detail);
            mskv__cuda_unlock(&cu->lock);
            mskv__cuda_failf(cu, "%s faulted in its self-test on %s (%s): the CUDA context is lost; the variant is "
                             "recorded as failed%s%s, so the next process does not run it", name, cu->info.name,
                             detail, v->path[0] ? " beside " : "", v->path);
            *res = MSKV_ERROR_CUDA;
            return -1;
        }
        if (verdict == 0) {
            mskv__cuda_format(why, cap, "%s failed its self-test on %s: %s", name, cu->info.name, detail);
            mskv__cuda_format(line, sizeof(line), "%s\t%s\n", key, detail);
            mskv__st_mark(cu, v->path, line);
        }
    }
    ms = mskv__st_now_ms() - t0;
    mskv__cuda_lock(&cu->lock);
    if (verdict == 1) cu->info.selftests_passed++;
    if (verdict == 0) cu->info.selftests_failed++;
    cu->info.selftest_ms += ms;
    mskv__cuda_appendf(cu->info.selftest_report, sizeof(cu->info.selftest_report), "%s: %s%s%s (%.1f ms)\n", name,
                       verdict == 1 ? "pass" : verdict == 0 ? "FAIL" : "not tested: the wrappers do not launch it so",
                       detail[0] ? ", " : "", detail, ms);
    mskv__cuda_unlock(&cu->lock);
    if (verdict == 0) mskv__cuda_log(cu->log, cu->log_user, MSKV_LOG_ERROR, "mstar_kv cuda: %s", why);
    else mskv__cuda_log(cu->log, cu->log_user, MSKV_LOG_INFO, "mstar_kv cuda: self-test of %s: %s%s%s (%.1f ms)", name,
                        verdict == 1 ? "pass" : "not applicable", detail[0] ? ", " : "", detail, ms);
    return verdict != 0;
}

/* ==========================================================================
   >>embedded kernels: the generated copy of kernels.cu, one C string literal
   per source line. Written by tools/embed_kernels.sh (run it after editing
   kernels.cu; --check says whether it is stale, and the test
   cuda_embedded_copy_equals_kernels_cu compares it with kernels.cu byte for
   byte). Do not edit by hand: nothing of the library's code lies below.
   ========================================================================== */
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
    "     MSKV_ATTN_WARP_KEYS  attention only: 0 = prefill layout (4 warps x 32\n",
    "                     rows, 128 rows per block; 16 and 64 at D = 256); 1 = decode\n",
    "                     layout (16 rows per block, the 4 warps split each key tile,\n",
    "                     merged in smem)\n",
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
    "             page_magic, page_shift, scale_log2, mask, window_left,\n",
    "             kv_chunk, n_splits, o, lse, o_part, lse_part, q_pos,\n",
    "             vis_sink_end, vis_window_start)\n",
    "     Paged attention over a CSR plan (MSKV_DTYPE 1 or 2; mma.sync m16n8k16\n",
    "     with f32 accumulation). A block takes one (segment, kv head, key split)\n",
    "     and a tile of \"rows\", row = query * group + (q head within the kv head's\n",
    "     group), so every K/V byte is read once for all of a kv head's q heads.\n",
    "     Grid (ceil(max over segments of qo_len * group / BM), batch,\n",
    "     kv_heads * n_splits); block 128 (4 warps); dynamic shared memory\n",
    "     MSKV_ATTN_SMEM:\n",
    "       prefill, D <= 128: BM = 128 (32 rows per warp), BN = 64, Q tile + 2\n",
    "         stages of K and V (96 KiB at D = 128, 48 KiB at D = 64);\n",
    "       prefill, D = 256: BM = 64 (16 rows per warp), BN = 32, 96 KiB;\n",
    "       decode: BM = 16, BN = 64 (16 keys per warp), 3 stages, Q read into\n",
    "         registers once from the last stage (96 KiB at D = 128; D = 256\n",
    "         keeps a Q tile: 200 KiB).\n",
    "     The page of key j is (j * page_magic) >> page_shift (host:\n",
    "     mskv_cuda_page_divisor; any page size >= 1), and page_size * kv_heads *\n",
    "     D * 2 < 2^32. Each thread copies part of one K/V row per tile with\n",
    "     cp.async, its page id loaded a tile ahead; rows past kv_len are\n",
    "     zero-filled. S = Q K^T and O += P V with ldmatrix(.trans) fragments and\n",
    "     mma; online softmax in exp2; row sums by mma of P with ones. The tiles\n",
    "     that need a per-element mask run first, in a loop of their own.\n",
    "     Positions must not decrease with the compacted index (kv_pos_shift >= 0):\n",
    "     the mask's reach bounds the key range a block visits.\n",
    "     mask: 0 none, 1 causal (key pos <= query pos), 2 causal and\n",
    "     q - k <= window_left, on absolute positions. scale_log2 = scale * log2(e).\n",
    "     Query i of segment b is at q_pos[qo_indptr[b] + i] when q_pos is not\n",
    "     NULL (any order), else at the position of key kv_len - qo_len + i (the\n",
    "     tail rule). With vis_sink_end and vis_window_start (per segment, both\n",
    "     or neither), keys at positions in [vis_sink_end[b], vis_window_start[b])\n",
    "     are hidden (none when window start <= sink end): as positions rise with\n",
    "     the index, the visible keys are two runs, [0, first(sink end)) and\n",
    "     [first(window start), kv_len). A block visits the tiles of each run\n",
    "     (tiles wholly hidden are not read); the one tile of the first run that\n",
    "     reaches past the hole masks the keys from its start on, and the tiles\n",
    "     every row sees whole run unmasked, in up to two runs of their own.\n",
    "     Everything is computed on the device from these arrays, so a plan\n",
    "     uploaded once and replayed by a graph needs nothing derived.\n",
    "     Dense K/V (a prefix view, any caller buffer [row][kv_heads][D]): with\n",
    "     kv_indices NULL, k_pool / v_pool are the buffers, page_size 1\n",
    "     (page_magic 2^31, page_shift 31) and kv_indptr[b] the row of segment\n",
    "     b's key 0: key j is row kv_indptr[b] + j, no table is read.\n",
    "     Keys of split s: [s * kv_chunk, (s + 1) * kv_chunk) (kv_chunk a multiple\n",
    "     of BN; n_splits 1 = no split). With n_splits == 1: o [total_q][q_heads][D]\n",
    "     (dtype) and lse [total_q][q_heads] (natural log; may be NULL). Otherwise\n",
    "     f32 partials o_part [n_splits][total_q][q_heads][D] and lse_part\n",
    "     [n_splits][total_q][q_heads], merged by mskv_lse_merge. A row that sees\n",
    "     no key: o = 0, lse = -inf.\n",
    "\n",
    "   mskv_attn_sm90(k_map, v_map, use_tma, q, k_pool, v_pool, qo_indptr,\n",
    "                  kv_indptr, kv_indices, kv_len, kv_pos_split, kv_pos_shift,\n",
    "                  q_heads, kv_heads, page_size, scale_log2, mask, window_left,\n",
    "                  kv_chunk, n_splits, o, lse, o_part, lse_part, q_pos,\n",
    "                  vis_sink_end, vis_window_start)\n",
    "     The same attention as mskv_attn (plan, rows, masks, q_pos, visibility\n",
    "     bounds, splits, outputs, empty rows) for sm_90a only (wgmma, setmaxnreg: compiled when NVRTC\n",
    "     targets sm_90a, MSKV_SM90A; the sm_90a module has no mskv_attn), in the\n",
    "     warp-specialised manner of FlashAttention-3. Block 384 threads =\n",
    "     3 warpgroups, __launch_bounds__(384, 1); grid (ceil(max qo_len * group\n",
    "     / 128), batch, kv_heads * n_splits); dynamic shared memory MSKV_H_SMEM:\n",
    "     1 KiB alignment slack + two 64-row Q tiles + STAGES x (K tile, V tile,\n",
    "     ones block) + 2 x STAGES mbarriers; BN = 128 keys (64 at D = 256),\n",
    "     STAGES = 3 at D = 64, else 2: 164,912 B (161 KiB) at D = 64, 197,664 B\n",
    "     (193 KiB) at D = 128 and at D = 256 (what the host's formula and\n",
    "     kernel-stats' smem_dyn give). Every tile is K-major with the 128-byte swizzle:\n",
    "     [D / 64 column blocks][rows][128 B], 16-byte chunk c of row r at\n",
    "     c ^ (r & 7), 1024-byte aligned.\n",
    "       producer (warpgroup 0, setmaxnreg.dec 40): for each key tile, waits\n",
    "         on the stage's \"empty\" mbarrier, then either (use_tma, and the tile\n",
    "         lies below kv_len) one warp issues TMA copies, one box per page\n",
    "         piece and column block, completing on the stage's \"full\" mbarrier\n",
    "         (arrive.expect_tx); or the warpgroup copies whole rows with\n",
    "         cp.async (one page id per row, any page size, rows past kv_len\n",
    "         zero-filled), waits, fence.proxy.async, and one thread arrives.\n",
    "         k_map / v_map (CUtensorMap, __grid_constant__): the pool as dims\n",
    "         (D, kv_heads, page_size, num_pages), byte strides (2 D,\n",
    "         2 D kv_heads, 2 D kv_heads page_size), box (64, 1, min(page_size,\n",
    "         BN), 1), 128-byte swizzle: box (c * 64, kvh, slot in page, page id)\n",
    "         is a 64-wide column block of up to BN consecutive slots of one page.\n",
    "         The host passes use_tma when page_size is a multiple of BN or BN a\n",
    "         multiple of a page of at least 16 slots; otherwise the maps are\n",
    "         not read. Dense K/V (kv_indices NULL, page_size 1, kv_indptr[b]\n",
    "         the row of segment b's key 0, as mskv_attn): the maps, if used,\n",
    "         are the buffers as dims (D, kv_heads, rows, 1), box (64, 1, BN, 1).\n",
    "       consumers (warpgroups 1 and 2, setmaxnreg.inc 232): 64 rows each,\n",
    "         Q (cp.async, fence.proxy.async) from a descriptor; per tile, in\n",
    "         alternating turns at the tensor cores (named barriers 4 and 5,\n",
    "         bar.sync / bar.arrive over 256 threads), issue S = Q K^T\n",
    "         (wgmma m64nBNk16, both operands from descriptors) and O += P V of\n",
    "         the previous tile (wgmma m64nNk16, P from registers, V N-major),\n",
    "         then mask and online softmax while the other warpgroup's GEMMs run,\n",
    "         wait for P V, release the stage (lane 0 of each consumer warp\n",
    "         arrives after its own warp's wgmma.wait_group: the \"empty\"\n",
    "         mbarrier counts all 8 consumer warps), rescale O. Up to\n",
    "         D = 128 each V tile is followed by a block of ones and N = D + 8,\n",
    "         so the row sums come out of the tensor cores with O.\n",
    "     Tiles that need a per-element mask run first, then the whole ones, in\n",
    "     loops of their own. Tiles start on multiples of BN (a TMA box never\n",
    "     straddles a page), so the tiles at both ends of the hidden keys mask\n",
    "     them per element; tiles wholly hidden are not loaded.\n",
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
    "MSKV_DEV int mskv_shfl_xor_i(int v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }\n",
    "/* lane 0's x in every lane: the compiler then knows x is warp-uniform (uniform registers and datapath) */\n",
    "MSKV_DEV int mskv_uniform(int x) { return __shfl_sync(0xffffffffu, x, 0); }\n",
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
    "   mskv_shfl_xor, mskv_shfl_xor_i, mskv_uniform, mskv_syncwarp, mskv_exp2, conversions, mma, ldmatrix, cp.async, mskv_v16). */\n",
    "#ifndef MSKV_EMU_H\n",
    "#error \"kernels.cu: include tests/emu/mskv_emu.h before compiling the kernels on the host\"\n",
    "#endif\n",
    "#endif\n",
    "\n",
    "/* sm_90a-only code (wgmma, setmaxnreg, the kernel built on them): NVRTC\n",
    "   compiling for sm_90a, or the host emulation (tests/emu/mskv_emu_sm90.h) */\n",
    "#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(MSKV_EMU_SM90)\n",
    "#define MSKV_SM90A 1\n",
    "#else\n",
    "#define MSKV_SM90A 0\n",
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
    "/* Layouts (4 warps, 128 threads; a row is query * group + q head within the\n",
    "   kv head's group, so one K/V tile serves the whole group):\n",
    "   prefill, D <= 128: 128 rows per block, warp w owns rows [32w, 32w + 32):\n",
    "       two m16 tiles, so each K/V fragment feeds four mma; 64-key tiles, 2 stages.\n",
    "   prefill, D = 256: 64 rows, 16 per warp (32 rows of f32 accumulators would\n",
    "       not fit the registers); 32-key tiles, 2 stages.\n",
    "   decode: 16 rows; warp w takes keys [16w, 16w + 16) of every 64-key tile;\n",
    "       3 stages; the four partial softmax states are merged through shared memory. */\n",
    "#if MSKV_ATTN_WARP_KEYS\n",
    "#define MSKV_MT 1\n",
    "#define MSKV_BM 16\n",
    "#define MSKV_BN 64\n",
    "#define MSKV_WK 16\n",
    "#define MSKV_STAGES 3\n",
    "#else\n",
    "#define MSKV_MT (MSKV_D <= 128 ? 2 : 1)\n",
    "#define MSKV_BM (64 * MSKV_MT)\n",
    "#define MSKV_BN (MSKV_D >= 256 ? 32 : 64)\n",
    "#define MSKV_WK MSKV_BN\n",
    "#define MSKV_STAGES 2\n",
    "#endif\n",
    "#define MSKV_WM (16 * MSKV_MT)                 /* rows per warp */\n",
    "#define MSKV_CH (MSKV_D / 8)                   /* 16-byte chunks per row */\n",
    "#define MSKV_ROWB (MSKV_D * 2)                 /* bytes per row of a tile */\n",
    "#define MSKV_NT (MSKV_WK / 8)                  /* n-tiles of 8 keys per warp and tile */\n",
    "#define MSKV_QREG (MSKV_WM * MSKV_D <= 2048)   /* Q fragments in registers (at most 32 per thread) */\n",
    "#define MSKV_TPR (128 / MSKV_BN)               /* gather: threads per K/V row */\n",
    "#define MSKV_CPT (MSKV_CH / MSKV_TPR)          /* gather: 16-byte chunks per thread and row */\n",
    "#define MSKV_TILE_BYTES (MSKV_BN * MSKV_D * 2) /* one K (or V) tile */\n",
    "#define MSKV_STAGE_BYTES (2 * MSKV_TILE_BYTES) /* K, then V */\n",
    "/* Q has its own tile unless the decode layout reads it into registers once:\n",
    "   then it waits in the last stage, which is first refilled after that read. */\n",
    "#define MSKV_Q_PARKED (MSKV_ATTN_WARP_KEYS && MSKV_QREG)\n",
    "#define MSKV_Q_BYTES (MSKV_Q_PARKED ? 0 : MSKV_BM * MSKV_D * 2)\n",
    "#define MSKV_Q_OFF (MSKV_Q_PARKED ? (MSKV_STAGES - 1) * MSKV_STAGE_BYTES : 0)\n",
    "#define MSKV_ATTN_SMEM (MSKV_Q_BYTES + MSKV_STAGES * MSKV_STAGE_BYTES)\n",
    "#define MSKV_MERGE_LD (MSKV_D + 8)             /* decode merge: padded f32 row, no bank conflicts */\n",
    "/* row-sum accumulator: element of row r (= 2 mt + h), and the row of element c */\n",
    "#define MSKV_LSUM(r) (MSKV_MT == 2 ? 2 * ((r) & 1) + ((r) >> 1) : 2 * ((r) & 1))\n",
    "#define MSKV_LROW(c) (MSKV_MT == 2 ? 2 * ((c) & 1) + ((c) >> 1) : ((c) >> 1))\n",
    "\n",
    "#ifndef MSKV_GPU\n",
    "/* for the host tests: the launch geometry of these defines */\n",
    "static const int mskv_attn_block_rows = MSKV_BM, mskv_attn_block_keys = MSKV_BN, mskv_attn_smem_bytes = MSKV_ATTN_SMEM;\n",
    "#endif\n",
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
    "/* two 16-bit ones (f16 0x3c00, bf16 0x3f80) */\n",
    "#define MSKV_ONE2 (MSKV_DTYPE == 1 ? 0x3c003c00u : 0x3f803f80u)\n",
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
    "/* The mask position of query i of a segment of kvl keys and qo_len queries:\n",
    "   q_pos[i] when the plan gives it, else the tail rule. */\n",
    "MSKV_DEV int mskv_q_pos(const int *q_pos, int i, int kvl, int qo_len, int split, int shift) {\n",
    "    return q_pos ? q_pos[i] : mskv_abs_pos(kvl - qo_len + i, split, shift);\n",
    "}\n",
    "/* The hidden run of compacted keys [*h0, *h1) of segment b: keys at\n",
    "   positions in [vis_sink_end, vis_window_start) (positions rise with the\n",
    "   index, so they are one run); none (h0 = h1 = kvl) without bounds. */\n",
    "MSKV_DEV void mskv_vis_hole(const int *vis_sink_end, const int *vis_window_start, int b, int kvl, int split, int shift,\n",
    "                            int *h0, int *h1) {\n",
    "    *h0 = *h1 = kvl;\n",
    "    if (vis_sink_end && vis_window_start && vis_window_start[b] > vis_sink_end[b]) {\n",
    "        const int a = mskv_first_at(vis_sink_end[b], split, shift), z = mskv_first_at(vis_window_start[b], split, shift);\n",
    "        *h0 = a < kvl ? a : kvl;\n",
    "        *h1 = z < kvl ? z : kvl;\n",
    "    }\n",
    "}\n",
    "/* The smallest and largest q_pos of the block's queries [qa, qa + nq) (any\n",
    "   order: a caller's positions need not rise), for the block's key range.\n",
    "   Every thread of the block calls it (two barriers); scratch: 2 ints per\n",
    "   warp of shared memory that nothing else uses until the second barrier. */\n",
    "template <int THREADS>\n",
    "MSKV_DEV void mskv_q_pos_range(const int *q_pos, int qa, int nq, int *scratch, int *mn, int *mx) {\n",
    "    const int tid = mskv_tid(), warp = tid >> 5, nw = THREADS / 32;\n",
    "    int lo = 0x7fffffff, hi = -0x7fffffff - 1;\n",
    "    for (int i = tid; i < nq; i += THREADS) { const int v = q_pos[qa + i]; lo = v < lo ? v : lo; hi = v > hi ? v : hi; }\n",
    "    for (int m = 1; m < 32; m <<= 1) {\n",
    "        const int a = mskv_shfl_xor_i(lo, m), z = mskv_shfl_xor_i(hi, m);\n",
    "        lo = a < lo ? a : lo;\n",
    "        hi = z > hi ? z : hi;\n",
    "    }\n",
    "    if ((tid & 31) == 0) { scratch[warp] = lo; scratch[nw + warp] = hi; }\n",
    "    MSKV_SYNC_ID(8);\n",
    "    for (int k = 0; k < nw; k++) {\n",
    "        lo = scratch[k] < lo ? scratch[k] : lo;\n",
    "        hi = scratch[nw + k] > hi ? scratch[nw + k] : hi;\n",
    "    }\n",
    "    MSKV_SYNC_ID(9);  /* every thread has read the scratch before it is reused */\n",
    "    *mn = lo;\n",
    "    *mx = hi;\n",
    "}\n",
    "\n",
    "/* Page of compacted index j (0 <= j < 2^31) without a division:\n",
    "   (j * magic) >> shift, magic = ceil(2^(31+l) / page_size), shift = 31 + l,\n",
    "   l = ceil(log2(page_size)) (mskv_cuda_page_divisor on the host). Exact: the\n",
    "   rounding adds j * (magic - 2^(31+l) / page_size) / 2^(31+l) < 1 / page_size. */\n",
    "MSKV_DEV int mskv_page_of(int j, mskv_u32 magic, int shift) {\n",
    "    return (int)(((mskv_u64)(mskv_u32)j * magic) >> shift);\n",
    "}\n",
    "\n",
    "/* The K/V gather: thread t copies chunks [c0, c0 + CPT) (c0 = (t % TPR) * CPT)\n",
    "   of row t / TPR of every tile, so each row's slot is found once per tile,\n",
    "   from one page id loaded a tile ahead. */\n",
    "struct mskv_gather {\n",
    "    /* kernel parameters as they are (the compiler reads them from the constant bank) */\n",
    "    const unsigned char *k_pool, *v_pool;\n",
    "    const int *kv_indices;\n",
    "    mskv_u32 magic;\n",
    "    int shift, page_size, kv_heads;\n",
    "    /* per thread */\n",
    "    int page0;                    /* the segment's first entry in kv_indices */\n",
    "    int n_hi, row;\n",
    "    mskv_u32 head;                /* byte offset of the kv head's chunk c0 within a slot */\n",
    "    mskv_u32 dst;                 /* byte offset of chunk c0 of the row within a K tile */\n",
    "};\n",
    "/* The key of the thread's row of the tile at n0, clamped into the sequence\n",
    "   (a tile past the end reads a harmless page id and copies nothing). */\n",
    "MSKV_DEV int mskv_row_key(const mskv_gather &g, int n0) {\n",
    "    return n0 + g.row < g.n_hi ? n0 + g.row : g.n_hi - 1;\n",
    "}\n",
    "/* Its page id, loaded a tile before the copies that need it. Dense K/V\n",
    "   (kv_indices NULL, page_size 1): \"page\" page0 + j is row page0 + j of the\n",
    "   buffer, no table to read. */\n",
    "MSKV_DEV int mskv_row_fetch(const mskv_gather &g, int n0) {\n",
    "    const int at = g.page0 + mskv_page_of(mskv_row_key(g, n0), g.magic, g.shift);\n",
    "    return g.kv_indices ? g.kv_indices[at] : at;\n",
    "}\n",
    "\n",
    "/* Issues the copies of the thread's chunks of K and V of the tile at key n0\n",
    "   into the stage at shared offset stage; a row at or past n_hi is\n",
    "   zero-filled (a page's unused slots may hold anything, NaN included). */\n",
    "MSKV_DEV void mskv_gather_tile(const mskv_gather &g, unsigned char *smem, mskv_u32 stage, int n0, int pid) {\n",
    "    const int bytes = n0 + g.row < g.n_hi ? 16 : 0, j = mskv_row_key(g, n0);\n",
    "    const int in_page = j - mskv_page_of(j, g.magic, g.shift) * g.page_size;\n",
    "    const mskv_u32 slot_bytes = (mskv_u32)g.kv_heads * (MSKV_D * 2);\n",
    "    const mskv_u64 off = (mskv_u64)(mskv_u32)pid * ((mskv_u32)g.page_size * slot_bytes) +\n",
    "                         ((mskv_u32)in_page * slot_bytes + g.head);\n",
    "    const unsigned char *ks = g.k_pool + off, *vs = g.v_pool + off;\n",
    "    const mskv_u32 d0 = g.dst + stage;\n",
    "MSKV_UNROLL\n",
    "    for (int k = 0; k < MSKV_CPT; k++) {\n",
    "        /* chunk c0 + k = c0 ^ k lands at (c0 ^ k) ^ (row & 7): the swizzle is an\n",
    "           XOR inside the row, whose start is aligned to its length */\n",
    "        const mskv_u32 d = d0 ^ (mskv_u32)(k << 4);\n",
    "        mskv_cp_async16(smem + d, ks + 16 * k, bytes);\n",
    "        mskv_cp_async16(smem + d + MSKV_TILE_BYTES, vs + 16 * k, bytes);\n",
    "    }\n",
    "}\n",
    "\n",
    "/* The tiles a block visits. Its keys are at most two runs of compacted\n",
    "   indices (the visibility bounds hide the keys between them): run A from\n",
    "   a_lo, tiles 0..n_a-1, and run B from b_lo (at or past A's last tile, so no\n",
    "   key is visited twice), tiles n_a..n_tiles-1. Tiles wholly hidden are not\n",
    "   visited. Tiles every row sees whole form up to two runs of consecutive\n",
    "   tiles, [f1_lo, f1_hi) and [f2_lo, f2_hi) (f1 empty unless both are not);\n",
    "   the others need the per-element mask and come first ([0, f1_lo),\n",
    "   [f1_hi, f2_lo), [f2_hi, n_tiles)), so each kind runs in a loop of its own. */\n",
    "struct mskv_tiles { int n_hi, a_lo, n_a, b_lo, n_tiles, f1_lo, f1_hi, f2_lo, f2_hi, n_masked; };\n",
    "/* First key of tile k (in key order). */\n",
    "MSKV_DEV int mskv_tile_at(const mskv_tiles &t, int k) {\n",
    "    return k < t.n_a ? t.a_lo + k * MSKV_BN : t.b_lo + (k - t.n_a) * MSKV_BN;\n",
    "}\n",
    "/* Key index of the i-th tile a block visits (n_hi when past the last: a\n",
    "   zero-filled load). */\n",
    "MSKV_DEV int mskv_tile_key(const mskv_tiles &t, int i) {\n",
    "    const int m1 = t.f1_lo, m2 = m1 + t.f2_lo - t.f1_hi, w1 = t.f1_hi - t.f1_lo;\n",
    "    int k;\n",
    "    if (i < t.n_masked) k = i < m1 ? i : i < m2 ? i - m1 + t.f1_hi : i - m2 + t.f2_hi;\n",
    "    else k = i - t.n_masked < w1 ? i - t.n_masked + t.f1_lo : i - t.n_masked - w1 + t.f2_lo;\n",
    "    return i < t.n_tiles ? mskv_tile_at(t, k) : t.n_hi;\n",
    "}\n",
    "/* One warp's running softmax state and what it needs per tile. */\n",
    "struct mskv_attn_warp {\n",
    "    float o[MSKV_MT][MSKV_D / 8][4];\n",
    "    float m[2 * MSKV_MT];                   /* row g + 8h of m-tile mt: index 2 mt + h */\n",
    "    /* row sums, by mma of P with a matrix of ones, so they add the P that O\n",
    "       adds, rounded alike, and the f32 probabilities die once packed. One\n",
    "       accumulator for both m-tiles: m-tile 0 sums into the even columns, 1\n",
    "       into the odd ones, so l[MSKV_LSUM(r)] is row r's (whole row, every lane) */\n",
    "    float l[4];\n",
    "    /* the keys row r may see, as compacted indices [klo[r], khi[r]): the\n",
    "       mask, the split and kv_len in one interval (positions grow with j) */\n",
    "    int klo[2 * MSKV_MT], khi[2 * MSKV_MT];\n",
    "    /* the first key the visibility bounds hide (kv_len: none): a tile of\n",
    "       run A (it starts below h0) masks the keys from h0 on; run B's tiles\n",
    "       start where the keys are visible again */\n",
    "    int h0;\n",
    "#if MSKV_QREG\n",
    "    mskv_u32 qf[MSKV_MT][MSKV_D / 16][4];\n",
    "#endif\n",
    "    /* ldmatrix addresses: a lane's row start and its swizzled chunk of k-step 0;\n",
    "       k-step kk XORs 32 * kk into it (the swizzle permutes chunks inside the row) */\n",
    "    mskv_u32 qb, kb, vb;\n",
    "    int wrow0, wkey0;\n",
    "    float scale_log2;\n",
    "};\n",
    "\n",
    "/* S = Q K^T, the mask (MASKED: per element), the online softmax and O += P V\n",
    "   for one tile whose K and V sit at tk, tv; n0 is its first key. */\n",
    "template <int MASKED>\n",
    "MSKV_DEV void mskv_attn_tile(mskv_attn_warp &w, const unsigned char *smem, mskv_u32 stage, int n0) {\n",
    "    const int t4 = mskv_tid() & 3;\n",
    "    const mskv_u32 kb0 = stage + w.kb, vb0 = stage + MSKV_TILE_BYTES + w.vb;\n",
    "    float s[MSKV_MT][MSKV_NT][4];\n",
    "MSKV_UNROLL\n",
    "    for (int mt = 0; mt < MSKV_MT; mt++)\n",
    "MSKV_UNROLL\n",
    "        for (int nt = 0; nt < MSKV_NT; nt++) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;\n",
    "MSKV_UNROLL\n",
    "    for (int kk = 0; kk < MSKV_D / 16; kk++) {\n",
    "#if MSKV_QREG\n",
    "#define MSKV_QA(mt) w.qf[mt][kk]\n",
    "#else\n",
    "        mskv_u32 qa[MSKV_MT][4];\n",
    "MSKV_UNROLL\n",
    "        for (int mt = 0; mt < MSKV_MT; mt++)\n",
    "            mskv_ldsm_x4(qa[mt], smem + ((w.qb ^ (mskv_u32)(32 * kk)) + mt * 16 * MSKV_ROWB));\n",
    "#define MSKV_QA(mt) qa[mt]\n",
    "#endif\n",
    "MSKV_UNROLL\n",
    "        for (int np = 0; np < MSKV_NT / 2; np++) {\n",
    "            mskv_u32 kb[4];\n",
    "            mskv_ldsm_x4(kb, smem + ((kb0 ^ (mskv_u32)(32 * kk)) + np * 16 * MSKV_ROWB));\n",
    "MSKV_UNROLL\n",
    "            for (int mt = 0; mt < MSKV_MT; mt++) {\n",
    "                mskv_mma(s[mt][2 * np], MSKV_QA(mt), kb);\n",
    "                mskv_mma(s[mt][2 * np + 1], MSKV_QA(mt), kb + 2);\n",
    "            }\n",
    "        }\n",
    "#undef MSKV_QA\n",
    "    }\n",
    "    /* the online softmax: m kept unscaled, exponents in log2 units */\n",
    "    {\n",
    "        float mx[2 * MSKV_MT], alpha[2 * MSKV_MT];\n",
    "        const int jb = n0 + w.wkey0 + 2 * t4;   /* this lane's first key of the tile */\n",
    "        const int clip = n0 < w.h0 ? w.h0 : 0x7fffffff;\n",
    "MSKV_UNROLL\n",
    "        for (int r = 0; r < 2 * MSKV_MT; r++) mx[r] = w.m[r];\n",
    "MSKV_UNROLL\n",
    "        for (int mt = 0; mt < MSKV_MT; mt++)\n",
    "MSKV_UNROLL\n",
    "            for (int nt = 0; nt < MSKV_NT; nt++)\n",
    "MSKV_UNROLL\n",
    "                for (int e = 0; e < 4; e++) {\n",
    "                    const int r = 2 * mt + (e >> 1);\n",
    "                    if (MASKED) {\n",
    "                        const int j = jb + nt * 8 + (e & 1);\n",
    "                        s[mt][nt][e] = (j >= w.klo[r]) & (j < w.khi[r]) & (j < clip) ? s[mt][nt][e] : mskv_neg_inf();\n",
    "                    }\n",
    "                    mx[r] = fmaxf(mx[r], s[mt][nt][e]);\n",
    "                }\n",
    "MSKV_UNROLL\n",
    "        for (int r = 0; r < 2 * MSKV_MT; r++) {\n",
    "            float mu;\n",
    "            mx[r] = fmaxf(mx[r], mskv_shfl_xor(mx[r], 1));\n",
    "            mx[r] = fmaxf(mx[r], mskv_shfl_xor(mx[r], 2));\n",
    "            mu = mx[r] == mskv_neg_inf() ? 0.0f : mx[r];  /* nothing seen yet: keep exp2 finite */\n",
    "            alpha[r] = mskv_exp2((w.m[r] - mu) * w.scale_log2);\n",
    "            w.m[r] = mx[r];\n",
    "            mx[r] = mu * w.scale_log2;  /* p = exp2(s * scale_log2 - mx): one fma per score */\n",
    "        }\n",
    "MSKV_UNROLL\n",
    "        for (int mt = 0; mt < MSKV_MT; mt++)\n",
    "MSKV_UNROLL\n",
    "            for (int i = 0; i < MSKV_D / 8; i++) {\n",
    "                w.o[mt][i][0] *= alpha[2 * mt]; w.o[mt][i][1] *= alpha[2 * mt];\n",
    "                w.o[mt][i][2] *= alpha[2 * mt + 1]; w.o[mt][i][3] *= alpha[2 * mt + 1];\n",
    "            }\n",
    "MSKV_UNROLL\n",
    "        for (int c = 0; c < 4; c++) w.l[c] *= alpha[MSKV_LROW(c)];\n",
    "MSKV_UNROLL\n",
    "        for (int mt = 0; mt < MSKV_MT; mt++)\n",
    "MSKV_UNROLL\n",
    "            for (int nt = 0; nt < MSKV_NT; nt++)\n",
    "MSKV_UNROLL\n",
    "                for (int e = 0; e < 4; e++) {\n",
    "                    const int r = 2 * mt + (e >> 1);\n",
    "                    s[mt][nt][e] = mskv_exp2(fmaf(s[mt][nt][e], w.scale_log2, -mx[r]));\n",
    "                }\n",
    "    }\n",
    "    /* O += P V: P packed first (the f32 scores die here; C layout == A\n",
    "       layout per 16 keys), then every V fragment feeds the warp's m-tiles */\n",
    "    {\n",
    "        mskv_u32 pa[MSKV_MT][MSKV_NT / 2][4];\n",
    "        /* B columns n = lane / 4: all ones, or (two m-tiles) ones in the even\n",
    "           columns for m-tile 0 and in the odd ones for m-tile 1 */\n",
    "        const mskv_u32 one_e = MSKV_MT == 1 || !(mskv_tid() & 4) ? MSKV_ONE2 : 0u;\n",
    "        const mskv_u32 one_o = MSKV_MT == 1 || (mskv_tid() & 4) ? MSKV_ONE2 : 0u;\n",
    "        const mskv_u32 ones[2][2] = { { one_e, one_e }, { one_o, one_o } };\n",
    "MSKV_UNROLL\n",
    "        for (int mt = 0; mt < MSKV_MT; mt++)\n",
    "MSKV_UNROLL\n",
    "            for (int ks = 0; ks < MSKV_NT / 2; ks++) {\n",
    "                pa[mt][ks][0] = mskv_pack2(s[mt][2 * ks][0], s[mt][2 * ks][1]);\n",
    "                pa[mt][ks][1] = mskv_pack2(s[mt][2 * ks][2], s[mt][2 * ks][3]);\n",
    "                pa[mt][ks][2] = mskv_pack2(s[mt][2 * ks + 1][0], s[mt][2 * ks + 1][1]);\n",
    "                pa[mt][ks][3] = mskv_pack2(s[mt][2 * ks + 1][2], s[mt][2 * ks + 1][3]);\n",
    "            }\n",
    "MSKV_UNROLL\n",
    "        for (int mt = 0; mt < MSKV_MT; mt++)\n",
    "MSKV_UNROLL\n",
    "            for (int ks = 0; ks < MSKV_NT / 2; ks++) mskv_mma(w.l, pa[mt][ks], ones[mt]);\n",
    "MSKV_UNROLL\n",
    "        for (int dp = 0; dp < MSKV_D / 16; dp++)\n",
    "MSKV_UNROLL\n",
    "            for (int ks = 0; ks < MSKV_NT / 2; ks++) {\n",
    "                mskv_u32 vb[4];\n",
    "                mskv_ldsm_x4_t(vb, smem + ((vb0 ^ (mskv_u32)(32 * dp)) + ks * 16 * MSKV_ROWB));\n",
    "MSKV_UNROLL\n",
    "                for (int mt = 0; mt < MSKV_MT; mt++) {\n",
    "                    mskv_mma(w.o[mt][2 * dp], pa[mt][ks], vb);\n",
    "                    mskv_mma(w.o[mt][2 * dp + 1], pa[mt][ks], vb + 2);\n",
    "                }\n",
    "            }\n",
    "    }\n",
    "}\n",
    "\n",
    "/* The pipeline: STAGES - 1 tiles in flight ahead of the one computed. One\n",
    "   barrier per tile: after it, tile i has landed for every thread and every\n",
    "   warp is done with tile i - 1, whose stage takes tile i + STAGES - 1. */\n",
    "struct mskv_pipe {\n",
    "    int next;                    /* page id of the thread's row of the tile issued next */\n",
    "    mskv_u32 cs, ls;             /* shared offsets of the stage computed and the stage loaded */\n",
    "};\n",
    "MSKV_DEV mskv_u32 mskv_stage_next(mskv_u32 s) {\n",
    "    return s + MSKV_STAGE_BYTES < MSKV_Q_BYTES + MSKV_STAGES * MSKV_STAGE_BYTES ? s + MSKV_STAGE_BYTES : MSKV_Q_BYTES;\n",
    "}\n",
    "/* One tile: wait for the tile at key n0, refill the oldest stage with the\n",
    "   tile at key n_load, fetch the page id for the one at n_fetch, compute.\n",
    "   ST < 0: the stages rotate in p; ST >= 0: n0's tile sits in stage ST, known\n",
    "   when compiling (an unrolled loop), so every shared address is a constant\n",
    "   offset from registers set up once. */\n",
    "template <int MASKED, int ST>\n",
    "MSKV_DEV void mskv_attn_step(mskv_attn_warp &w, mskv_pipe &p, const mskv_gather &g, unsigned char *smem,\n",
    "                             int n0, int n_load, int n_fetch) {\n",
    "    const mskv_u32 cs = ST < 0 ? p.cs : (mskv_u32)(MSKV_Q_BYTES + ST * MSKV_STAGE_BYTES);\n",
    "    const mskv_u32 ls = ST < 0 ? p.ls : (mskv_u32)(MSKV_Q_BYTES + ((ST + MSKV_STAGES - 1) % MSKV_STAGES) * MSKV_STAGE_BYTES);\n",
    "    mskv_cp_wait<MSKV_STAGES - 2>();\n",
    "    MSKV_SYNC_ID(1);\n",
    "    mskv_gather_tile(g, smem, ls, n_load, p.next);\n",
    "    mskv_cp_commit();\n",
    "    p.next = mskv_row_fetch(g, n_fetch);\n",
    "    mskv_attn_tile<MASKED>(w, smem, cs, n0);\n",
    "    if (ST < 0) {\n",
    "        p.cs = mskv_stage_next(p.cs);\n",
    "        p.ls = mskv_stage_next(p.ls);\n",
    "    }\n",
    "}\n",
    "\n",
    "/* A run of whole tiles, keys [n0, f_end), the block's last: loads past it\n",
    "   are zero-filled (n_hi). */\n",
    "MSKV_DEV void mskv_attn_run(mskv_attn_warp &w, mskv_pipe &p, const mskv_gather &g, unsigned char *smem,\n",
    "                            int n0, int f_end, int n_hi) {\n",
    "#define MSKV_FULL_STEP(st, n) \\\n",
    "    mskv_attn_step<0, st>(w, p, g, smem, (n), (n) + (MSKV_STAGES - 1) * MSKV_BN < f_end ? (n) + (MSKV_STAGES - 1) * MSKV_BN : n_hi, \\\n",
    "                          (n) + MSKV_STAGES * MSKV_BN < f_end ? (n) + MSKV_STAGES * MSKV_BN : n_hi)\n",
    "#if MSKV_ATTN_WARP_KEYS && MSKV_D <= 128\n",
    "    /* decode: three tiles an iteration, one per stage, so no stage\n",
    "       arithmetic and no address arithmetic for shared memory remains\n",
    "       (at D = 256 the unrolled addresses would spill registers) */\n",
    "    for (; n0 < f_end && p.cs != (mskv_u32)MSKV_Q_BYTES; n0 += MSKV_BN) MSKV_FULL_STEP(-1, n0);\n",
    "    for (; n0 + 2 * MSKV_BN < f_end; n0 += 3 * MSKV_BN) {\n",
    "        MSKV_FULL_STEP(0, n0);\n",
    "        MSKV_FULL_STEP(1, n0 + MSKV_BN);\n",
    "        MSKV_FULL_STEP(2, n0 + 2 * MSKV_BN);\n",
    "    }\n",
    "#endif\n",
    "    for (; n0 < f_end; n0 += MSKV_BN) MSKV_FULL_STEP(-1, n0);\n",
    "#undef MSKV_FULL_STEP\n",
    "}\n",
    "/* The first of two runs of whole tiles (the sink's, before the hidden\n",
    "   keys), keys [n0, f_end): loads past its end continue gap keys later, in\n",
    "   the second run (and past that, where nothing is computed, they only\n",
    "   read keys of the sequence: mskv_row_key clamps). */\n",
    "MSKV_DEV void mskv_attn_run1(mskv_attn_warp &w, mskv_pipe &p, const mskv_gather &g, unsigned char *smem,\n",
    "                             int n0, int f_end, int gap) {\n",
    "    for (; n0 < f_end; n0 += MSKV_BN) {\n",
    "        const int l = n0 + (MSKV_STAGES - 1) * MSKV_BN, f = n0 + MSKV_STAGES * MSKV_BN;\n",
    "        mskv_attn_step<0, -1>(w, p, g, smem, n0, l < f_end ? l : l + gap, f < f_end ? f : f + gap);\n",
    "    }\n",
    "}\n",
    "\n",
    "/* Tiles [lo, hi) of a run of n tiles from key r0 that every row sees whole:\n",
    "   those inside [kw, kc); an empty range is (n, n). */\n",
    "template <int BN>\n",
    "MSKV_DEV void mskv_whole_tiles(int r0, int n, int kw, int kc, int *lo, int *hi) {\n",
    "    const int a = kw > r0 ? (kw - r0 + BN - 1) / BN : 0;\n",
    "    int z = kc > r0 ? (kc - r0) / BN : 0;\n",
    "    z = z < n ? z : n;\n",
    "    *lo = a < z ? a : n;\n",
    "    *hi = a < z ? z : n;\n",
    "}\n",
    "\n",
    "/* The keys a block needs (its split, cut by the mask's reach over the\n",
    "   block's query positions [qpos_min, qpos_max], less the hidden run\n",
    "   [h0, h1)) and which of its tiles every row of the block sees whole\n",
    "   (positions grow with the compacted index, so those form one run of tiles\n",
    "   on either side of the hidden keys). */\n",
    "MSKV_DEV mskv_tiles mskv_attn_tiles(int n_splits, int split, int kv_chunk, int kvl, int mask, int window_left,\n",
    "                                    int psplit, int pshift, int qpos_min, int qpos_max, int h0, int h1) {\n",
    "    mskv_tiles t;\n",
    "    int n_lo, a_hi, b_lo, kc, kw, alo, ahi, blo, bhi;\n",
    "    n_lo = n_splits > 1 ? split * kv_chunk : 0;\n",
    "    t.n_hi = n_splits > 1 ? (n_lo + kv_chunk < kvl ? n_lo + kv_chunk : kvl) : kvl;\n",
    "    if (mask >= 1) { const int c = mskv_first_at(qpos_max + 1, psplit, pshift); t.n_hi = c < t.n_hi ? c : t.n_hi; }\n",
    "    if (mask == 2) { const int c = mskv_first_at(qpos_min - window_left, psplit, pshift); n_lo = c > n_lo ? c : n_lo; }\n",
    "    /* run A: [n_lo, min(n_hi, h0)); run B: [max(n_lo, h1), n_hi), whose\n",
    "       first keys A's last tile may load too (masked there: they are >= h0) */\n",
    "    a_hi = h0 < t.n_hi ? h0 : t.n_hi;\n",
    "    t.a_lo = n_lo;\n",
    "    t.n_a = a_hi > n_lo ? (a_hi - n_lo + MSKV_BN - 1) / MSKV_BN : 0;\n",
    "    b_lo = h1 > n_lo ? h1 : n_lo;\n",
    "    t.b_lo = b_lo;\n",
    "    t.n_tiles = t.n_a + (t.n_hi > t.b_lo ? (t.n_hi - t.b_lo + MSKV_BN - 1) / MSKV_BN : 0);\n",
    "    kc = t.n_hi;   /* keys below kc: seen by every row (causal) */\n",
    "    kw = n_lo;     /* keys from kw on: within every row's window */\n",
    "    if (mask >= 1) { const int c = mskv_first_at(qpos_min + 1, psplit, pshift); kc = c < kc ? c : kc; }\n",
    "    if (mask == 2) { const int c = mskv_first_at(qpos_max - window_left, psplit, pshift); kw = c > kw ? c : kw; }\n",
    "    mskv_whole_tiles<MSKV_BN>(t.a_lo, t.n_a, kw, kc < a_hi ? kc : a_hi, &alo, &ahi);\n",
    "    mskv_whole_tiles<MSKV_BN>(t.b_lo, t.n_tiles - t.n_a, kw, kc, &blo, &bhi);\n",
    "    blo += t.n_a; bhi += t.n_a;\n",
    "    if (alo == ahi) { t.f1_lo = t.f1_hi = blo; t.f2_lo = blo; t.f2_hi = bhi; }       /* B's run (or none) last */\n",
    "    else if (blo == bhi) { t.f1_lo = t.f1_hi = alo; t.f2_lo = alo; t.f2_hi = ahi; }  /* A's run alone */\n",
    "    else { t.f1_lo = alo; t.f1_hi = ahi; t.f2_lo = blo; t.f2_hi = bhi; }\n",
    "    t.n_masked = t.n_tiles - (t.f1_hi - t.f1_lo) - (t.f2_hi - t.f2_lo);\n",
    "    return t;\n",
    "}\n",
    "\n",
    "/* The block's rows out: o (or the split's partial o_part) and lse. Indices\n",
    "   are recomputed here, not kept alive through the key loop, where every\n",
    "   register is taken. */\n",
    "MSKV_DEV void mskv_attn_store(mskv_attn_warp &w, unsigned char *smem, const int *qo_indptr, int q_heads, int kv_heads,\n",
    "                              float scale_log2, int n_splits, void *o, float *lse, float *o_part, float *lse_part) {\n",
    "    const int tid = mskv_tid(), warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;\n",
    "    const int b = mskv_bid_y(), kvh = mskv_bid_z() % kv_heads, split = mskv_bid_z() / kv_heads;\n",
    "    const int group = q_heads / kv_heads;\n",
    "    const int q0 = qo_indptr[b], rows = (qo_indptr[b + 1] - q0) * group, row0 = mskv_bid_x() * MSKV_BM;\n",
    "    {\n",
    "        const mskv_i64 total_q = qo_indptr[mskv_nblk_y()];\n",
    "        const float ln2 = 0.6931471805599453f;\n",
    "#if MSKV_ATTN_WARP_KEYS\n",
    "        /* merge the 4 warps' states: smem [warp][16][D + 8] f32 o (the pad\n",
    "           keeps the 8 rows of a 64-bit store in different banks), then m, l */\n",
    "        float *mo = (float *)smem, *mm = mo + 4 * 16 * MSKV_MERGE_LD, *ml = mm + 4 * 16;\n",
    "        MSKV_SYNC_ID(3);  /* K/V tiles are dead: reuse shared memory */\n",
    "MSKV_UNROLL\n",
    "        for (int d = 0; d < MSKV_D / 8; d++) {\n",
    "            float *p0 = mo + (warp * 16 + g) * MSKV_MERGE_LD + d * 8 + 2 * t4, *p1 = p0 + 8 * MSKV_MERGE_LD;\n",
    "            p0[0] = w.o[0][d][0]; p0[1] = w.o[0][d][1]; p1[0] = w.o[0][d][2]; p1[1] = w.o[0][d][3];\n",
    "        }\n",
    "        if (t4 == 0) {\n",
    "            mm[warp * 16 + g] = w.m[0]; mm[warp * 16 + g + 8] = w.m[1];\n",
    "            ml[warp * 16 + g] = w.l[MSKV_LSUM(0)]; ml[warp * 16 + g + 8] = w.l[MSKV_LSUM(1)];\n",
    "        }\n",
    "        MSKV_SYNC_ID(4);\n",
    "        for (int idx = tid; idx < 16 * MSKV_D; idx += 128) {\n",
    "            int r = idx / MSKV_D, d = idx % MSKV_D, R = row0 + r;\n",
    "            float M = mskv_neg_inf(), L = 0.0f, acc = 0.0f;\n",
    "            mskv_i64 orow;\n",
    "            if (R >= rows) continue;\n",
    "            for (int k = 0; k < 4; k++) M = fmaxf(M, mm[k * 16 + r]);\n",
    "            if (M != mskv_neg_inf()) {\n",
    "                for (int k = 0; k < 4; k++) {\n",
    "                    float f = mskv_exp2((mm[k * 16 + r] - M) * scale_log2);\n",
    "                    L += f * ml[k * 16 + r];\n",
    "                    acc += f * mo[(k * 16 + r) * MSKV_MERGE_LD + d];\n",
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
    "        (void)smem;\n",
    "        for (int h = 0; h < 2 * MSKV_MT; h++) {\n",
    "            const int mt = h >> 1, e = 2 * (h & 1);\n",
    "            int R = row0 + warp * MSKV_WM + 16 * mt + g + 8 * (h & 1);\n",
    "            const float l = w.l[MSKV_LSUM(h)];\n",
    "            float inv = l > 0.0f ? 1.0f / l : 0.0f;\n",
    "            float lv = l > 0.0f ? (w.m[h] * scale_log2 + log2f(l)) * ln2 : mskv_neg_inf();\n",
    "            mskv_i64 orow;\n",
    "            if (R >= rows) continue;\n",
    "            orow = (mskv_i64)(q0 + R / group) * q_heads + kvh * group + R % group;\n",
    "            if (n_splits > 1) {\n",
    "                float *dst = o_part + ((mskv_i64)split * total_q * q_heads + orow) * MSKV_D + 2 * t4;\n",
    "MSKV_UNROLL\n",
    "                for (int d = 0; d < MSKV_D / 8; d++) { dst[d * 8] = w.o[mt][d][e] * inv; dst[d * 8 + 1] = w.o[mt][d][e + 1] * inv; }\n",
    "                if (t4 == 0) lse_part[(mskv_i64)split * total_q * q_heads + orow] = lv;\n",
    "            } else {\n",
    "                mskv_u32 *dst = (mskv_u32 *)((mskv_u16 *)o + orow * MSKV_D + 2 * t4);\n",
    "MSKV_UNROLL\n",
    "                for (int d = 0; d < MSKV_D / 8; d++) dst[d * 4] = mskv_pack2(w.o[mt][d][e] * inv, w.o[mt][d][e + 1] * inv);\n",
    "                if (lse && t4 == 0) lse[orow] = lv;\n",
    "            }\n",
    "        }\n",
    "#endif\n",
    "    }\n",
    "}\n",
    "\n",
    "/* The sm_90a module (the runtime's arch-specific build, for mskv_attn_sm90)\n",
    "   leaves mskv_attn out: it is launched from the sm_90 module only, and at the\n",
    "   sm_90a module's ptxas -O3 it would spill. */\n",
    "#if !(defined(MSKV_GPU) && MSKV_SM90A)\n",
    "MSKV_KERNEL void mskv_attn(const void *q, const void *k_pool, const void *v_pool,\n",
    "                           const int *qo_indptr, const int *kv_indptr, const int *kv_indices,\n",
    "                           const int *kv_len, const int *kv_pos_split, const int *kv_pos_shift,\n",
    "                           int q_heads, int kv_heads, int page_size, unsigned int page_magic, int page_shift,\n",
    "                           float scale_log2, int mask, int window_left, int kv_chunk, int n_splits,\n",
    "                           void *o, float *lse, float *o_part, float *lse_part,\n",
    "                           const int *q_pos, const int *vis_sink_end, const int *vis_window_start) {\n",
    "    MSKV_SMEM(smem);\n",
    "    const int tid = mskv_tid(), warp = tid >> 5, lane = tid & 31, g = lane >> 2;\n",
    "    const int b = mskv_bid_y(), kvh = mskv_bid_z() % kv_heads, split = mskv_bid_z() / kv_heads;\n",
    "    const int group = q_heads / kv_heads;\n",
    "    const int q0 = qo_indptr[b], qo_len = qo_indptr[b + 1] - q0;\n",
    "    const int rows = qo_len * group, row0 = mskv_bid_x() * MSKV_BM;\n",
    "    const int kvl = kv_len[b], psplit = kv_pos_split[b], pshift = kv_pos_shift[b];\n",
    "    mskv_u16 *sq = (mskv_u16 *)(smem + MSKV_Q_OFF);\n",
    "    mskv_attn_warp w;\n",
    "    mskv_tiles t;\n",
    "    mskv_gather ga;\n",
    "    mskv_pipe p;\n",
    "    int i, qpos_min, qpos_max, h0, h1;\n",
    "    if (row0 >= rows) return;  /* whole block: before any barrier */\n",
    "    w.wrow0 = MSKV_ATTN_WARP_KEYS ? 0 : warp * MSKV_WM;\n",
    "    w.wkey0 = MSKV_ATTN_WARP_KEYS ? warp * 16 : 0;\n",
    "    /* Q (A operand): row wrow0 + (lane & 15), chunk 2 kk + lane / 16; K (B\n",
    "       operand): key wkey0 + (lane & 7) + 8 (lane / 16), chunk 2 kk + bit 3 of\n",
    "       lane; V (B, transposed): key wkey0 + (lane & 15), chunk 2 dp + lane / 16.\n",
    "       In every case row & 7 == lane & 7 and the chunk's low bit is b, so the\n",
    "       swizzled chunk of k-step kk is 2 kk ^ b ^ (lane & 7): the offset of\n",
    "       k-step 0 XOR 32 kk (the row start is aligned to the row's length). */\n",
    "    w.qb = (mskv_u32)(MSKV_Q_OFF + (w.wrow0 + (lane & 15)) * MSKV_ROWB + 16 * ((lane >> 4) ^ (lane & 7)));\n",
    "    w.kb = (mskv_u32)((w.wkey0 + (lane & 7) + 8 * (lane >> 4)) * MSKV_ROWB + 16 * (((lane >> 3) & 1) ^ (lane & 7)));\n",
    "    w.vb = (mskv_u32)((w.wkey0 + (lane & 15)) * MSKV_ROWB + 16 * ((lane >> 4) ^ (lane & 7)));\n",
    "    w.scale_log2 = scale_log2;\n",
    "\n",
    "    {\n",
    "        /* the block's queries [qa, qz] and their mask positions */\n",
    "        const int qa = row0 / group, qz = (row0 + MSKV_BM - 1 < rows - 1 ? row0 + MSKV_BM - 1 : rows - 1) / group;\n",
    "        if (q_pos && mask >= 1) {\n",
    "            mskv_q_pos_range<128>(q_pos + q0, qa, qz - qa + 1, (int *)(void *)smem, &qpos_min, &qpos_max);\n",
    "        } else {\n",
    "            qpos_min = mskv_abs_pos(kvl - qo_len + qa, psplit, pshift);\n",
    "            qpos_max = mskv_abs_pos(kvl - qo_len + qz, psplit, pshift);\n",
    "        }\n",
    "    }\n",
    "    mskv_vis_hole(vis_sink_end, vis_window_start, b, kvl, psplit, pshift, &h0, &h1);\n",
    "    /* block-uniform values the compiler cannot see as such (they went\n",
    "       through shared memory): said so, the key loop's bounds stay in\n",
    "       uniform registers */\n",
    "    qpos_min = mskv_uniform(qpos_min); qpos_max = mskv_uniform(qpos_max);\n",
    "    h0 = mskv_uniform(h0); h1 = mskv_uniform(h1);\n",
    "    w.h0 = h0;\n",
    "    t = mskv_attn_tiles(n_splits, split, kv_chunk, kvl, mask, window_left, psplit, pshift, qpos_min, qpos_max, h0, h1);\n",
    "    {\n",
    "        const int c0 = (tid % MSKV_TPR) * MSKV_CPT, row = tid / MSKV_TPR;\n",
    "        ga.k_pool = (const unsigned char *)k_pool;\n",
    "        ga.v_pool = (const unsigned char *)v_pool;\n",
    "        ga.kv_indices = kv_indices;\n",
    "        ga.magic = page_magic; ga.shift = page_shift; ga.page_size = page_size; ga.kv_heads = kv_heads;\n",
    "        ga.page0 = kv_indptr[b];\n",
    "        ga.head = (mskv_u32)(kvh * MSKV_D * 2 + c0 * 16);\n",
    "        ga.n_hi = t.n_hi;\n",
    "        ga.row = row;\n",
    "        ga.dst = (mskv_u32)((row * MSKV_CH + (c0 ^ (row & 7))) * 16);\n",
    "    }\n",
    "\n",
    "    /* Q tile: row r of the block is query (row0 + r) / group, q head kvh * group + (row0 + r) % group */\n",
    "    for (int idx = tid; idx < MSKV_BM * MSKV_CH; idx += 128) {\n",
    "        int r = idx / MSKV_CH, ch = idx % MSKV_CH, R = row0 + r, ok = R < rows;\n",
    "        mskv_i64 off = 0;\n",
    "        if (ok) off = (((mskv_i64)(q0 + R / group) * q_heads + kvh * group + R % group) * MSKV_D + ch * 8) * 2;\n",
    "        mskv_cp_async16(sq + mskv_swz(r, ch), (const unsigned char *)q + off, ok ? 16 : 0);\n",
    "    }\n",
    "    /* the first STAGES - 1 tiles, one commit group each (Q rides with tile 0) */\n",
    "    p.cs = MSKV_Q_BYTES;\n",
    "    p.ls = MSKV_Q_BYTES;\n",
    "    for (i = 0; i < MSKV_STAGES - 1; i++) {\n",
    "        if (t.n_tiles > 0) mskv_gather_tile(ga, smem, p.ls, mskv_tile_key(t, i), mskv_row_fetch(ga, mskv_tile_key(t, i)));\n",
    "        mskv_cp_commit();\n",
    "        p.ls = mskv_stage_next(p.ls);\n",
    "    }\n",
    "    if (t.n_tiles > 0) p.next = mskv_row_fetch(ga, mskv_tile_key(t, MSKV_STAGES - 1));\n",
    "    else p.next = 0;\n",
    "\n",
    "    for (int h = 0; h < 2 * MSKV_MT; h++) {\n",
    "        const int R = row0 + w.wrow0 + 16 * (h >> 1) + g + 8 * (h & 1);\n",
    "        const int qpos = mskv_q_pos(q_pos ? q_pos + q0 : 0, (R < rows ? R : rows - 1) / group, kvl, qo_len, psplit, pshift);\n",
    "        int lo = t.a_lo, hi = t.n_hi;\n",
    "        if (mask >= 1) { const int c = mskv_first_at(qpos + 1, psplit, pshift); hi = c < hi ? c : hi; }\n",
    "        if (mask == 2) { const int c = mskv_first_at(qpos - window_left, psplit, pshift); lo = c > lo ? c : lo; }\n",
    "        w.klo[h] = lo;\n",
    "        w.khi[h] = hi;\n",
    "        w.m[h] = mskv_neg_inf();\n",
    "    }\n",
    "    w.l[0] = w.l[1] = w.l[2] = w.l[3] = 0.0f;\n",
    "MSKV_UNROLL\n",
    "    for (int mt = 0; mt < MSKV_MT; mt++)\n",
    "MSKV_UNROLL\n",
    "        for (int d = 0; d < MSKV_D / 8; d++) w.o[mt][d][0] = w.o[mt][d][1] = w.o[mt][d][2] = w.o[mt][d][3] = 0.0f;\n",
    "#if MSKV_QREG\n",
    "    /* Q into registers once (with tile 0: its group is the oldest) */\n",
    "    mskv_cp_wait<MSKV_STAGES - 2>();\n",
    "    MSKV_SYNC_ID(5);\n",
    "MSKV_UNROLL\n",
    "    for (int mt = 0; mt < MSKV_MT; mt++)\n",
    "MSKV_UNROLL\n",
    "        for (int kk = 0; kk < MSKV_D / 16; kk++)\n",
    "            mskv_ldsm_x4(w.qf[mt][kk], smem + ((w.qb ^ (mskv_u32)(32 * kk)) + mt * 16 * MSKV_ROWB));\n",
    "#endif\n",
    "\n",
    "    /* the masked tiles, then the whole ones: loops of their own, so the common one carries no mask code */\n",
    "    for (i = 0; i < t.n_masked; i++)\n",
    "        mskv_attn_step<1, -1>(w, p, ga, smem, mskv_tile_key(t, i), mskv_tile_key(t, i + MSKV_STAGES - 1),\n",
    "                              mskv_tile_key(t, i + MSKV_STAGES));\n",
    "    if (t.f1_hi > t.f1_lo)\n",
    "        mskv_attn_run1(w, p, ga, smem, mskv_tile_at(t, t.f1_lo), mskv_tile_at(t, t.f1_hi - 1) + MSKV_BN,\n",
    "                       mskv_tile_at(t, t.f2_lo) - (mskv_tile_at(t, t.f1_hi - 1) + MSKV_BN));\n",
    "    mskv_attn_run(w, p, ga, smem, mskv_tile_at(t, t.f2_lo), mskv_tile_at(t, t.f2_lo) + (t.f2_hi - t.f2_lo) * MSKV_BN, t.n_hi);\n",
    "    mskv_cp_wait<0>();\n",
    "\n",
    "    mskv_attn_store(w, smem, qo_indptr, q_heads, kv_heads, scale_log2, n_splits, o, lse, o_part, lse_part);\n",
    "}\n",
    "#endif\n",
    "\n",
    "#endif /* MSKV_DTYPE != 0 */\n",
    "\n",
    "/* >>attention sm90a -------------------------------------------------------- */\n",
    "/* mskv_attn_sm90: the prefill/chunk attention of mskv_attn for sm_90a, in the\n",
    "   warp-specialised manner of FlashAttention-3 (see the file's header). */\n",
    "#if MSKV_SM90A && MSKV_DTYPE != 0\n",
    "\n",
    "#ifdef MSKV_GPU\n",
    "/* Hopper primitives. The tensor map is CUtensorMap: 128 opaque bytes, passed\n",
    "   by value as a __grid_constant__ parameter so TMA can read it in place. */\n",
    "struct __align__(64) mskv_tmap { mskv_u64 opaque[16]; };\n",
    "#define MSKV_GRID_CONST __grid_constant__\n",
    "#define MSKV_BOUNDS(threads, blocks) __launch_bounds__(threads, blocks)\n",
    "/* bar.sync / bar.arrive: n threads (a multiple of 32) meet at named barrier id */\n",
    "MSKV_DEV void mskv_bar_sync(int id, int n) { asm volatile(\"bar.sync %0, %1;\" :: \"r\"(id), \"r\"(n) : \"memory\"); }\n",
    "MSKV_DEV void mskv_bar_arrive(int id, int n) { asm volatile(\"bar.arrive %0, %1;\" :: \"r\"(id), \"r\"(n) : \"memory\"); }\n",
    "MSKV_DEV void mskv_mbar_init(mskv_u32 bar, int count) {\n",
    "    asm volatile(\"mbarrier.init.shared::cta.b64 [%0], %1;\" :: \"r\"(bar), \"r\"(count) : \"memory\");\n",
    "}\n",
    "/* makes the inits visible to the async proxy (the copies that complete on them) */\n",
    "MSKV_DEV void mskv_mbar_init_fence(void) { asm volatile(\"fence.mbarrier_init.release.cluster;\" ::: \"memory\"); }\n",
    "MSKV_DEV void mskv_mbar_arrive(mskv_u32 bar) {\n",
    "    asm volatile(\"{\\n.reg .b64 st;\\nmbarrier.arrive.shared::cta.b64 st, [%0];\\n}\" :: \"r\"(bar) : \"memory\");\n",
    "}\n",
    "MSKV_DEV void mskv_mbar_arrive_tx(mskv_u32 bar, mskv_u32 bytes) {\n",
    "    asm volatile(\"{\\n.reg .b64 st;\\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\\n}\" :: \"r\"(bar), \"r\"(bytes) : \"memory\");\n",
    "}\n",
    "/* 1 once the phase of this parity has completed */\n",
    "MSKV_DEV int mskv_mbar_try_wait(mskv_u32 bar, int parity) {\n",
    "    mskv_u32 ok;\n",
    "    asm volatile(\"{\\n.reg .pred p;\\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\\nselp.u32 %0, 1, 0, p;\\n}\"\n",
    "                 : \"=r\"(ok) : \"r\"(bar), \"r\"(parity) : \"memory\");\n",
    "    return (int)ok;\n",
    "}\n",
    "/* generic-proxy writes of this thread (cp.async) become visible to wgmma and TMA */\n",
    "MSKV_DEV void mskv_fence_proxy_async(void) { asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\"); }\n",
    "MSKV_DEV void mskv_tma_load_4d(mskv_u32 dst, const mskv_tmap *map, int c0, int c1, int c2, int c3, mskv_u32 bar) {\n",
    "    asm volatile(\"cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\"\n",
    "                 :: \"r\"(dst), \"l\"((mskv_u64)map), \"r\"(c0), \"r\"(c1), \"r\"(c2), \"r\"(c3), \"r\"(bar) : \"memory\");\n",
    "}\n",
    "MSKV_DEV void mskv_wgmma_fence(void) { asm volatile(\"wgmma.fence.sync.aligned;\" ::: \"memory\"); }\n",
    "MSKV_DEV void mskv_wgmma_commit(void) { asm volatile(\"wgmma.commit_group.sync.aligned;\" ::: \"memory\"); }\n",
    "template <int N> MSKV_DEV void mskv_wgmma_wait(void) { asm volatile(\"wgmma.wait_group.sync.aligned %0;\" :: \"n\"(N) : \"memory\"); }\n",
    "template <int N> MSKV_DEV void mskv_setmaxnreg_inc(void) { asm volatile(\"setmaxnreg.inc.sync.aligned.u32 %0;\" :: \"n\"(N)); }\n",
    "template <int N> MSKV_DEV void mskv_setmaxnreg_dec(void) { asm volatile(\"setmaxnreg.dec.sync.aligned.u32 %0;\" :: \"n\"(N)); }\n",
    "/* Registers an asynchronous wgmma reads or writes: the compiler must neither\n",
    "   move their uses across the wait nor reuse them while the op runs. */\n",
    "MSKV_DEV void mskv_wg_keep(float &x) { asm volatile(\"\" : \"+f\"(x) :: \"memory\"); }\n",
    "/* lane 0's x in every lane: the compiler then knows x is warp-uniform (descriptors\n",
    "   and barrier ids stay in uniform registers) */\n",
    "MSKV_DEV int mskv_bcast0(int x) { return __shfl_sync(0xffffffffu, x, 0); }\n",
    "MSKV_DEV void mskv_wg_keep_u(mskv_u32 &x) { asm volatile(\"\" : \"+r\"(x) :: \"memory\"); }\n",
    "#if MSKV_DTYPE == 1\n",
    "#define MSKV_WG_TY \".f16.f16\"\n",
    "#else\n",
    "#define MSKV_WG_TY \".bf16.bf16\"\n",
    "#endif\n",
    "/* accumulator operand lists: \"+f\"(d[0]) ... */\n",
    "#define MSKV_WG_O8(i) \"+f\"(d[i]), \"+f\"(d[i + 1]), \"+f\"(d[i + 2]), \"+f\"(d[i + 3]), \"+f\"(d[i + 4]), \"+f\"(d[i + 5]), \"+f\"(d[i + 6]), \"+f\"(d[i + 7])\n",
    "#define MSKV_WG_O32 MSKV_WG_O8(0), MSKV_WG_O8(8), MSKV_WG_O8(16), MSKV_WG_O8(24)\n",
    "#define MSKV_WG_O64 MSKV_WG_O32, MSKV_WG_O8(32), MSKV_WG_O8(40), MSKV_WG_O8(48), MSKV_WG_O8(56)\n",
    "#define MSKV_WG_O36 MSKV_WG_O32, \"+f\"(d[32]), \"+f\"(d[33]), \"+f\"(d[34]), \"+f\"(d[35])\n",
    "#define MSKV_WG_O68 MSKV_WG_O64, \"+f\"(d[64]), \"+f\"(d[65]), \"+f\"(d[66]), \"+f\"(d[67])\n",
    "#define MSKV_WG_O128 MSKV_WG_O64, MSKV_WG_O8(64), MSKV_WG_O8(72), MSKV_WG_O8(80), MSKV_WG_O8(88), \\\n",
    "    MSKV_WG_O8(96), MSKV_WG_O8(104), MSKV_WG_O8(112), MSKV_WG_O8(120)\n",
    "#define MSKV_WG_D32 \"{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, \" \\\n",
    "    \"%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}\"\n",
    "#define MSKV_WG_D36 \"{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, \" \\\n",
    "    \"%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, \" \\\n",
    "    \"%32, %33, %34, %35}\"\n",
    "#define MSKV_WG_D68 \"{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, \" \\\n",
    "    \"%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, \" \\\n",
    "    \"%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, \" \\\n",
    "    \"%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, \" \\\n",
    "    \"%64, %65, %66, %67}\"\n",
    "#define MSKV_WG_D64 \"{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, \" \\\n",
    "    \"%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, \" \\\n",
    "    \"%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, \" \\\n",
    "    \"%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}\"\n",
    "#define MSKV_WG_D128 \"{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, \" \\\n",
    "    \"%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, \" \\\n",
    "    \"%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, \" \\\n",
    "    \"%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, \" \\\n",
    "    \"%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, \" \\\n",
    "    \"%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, \" \\\n",
    "    \"%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, \" \\\n",
    "    \"%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}\"\n",
    "/* wgmma m64nNk16 with f32 accumulators d[N/2]; acc 0: D = A B, else D += A B.\n",
    "   ss: A and B K-major from descriptors (S = Q K^T); rs: A from registers (P),\n",
    "   B N-major from a descriptor (O += P V, imm-trans-b 1; N = head_dim + 8\n",
    "   when V carries a block of ones for the row sums). */\n",
    "#define MSKV_WG_SS(N, DL, OPS, IA, IB, IP)                                                              \\\n",
    "    MSKV_DEV void mskv_wgmma_ss##N(float *d, mskv_u64 da, mskv_u64 db, int acc) {                       \\\n",
    "        asm volatile(\"{\\n.reg .pred p;\\nsetp.ne.b32 p, %\" #IP \", 0;\\n\"                                  \\\n",
    "                     \"wgmma.mma_async.sync.aligned.m64n\" #N \"k16.f32\" MSKV_WG_TY \" \" DL \", %\" #IA \", %\" #IB \\\n",
    "                     \", p, 1, 1, 0, 0;\\n}\\n\" : OPS : \"l\"(da), \"l\"(db), \"r\"(acc));                        \\\n",
    "    }\n",
    "#define MSKV_WG_RS(N, DL, OPS, I0, I1, I2, I3, IB, IP)                                                  \\\n",
    "    MSKV_DEV void mskv_wgmma_rs##N(float *d, const mskv_u32 *a, mskv_u64 db, int acc) {                 \\\n",
    "        asm volatile(\"{\\n.reg .pred p;\\nsetp.ne.b32 p, %\" #IP \", 0;\\n\"                                  \\\n",
    "                     \"wgmma.mma_async.sync.aligned.m64n\" #N \"k16.f32\" MSKV_WG_TY \" \" DL \", {%\" #I0 \", %\" #I1 \\\n",
    "                     \", %\" #I2 \", %\" #I3 \"}, %\" #IB \", p, 1, 1, 1;\\n}\\n\"                                 \\\n",
    "                     : OPS : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"l\"(db), \"r\"(acc));            \\\n",
    "    }\n",
    "MSKV_WG_SS(64, MSKV_WG_D32, MSKV_WG_O32, 32, 33, 34)\n",
    "MSKV_WG_SS(128, MSKV_WG_D64, MSKV_WG_O64, 64, 65, 66)\n",
    "MSKV_WG_RS(72, MSKV_WG_D36, MSKV_WG_O36, 36, 37, 38, 39, 40, 41)\n",
    "MSKV_WG_RS(136, MSKV_WG_D68, MSKV_WG_O68, 68, 69, 70, 71, 72, 73)\n",
    "MSKV_WG_RS(256, MSKV_WG_D128, MSKV_WG_O128, 128, 129, 130, 131, 132, 133)\n",
    "/* a 16-byte generic store of four copies of w (fence.proxy.async before the tensor cores read it) */\n",
    "MSKV_DEV void mskv_sts16(void *dst, mskv_u32 w) {\n",
    "    mskv_v16 v;\n",
    "    v.x = v.y = v.z = v.w = w;\n",
    "    *(mskv_v16 *)dst = v;\n",
    "}\n",
    "#else\n",
    "/* host emulation: tests/emu/mskv_emu_sm90.h has the primitives; the wgmma\n",
    "   entry points take this file's MSKV_DTYPE */\n",
    "MSKV_DEV void mskv_wgmma_ss64(float *d, mskv_u64 da, mskv_u64 db, int acc) { mskv_emu_wgmma_ss(d, 64, da, db, acc, MSKV_DTYPE == 2); }\n",
    "MSKV_DEV void mskv_wgmma_ss128(float *d, mskv_u64 da, mskv_u64 db, int acc) { mskv_emu_wgmma_ss(d, 128, da, db, acc, MSKV_DTYPE == 2); }\n",
    "MSKV_DEV void mskv_wgmma_rs72(float *d, const mskv_u32 *a, mskv_u64 db, int acc) { mskv_emu_wgmma_rs_tb(d, 72, a, db, acc, MSKV_DTYPE == 2); }\n",
    "MSKV_DEV void mskv_wgmma_rs136(float *d, const mskv_u32 *a, mskv_u64 db, int acc) { mskv_emu_wgmma_rs_tb(d, 136, a, db, acc, MSKV_DTYPE == 2); }\n",
    "MSKV_DEV void mskv_wgmma_rs256(float *d, const mskv_u32 *a, mskv_u64 db, int acc) { mskv_emu_wgmma_rs_tb(d, 256, a, db, acc, MSKV_DTYPE == 2); }\n",
    "#endif\n",
    "\n",
    "/* Tiles: 128 rows per block (two consumer warpgroups of 64), BN keys per K/V\n",
    "   tile, a ring of STAGES stages of K and V. Every operand tile is K-major\n",
    "   with the 128-byte swizzle: [D/64 column blocks][rows][128 B], 16-byte chunk\n",
    "   c of row r at ((c ^ (r & 7)) << 4) of its 128-byte row, each tile on a\n",
    "   1024-byte boundary. */\n",
    "#if MSKV_D >= 256\n",
    "#define MSKV_H_BN 64\n",
    "#else\n",
    "#define MSKV_H_BN 128\n",
    "#endif\n",
    "#if MSKV_D <= 64\n",
    "#define MSKV_H_STAGES 3\n",
    "#else\n",
    "#define MSKV_H_STAGES 2\n",
    "#endif\n",
    "/* Row sums by the tensor cores where N allows (head_dim <= 128): each\n",
    "   stage's V is followed by a block of ones, so O += P V with N = D + 8 also\n",
    "   accumulates sum(P) in columns D..D+7, rescaled with O (64 FADD less a tile). */\n",
    "#if MSKV_D == 64\n",
    "#define MSKV_H_PVN 72\n",
    "#define MSKV_H_ONES 1\n",
    "#elif MSKV_D == 128\n",
    "#define MSKV_H_PVN 136\n",
    "#define MSKV_H_ONES 1\n",
    "#else\n",
    "#define MSKV_H_PVN MSKV_D\n",
    "#define MSKV_H_ONES 0\n",
    "#endif\n",
    "#define MSKV_H_THREADS 384                        /* producer warpgroup + 2 consumers */\n",
    "#define MSKV_H_BM 128\n",
    "#define MSKV_H_QB (64 * MSKV_D * 2)                /* one consumer's Q tile */\n",
    "#define MSKV_H_TB (MSKV_H_BN * MSKV_D * 2)         /* one K (or V) tile */\n",
    "#define MSKV_H_OB (MSKV_H_ONES * MSKV_H_BN * 128)  /* the ones block after V (an atom of 64 columns) */\n",
    "#define MSKV_H_SB (2 * MSKV_H_TB + MSKV_H_OB)      /* a stage: K, V, ones */\n",
    "#define MSKV_H_BARS (2 * MSKV_H_QB + MSKV_H_STAGES * MSKV_H_SB)   /* full[STAGES], empty[STAGES] */\n",
    "#define MSKV_H_SMEM (1024 + MSKV_H_BARS + 16 * MSKV_H_STAGES)     /* + slack to align the base */\n",
    "/* A stage goes back to the producer when every consumer warp that read it\n",
    "   has waited for its own wgmma groups: wgmma.commit_group / wait_group track\n",
    "   the executing warp's groups, so one warp's wait says nothing of the other\n",
    "   three. Lane 0 of each consumer warp arrives on the stage's \"empty\" barrier\n",
    "   after its warp's wgmma.wait_group (.sync.aligned: the whole warp waits\n",
    "   together), and the barrier counts 4 warps x 2 consumer warpgroups. The\n",
    "   leader-only form (one arrival per warpgroup, count 2) is kept as a planted\n",
    "   bug for the emulator's tests only: MSKV_SM90_PLANT_LEADER_RELEASE. */\n",
    "#if !defined(MSKV_GPU) && defined(MSKV_SM90_PLANT_LEADER_RELEASE)\n",
    "#define MSKV_H_RELEASERS 2\n",
    "#else\n",
    "#define MSKV_H_RELEASERS 8\n",
    "#endif\n",
    "#define MSKV_H_REGS_PRODUCER 40\n",
    "#define MSKV_H_REGS_CONSUMER 232                  /* 128 x 40 + 256 x 232 <= 64K */\n",
    "/* named barriers: 1 producer team, 2 + w consumer w's Q, 4 + w consumer w's turn at the tensor cores */\n",
    "#define MSKV_CAT2(a, b) a##b\n",
    "#define MSKV_CAT(a, b) MSKV_CAT2(a, b)\n",
    "#define MSKV_WGMMA_S MSKV_CAT(mskv_wgmma_ss, MSKV_H_BN)\n",
    "#define MSKV_WGMMA_PV MSKV_CAT(mskv_wgmma_rs, MSKV_H_PVN)\n",
    "\n",
    "#ifndef MSKV_GPU\n",
    "/* for the host tests: the launch geometry of these defines */\n",
    "static const int mskv_attn_sm90_block_keys = MSKV_H_BN, mskv_attn_sm90_smem_bytes = MSKV_H_SMEM;\n",
    "#endif\n",
    "\n",
    "/* matrix descriptor, 128-byte swizzle: start, leading / stride byte offsets */\n",
    "MSKV_DEV mskv_u64 mskv_h_desc(mskv_u32 addr, mskv_u32 lbo, mskv_u32 sbo) {\n",
    "    return (mskv_u64)((addr & 0x3ffffu) >> 4) | ((mskv_u64)((lbo & 0x3ffffu) >> 4) << 16) |\n",
    "           ((mskv_u64)((sbo & 0x3ffffu) >> 4) << 32) | (1ull << 62);\n",
    "}\n",
    "\n",
    "/* The keys a block visits, as tiles of BN on BN-aligned keys (a TMA box\n",
    "   never straddles a page). Like mskv_attn's: run A from a0 (tiles\n",
    "   0..n_a-1) up to the hidden keys, run B from b0 (at or past A's last tile)\n",
    "   after them, tiles n_a..n_tiles-1; tiles wholly hidden are not visited.\n",
    "   Tiles [f1_lo, f1_hi) and [f2_lo, f2_hi) are visible whole to every row of\n",
    "   the block (f1 empty unless both are not); the others (\"masked\") go first,\n",
    "   in a loop of their own, then the whole ones. */\n",
    "struct mskv_h_keys {\n",
    "    int split_lo, split_hi;   /* the split's keys (kv_len cut) */\n",
    "    int a0, n_a, b0, n_tiles, f1_lo, f1_hi, f2_lo, f2_hi, n_masked;\n",
    "};\n",
    "MSKV_DEV mskv_h_keys mskv_h_block_keys(int kvl, int psplit, int pshift, int mask, int window_left, int kv_chunk,\n",
    "                                       int n_splits, int split, int qpos_min, int qpos_max, int h0, int h1) {\n",
    "    mskv_h_keys k;\n",
    "    int n_lo, n_hi, lo_max, hi_min, a_hi, b_lo, alo, ahi, blo, bhi;\n",
    "    k.split_lo = n_splits > 1 ? split * kv_chunk : 0;\n",
    "    k.split_hi = n_splits > 1 ? (k.split_lo + kv_chunk < kvl ? k.split_lo + kv_chunk : kvl) : kvl;\n",
    "    n_lo = lo_max = k.split_lo;\n",
    "    n_hi = hi_min = k.split_hi;\n",
    "    if (mask >= 1) {\n",
    "        const int c = mskv_first_at(qpos_max + 1, psplit, pshift), c2 = mskv_first_at(qpos_min + 1, psplit, pshift);\n",
    "        if (c < n_hi) n_hi = c;\n",
    "        if (c2 < hi_min) hi_min = c2;\n",
    "    }\n",
    "    if (mask == 2) {\n",
    "        const int lo = mskv_first_at(qpos_min - window_left, psplit, pshift);\n",
    "        const int lo2 = mskv_first_at(qpos_max - window_left, psplit, pshift);\n",
    "        if (lo > n_lo) n_lo = lo;\n",
    "        if (lo2 > lo_max) lo_max = lo2;\n",
    "    }\n",
    "    a_hi = h0 < n_hi ? h0 : n_hi;\n",
    "    k.a0 = n_lo / MSKV_H_BN * MSKV_H_BN;\n",
    "    k.n_a = a_hi > n_lo ? (a_hi - k.a0 + MSKV_H_BN - 1) / MSKV_H_BN : 0;\n",
    "    b_lo = h1 > n_lo ? h1 : n_lo;\n",
    "    k.b0 = b_lo / MSKV_H_BN * MSKV_H_BN;\n",
    "    if (k.b0 < k.a0 + k.n_a * MSKV_H_BN) k.b0 = k.a0 + k.n_a * MSKV_H_BN;\n",
    "    k.n_tiles = k.n_a + (n_hi > b_lo && n_hi > k.b0 ? (n_hi - k.b0 + MSKV_H_BN - 1) / MSKV_H_BN : 0);\n",
    "    mskv_whole_tiles<MSKV_H_BN>(k.a0, k.n_a, lo_max, hi_min < a_hi ? hi_min : a_hi, &alo, &ahi);\n",
    "    mskv_whole_tiles<MSKV_H_BN>(k.b0, k.n_tiles - k.n_a, lo_max > b_lo ? lo_max : b_lo, hi_min, &blo, &bhi);\n",
    "    blo += k.n_a; bhi += k.n_a;\n",
    "    if (alo == ahi) { k.f1_lo = k.f1_hi = blo; k.f2_lo = blo; k.f2_hi = bhi; }\n",
    "    else if (blo == bhi) { k.f1_lo = k.f1_hi = alo; k.f2_lo = alo; k.f2_hi = ahi; }\n",
    "    else { k.f1_lo = alo; k.f1_hi = ahi; k.f2_lo = blo; k.f2_hi = bhi; }\n",
    "    k.n_masked = k.n_tiles - (k.f1_hi - k.f1_lo) - (k.f2_hi - k.f2_lo);\n",
    "    return k;\n",
    "}\n",
    "/* first key of tile k in key order */\n",
    "MSKV_DEV int mskv_h_tile_at(const mskv_h_keys &k, int t) {\n",
    "    return t < k.n_a ? k.a0 + t * MSKV_H_BN : k.b0 + (t - k.n_a) * MSKV_H_BN;\n",
    "}\n",
    "/* first key of the i-th tile in visiting order (producer and consumers agree) */\n",
    "MSKV_DEV int mskv_h_tile_key(const mskv_h_keys &k, int i) {\n",
    "    const int m1 = k.f1_lo, m2 = m1 + k.f2_lo - k.f1_hi, w1 = k.f1_hi - k.f1_lo;\n",
    "    int t;\n",
    "    if (i < k.n_masked) t = i < m1 ? i : i < m2 ? i - m1 + k.f1_hi : i - m2 + k.f2_hi;\n",
    "    else t = i - k.n_masked < w1 ? i - k.n_masked + k.f1_lo : i - k.n_masked - w1 + k.f2_lo;\n",
    "    return mskv_h_tile_at(k, t);\n",
    "}\n",
    "\n",
    "/* ---- producer: one tile of K and V into a stage ---- */\n",
    "\n",
    "/* TMA: the tile lies in whole pages (page_size a multiple of BN, or BN a\n",
    "   multiple of page_size), one box per page piece and 64-wide column block:\n",
    "   the tensor map is the pool as [pages][page_size][kv_heads][D] (dims D,\n",
    "   kv_heads, page_size, num_pages; box 64 x 1 x min(page_size, BN) x 1), so a\n",
    "   box is (c * 64, kvh, slot in page, page id). Dense K/V (pages NULL, key0\n",
    "   its buffer row): the map is the buffer as one page of all its rows (box\n",
    "   64 x 1 x BN x 1), a box (c * 64, kvh, key0, 0). Lanes of one warp share the boxes. */\n",
    "MSKV_DEV void mskv_h_load_tma(const mskv_tmap *k_map, const mskv_tmap *v_map, const int *pages, int page_size, int kvh,\n",
    "                              int key0, mskv_u32 kst, mskv_u32 full, int lane) {\n",
    "    /* dense K/V (pages NULL): one page of every row, the box BN rows from row key0 */\n",
    "    const int box_rows = !pages || page_size >= MSKV_H_BN ? MSKV_H_BN : page_size, boxes = MSKV_H_BN / box_rows;\n",
    "    /* the expectation may follow the first bytes: tx counts below zero until it comes */\n",
    "    if (lane == 0) mskv_mbar_arrive_tx(full, 2 * MSKV_H_TB);\n",
    "    for (int x = lane; x < boxes * (MSKV_D / 64); x += 32) {\n",
    "        const int pb = x / (MSKV_D / 64), cb = x % (MSKV_D / 64), key = key0 + pb * box_rows;\n",
    "        const int page = pages ? pages[key / page_size] : 0, slot = pages ? key % page_size : key;\n",
    "        const mskv_u32 dst = kst + (mskv_u32)(cb * (MSKV_H_BN * 128) + pb * box_rows * 128);\n",
    "        mskv_tma_load_4d(dst, k_map, cb * 64, kvh, slot, page, full);\n",
    "        mskv_tma_load_4d(dst + MSKV_H_TB, v_map, cb * 64, kvh, slot, page, full);\n",
    "    }\n",
    "}\n",
    "\n",
    "/* cp.async, any page size: team threads copy whole rows (one page id each),\n",
    "   rows at or past kv_len zero-filled (a page's unused slots may hold NaN);\n",
    "   then wait, fence the generic writes for the tensor cores, meet, arrive. */\n",
    "MSKV_DEV void mskv_h_load_rows(const unsigned char *k_pool, const unsigned char *v_pool, const int *pages, int krow0,\n",
    "                               int page_size, int kv_heads, int kvh, int kvl, int key0, unsigned char *sk, mskv_u32 full,\n",
    "                               int idx, int team) {\n",
    "    const mskv_u64 slot_bytes = (mskv_u64)kv_heads * (MSKV_D * 2);\n",
    "    for (int r = idx; r < MSKV_H_BN; r += team) {\n",
    "        const int j = key0 + r, ok = j < kvl;\n",
    "        mskv_u64 off = 0;\n",
    "        if (ok) off = (pages ? (mskv_u64)pages[j / page_size] * (mskv_u64)page_size + (mskv_u64)(j % page_size)\n",
    "                             : (mskv_u64)(krow0 + j)) * slot_bytes +\n",
    "                      (mskv_u64)kvh * (MSKV_D * 2);\n",
    "MSKV_UNROLL\n",
    "        for (int c = 0; c < MSKV_D / 8; c++) {\n",
    "            const int d = (c >> 3) * (MSKV_H_BN * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4);\n",
    "            mskv_cp_async16(sk + d, k_pool + off + 16 * c, ok ? 16 : 0);\n",
    "            mskv_cp_async16(sk + d + MSKV_H_TB, v_pool + off + 16 * c, ok ? 16 : 0);\n",
    "        }\n",
    "    }\n",
    "    mskv_cp_commit();\n",
    "    mskv_cp_wait<0>();\n",
    "    mskv_fence_proxy_async();\n",
    "    if (team == 32) mskv_syncwarp();\n",
    "    else mskv_bar_sync(1, team);\n",
    "    if (idx == 0) mskv_mbar_arrive(full);\n",
    "}\n",
    "\n",
    "/* ---- consumers ---- */\n",
    "\n",
    "/* One consumer warpgroup's state; a thread holds rows g and g + 8 of its\n",
    "   warp's 16 (the wgmma accumulator layout: element i is row g + 8 ((i >> 1) & 1),\n",
    "   column 8 (i >> 2) + 2 t4 + (i & 1)). */\n",
    "struct mskv_h_cons {\n",
    "    float o[MSKV_H_PVN / 2];             /* O, unnormalised (then the row sums, MSKV_H_ONES) */\n",
    "    float s[MSKV_H_BN / 2];              /* S, then P of the current tile */\n",
    "    mskv_u32 p[MSKV_H_BN / 16][4];       /* P of the previous tile as A fragments (k16 slices) */\n",
    "    float m[2], l[2];                    /* running max (unscaled), this lane's part of the row sums */\n",
    "    int klo[2], khi[2];                  /* the keys row h may see: [klo, khi) */\n",
    "    int h0;                              /* the visibility bounds' hidden keys [h0, h0 + hlen) */\n",
    "    mskv_u32 hlen;\n",
    "    mskv_u64 qd;                         /* descriptor of this warpgroup's Q tile */\n",
    "    mskv_u32 ring;                       /* shared address of stage 0 */\n",
    "    mskv_u32 bars;                       /* shared address of full[0] */\n",
    "    int cw, t4, leader;                  /* consumer 0 or 1 (warp-uniform), lane in quad, arrives for its warp */\n",
    "    float scale_log2;\n",
    "};\n",
    "\n",
    "/* mask, online softmax, P into c.s; the O rescale factors into alpha */\n",
    "template <int MASKED>\n",
    "MSKV_DEV void mskv_h_softmax(mskv_h_cons &c, int key0, float alpha[2]) {\n",
    "    float mx[2], neg[2];\n",
    "    mx[0] = c.m[0]; mx[1] = c.m[1];\n",
    "    if (MASKED) {\n",
    "        int lo[2], hi[2];\n",
    "        const int hl = c.h0 - key0 - 2 * c.t4;\n",
    "        for (int h = 0; h < 2; h++) { lo[h] = c.klo[h] - key0 - 2 * c.t4; hi[h] = c.khi[h] - key0 - 2 * c.t4; }\n",
    "MSKV_UNROLL\n",
    "        for (int i = 0; i < MSKV_H_BN / 2; i++) {\n",
    "            const int h = (i >> 1) & 1, col = (i >> 2) * 8 + (i & 1);\n",
    "            c.s[i] = col >= lo[h] && col < hi[h] && (mskv_u32)(col - hl) >= c.hlen ? c.s[i] : mskv_neg_inf();\n",
    "        }\n",
    "    }\n",
    "MSKV_UNROLL\n",
    "    for (int i = 0; i < MSKV_H_BN / 2; i++) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], c.s[i]);\n",
    "MSKV_UNROLL\n",
    "    for (int h = 0; h < 2; h++) {\n",
    "        float mu;\n",
    "        mx[h] = fmaxf(mx[h], mskv_shfl_xor(mx[h], 1));\n",
    "        mx[h] = fmaxf(mx[h], mskv_shfl_xor(mx[h], 2));\n",
    "        mu = mx[h] == mskv_neg_inf() ? 0.0f : mx[h];   /* nothing seen yet: keep exp2 finite */\n",
    "        alpha[h] = mskv_exp2((c.m[h] - mu) * c.scale_log2);\n",
    "        c.m[h] = mx[h];\n",
    "#if !MSKV_H_ONES\n",
    "        c.l[h] *= alpha[h];\n",
    "#endif\n",
    "        neg[h] = mu * c.scale_log2;\n",
    "    }\n",
    "MSKV_UNROLL\n",
    "    for (int i = 0; i < MSKV_H_BN / 2; i++) {\n",
    "        const int h = (i >> 1) & 1;\n",
    "        c.s[i] = mskv_exp2(fmaf(c.s[i], c.scale_log2, -neg[h]));\n",
    "#if !MSKV_H_ONES\n",
    "        c.l[h] += c.s[i];\n",
    "#endif\n",
    "    }\n",
    "}\n",
    "\n",
    "/* O += P V of the tile in stage ps (issued, committed) */\n",
    "MSKV_DEV void mskv_h_issue_pv(mskv_h_cons &c, int ps) {\n",
    "    const mskv_u64 vd = mskv_h_desc(c.ring + (mskv_u32)(ps * MSKV_H_SB + MSKV_H_TB), MSKV_H_BN * 128, 1024);\n",
    "MSKV_UNROLL\n",
    "    for (int kk = 0; kk < MSKV_H_BN / 16; kk++) MSKV_WGMMA_PV(c.o, c.p[kk], vd + (mskv_u64)(kk * 16 * 128 / 16), 1);\n",
    "    mskv_wgmma_commit();\n",
    "}\n",
    "\n",
    "/* PV done (this warp's wgmma.wait_group 0): the stage goes back to the\n",
    "   producer, one arrival per consumer warp (see MSKV_H_RELEASERS) */\n",
    "MSKV_DEV void mskv_h_release(mskv_h_cons &c, int ps) {\n",
    "MSKV_UNROLL\n",
    "    for (int i = 0; i < MSKV_H_PVN / 2; i++) mskv_wg_keep(c.o[i]);\n",
    "MSKV_UNROLL\n",
    "    for (int kk = 0; kk < MSKV_H_BN / 16; kk++) {\n",
    "MSKV_UNROLL\n",
    "        for (int e = 0; e < 4; e++) mskv_wg_keep_u(c.p[kk][e]);\n",
    "    }\n",
    "    if (c.leader) mskv_mbar_arrive(c.bars + (mskv_u32)(8 * (MSKV_H_STAGES + ps)));\n",
    "}\n",
    "\n",
    "/* One turn at the tensor cores (taken in alternation with the other\n",
    "   consumer, so one's softmax runs under the other's GEMMs): S = Q K^T of\n",
    "   tile t and O += P V of tile t - 1 are issued together; the softmax of S\n",
    "   overlaps the P V; O is rescaled once that is done. */\n",
    "template <int MASKED, int FIRST>\n",
    "MSKV_DEV void mskv_h_turn(mskv_h_cons &c, int t, int key0) {\n",
    "    const int s = t % MSKV_H_STAGES, ps = (t + MSKV_H_STAGES - 1) % MSKV_H_STAGES;\n",
    "    float alpha[2];\n",
    "    while (!mskv_mbar_try_wait(c.bars + (mskv_u32)(8 * s), (t / MSKV_H_STAGES) & 1)) {}\n",
    "    mskv_bar_sync(4 + c.cw, 256);\n",
    "    mskv_wgmma_fence();\n",
    "    {\n",
    "        const mskv_u64 kd = mskv_h_desc(c.ring + (mskv_u32)(s * MSKV_H_SB), 16, 1024);\n",
    "MSKV_UNROLL\n",
    "        for (int kk = 0; kk < MSKV_D / 16; kk++)\n",
    "            MSKV_WGMMA_S(c.s, c.qd + (mskv_u64)(((kk >> 2) * 64 * 128 + (kk & 3) * 32) >> 4),\n",
    "                         kd + (mskv_u64)(((kk >> 2) * MSKV_H_BN * 128 + (kk & 3) * 32) >> 4), kk > 0);\n",
    "        mskv_wgmma_commit();\n",
    "    }\n",
    "    if (!FIRST) mskv_h_issue_pv(c, ps);\n",
    "    mskv_bar_arrive(4 + (c.cw ^ 1), 256);\n",
    "    if (FIRST) mskv_wgmma_wait<0>();\n",
    "    else mskv_wgmma_wait<1>();\n",
    "MSKV_UNROLL\n",
    "    for (int i = 0; i < MSKV_H_BN / 2; i++) mskv_wg_keep(c.s[i]);\n",
    "    mskv_h_softmax<MASKED>(c, key0, alpha);\n",
    "    if (!FIRST) {\n",
    "        mskv_wgmma_wait<0>();\n",
    "        mskv_h_release(c, ps);\n",
    "    }\n",
    "MSKV_UNROLL\n",
    "    for (int i = 0; i < MSKV_H_PVN / 2; i++) c.o[i] *= alpha[(i >> 1) & 1];\n",
    "MSKV_UNROLL\n",
    "    for (int kk = 0; kk < MSKV_H_BN / 16; kk++) {\n",
    "        c.p[kk][0] = mskv_pack2(c.s[8 * kk], c.s[8 * kk + 1]);\n",
    "        c.p[kk][1] = mskv_pack2(c.s[8 * kk + 2], c.s[8 * kk + 3]);\n",
    "        c.p[kk][2] = mskv_pack2(c.s[8 * kk + 4], c.s[8 * kk + 5]);\n",
    "        c.p[kk][3] = mskv_pack2(c.s[8 * kk + 6], c.s[8 * kk + 7]);\n",
    "    }\n",
    "}\n",
    "\n",
    "/* the last turn: only the P V of the last tile (consumer 1 has no one to hand on to) */\n",
    "MSKV_DEV void mskv_h_last_turn(mskv_h_cons &c, int n) {\n",
    "    const int ps = (n - 1) % MSKV_H_STAGES;\n",
    "    mskv_bar_sync(4 + c.cw, 256);\n",
    "    mskv_wgmma_fence();\n",
    "    mskv_h_issue_pv(c, ps);\n",
    "    if (c.cw == 0) mskv_bar_arrive(5, 256);\n",
    "    mskv_wgmma_wait<0>();\n",
    "    mskv_h_release(c, ps);\n",
    "}\n",
    "\n",
    "MSKV_KERNEL void MSKV_BOUNDS(MSKV_H_THREADS, 1)\n",
    "mskv_attn_sm90(const MSKV_GRID_CONST mskv_tmap k_map, const MSKV_GRID_CONST mskv_tmap v_map, int use_tma,\n",
    "               const void *q, const void *k_pool, const void *v_pool, const int *qo_indptr, const int *kv_indptr,\n",
    "               const int *kv_indices, const int *kv_len, const int *kv_pos_split, const int *kv_pos_shift,\n",
    "               int q_heads, int kv_heads, int page_size, float scale_log2, int mask, int window_left, int kv_chunk,\n",
    "               int n_splits, void *o, float *lse, float *o_part, float *lse_part,\n",
    "               const int *q_pos, const int *vis_sink_end, const int *vis_window_start) {\n",
    "    MSKV_SMEM(smem);\n",
    "    const int tid = mskv_tid(), wg = tid >> 7;\n",
    "    const int b = mskv_bid_y(), kvh = mskv_bid_z() % kv_heads, split = mskv_bid_z() / kv_heads;\n",
    "    const int group = q_heads / kv_heads;\n",
    "    const int q0 = qo_indptr[b], qo_len = qo_indptr[b + 1] - q0, rows = qo_len * group;\n",
    "    const int row0 = mskv_bid_x() * MSKV_H_BM;\n",
    "    const int kvl = kv_len[b], psplit = kv_pos_split[b], pshift = kv_pos_shift[b];\n",
    "    mskv_h_keys kb;\n",
    "    mskv_u32 base;\n",
    "    unsigned char *sbase;\n",
    "    int qpos_min, qpos_max, h0, h1;\n",
    "    if (row0 >= rows) return;  /* whole block: before any barrier */\n",
    "    base = (mskv_smem_addr(smem) + 1023u) & ~1023u;\n",
    "    sbase = smem + (base - mskv_smem_addr(smem));\n",
    "    {\n",
    "        /* the block's queries [qa, qz] and their mask positions (the scratch:\n",
    "           the Q tiles, loaded after the barrier that follows the mbarrier inits) */\n",
    "        const int qa = row0 / group, qz = (row0 + MSKV_H_BM - 1 < rows - 1 ? row0 + MSKV_H_BM - 1 : rows - 1) / group;\n",
    "        if (q_pos && mask >= 1) {\n",
    "            mskv_q_pos_range<MSKV_H_THREADS>(q_pos + q0, qa, qz - qa + 1, (int *)(void *)sbase, &qpos_min, &qpos_max);\n",
    "        } else {\n",
    "            qpos_min = mskv_abs_pos(kvl - qo_len + qa, psplit, pshift);\n",
    "            qpos_max = mskv_abs_pos(kvl - qo_len + qz, psplit, pshift);\n",
    "        }\n",
    "    }\n",
    "    mskv_vis_hole(vis_sink_end, vis_window_start, b, kvl, psplit, pshift, &h0, &h1);\n",
    "    qpos_min = mskv_uniform(qpos_min); qpos_max = mskv_uniform(qpos_max);   /* as in mskv_attn */\n",
    "    h0 = mskv_uniform(h0); h1 = mskv_uniform(h1);\n",
    "    kb = mskv_h_block_keys(kvl, psplit, pshift, mask, window_left, kv_chunk, n_splits, split, qpos_min, qpos_max, h0, h1);\n",
    "    if (tid == 0) {\n",
    "        for (int s = 0; s < MSKV_H_STAGES; s++) {\n",
    "            mskv_mbar_init(base + MSKV_H_BARS + 8 * s, 1);                      /* full: the producer */\n",
    "            mskv_mbar_init(base + MSKV_H_BARS + 8 * (MSKV_H_STAGES + s), MSKV_H_RELEASERS);   /* empty: every consumer warp */\n",
    "        }\n",
    "        mskv_mbar_init_fence();\n",
    "    }\n",
    "#if MSKV_H_ONES\n",
    "    for (int x = tid; x < MSKV_H_STAGES * (MSKV_H_OB / 16); x += MSKV_H_THREADS) {\n",
    "        const int st = x / (MSKV_H_OB / 16), at = x % (MSKV_H_OB / 16);\n",
    "        mskv_sts16(sbase + 2 * MSKV_H_QB + st * MSKV_H_SB + 2 * MSKV_H_TB + 16 * at, MSKV_DTYPE == 1 ? 0x3c003c00u : 0x3f803f80u);\n",
    "    }\n",
    "    mskv_fence_proxy_async();   /* generic stores the tensor cores read */\n",
    "#endif\n",
    "    mskv_sync();\n",
    "\n",
    "    if (wg == 0) {\n",
    "        /* producer: TMA needs one warp (the rest leave); cp.async takes all four */\n",
    "        const int team = use_tma ? 32 : 128;\n",
    "        /* dense K/V (kv_indices NULL, page_size 1): key j of the segment is row krow0 + j */\n",
    "        const int krow0 = kv_indptr[b];\n",
    "        const int *pages = kv_indices ? kv_indices + krow0 : 0;\n",
    "        mskv_setmaxnreg_dec<MSKV_H_REGS_PRODUCER>();\n",
    "        if (tid >= team) return;\n",
    "        for (int i = 0; i < kb.n_tiles; i++) {\n",
    "            const int s = i % MSKV_H_STAGES, key0 = mskv_h_tile_key(kb, i);\n",
    "            const mskv_u32 full = base + MSKV_H_BARS + 8 * s, stage = base + 2 * MSKV_H_QB + s * MSKV_H_SB;\n",
    "            while (!mskv_mbar_try_wait(full + 8 * MSKV_H_STAGES, ((i / MSKV_H_STAGES) & 1) ^ 1)) {}\n",
    "            if (use_tma && key0 + MSKV_H_BN <= kvl)\n",
    "                mskv_h_load_tma(&k_map, &v_map, pages, page_size, kvh, key0 + (pages ? 0 : krow0), stage, full, tid);\n",
    "            else\n",
    "                mskv_h_load_rows((const unsigned char *)k_pool, (const unsigned char *)v_pool, pages, krow0, page_size,\n",
    "                                 kv_heads, kvh, kvl, key0, sbase + (stage - base), full, tid, team);\n",
    "        }\n",
    "    } else {\n",
    "        mskv_h_cons c;\n",
    "        const int cw = mskv_bcast0(wg - 1), t = tid & 127, warp = t >> 5, lane = tid & 31, g = lane >> 2;\n",
    "        mskv_setmaxnreg_inc<MSKV_H_REGS_CONSUMER>();\n",
    "        c.cw = cw; c.t4 = lane & 3; c.leader = MSKV_H_RELEASERS == 8 ? lane == 0 : t == 0; c.scale_log2 = scale_log2;\n",
    "        c.h0 = h0; c.hlen = (mskv_u32)(h1 - h0);\n",
    "        c.ring = base + 2 * MSKV_H_QB;\n",
    "        c.bars = base + MSKV_H_BARS;\n",
    "        c.qd = mskv_h_desc(base + (mskv_u32)(cw * MSKV_H_QB), 16, 1024);\n",
    "        {\n",
    "            /* this warpgroup's 64 rows of Q; row r of the block is query r / group,\n",
    "               q head kvh * group + r % group; rows past the segment are zero */\n",
    "            unsigned char *qs = sbase + cw * MSKV_H_QB;\n",
    "            for (int idx = t; idx < 64 * (MSKV_D / 8); idx += 128) {\n",
    "                const int r = idx / (MSKV_D / 8), ch = idx % (MSKV_D / 8), R = row0 + 64 * cw + r, ok = R < rows;\n",
    "                mskv_i64 off = 0;\n",
    "                if (ok) off = (((mskv_i64)(q0 + R / group) * q_heads + kvh * group + R % group) * MSKV_D + ch * 8) * 2;\n",
    "                mskv_cp_async16(qs + (ch >> 3) * (64 * 128) + r * 128 + (((ch & 7) ^ (r & 7)) << 4),\n",
    "                                (const unsigned char *)q + off, ok ? 16 : 0);\n",
    "            }\n",
    "            mskv_cp_commit();\n",
    "            mskv_cp_wait<0>();\n",
    "            mskv_fence_proxy_async();\n",
    "            mskv_bar_sync(2 + cw, 128);\n",
    "        }\n",
    "        for (int h = 0; h < 2; h++) {\n",
    "            const int R = row0 + 64 * cw + 16 * warp + g + 8 * h, Rc = R < rows ? R : rows - 1;\n",
    "            const int qpos = mskv_q_pos(q_pos ? q_pos + q0 : 0, Rc / group, kvl, qo_len, psplit, pshift);\n",
    "            c.klo[h] = kb.split_lo;\n",
    "            c.khi[h] = kb.split_hi;\n",
    "            if (mask >= 1) {\n",
    "                const int hi = mskv_first_at(qpos + 1, psplit, pshift);\n",
    "                if (hi < c.khi[h]) c.khi[h] = hi;\n",
    "            }\n",
    "            if (mask == 2) {\n",
    "                const int lo = mskv_first_at(qpos - window_left, psplit, pshift);\n",
    "                if (lo > c.klo[h]) c.klo[h] = lo;\n",
    "            }\n",
    "            c.m[h] = mskv_neg_inf();\n",
    "            c.l[h] = 0.0f;\n",
    "        }\n",
    "MSKV_UNROLL\n",
    "        for (int i = 0; i < MSKV_H_PVN / 2; i++) c.o[i] = 0.0f;\n",
    "        if (kb.n_tiles > 0) {\n",
    "            int it = 1;\n",
    "            if (cw == 1) mskv_bar_arrive(4, 256);   /* consumer 0 takes the first turn */\n",
    "            if (kb.n_masked > 0) mskv_h_turn<1, 1>(c, 0, mskv_h_tile_key(kb, 0));\n",
    "            else mskv_h_turn<0, 1>(c, 0, mskv_h_tile_key(kb, 0));\n",
    "            for (; it < kb.n_masked; it++) mskv_h_turn<1, 0>(c, it, mskv_h_tile_key(kb, it));\n",
    "            /* whole tiles: the consumers need no key (only the producer does) */\n",
    "            for (; it < kb.n_tiles; it++) mskv_h_turn<0, 0>(c, it, 0);\n",
    "            mskv_h_last_turn(c, kb.n_tiles);\n",
    "        }\n",
    "        /* the row sums: from the ones columns, else the 4 lanes of a row add theirs; write O / l and the LSE */\n",
    "        for (int h = 0; h < 2; h++) {\n",
    "#if MSKV_H_ONES\n",
    "            c.l[h] = c.o[MSKV_D / 2 + 2 * h];\n",
    "#else\n",
    "            c.l[h] += mskv_shfl_xor(c.l[h], 1);\n",
    "            c.l[h] += mskv_shfl_xor(c.l[h], 2);\n",
    "#endif\n",
    "        }\n",
    "        {\n",
    "            const mskv_i64 total_q = qo_indptr[mskv_nblk_y()];\n",
    "            const float ln2 = 0.6931471805599453f;\n",
    "            for (int h = 0; h < 2; h++) {\n",
    "                const int R = row0 + 64 * cw + 16 * warp + g + 8 * h;\n",
    "                const float inv = c.l[h] > 0.0f ? 1.0f / c.l[h] : 0.0f;\n",
    "                const float lv = c.l[h] > 0.0f ? (c.m[h] * scale_log2 + log2f(c.l[h])) * ln2 : mskv_neg_inf();\n",
    "                mskv_i64 orow;\n",
    "                if (R >= rows) continue;\n",
    "                orow = (mskv_i64)(q0 + R / group) * q_heads + kvh * group + R % group;\n",
    "                if (n_splits > 1) {\n",
    "                    float *dst = o_part + ((mskv_i64)split * total_q * q_heads + orow) * MSKV_D + 2 * c.t4;\n",
    "MSKV_UNROLL\n",
    "                    for (int qd = 0; qd < MSKV_D / 8; qd++) {\n",
    "                        dst[qd * 8] = c.o[4 * qd + 2 * h] * inv;\n",
    "                        dst[qd * 8 + 1] = c.o[4 * qd + 2 * h + 1] * inv;\n",
    "                    }\n",
    "                    if (c.t4 == 0) lse_part[(mskv_i64)split * total_q * q_heads + orow] = lv;\n",
    "                } else {\n",
    "                    mskv_u32 *dst = (mskv_u32 *)((mskv_u16 *)o + orow * MSKV_D + 2 * c.t4);\n",
    "MSKV_UNROLL\n",
    "                    for (int qd = 0; qd < MSKV_D / 8; qd++)\n",
    "                        dst[qd * 4] = mskv_pack2(c.o[4 * qd + 2 * h] * inv, c.o[4 * qd + 2 * h + 1] * inv);\n",
    "                    if (lse && c.t4 == 0) lse[orow] = lv;\n",
    "                }\n",
    "            }\n",
    "        }\n",
    "    }\n",
    "}\n",
    "#endif /* MSKV_SM90A && MSKV_DTYPE != 0 */\n",
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
    "#undef MSKV_MT\n",
    "#undef MSKV_BM\n",
    "#undef MSKV_BN\n",
    "#undef MSKV_WK\n",
    "#undef MSKV_STAGES\n",
    "#undef MSKV_WM\n",
    "#undef MSKV_CH\n",
    "#undef MSKV_ROWB\n",
    "#undef MSKV_NT\n",
    "#undef MSKV_QREG\n",
    "#undef MSKV_TPR\n",
    "#undef MSKV_CPT\n",
    "#undef MSKV_TILE_BYTES\n",
    "#undef MSKV_STAGE_BYTES\n",
    "#undef MSKV_Q_PARKED\n",
    "#undef MSKV_Q_BYTES\n",
    "#undef MSKV_Q_OFF\n",
    "#undef MSKV_ATTN_SMEM\n",
    "#undef MSKV_MERGE_LD\n",
    "#undef MSKV_ONE2\n",
    "#undef MSKV_LSUM\n",
    "#undef MSKV_LROW\n",
    "#undef MSKV_SM90A\n",
    "#undef MSKV_H_BN\n",
    "#undef MSKV_H_STAGES\n",
    "#undef MSKV_H_THREADS\n",
    "#undef MSKV_H_BM\n",
    "#undef MSKV_H_QB\n",
    "#undef MSKV_H_TB\n",
    "#undef MSKV_H_SB\n",
    "#undef MSKV_H_OB\n",
    "#undef MSKV_H_PVN\n",
    "#undef MSKV_H_ONES\n",
    "#undef MSKV_H_BARS\n",
    "#undef MSKV_H_SMEM\n",
    "#undef MSKV_H_REGS_PRODUCER\n",
    "#undef MSKV_H_RELEASERS\n",
    "#undef MSKV_SM90_PLANT_LEADER_RELEASE\n",
    "#undef MSKV_H_REGS_CONSUMER\n",
    "#undef MSKV_CAT2\n",
    "#undef MSKV_CAT\n",
    "#undef MSKV_WGMMA_S\n",
    "#undef MSKV_WGMMA_PV\n",
    "#endif\n",
};
/* >>kernels-end */

static const char *const *mskv__cuda_kernels(size_t *lines) {
    *lines = sizeof(mskv__cuda_kernel_lines) / sizeof(mskv__cuda_kernel_lines[0]);
    return mskv__cuda_kernel_lines;
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
