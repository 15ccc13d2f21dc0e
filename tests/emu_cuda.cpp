/* The launch wrappers of mstar_kv_cuda.h (mskv_cuda_attention,
   mskv_cuda_merge, mskv_cuda_rope, mskv_cuda_attn_geometry_get) end to end
   without a GPU: an injected driver/NVRTC table whose "device memory" is host
   memory and whose cuLaunchKernel runs the emulated kernels, so the wrappers'
   variant choice, geometry, split-KV and argument order are checked against
   the CPU backend. */
#include "mskv_test.h"
#include "emu/mskv_emu.h"
#define MSTAR_KV_IMPLEMENTATION      /* the GPU layer's implementation reuses the core's platform wrappers */
#include "../mstar_kv.h"
#define MSTAR_KV_CUDA_IMPLEMENTATION
#include "../mstar_kv_cuda.h"
#include <deque>
#include <random>
#include <string>
/* the GPU benchmark's --check, run below on the emulated device */
#define GB_EMBEDDED
#define GB_NO_MAIN
#include "../bench/gpu_bench.c"

namespace ecu_p_bf16_64 {
#define MSKV_DTYPE 2
#define MSKV_HEAD_DIM 64
#include "../kernels.cu"
}
namespace ecu_d_bf16_64 {
#define MSKV_DTYPE 2
#define MSKV_HEAD_DIM 64
#define MSKV_ATTN_WARP_KEYS 1
#include "../kernels.cu"
}
namespace ecu_f32_64 {
#define MSKV_DTYPE 0
#define MSKV_HEAD_DIM 64
#include "../kernels.cu"
}
namespace ecu_rope1_bf16_64 {
#define MSKV_DTYPE 2
#define MSKV_HEAD_DIM 64
#define MSKV_ROPE 1
#define MSKV_ROPE_STYLE 0
#include "../kernels.cu"
}

/* mskv_kv_write of every (pool dtype, source dtype) pair at head_dim 64, and
   RoPE (1-D, half style) on the way in for the converting pairs tested with it */
namespace ecu_kvw_p0_s1_r0 {
#define MSKV_DTYPE 0
#define MSKV_SRC_DTYPE 1
#define MSKV_HEAD_DIM 64
#include "../kernels.cu"
}
namespace ecu_kvw_p0_s2_r0 {
#define MSKV_DTYPE 0
#define MSKV_SRC_DTYPE 2
#define MSKV_HEAD_DIM 64
#include "../kernels.cu"
}
namespace ecu_kvw_p1_s0_r0 {
#define MSKV_DTYPE 1
#define MSKV_SRC_DTYPE 0
#define MSKV_HEAD_DIM 64
#include "../kernels.cu"
}
namespace ecu_kvw_p1_s0_r1 {
#define MSKV_DTYPE 1
#define MSKV_SRC_DTYPE 0
#define MSKV_HEAD_DIM 64
#define MSKV_ROPE 1
#define MSKV_ROPE_STYLE 0
#include "../kernels.cu"
}
namespace ecu_kvw_p1_s1_r0 {
#define MSKV_DTYPE 1
#define MSKV_SRC_DTYPE 1
#define MSKV_HEAD_DIM 64
#include "../kernels.cu"
}
namespace ecu_kvw_p1_s2_r0 {
#define MSKV_DTYPE 1
#define MSKV_SRC_DTYPE 2
#define MSKV_HEAD_DIM 64
#include "../kernels.cu"
}
namespace ecu_kvw_p1_s2_r1 {
#define MSKV_DTYPE 1
#define MSKV_SRC_DTYPE 2
#define MSKV_HEAD_DIM 64
#define MSKV_ROPE 1
#define MSKV_ROPE_STYLE 0
#include "../kernels.cu"
}
namespace ecu_kvw_p2_s0_r0 {
#define MSKV_DTYPE 2
#define MSKV_SRC_DTYPE 0
#define MSKV_HEAD_DIM 64
#include "../kernels.cu"
}
namespace ecu_kvw_p2_s0_r1 {
#define MSKV_DTYPE 2
#define MSKV_SRC_DTYPE 0
#define MSKV_HEAD_DIM 64
#define MSKV_ROPE 1
#define MSKV_ROPE_STYLE 0
#include "../kernels.cu"
}
namespace ecu_kvw_p2_s1_r0 {
#define MSKV_DTYPE 2
#define MSKV_SRC_DTYPE 1
#define MSKV_HEAD_DIM 64
#include "../kernels.cu"
}
namespace ecu_kvw_p2_s1_r1 {
#define MSKV_DTYPE 2
#define MSKV_SRC_DTYPE 1
#define MSKV_HEAD_DIM 64
#define MSKV_ROPE 1
#define MSKV_ROPE_STYLE 0
#include "../kernels.cu"
}
typedef void (*ecu_kvw_fn)(const void *, const void *, const mskv_i64 *, int, int, void *, void *, mskv_i64, const int *, float);
static ecu_kvw_fn ecu_kvw(int pool, int src, int rope) {
    if (rope == 0 && pool == 2 && src == 2) return ecu_p_bf16_64::mskv_kv_write;
    if (rope == 0 && pool == 0 && src == 0) return ecu_f32_64::mskv_kv_write;
    if (rope == 1 && pool == 2 && src == 2) return ecu_rope1_bf16_64::mskv_kv_write;
    if (rope == 0 && pool == 0 && src == 1) return ecu_kvw_p0_s1_r0::mskv_kv_write;
    if (rope == 0 && pool == 0 && src == 2) return ecu_kvw_p0_s2_r0::mskv_kv_write;
    if (rope == 0 && pool == 1 && src == 0) return ecu_kvw_p1_s0_r0::mskv_kv_write;
    if (rope == 1 && pool == 1 && src == 0) return ecu_kvw_p1_s0_r1::mskv_kv_write;
    if (rope == 0 && pool == 1 && src == 1) return ecu_kvw_p1_s1_r0::mskv_kv_write;
    if (rope == 0 && pool == 1 && src == 2) return ecu_kvw_p1_s2_r0::mskv_kv_write;
    if (rope == 1 && pool == 1 && src == 2) return ecu_kvw_p1_s2_r1::mskv_kv_write;
    if (rope == 0 && pool == 2 && src == 0) return ecu_kvw_p2_s0_r0::mskv_kv_write;
    if (rope == 1 && pool == 2 && src == 0) return ecu_kvw_p2_s0_r1::mskv_kv_write;
    if (rope == 0 && pool == 2 && src == 1) return ecu_kvw_p2_s1_r0::mskv_kv_write;
    if (rope == 1 && pool == 2 && src == 1) return ecu_kvw_p2_s1_r1::mskv_kv_write;
    return nullptr;
}

/* >>mock device ---------------------------------------------------------- */
struct ecu_module { int dtype, head_dim, warp_keys, rope, style, d0, sm90a, src; };
struct ecu_func { std::string name; ecu_module mod; };
/* A captured launch: its parameter values copied (the store rewrites its
   blocks on the next call), as a CUDA graph keeps them. */
struct ecu_call {
    mskv_cu_function f;
    unsigned int g[3], b[3], smem;
    uint64_t val[MSKV__CUDA_MAX_ARGS];
    unsigned char maps[2][128];   /* mskv_attn_sm90's K and V tensor maps, passed by value */
};
struct ecu_graph { std::vector<ecu_call> calls; };
static struct {
    int sms = 4;
    int devices = 1;   /* cuDeviceGetCount (the head-shard tests use 2; every device runs the same emulation) */
    int cc_major = 9, cc_minor = 0;
    int resident = 2;   /* cuOccupancyMaxActiveBlocksPerMultiprocessor's answer */
    int launches = 0, splits_seen = 0, occupancy_queries = 0;
    int fail_sm90a = 0;        /* NVRTC refuses sm_90a compiles */
    int tma_seen = -1;         /* use_tma of the last mskv_attn_sm90 launch */
    int tmap_encodes = 0;      /* cuTensorMapEncodeTiled calls */
    std::vector<std::string> launched;
    std::string last_options;
    ecu_graph *capturing = nullptr;   /* launches on capture_stream are recorded, not run */
    mskv_cu_stream capture_stream = nullptr;
    /* planted faults for the self-test tests: the named kernel runs with its
       softmax scale (attention) or RoPE theta (K/V write) times scale_factor */
    std::string plant_kernel;
    float plant_factor = 1.0f;
} ecu;

template <typename F> struct ecu_stub;
template <typename R, typename... A> struct ecu_stub<R (*)(A...)> {
    static R fn(A...) { return R(); }
};

static int ecu_define(const std::string &img, const char *name) {
    size_t p = img.find(std::string(name) + "=");
    return p == std::string::npos ? 0 : std::atoi(img.c_str() + p + std::strlen(name) + 1);
}
static unsigned long long ecu_u64(void *p) { unsigned long long v; std::memcpy(&v, p, 8); return v; }
static int ecu_i32(void *p) { int v; std::memcpy(&v, p, 4); return v; }
static float ecu_f32(void *p) { float v; std::memcpy(&v, p, 4); return v; }
template <typename T> static T ecu_ptr(void *p) { return (T)(uintptr_t)ecu_u64(p); }

static mskv_cu_result ecu_launch(mskv_cu_function f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                 unsigned int by, unsigned int bz, unsigned int smem, mskv_cu_stream s, void **a, void **extra) {
    const ecu_func *fn = (const ecu_func *)(const void *)f;
    const ecu_module &m = fn->mod;
    std::function<void()> body;
    (void)by; (void)bz; (void)extra;
    if (ecu.capturing && s == ecu.capture_stream) {
        ecu_call c = ecu_call();
        c.f = f; c.g[0] = gx; c.g[1] = gy; c.g[2] = gz; c.b[0] = bx; c.b[1] = by; c.b[2] = bz; c.smem = smem;
        bool maps = fn->name == "mskv_attn_sm90";
        for (int i = 0; i < MSKV__CUDA_MAX_ARGS; i++)   /* every other slot is 8 bytes */
            if (!(maps && i < 2)) std::memcpy(&c.val[i], a[i], 8);
        if (maps) { std::memcpy(c.maps[0], a[0], 128); std::memcpy(c.maps[1], a[1], 128); }
        ecu.capturing->calls.push_back(c);
        return 0;
    }
    ecu.launches++;
    ecu.launched.push_back(fn->name);
    float planted[1];
    void *planted_args[MSKV__CUDA_MAX_ARGS];
    if (!ecu.plant_kernel.empty() && fn->name == ecu.plant_kernel) {
        /* the parameter block is the store's: plant on a copy of the one value
           (the body below runs before this function returns) */
        int at = fn->name == "mskv_attn_sm90" ? 15 : fn->name == "mskv_attn" ? 14 : fn->name == "mskv_kv_write" ? 9 : -1;
        if (at >= 0) {
            planted[0] = ecu_f32(a[at]) * ecu.plant_factor;
            std::memcpy(planted_args, a, sizeof planted_args);
            planted_args[at] = planted;
            a = planted_args;
        }
    }
    if (fn->name == "mskv_attn_sm90") {
        if (m.dtype != 2 || m.head_dim != 64 || !m.sm90a) return 700;
        if (ecu_i32(a[19]) > 1) ecu.splits_seen = ecu_i32(a[19]);
        ecu.tma_seen = ecu_i32(a[2]);
        mskv_tmap km, vm;
        std::memcpy(&km, a[0], sizeof km);
        std::memcpy(&vm, a[1], sizeof vm);
        body = [=] {
            ecu_p_bf16_64::mskv_attn_sm90(km, vm, ecu_i32(a[2]), ecu_ptr<const void *>(a[3]), ecu_ptr<const void *>(a[4]),
                                          ecu_ptr<const void *>(a[5]), ecu_ptr<const int *>(a[6]), ecu_ptr<const int *>(a[7]),
                                          ecu_ptr<const int *>(a[8]), ecu_ptr<const int *>(a[9]), ecu_ptr<const int *>(a[10]),
                                          ecu_ptr<const int *>(a[11]), ecu_i32(a[12]), ecu_i32(a[13]), ecu_i32(a[14]),
                                          ecu_f32(a[15]), ecu_i32(a[16]), ecu_i32(a[17]), ecu_i32(a[18]), ecu_i32(a[19]),
                                          ecu_ptr<void *>(a[20]), ecu_ptr<float *>(a[21]), ecu_ptr<float *>(a[22]),
                                          ecu_ptr<float *>(a[23]), ecu_ptr<const int *>(a[24]), ecu_ptr<const int *>(a[25]),
                                          ecu_ptr<const int *>(a[26]));
        };
    } else if (fn->name == "mskv_attn") {
        if (m.dtype != 2 || m.head_dim != 64) return 700;
        auto k = m.warp_keys ? ecu_d_bf16_64::mskv_attn : ecu_p_bf16_64::mskv_attn;
        if (ecu_i32(a[18]) > 1) ecu.splits_seen = ecu_i32(a[18]);
        body = [=] {
            k(ecu_ptr<const void *>(a[0]), ecu_ptr<const void *>(a[1]), ecu_ptr<const void *>(a[2]), ecu_ptr<const int *>(a[3]),
              ecu_ptr<const int *>(a[4]), ecu_ptr<const int *>(a[5]), ecu_ptr<const int *>(a[6]), ecu_ptr<const int *>(a[7]),
              ecu_ptr<const int *>(a[8]), ecu_i32(a[9]), ecu_i32(a[10]), ecu_i32(a[11]), (unsigned int)ecu_i32(a[12]),
              ecu_i32(a[13]), ecu_f32(a[14]), ecu_i32(a[15]), ecu_i32(a[16]), ecu_i32(a[17]), ecu_i32(a[18]),
              ecu_ptr<void *>(a[19]), ecu_ptr<float *>(a[20]), ecu_ptr<float *>(a[21]), ecu_ptr<float *>(a[22]),
              ecu_ptr<const int *>(a[23]), ecu_ptr<const int *>(a[24]), ecu_ptr<const int *>(a[25]));
        };
    } else if (fn->name == "mskv_lse_merge") {
        if (m.dtype != 2 || m.head_dim != 64) return 700;
        body = [=] {
            ecu_p_bf16_64::mskv_lse_merge(ecu_ptr<const float *>(a[0]), ecu_ptr<const float *>(a[1]), ecu_i32(a[2]),
                                          (mskv_i64)ecu_u64(a[3]), (mskv_i64)ecu_u64(a[4]), ecu_ptr<void *>(a[5]),
                                          ecu_ptr<float *>(a[6]));
        };
    } else if (fn->name == "mskv_state_merge") {
        if (m.dtype != 0 || m.head_dim != 64) return 700;
        body = [=] {
            ecu_f32_64::mskv_state_merge(ecu_ptr<const float *>(a[0]), ecu_ptr<const float *>(a[1]), ecu_ptr<const float *>(a[2]),
                                         ecu_ptr<const float *>(a[3]), (mskv_i64)ecu_u64(a[4]), ecu_ptr<float *>(a[5]),
                                         ecu_ptr<float *>(a[6]));
        };
    } else if (fn->name == "mskv_page_gather" || fn->name == "mskv_page_scatter") {
        /* byte copies: any dtype's variant runs the same code */
        bool gather = fn->name == "mskv_page_gather";
        body = [=] {
            if (gather)
                ecu_p_bf16_64::mskv_page_gather(ecu_ptr<const unsigned char *>(a[0]), ecu_ptr<const int *>(a[1]), ecu_i32(a[2]),
                                                (long long)ecu_u64(a[3]), ecu_ptr<unsigned char *>(a[4]), (long long)ecu_u64(a[5]));
            else
                ecu_p_bf16_64::mskv_page_scatter(ecu_ptr<unsigned char *>(a[0]), ecu_ptr<const int *>(a[1]), ecu_i32(a[2]),
                                                 (long long)ecu_u64(a[3]), ecu_ptr<const unsigned char *>(a[4]), (long long)ecu_u64(a[5]));
        };
    } else if (fn->name == "mskv_kv_write") {
        ecu_kvw_fn k = m.head_dim == 64 && m.style == 0 && m.d0 == 0 && m.rope <= 1 ? ecu_kvw(m.dtype, m.src, m.rope) : nullptr;
        if (!k) return 700;
        body = [=] {
            k(ecu_ptr<const void *>(a[0]), ecu_ptr<const void *>(a[1]), ecu_ptr<const mskv_i64 *>(a[2]), ecu_i32(a[3]),
              ecu_i32(a[4]), ecu_ptr<void *>(a[5]), ecu_ptr<void *>(a[6]), (mskv_i64)ecu_u64(a[7]),
              ecu_ptr<const int *>(a[8]), ecu_f32(a[9]));
        };
    } else if (fn->name == "mskv_rope") {
        if (m.dtype != 2 || m.head_dim != 64 || m.rope != 1 || m.style != 0 || m.d0 != 0) return 700;
        body = [=] {
            ecu_rope1_bf16_64::mskv_rope(ecu_ptr<void *>(a[0]), (mskv_i64)ecu_u64(a[1]), ecu_i32(a[2]),
                                         ecu_ptr<const int *>(a[3]), ecu_f32(a[4]));
        };
    } else {
        return 500;
    }
    return mskv_emu::launch(mskv_emu::Dim3{(int)gx, (int)gy, (int)gz}, (int)bx, smem, body) ? 0 : 719;
}

static mskv_cuda_functions ecu_table(void) {
    mskv_cuda_functions f;
#define ECU_STUB(ret, name, sym, params) f.name = ecu_stub<decltype(f.name)>::fn;
    MSKV_CUDA_DRIVER_FUNCTIONS(ECU_STUB)
    MSKV_CUDA_NVRTC_FUNCTIONS(ECU_STUB)
#undef ECU_STUB
    f.cuDriverGetVersion = [](int *v) -> mskv_cu_result { *v = 13000; return 0; };
    f.cuDeviceGetCount = [](int *n) -> mskv_cu_result { *n = ecu.devices; return 0; };
    f.cuDeviceGetAttribute = [](int *v, int at, mskv_cu_device) -> mskv_cu_result {
        *v = at == MSKV_CU_ATTR_CC_MAJOR ? ecu.cc_major : at == MSKV_CU_ATTR_CC_MINOR ? ecu.cc_minor
           : at == MSKV_CU_ATTR_MULTIPROCESSOR_COUNT ? ecu.sms : at == MSKV_CU_ATTR_MAX_SMEM_OPTIN ? 227 * 1024 : 0;
        return 0;
    };
    f.cuDeviceGetName = [](char *name, int len, mskv_cu_device) -> mskv_cu_result { snprintf(name, (size_t)len, "emulated"); return 0; };
    f.cuOccupancyMaxActiveBlocksPerMultiprocessor = [](int *n, mskv_cu_function, int, size_t) -> mskv_cu_result {
        ecu.occupancy_queries++;
        *n = ecu.resident;
        return 0;
    };
    f.cuDevicePrimaryCtxRetain = [](mskv_cu_context *c, mskv_cu_device) -> mskv_cu_result { *c = (mskv_cu_context)(void *)&ecu; return 0; };
    f.cuMemAlloc = [](mskv_cu_ptr *p, size_t n) -> mskv_cu_result {
        void *m = std::malloc(n ? n : 1);
        if (!m) return MSKV_CU_ERROR_OUT_OF_MEMORY;
        std::memset(m, 0xff, n);  /* fresh device memory holds NaN bytes */
        *p = (mskv_cu_ptr)(uintptr_t)m;
        return 0;
    };
    f.cuMemFree = [](mskv_cu_ptr p) -> mskv_cu_result { std::free((void *)(uintptr_t)p); return 0; };
    f.cuMemAllocHost = [](void **p, size_t n) -> mskv_cu_result { *p = std::malloc(n ? n : 1); return *p ? 0 : MSKV_CU_ERROR_OUT_OF_MEMORY; };
    f.cuMemFreeHost = [](void *p) -> mskv_cu_result { std::free(p); return 0; };
    f.cuMemcpyHtoDAsync = [](mskv_cu_ptr d, const void *s, size_t n, mskv_cu_stream) -> mskv_cu_result { std::memcpy((void *)(uintptr_t)d, s, n); return 0; };
    f.cuMemcpyDtoHAsync = [](void *d, mskv_cu_ptr s, size_t n, mskv_cu_stream) -> mskv_cu_result { std::memcpy(d, (const void *)(uintptr_t)s, n); return 0; };
    f.cuMemcpyDtoDAsync = [](mskv_cu_ptr d, mskv_cu_ptr s, size_t n, mskv_cu_stream) -> mskv_cu_result { std::memmove((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n); return 0; };
    f.cuMemsetD8Async = [](mskv_cu_ptr d, unsigned char v, size_t n, mskv_cu_stream) -> mskv_cu_result { std::memset((void *)(uintptr_t)d, v, n); return 0; };
    f.cuStreamCreate = [](mskv_cu_stream *s, unsigned int) -> mskv_cu_result { *s = (mskv_cu_stream)std::malloc(1); return 0; };
    f.cuStreamDestroy = [](mskv_cu_stream s) -> mskv_cu_result { std::free((void *)s); return 0; };
    f.cuEventCreate = [](mskv_cu_event *e, unsigned int) -> mskv_cu_result { *e = (mskv_cu_event)std::malloc(1); return 0; };
    f.cuEventDestroy = [](mskv_cu_event e) -> mskv_cu_result { std::free((void *)e); return 0; };
    f.cuModuleLoadData = [](mskv_cu_module *m, const void *image) -> mskv_cu_result {
        std::string img((const char *)image);
        if (img.compare(0, 12, "EMUCUBIN sm_") != 0) return MSKV_CU_ERROR_INVALID_IMAGE;
        ecu_module *mod = new ecu_module{ecu_define(img, "-DMSKV_DTYPE"), ecu_define(img, "-DMSKV_HEAD_DIM"),
                                         ecu_define(img, "-DMSKV_ATTN_WARP_KEYS"), ecu_define(img, "-DMSKV_ROPE"),
                                         ecu_define(img, "-DMSKV_ROPE_STYLE"), ecu_define(img, "-DMSKV_ROPE_D0"),
                                         img.find("sm_90a") != std::string::npos, ecu_define(img, "-DMSKV_SRC_DTYPE")};
        *m = (mskv_cu_module)(void *)mod;
        return 0;
    };
    f.cuModuleUnload = [](mskv_cu_module m) -> mskv_cu_result { delete (ecu_module *)(void *)m; return 0; };
    f.cuModuleGetFunction = [](mskv_cu_function *out, mskv_cu_module m, const char *name) -> mskv_cu_result {
        /* the runtime caches functions for the context's life; they live until exit */
        static std::deque<ecu_func> funcs;
        /* kernels.cu has mskv_attn_sm90 only when compiled for sm_90a */
        if (std::strcmp(name, "mskv_attn_sm90") == 0 && !((const ecu_module *)(const void *)m)->sm90a) return MSKV_CU_ERROR_NOT_FOUND;
        funcs.push_back(ecu_func{name, *(const ecu_module *)(const void *)m});
        *out = (mskv_cu_function)(void *)&funcs.back();
        return 0;
    };
    f.cuLaunchKernel = ecu_launch;
    f.cuTensorMapEncodeTiled = [](void *map, int dt, unsigned int rank, void *g, const unsigned long long *dims,
                                  const unsigned long long *strides, const unsigned int *box, const unsigned int *es,
                                  int il, int sw, int l2, int oob) -> mskv_cu_result {
        ecu.tmap_encodes++;
        return mskv_emu::tmap_encode(map, dt, rank, g, dims, strides, box, es, il, sw, l2, oob);
    };
    f.cuStreamBeginCapture = [](mskv_cu_stream s, int) -> mskv_cu_result {
        if (ecu.capturing) return 401;
        ecu.capturing = new ecu_graph();
        ecu.capture_stream = s;
        return 0;
    };
    f.cuStreamEndCapture = [](mskv_cu_stream s, mskv_cu_graph *g) -> mskv_cu_result {
        if (s != ecu.capture_stream) return 401;
        *g = (mskv_cu_graph)(void *)ecu.capturing;
        ecu.capturing = nullptr;
        ecu.capture_stream = nullptr;
        return *g ? 0 : 401;
    };
    f.cuGraphInstantiateWithFlags = [](mskv_cu_graph_exec *e, mskv_cu_graph g, unsigned long long) -> mskv_cu_result {
        *e = (mskv_cu_graph_exec)(void *)new ecu_graph(*(const ecu_graph *)(const void *)g);
        return 0;
    };
    f.cuGraphLaunch = [](mskv_cu_graph_exec e, mskv_cu_stream s) -> mskv_cu_result {
        for (ecu_call c : ((ecu_graph *)(void *)e)->calls) {
            void *ptr[MSKV__CUDA_MAX_ARGS];
            for (int i = 0; i < MSKV__CUDA_MAX_ARGS; i++) ptr[i] = &c.val[i];
            if (((const ecu_func *)(const void *)c.f)->name == "mskv_attn_sm90") { ptr[0] = c.maps[0]; ptr[1] = c.maps[1]; }
            mskv_cu_result r = ecu_launch(c.f, c.g[0], c.g[1], c.g[2], c.b[0], c.b[1], c.b[2], c.smem, s, ptr, NULL);
            if (r != 0) return r;
        }
        return 0;
    };
    f.cuGraphExecDestroy = [](mskv_cu_graph_exec e) -> mskv_cu_result { delete (ecu_graph *)(void *)e; return 0; };
    f.cuGraphDestroy = [](mskv_cu_graph g) -> mskv_cu_result { delete (ecu_graph *)(void *)g; return 0; };
    f.nvrtcVersion = [](int *ma, int *mi) -> mskv_nvrtc_result { *ma = 13; *mi = 0; return 0; };
    f.nvrtcGetNumSupportedArchs = [](int *n) -> mskv_nvrtc_result { *n = 1; return 0; };
    f.nvrtcGetSupportedArchs = [](int *archs) -> mskv_nvrtc_result { archs[0] = 90; return 0; };
    f.nvrtcGetErrorString = [](mskv_nvrtc_result) -> const char * { return "emulated NVRTC"; };
    f.nvrtcCreateProgram = [](mskv_nvrtc_program *p, const char *, const char *, int, const char *const *, const char *const *) -> mskv_nvrtc_result {
        *p = (mskv_nvrtc_program)(void *)new std::string();
        return 0;
    };
    f.nvrtcDestroyProgram = [](mskv_nvrtc_program *p) -> mskv_nvrtc_result { delete (std::string *)(void *)*p; *p = NULL; return 0; };
    f.nvrtcCompileProgram = [](mskv_nvrtc_program p, int n, const char *const *opts) -> mskv_nvrtc_result {
        std::string *img = (std::string *)(void *)p;
        *img = "EMUCUBIN sm_90\n";
        for (int i = 0; i < n; i++) *img += std::string(opts[i]) + "\n";
        ecu.last_options = *img;
        return ecu.fail_sm90a && img->find("sm_90a") != std::string::npos ? MSKV_NVRTC_ERROR_COMPILATION : 0;
    };
    f.nvrtcGetProgramLogSize = [](mskv_nvrtc_program, size_t *n) -> mskv_nvrtc_result { *n = 0; return 0; };
    f.nvrtcGetCUBINSize = [](mskv_nvrtc_program p, size_t *n) -> mskv_nvrtc_result { *n = ((std::string *)(void *)p)->size(); return 0; };
    f.nvrtcGetCUBIN = [](mskv_nvrtc_program p, char *out) -> mskv_nvrtc_result {
        const std::string *img = (const std::string *)(void *)p;
        std::memcpy(out, img->data(), img->size());
        return 0;
    };
    return f;
}

/* >>fixture -------------------------------------------------------------- */
static void ecu_log(void *user, mskv_log_level level, const char *msg) {
    (void)level;
    ((std::string *)user)->append(msg).append("\n");
}

struct ecu_env {
    mskv_cuda_functions table;
    mskv_cuda_attn_path path = MSKV_CUDA_ATTN_AUTO;
    int no_tensor_maps = 0;    /* a driver without cuTensorMapEncodeTiled */
    /* off for the tests that count launches (a variant's first use would add
       its self-test's); the self-test tests, gpu_bench and the demo run it */
    int selftest = MSKV_CUDA_SELFTEST_OFF;
    const char *cache_dir = nullptr;   /* a disk cache (nullptr: none) */
    std::string log;
    mskv_cuda *cu = nullptr;
    mskv_cuda_store *st = nullptr;
    ~ecu_env() {
        if (st) mskv_cuda_store_destroy(st);
        if (cu) mskv_cuda_destroy(cu);
    }
    mskv_result open(mskv_dtype dt, int page_size, int kv_heads, int num_pages) {
        mskv_cuda_desc d;
        mskv_cuda_store_desc sd;
        mskv_result r;
        table = ecu_table();
        if (no_tensor_maps) table.cuTensorMapEncodeTiled = NULL;
        std::memset(&d, 0, sizeof d);
        d.functions = &table;
        d.disable_disk_cache = cache_dir == nullptr;
        d.cache_dir = cache_dir;
        d.selftest = selftest;
        d.attn_path = path;
        d.log = ecu_log;
        d.log_user = &log;
        if ((r = mskv_cuda_create(&d, &cu)) != MSKV_SUCCESS) return r;
        std::memset(&sd, 0, sizeof sd);
        sd.num_pages = num_pages; sd.page_size = page_size; sd.num_layers = 2; sd.kv_heads = kv_heads;
        sd.head_dim = 64; sd.dtype = dt;
        return mskv_cuda_store_create(cu, &sd, &st);
    }
};

/* A paged problem on the mock device: layer 1 of the store filled at shuffled
   pages; q; the host plan and its upload. */
struct ecu_problem {
    std::vector<int32_t> qo_indptr{0}, kv_indptr{0}, kv_indices, last, kv_len, split, shift;
    std::vector<uint16_t> k, v, q;
    mskv_plan plan;
    mskv_cuda_dplan dplan;
};

static mskv_result ecu_make(ecu_env &e, ecu_problem &p, int P, int kvh, int qh, int num_pages,
                            const std::vector<int> &qo, const std::vector<int> &kv, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    std::vector<int32_t> ids;
    mskv_result r;
    for (int i = 1; i < num_pages; i++) ids.push_back(i);
    std::shuffle(ids.begin(), ids.end(), rng);
    size_t at = 0, se = (size_t)kvh * 64;
    p.k.assign((size_t)num_pages * P * se, 0x7fc0);
    p.v = p.k;
    for (size_t b = 0; b < qo.size(); b++) {
        int np = (kv[b] + P - 1) / P;
        p.qo_indptr.push_back(p.qo_indptr.back() + qo[b]);
        p.kv_indptr.push_back(p.kv_indptr.back() + np);
        for (int i = 0; i < np; i++) p.kv_indices.push_back(ids[at++]);
        p.last.push_back(np ? kv[b] - (np - 1) * P : 0);
        p.kv_len.push_back(kv[b]);
        p.split.push_back(kv[b] / 2);
        p.shift.push_back(11);
        for (int j = 0; j < kv[b]; j++) {
            size_t slot = (size_t)p.kv_indices[(size_t)(p.kv_indptr[b] + j / P)] * P + (size_t)(j % P);
            for (size_t x = 0; x < se; x++) {
                p.k[slot * se + x] = mskv_f32_to_bf16(uni(rng));
                p.v[slot * se + x] = mskv_f32_to_bf16(uni(rng));
            }
        }
    }
    p.q.resize((size_t)p.qo_indptr.back() * qh * 64);
    for (auto &x : p.q) x = mskv_f32_to_bf16(2.0f * uni(rng));
    std::memset(&p.plan, 0, sizeof p.plan);
    p.plan.batch = (int32_t)qo.size(); p.plan.total_q = p.qo_indptr.back(); p.plan.page_size = P;
    p.plan.num_page_ids = (int32_t)p.kv_indices.size();
    p.plan.qo_indptr = p.qo_indptr.data(); p.plan.kv_indptr = p.kv_indptr.data(); p.plan.kv_indices = p.kv_indices.data();
    p.plan.kv_last_page_len = p.last.data(); p.plan.kv_len = p.kv_len.data();
    p.plan.kv_pos_split = p.split.data(); p.plan.kv_pos_shift = p.shift.data();
    if ((r = mskv_cuda_upload(e.st, mskv_cuda_store_pool(e.st, 1, 0), p.k.data(), p.k.size() * 2)) != MSKV_SUCCESS) return r;
    if ((r = mskv_cuda_upload(e.st, mskv_cuda_store_pool(e.st, 1, 1), p.v.data(), p.v.size() * 2)) != MSKV_SUCCESS) return r;
    return mskv_cuda_plan_upload(e.st, &p.plan, MSKV_POS_NONE, &p.dplan);
}

/* mskv_cuda_attention on layer 1 vs mskv_cpu_attention_pools; returns the worst o error */
static double ecu_attention_error(ecu_env &e, ecu_problem &p, int P, int kvh, int qh, int num_pages, mskv_mask mask, int wl) {
    mskv_attn at;
    std::memset(&at, 0, sizeof at);
    at.q_heads = qh; at.mask = mask; at.window_left = wl; at.q_dtype = MSKV_DTYPE_BF16;
    size_t n = p.q.size(), rows = n / 64;
    mskv_cu_ptr dq = 0, dout = 0, dlse = 0;
    if (mskv_cuda_malloc(e.cu, n * 2, &dq) != MSKV_SUCCESS || mskv_cuda_malloc(e.cu, n * 2, &dout) != MSKV_SUCCESS ||
        mskv_cuda_malloc(e.cu, rows * 4, &dlse) != MSKV_SUCCESS || mskv_cuda_upload(e.st, dq, p.q.data(), n * 2) != MSKV_SUCCESS)
        return 1e9;
    std::vector<uint16_t> o(n), ref(n);
    std::vector<float> lse(rows), lref(rows);
    mskv_result r = mskv_cuda_attention(e.st, 1, &p.plan, &p.dplan, &at, dq, dout, dlse);
    mskv_cuda_download(e.st, o.data(), dout, n * 2);
    mskv_cuda_download(e.st, lse.data(), dlse, rows * 4);
    mskv_cuda_free(e.cu, dq); mskv_cuda_free(e.cu, dout); mskv_cuda_free(e.cu, dlse);
    if (r != MSKV_SUCCESS) return 1e9;
    mskv_pools pools = {p.k.data(), p.v.data(), MSKV_DTYPE_BF16, num_pages, P, kvh, 64};
    if (mskv_cpu_attention_pools(NULL, &pools, &p.plan, &at, p.q.data(), ref.data(), lref.data()) != MSKV_SUCCESS) return 1e9;
    double err = 0;
    for (size_t i = 0; i < n; i++) {
        double a = mskv_bf16_to_f32(o[i]), b = mskv_bf16_to_f32(ref[i]);
        err = std::max(err, std::isfinite(a) ? std::fabs(a - b) : 1e9);
    }
    for (size_t i = 0; i < rows; i++) {
        if (std::isinf(lref[i])) { if (!(std::isinf(lse[i]) && lse[i] < 0)) err = 1e9; }
        else err = std::max(err, std::isfinite(lse[i]) ? (double)std::fabs(lse[i] - lref[i]) : 1e9);
    }
    return err;
}

/* >>tests ---------------------------------------------------------------- */
TEST(cuda_attention_wrapper_matches_cpu_backend_on_a_prefill_batch) {
    ecu_env e;
    ecu_problem p;
    const int P = 16, kvh = 2, qh = 8, pages = 16;
    ASSERT_EQ(MSKV_SUCCESS, e.open(MSKV_DTYPE_BF16, P, kvh, pages));
    ASSERT_EQ(MSKV_SUCCESS, ecu_make(e, p, P, kvh, qh, pages, {30, 5}, {100, 37}, 1));
    ecu.launched.clear();
    EXPECT_NEAR(0.0, ecu_attention_error(e, p, P, kvh, qh, pages, MSKV_MASK_CAUSAL, 0), 2.5e-2);
    ASSERT_EQ(1, (int)ecu.launched.size());
    EXPECT_TRUE(ecu.last_options.find("-DMSKV_ATTN_WARP_KEYS=0") != std::string::npos);
}

TEST(cuda_attention_wrapper_splits_a_lone_long_decode_and_merges) {
    ecu_env e;
    ecu_problem p;
    const int P = 40, kvh = 1, qh = 4, pages = 40;
    ecu.sms = 4;  /* 1 block alone would leave the device idle: split the keys */
    ASSERT_EQ(MSKV_SUCCESS, e.open(MSKV_DTYPE_BF16, P, kvh, pages));
    ASSERT_EQ(MSKV_SUCCESS, ecu_make(e, p, P, kvh, qh, pages, {1}, {1500}, 2));
    ecu.launched.clear();
    ecu.splits_seen = 0;
    EXPECT_NEAR(0.0, ecu_attention_error(e, p, P, kvh, qh, pages, MSKV_MASK_NONE, 0), 2.5e-2);
    ASSERT_EQ(2, (int)ecu.launched.size());
    EXPECT_STREQ("mskv_lse_merge", ecu.launched[1].c_str());
    EXPECT_GT(ecu.splits_seen, 1);
    EXPECT_TRUE(ecu.last_options.find("-DMSKV_ATTN_WARP_KEYS=1") != std::string::npos);
}

/* ---- the sm_90a kernel behind the wrapper ---- */

static int ecu_count(const std::string &hay, const char *needle) {
    int n = 0;
    for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) n++;
    return n;
}

TEST(cuda_attention_on_compute_capability_9_0_runs_the_sm90a_kernel_for_prefill) {
    ecu_env e;
    ecu_problem p;
    mskv_cuda_info info;
    const int P = 16, kvh = 2, qh = 8, pages = 16;
    ASSERT_EQ(MSKV_SUCCESS, e.open(MSKV_DTYPE_BF16, P, kvh, pages));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_info_get(e.cu, &info));
    EXPECT_EQ(1, info.wgmma);
    ASSERT_EQ(MSKV_SUCCESS, ecu_make(e, p, P, kvh, qh, pages, {30, 5}, {100, 37}, 11));
    ecu.launched.clear();
    ecu.tma_seen = -1;
    EXPECT_NEAR(0.0, ecu_attention_error(e, p, P, kvh, qh, pages, MSKV_MASK_CAUSAL, 0), 2.5e-2);
    ASSERT_EQ(1, (int)ecu.launched.size());
    EXPECT_STREQ("mskv_attn_sm90", ecu.launched[0].c_str());
    EXPECT_TRUE(ecu.last_options.find("--gpu-architecture=sm_90a") != std::string::npos);
    EXPECT_EQ(1, ecu.tma_seen);   /* pages of 16 keys: whole pages per 128-key tile */
}

TEST(cuda_attention_sm90a_kernel_copies_with_cp_async_where_tiles_cut_pages) {
    ecu_env e;
    ecu_problem p;
    const int P = 40, kvh = 1, qh = 4, pages = 12;
    ASSERT_EQ(MSKV_SUCCESS, e.open(MSKV_DTYPE_BF16, P, kvh, pages));
    ASSERT_EQ(MSKV_SUCCESS, ecu_make(e, p, P, kvh, qh, pages, {40}, {300}, 12));
    ecu.launched.clear();
    ecu.tma_seen = -1;
    EXPECT_NEAR(0.0, ecu_attention_error(e, p, P, kvh, qh, pages, MSKV_MASK_WINDOW, 90), 2.5e-2);
    EXPECT_STREQ("mskv_attn_sm90", ecu.launched.empty() ? "" : ecu.launched[0].c_str());
    EXPECT_EQ(0, ecu.tma_seen);
}

TEST(cuda_attention_sm90a_kernel_without_cuTensorMapEncodeTiled_copies_with_cp_async) {
    ecu_env e;
    ecu_problem p;
    const int P = 16, kvh = 1, qh = 2, pages = 24;
    e.no_tensor_maps = 1;
    ASSERT_EQ(MSKV_SUCCESS, e.open(MSKV_DTYPE_BF16, P, kvh, pages));
    ASSERT_EQ(MSKV_SUCCESS, ecu_make(e, p, P, kvh, qh, pages, {50}, {300}, 13));
    ecu.tma_seen = -1;
    EXPECT_NEAR(0.0, ecu_attention_error(e, p, P, kvh, qh, pages, MSKV_MASK_NONE, 0), 2.5e-2);
    EXPECT_EQ(0, ecu.tma_seen);
}

TEST(cuda_attention_sm90a_kernel_splits_few_blocks_and_merges) {
    ecu_env e;
    ecu_problem p;
    const int P = 16, kvh = 1, qh = 2, pages = 70;
    ecu.sms = 4;
    ASSERT_EQ(MSKV_SUCCESS, e.open(MSKV_DTYPE_BF16, P, kvh, pages));
    ASSERT_EQ(MSKV_SUCCESS, ecu_make(e, p, P, kvh, qh, pages, {20}, {1050}, 14));
    ecu.launched.clear();
    ecu.splits_seen = 0;
    EXPECT_NEAR(0.0, ecu_attention_error(e, p, P, kvh, qh, pages, MSKV_MASK_NONE, 0), 2.5e-2);
    ASSERT_EQ(2, (int)ecu.launched.size());
    EXPECT_STREQ("mskv_attn_sm90", ecu.launched[0].c_str());
    EXPECT_STREQ("mskv_lse_merge", ecu.launched[1].c_str());
    EXPECT_EQ(3, ecu.splits_seen);   /* one block for 4 SMs: min(4, 1050 keys / (4 x 128)) splits */
}

TEST(cuda_attention_falls_back_to_mma_sync_once_when_the_sm90a_kernel_fails_to_compile) {
    ecu_env e;
    ecu_problem p;
    mskv_cuda_info info;
    const int P = 16, kvh = 2, qh = 4, pages = 16;
    ecu.fail_sm90a = 1;
    ASSERT_EQ(MSKV_SUCCESS, e.open(MSKV_DTYPE_BF16, P, kvh, pages));
    ASSERT_EQ(MSKV_SUCCESS, ecu_make(e, p, P, kvh, qh, pages, {30, 5}, {100, 37}, 15));
    ecu.launched.clear();
    double err1 = ecu_attention_error(e, p, P, kvh, qh, pages, MSKV_MASK_CAUSAL, 0);
    double err2 = ecu_attention_error(e, p, P, kvh, qh, pages, MSKV_MASK_NONE, 0);
    ecu.fail_sm90a = 0;
    EXPECT_NEAR(0.0, err1, 2.5e-2);
    EXPECT_NEAR(0.0, err2, 2.5e-2);
    ASSERT_EQ(2, (int)ecu.launched.size());
    EXPECT_STREQ("mskv_attn", ecu.launched[0].c_str());
    EXPECT_STREQ("mskv_attn", ecu.launched[1].c_str());
    EXPECT_EQ(1, ecu_count(e.log, "sm_90a attention kernel is unavailable"));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_info_get(e.cu, &info));
    EXPECT_EQ(0, info.wgmma);
}

TEST(cuda_attention_path_forced_to_mma_sync_never_compiles_for_sm90a) {
    ecu_env e;
    ecu_problem p;
    mskv_cuda_info info;
    const int P = 16, kvh = 1, qh = 2, pages = 16;
    e.path = MSKV_CUDA_ATTN_MMA;
    ASSERT_EQ(MSKV_SUCCESS, e.open(MSKV_DTYPE_BF16, P, kvh, pages));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_info_get(e.cu, &info));
    EXPECT_EQ(0, info.wgmma);
    ASSERT_EQ(MSKV_SUCCESS, ecu_make(e, p, P, kvh, qh, pages, {60}, {200}, 16));
    ecu.launched.clear();
    EXPECT_NEAR(0.0, ecu_attention_error(e, p, P, kvh, qh, pages, MSKV_MASK_NONE, 0), 2.5e-2);
    EXPECT_STREQ("mskv_attn", ecu.launched.empty() ? "" : ecu.launched[0].c_str());
    EXPECT_TRUE(ecu.last_options.find("sm_90a") == std::string::npos);
}

TEST(cuda_attention_path_forced_to_wgmma_serves_decode_and_reports_failures) {
    const int P = 16, kvh = 1, qh = 4, pages = 16;
    {
        ecu_env e;
        ecu_problem p;
        e.path = MSKV_CUDA_ATTN_WGMMA;
        ASSERT_EQ(MSKV_SUCCESS, e.open(MSKV_DTYPE_BF16, P, kvh, pages));
        ASSERT_EQ(MSKV_SUCCESS, ecu_make(e, p, P, kvh, qh, pages, {1}, {150}, 17));
        ecu.launched.clear();
        EXPECT_NEAR(0.0, ecu_attention_error(e, p, P, kvh, qh, pages, MSKV_MASK_NONE, 0), 2.5e-2);
        EXPECT_STREQ("mskv_attn_sm90", ecu.launched.empty() ? "" : ecu.launched[0].c_str());
    }
    {
        /* forced, it does not fall back: the compile error is the answer */
        ecu_env e;
        ecu_problem p;
        e.path = MSKV_CUDA_ATTN_WGMMA;
        ecu.fail_sm90a = 1;
        ASSERT_EQ(MSKV_SUCCESS, e.open(MSKV_DTYPE_BF16, P, kvh, pages));
        ASSERT_EQ(MSKV_SUCCESS, ecu_make(e, p, P, kvh, qh, pages, {20}, {150}, 18));
        mskv_attn at;
        std::memset(&at, 0, sizeof at);
        at.q_heads = qh; at.q_dtype = MSKV_DTYPE_BF16;
        mskv_cu_ptr buf = 0;
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(e.cu, 65536, &buf));
        EXPECT_EQ(MSKV_ERROR_NVRTC, mskv_cuda_attention(e.st, 1, &p.plan, &p.dplan, &at, buf, buf + 32768, 0));
        ecu.fail_sm90a = 0;
        mskv_cuda_free(e.cu, buf);
    }
    {
        /* on another device (here a 10.0 the mock NVRTC serves with sm_90 PTX) there is nothing to force */
        ecu_env e;
        ecu_problem p;
        e.path = MSKV_CUDA_ATTN_WGMMA;
        ecu.cc_major = 10; ecu.cc_minor = 0;
        mskv_result r = e.open(MSKV_DTYPE_BF16, P, kvh, pages);
        mskv_result ra = MSKV_ERROR_CUDA;
        if (r == MSKV_SUCCESS && ecu_make(e, p, P, kvh, qh, pages, {20}, {150}, 19) == MSKV_SUCCESS) {
            mskv_attn at;
            std::memset(&at, 0, sizeof at);
            at.q_heads = qh; at.q_dtype = MSKV_DTYPE_BF16;
            ra = mskv_cuda_attention(e.st, 1, &p.plan, &p.dplan, &at, 16, 32, 0);
        }
        ecu.cc_major = 9; ecu.cc_minor = 0;
        ASSERT_EQ(MSKV_SUCCESS, r);
        EXPECT_EQ(MSKV_ERROR_UNSUPPORTED, ra);
    }
}

TEST(cuda_attention_wrapper_rejects_f32_stores_and_foreign_q_dtype) {
    ecu_env e;
    mskv_plan plan;
    mskv_cuda_dplan dp;
    mskv_attn at;
    std::memset(&plan, 0, sizeof plan); std::memset(&dp, 0, sizeof dp); std::memset(&at, 0, sizeof at);
    ASSERT_EQ(MSKV_SUCCESS, e.open(MSKV_DTYPE_F32, 16, 1, 4));
    at.q_heads = 1;
    plan.page_size = 16;
    EXPECT_EQ(MSKV_ERROR_UNSUPPORTED, mskv_cuda_attention(e.st, 0, &plan, &dp, &at, 1, 1, 0));
    ecu_env e2;
    ASSERT_EQ(MSKV_SUCCESS, e2.open(MSKV_DTYPE_BF16, 16, 1, 4));
    at.q_dtype = MSKV_DTYPE_F16;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_attention(e2.st, 0, &plan, &dp, &at, 1, 1, 0));
    at.q_dtype = MSKV_DTYPE_BF16;
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mskv_cuda_attention(e2.st, 2, &plan, &dp, &at, 1, 1, 0));
}

/* f32 q/o are refused, not converted: the pass over q and o belongs fused into
   the caller's projections (README, GPU dtypes); the message says what to do. */
TEST(cuda_attention_refuses_f32_q_on_a_16_bit_store_as_unsupported) {
    ecu_env e;
    mskv_plan plan;
    mskv_cuda_dplan dp;
    mskv_attn at;
    std::memset(&plan, 0, sizeof plan); std::memset(&dp, 0, sizeof dp); std::memset(&at, 0, sizeof at);
    ASSERT_EQ(MSKV_SUCCESS, e.open(MSKV_DTYPE_F16, 16, 1, 4));
    at.q_heads = 1; at.q_dtype = MSKV_DTYPE_F32;
    plan.page_size = 16;
    EXPECT_EQ(MSKV_ERROR_UNSUPPORTED, mskv_cuda_attention(e.st, 0, &plan, &dp, &at, 1, 1, 0));
    EXPECT_TRUE(std::strstr(mskv_cuda_last_error(e.cu), "convert f32 q") != NULL);
    at.q_dtype = MSKV_DTYPE_F16;
    EXPECT_EQ(MSKV_SUCCESS, mskv_cuda_attention(e.st, 0, &plan, &dp, &at, 1, 1, 0));   /* an empty plan: nothing to do */
}

/* The kernel trusts the table it is given, so the wrapper refuses what the
   CPU backend refuses: a kv_len past the sequence's pages, indptrs that do
   not add up, more queries than keys under a mask. */
TEST(cuda_attention_wrapper_refuses_a_table_the_kernel_would_overrun) {
    ecu_env e;
    mskv_plan plan;
    mskv_cuda_dplan dp;
    mskv_attn at;
    int32_t qo[2] = {0, 2}, kvp[2] = {0, 3}, ids[3] = {1, 2, 3}, last[1] = {16}, kvl[1] = {1024}, split[1] = {0}, shift[1] = {0};
    std::memset(&plan, 0, sizeof plan); std::memset(&dp, 0, sizeof dp); std::memset(&at, 0, sizeof at);
    ASSERT_EQ(MSKV_SUCCESS, e.open(MSKV_DTYPE_BF16, 16, 1, 4));
    at.q_heads = 1; at.q_dtype = MSKV_DTYPE_BF16;
    plan.batch = 1; plan.total_q = 2; plan.num_page_ids = 3; plan.page_size = 16;
    plan.qo_indptr = qo; plan.kv_indptr = kvp; plan.kv_indices = ids; plan.kv_last_page_len = last;
    plan.kv_len = kvl; plan.kv_pos_split = split; plan.kv_pos_shift = shift;
    dp.batch = 1; dp.total_q = 2; dp.num_page_ids = 3;
    mskv_cu_ptr buf = 0;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(e.cu, 4096, &buf));
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_attention(e.st, 0, &plan, &dp, &at, buf, buf + 2048, 0));  /* 1024 keys, 3 pages */
    kvl[0] = 32;                                   /* not past page 2: the third page would be empty */
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_attention(e.st, 0, &plan, &dp, &at, buf, buf + 2048, 0));
    kvl[0] = 40;
    kvp[1] = 4;                                    /* indptr past num_page_ids */
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_attention(e.st, 0, &plan, &dp, &at, buf, buf + 2048, 0));
    kvp[1] = 3;
    qo[1] = 3;                                     /* qo_indptr does not end at total_q */
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_attention(e.st, 0, &plan, &dp, &at, buf, buf + 2048, 0));
    qo[1] = 2;
    kvl[0] = 1; kvp[1] = 1; plan.num_page_ids = 1; dp.num_page_ids = 1; last[0] = 1;
    at.mask = MSKV_MASK_CAUSAL;                    /* 2 queries, 1 key */
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_attention(e.st, 0, &plan, &dp, &at, buf, buf + 2048, 0));
    mskv_cuda_free(e.cu, buf);
}

/* What a plan's features ask for must be there: a feature bit the kernels
   do not know is refused (UNSUPPORTED), and so is q_pos or bounds the plan
   or its upload lacks (NULL_POINTER: the device buffers would hold an earlier
   plan's), by either kernel and before anything launches; the arrays
   holding their defaults with the bits clear are fine. */
TEST(cuda_attention_wrapper_refuses_features_it_cannot_honour) {
    const mskv_cuda_attn_path paths[2] = {MSKV_CUDA_ATTN_AUTO, MSKV_CUDA_ATTN_WGMMA};
    for (mskv_cuda_attn_path path : paths) {
        ecu_env e;
        mskv_plan plan;
        mskv_cuda_dplan dp;
        mskv_attn at;
        int32_t qo[2] = {0, 2}, kvp[2] = {0, 2}, ids[2] = {1, 2}, last[1] = {8}, kvl[1] = {24}, split[1] = {24}, shift[1] = {0};
        int32_t qpos[2] = {22, 23}, se[1] = {0}, ws[1] = {0};
        std::memset(&plan, 0, sizeof plan); std::memset(&dp, 0, sizeof dp); std::memset(&at, 0, sizeof at);
        e.path = path;
        ASSERT_EQ(MSKV_SUCCESS, e.open(MSKV_DTYPE_BF16, 16, 1, 4));
        at.q_heads = 1; at.q_dtype = MSKV_DTYPE_BF16;
        plan.batch = 1; plan.total_q = 2; plan.num_page_ids = 2; plan.page_size = 16;
        plan.qo_indptr = qo; plan.kv_indptr = kvp; plan.kv_indices = ids; plan.kv_last_page_len = last;
        plan.kv_len = kvl; plan.kv_pos_split = split; plan.kv_pos_shift = shift;
        mskv_cu_ptr buf = 0;
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(e.cu, 4096, &buf));
        /* uploaded without the optional arrays */
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(e.st, &plan, MSKV_POS_NONE, &dp));
        EXPECT_EQ(0u, (unsigned)(dp.q_pos | dp.vis_sink_end | dp.vis_window_start));
        ecu.launched.clear();
        plan.q_pos = qpos; plan.vis_sink_end = se; plan.vis_window_start = ws;
        plan.features = MSKV_PLAN_Q_POS;
        EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_cuda_attention(e.st, 0, &plan, &dp, &at, buf, buf + 2048, 0));
        plan.features = MSKV_PLAN_VISIBILITY;
        EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_cuda_attention(e.st, 0, &plan, &dp, &at, buf, buf + 2048, 0));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(e.st, &plan, MSKV_POS_NONE, &dp));
        plan.features = 4u;
        EXPECT_EQ(MSKV_ERROR_UNSUPPORTED, mskv_cuda_attention(e.st, 0, &plan, &dp, &at, buf, buf + 2048, 0));
        plan.features = MSKV_PLAN_Q_POS;
        plan.q_pos = NULL;
        EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_cuda_attention(e.st, 0, &plan, &dp, &at, buf, buf + 2048, 0));
        EXPECT_EQ(0, (int)ecu.launched.size());
        plan.q_pos = qpos;
        plan.features = 0;   /* the arrays hold what their absence means: the tail rule, nothing hidden */
        EXPECT_EQ(MSKV_SUCCESS, mskv_cuda_attention(e.st, 0, &plan, &dp, &at, buf, buf + 2048, 0));
        plan.features = MSKV_PLAN_Q_POS | MSKV_PLAN_VISIBILITY;
        EXPECT_EQ(MSKV_SUCCESS, mskv_cuda_attention(e.st, 0, &plan, &dp, &at, buf, buf + 2048, 0));
        EXPECT_STREQ(path == MSKV_CUDA_ATTN_WGMMA ? "mskv_attn_sm90" : "mskv_attn",
                     ecu.launched.empty() ? "" : ecu.launched[0].c_str());
        mskv_cuda_free(e.cu, buf);
    }
}

/* ---- q_pos and the visibility bounds through the wrappers ---- */

/* A plan's features ask for q_pos or the bounds: both kernels (mskv_attn,
   and mskv_attn_sm90 when forced) read them from the uploaded plan and
   agree with the CPU backend on the same pools and plan. */
TEST(cuda_attention_honours_q_pos_and_visibility_bounds_on_both_kernels) {
    const mskv_cuda_attn_path paths[2] = {MSKV_CUDA_ATTN_AUTO, MSKV_CUDA_ATTN_WGMMA};
    for (mskv_cuda_attn_path path : paths) {
        ecu_env e;
        ecu_problem p;
        const int P = 16, kvh = 2, qh = 4, pages = 40;
        e.path = path;
        ASSERT_EQ(MSKV_SUCCESS, e.open(MSKV_DTYPE_BF16, P, kvh, pages));
        ASSERT_EQ(MSKV_SUCCESS, ecu_make(e, p, P, kvh, qh, pages, {6, 1}, {300, 170}, 21));
        std::vector<int32_t> qpos = {150, 3, 299, 64, 63, 200, 100}, se = {40, 17}, ws = {230, 120};
        p.plan.q_pos = qpos.data(); p.plan.vis_sink_end = se.data(); p.plan.vis_window_start = ws.data();
        p.plan.features = MSKV_PLAN_Q_POS | MSKV_PLAN_VISIBILITY;
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(e.st, &p.plan, MSKV_POS_NONE, &p.dplan));
        EXPECT_TRUE(p.dplan.q_pos != 0 && p.dplan.vis_sink_end != 0 && p.dplan.vis_window_start != 0);
        for (int m = 0; m < 3; m++) {
            ecu.launched.clear();
            EXPECT_NEAR(0.0, ecu_attention_error(e, p, P, kvh, qh, pages, (mskv_mask)m, 90), 2.5e-2);
            EXPECT_STREQ(path == MSKV_CUDA_ATTN_WGMMA ? "mskv_attn_sm90" : "mskv_attn",
                         ecu.launched.empty() ? "" : ecu.launched[0].c_str());
        }
    }
}

/* The kernels compute a query's mask position + 1 and position -
   window_left in 32 bits: positions that would wrap are refused, eagerly
   and at graph replay, before anything is launched (the CPU, in 64 bits,
   takes them). */
TEST(cuda_attention_refuses_mask_positions_the_kernels_cannot_hold) {
    ecu_env e;
    ecu_problem p;
    const int P = 16, kvh = 1, qh = 2, pages = 8;
    ASSERT_EQ(MSKV_SUCCESS, e.open(MSKV_DTYPE_BF16, P, kvh, pages));
    ASSERT_EQ(MSKV_SUCCESS, ecu_make(e, p, P, kvh, qh, pages, {3}, {40}, 5));
    mskv_attn at;
    std::memset(&at, 0, sizeof at);
    at.q_heads = qh; at.q_dtype = MSKV_DTYPE_BF16; at.mask = MSKV_MASK_CAUSAL;
    mskv_cu_ptr dq = 0, dout = 0, dlse = 0;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(e.cu, p.q.size() * 2, &dq));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(e.cu, p.q.size() * 2, &dout));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(e.cu, p.q.size() / 64 * 4, &dlse));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_upload(e.st, dq, p.q.data(), p.q.size() * 2));
    /* a graph captured over a good plan with q_pos */
    mskv_cuda_graph *g = nullptr;
    std::vector<int32_t> good = {37, 38, 39};
    p.plan.q_pos = good.data(); p.plan.features = MSKV_PLAN_Q_POS;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(e.st, &p.plan, MSKV_POS_NONE, &p.dplan));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_attention(e.st, 1, &p.plan, &p.dplan, &at, dq, dout, dlse));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_capture_begin(e.st));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_attention(e.st, 1, &p.plan, &p.dplan, &at, dq, dout, dlse));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_capture_end(e.st, &g));
    /* a query at INT32_MAX */
    std::vector<int32_t> qpos = {5, INT32_MAX, 39};
    p.plan.q_pos = qpos.data(); p.plan.features = MSKV_PLAN_Q_POS;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(e.st, &p.plan, MSKV_POS_NONE, &p.dplan));
    ecu.launched.clear();
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mskv_cuda_attention(e.st, 1, &p.plan, &p.dplan, &at, dq, dout, dlse));
    EXPECT_TRUE(std::string(mskv_cuda_last_error(e.cu)).find("2^31 - 2") != std::string::npos);
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mskv_cuda_graph_launch(e.st, g));
    EXPECT_EQ(0, (int)ecu.launched.size());
    at.mask = MSKV_MASK_NONE;   /* no mask: positions are not computed */
    EXPECT_EQ(MSKV_SUCCESS, mskv_cuda_attention(e.st, 1, &p.plan, &p.dplan, &at, dq, dout, dlse));
    /* keys shifted to the top of int32 */
    at.mask = MSKV_MASK_CAUSAL;
    p.plan.q_pos = NULL; p.plan.features = 0;
    p.split = {0}; p.shift = {INT32_MAX - 39};   /* the last key at INT32_MAX */
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(e.st, &p.plan, MSKV_POS_NONE, &p.dplan));
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mskv_cuda_attention(e.st, 1, &p.plan, &p.dplan, &at, dq, dout, dlse));
    p.shift = {INT32_MAX - 40};   /* the last key at 2^31 - 2: the kernels' limit, run and checked */
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(e.st, &p.plan, MSKV_POS_NONE, &p.dplan));
    EXPECT_NEAR(0.0, ecu_attention_error(e, p, P, kvh, qh, pages, MSKV_MASK_CAUSAL, 0), 2.5e-2);
    /* a window below INT32_MIN */
    std::vector<int32_t> low = {INT32_MIN + 5, 0, 1};
    p.split = {40}; p.shift = {0};
    p.plan.q_pos = low.data(); p.plan.features = MSKV_PLAN_Q_POS;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(e.st, &p.plan, MSKV_POS_NONE, &p.dplan));
    at.mask = MSKV_MASK_WINDOW; at.window_left = 6;
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mskv_cuda_attention(e.st, 1, &p.plan, &p.dplan, &at, dq, dout, dlse));
    EXPECT_NEAR(0.0, ecu_attention_error(e, p, P, kvh, qh, pages, MSKV_MASK_WINDOW, 5), 2.5e-2);   /* exactly INT32_MIN: fits */
    mskv_cuda_graph_destroy(e.st, g);
    mskv_cuda_free(e.cu, dq); mskv_cuda_free(e.cu, dout); mskv_cuda_free(e.cu, dlse);
}

/* The device's o (as f32) and lse of an uploaded plan on layer 1, q from p. */
static int ecu_run(ecu_env &e, ecu_problem &p, mskv_plan *plan, const mskv_attn &at, std::vector<float> &o, std::vector<float> &lse) {
    mskv_cuda_dplan dp;
    size_t n = p.q.size(), rows = n / 64;
    mskv_cu_ptr dq = 0, dout = 0, dlse = 0;
    std::vector<uint16_t> ob(n);
    int ok = mskv_cuda_plan_upload(e.st, plan, MSKV_POS_NONE, &dp) == MSKV_SUCCESS &&
             mskv_cuda_malloc(e.cu, n * 2, &dq) == MSKV_SUCCESS && mskv_cuda_malloc(e.cu, n * 2, &dout) == MSKV_SUCCESS &&
             mskv_cuda_malloc(e.cu, rows * 4, &dlse) == MSKV_SUCCESS && mskv_cuda_upload(e.st, dq, p.q.data(), n * 2) == MSKV_SUCCESS &&
             mskv_cuda_attention(e.st, 1, plan, &dp, &at, dq, dout, dlse) == MSKV_SUCCESS &&
             mskv_cuda_download(e.st, ob.data(), dout, n * 2) == MSKV_SUCCESS;
    lse.assign(rows, 0.0f);
    ok = ok && mskv_cuda_download(e.st, lse.data(), dlse, rows * 4) == MSKV_SUCCESS;
    if (dq) mskv_cuda_free(e.cu, dq);
    if (dout) mskv_cuda_free(e.cu, dout);
    if (dlse) mskv_cuda_free(e.cu, dlse);
    o.resize(n);
    for (size_t i = 0; i < n; i++) o[i] = mskv_bf16_to_f32(ob[i]);
    return ok;
}

/* A causal split-KV computation by the caller: the first part's keys end
   inside the queries' range, so it needs the queries' true positions (q_pos)
   to mask; the second part holds the keys after the cut at their positions
   (kv_pos_shift). Both parts merged by their LSE equal the unsplit attention. */
TEST(cuda_attention_with_q_pos_splits_causally_and_merges_to_the_whole) {
    ecu_env e;
    ecu_problem p;
    const int P = 16, kvh = 1, qh = 2, pages = 24, kv = 300, qo = 40, cut = 288;  /* queries at 260..299 */
    ASSERT_EQ(MSKV_SUCCESS, e.open(MSKV_DTYPE_BF16, P, kvh, pages));
    ASSERT_EQ(MSKV_SUCCESS, ecu_make(e, p, P, kvh, qh, pages, {qo}, {kv}, 31));
    mskv_attn at;
    std::memset(&at, 0, sizeof at);
    at.q_heads = qh; at.mask = MSKV_MASK_CAUSAL; at.q_dtype = MSKV_DTYPE_BF16;
    std::vector<int32_t> qpos, all_split = {kv}, zero = {0};
    for (int i = 0; i < qo; i++) qpos.push_back(kv - qo + i);
    p.split = {kv}; p.shift = {0};     /* positions = indices */
    p.plan.kv_pos_split = p.split.data(); p.plan.kv_pos_shift = p.shift.data();
    std::vector<float> ow, lw, o1, l1, o2, l2;
    ASSERT_TRUE(ecu_run(e, p, &p.plan, at, ow, lw));
    /* part 1: keys [0, cut) on the first cut / P pages */
    mskv_plan a = p.plan;
    std::vector<int32_t> a_indptr = {0, cut / P}, a_len = {cut}, a_last = {P}, a_split = {cut}, a_shift = {0};
    a.num_page_ids = cut / P; a.kv_indptr = a_indptr.data(); a.kv_len = a_len.data(); a.kv_last_page_len = a_last.data();
    a.kv_pos_split = a_split.data(); a.kv_pos_shift = a_shift.data();
    a.q_pos = qpos.data(); a.features = MSKV_PLAN_Q_POS;
    ASSERT_TRUE(ecu_run(e, p, &a, at, o1, l1));
    /* part 2: keys [cut, kv) on the pages after, at positions cut + j */
    mskv_plan b = a;
    std::vector<int32_t> b_indptr = {0, (kv - cut + P - 1) / P}, b_len = {kv - cut}, b_last = {(kv - cut) % P ? (kv - cut) % P : P},
                         b_split = {0}, b_shift = {cut};
    b.num_page_ids = b_indptr[1]; b.kv_indices = p.kv_indices.data() + cut / P; b.kv_indptr = b_indptr.data();
    b.kv_len = b_len.data(); b.kv_last_page_len = b_last.data(); b.kv_pos_split = b_split.data(); b.kv_pos_shift = b_shift.data();
    ASSERT_TRUE(ecu_run(e, p, &b, at, o2, l2));
    double oe = 0, le = 0;
    int empty2 = 0;
    for (size_t r = 0; r < lw.size(); r++) {
        double m = std::max(l1[r], l2[r]), w1 = std::isinf(l1[r]) ? 0 : std::exp(l1[r] - m), w2 = std::isinf(l2[r]) ? 0 : std::exp(l2[r] - m);
        empty2 += std::isinf(l2[r]) && l2[r] < 0;
        le = std::max(le, std::fabs(m + std::log(w1 + w2) - lw[r]));
        for (int d = 0; d < 64; d++) oe = std::max(oe, std::fabs((w1 * o1[r * 64 + d] + w2 * o2[r * 64 + d]) / (w1 + w2) - ow[r * 64 + d]));
    }
    EXPECT_NEAR(0.0, oe, 2.5e-2);
    EXPECT_NEAR(0.0, le, 2e-3);
    EXPECT_EQ((cut - (kv - qo)) * qh, empty2);   /* queries before the cut see nothing of part 2 */
    /* without q_pos the first part's queries would be the tail of its keys: a different result */
    a.q_pos = NULL; a.features = 0;
    std::vector<float> o1t, l1t;
    ASSERT_TRUE(ecu_run(e, p, &a, at, o1t, l1t));
    double moved = 0;
    for (size_t r = 0; r < l1.size(); r++) moved = std::max(moved, (double)std::fabs(l1t[r] - l1[r]));
    EXPECT_TRUE(moved > 1e-2);
}

/* ---- token-exact windows on the device: Wan's frames on 16-token pages ---- */

enum { EVX_F = 1560, EVX_P = 16, EVX_BLOCK = 3 * EVX_F, EVX_NQ = 16, EVX_D = 64 };

static float evx_val(int kind, int64_t pos, int step, int d) {
    uint32_t x = (uint32_t)(pos * 2654435761u) ^ (uint32_t)(kind * 40503 + step * 7919 + d * 9973);
    x ^= x >> 15; x *= 0x2c1b3c6du; x ^= x >> 12; x ^= x >> 16;
    return (float)((int32_t)(x % 2001) - 1000) / 1000.0f;
}

struct evx_result {
    int ok = 0;
    double o_err = 0, lse_err = 0;   /* device vs CPU backend, worst over every step */
    double paged_off = 0;            /* whole-page visibility on the device vs the exact CPU result: the worst lse difference */
};

/* Blocks of 3 frames through a session keeping a sink of one frame and a
   window of `frames` frames (the open block included), on a store-bound
   arena: at every denoise step the block's K/V go into the device pools by
   mskv_cuda_write_kv and its last EVX_NQ tokens attend on the emulated
   device with a MSKV_VIS_EXACT plan; the CPU backend attends over the same
   pools (downloaded) and plan. Keys are small, so every score is near 0 and
   the LSE is close to the log of the number of keys seen: one key more or
   less moves it by about 1 / that number. With `paged`, the same queries
   also run with whole-page visibility (MSKV_VIS_PAGES). */
static evx_result evx_video(int frames, int blocks, int steps, int paged) {
    evx_result res;
    ecu_env e;
    mskv_arena_desc ad;
    mskv_arena *a = nullptr;
    mskv_request r;
    mskv_session ses;
    mskv_retention ret;
    mskv_plan wp, ap;
    mskv_cuda_dplan dwp, dap;
    mskv_attn at;
    const int pages = 2048;   /* every page a video of 4 blocks needs, none waiting for a fence */
    const size_t pool_bytes = (size_t)pages * EVX_P * EVX_D * 2;
    std::vector<uint16_t> bk((size_t)EVX_BLOCK * EVX_D), bv(bk.size()), q((size_t)EVX_NQ * EVX_D), o(q.size()), ref(q.size());
    std::vector<uint16_t> hk(pool_bytes / 2), hv(pool_bytes / 2);
    std::vector<float> lse(EVX_NQ), lref(EVX_NQ);
    mskv_cu_ptr dk = 0, dv = 0, dq = 0, dout = 0, dlse = 0;
    if (e.open(MSKV_DTYPE_BF16, EVX_P, 1, pages) != MSKV_SUCCESS) return res;
    std::memset(&ad, 0, sizeof ad);
    if (mskv_cuda_store_arena_desc(e.st, &ad) != MSKV_SUCCESS || mskv_arena_create(&ad, &a) != MSKV_SUCCESS ||
        mskv_cuda_store_bind(e.st, a) != MSKV_SUCCESS)
        return res;
    std::memset(&ret, 0, sizeof ret);
    ret.chunk_size = EVX_F;          /* a frame: 97.5 pages, no exact page fit */
    ret.sink_chunks = 1;
    ret.window_chunks = frames - 3;  /* committed frames kept; the open block adds 3 */
    std::memset(&at, 0, sizeof at);
    at.q_heads = 1; at.q_dtype = MSKV_DTYPE_BF16;   /* mask NONE: the block attends bidirectionally */
    if (mskv_request_add(a, &r) || mskv_session_init(&ses, a, r, &ret) || mskv_plan_alloc(a, 1, EVX_BLOCK, pages, &wp) ||
        mskv_plan_alloc(a, 1, EVX_NQ, pages, &ap) || mskv_cuda_malloc(e.cu, bk.size() * 2, &dk) ||
        mskv_cuda_malloc(e.cu, bv.size() * 2, &dv) || mskv_cuda_malloc(e.cu, q.size() * 2, &dq) ||
        mskv_cuda_malloc(e.cu, o.size() * 2, &dout) || mskv_cuda_malloc(e.cu, EVX_NQ * 4, &dlse))
        return res;
    int failed = 0;
    for (int b = 0; b < blocks && !failed; b++) {
        const int64_t first = (int64_t)b * EVX_BLOCK;
        if (mskv_session_begin_chunk(&ses, EVX_BLOCK) || mskv_session_plan(&ses, NULL, &wp)) { failed = 1; break; }
        for (int s = 0; s < steps && !failed; s++) {
            for (int t = 0; t < EVX_BLOCK; t++)
                for (int d = 0; d < EVX_D; d++) {
                    bk[(size_t)t * EVX_D + d] = mskv_f32_to_bf16(0.05f * evx_val(0, first + t, s, d));
                    bv[(size_t)t * EVX_D + d] = mskv_f32_to_bf16(evx_val(1, first + t, s, d));
                }
            for (int t = 0; t < EVX_NQ; t++)
                for (int d = 0; d < EVX_D; d++) q[(size_t)t * EVX_D + d] = mskv_f32_to_bf16(evx_val(2, first + EVX_BLOCK - EVX_NQ + t, s, d));
            mskv_plan_desc pd;
            mskv_segment seg;
            std::memset(&pd, 0, sizeof pd);
            seg.request = r; seg.n_tokens = EVX_NQ;
            for (int pass = 0; pass < (paged ? 2 : 1) && !failed; pass++) {
                pd.visibility = pass ? MSKV_VIS_PAGES : MSKV_VIS_EXACT;
                if (mskv_cuda_upload(e.st, dk, bk.data(), bk.size() * 2) || mskv_cuda_upload(e.st, dv, bv.data(), bv.size() * 2) ||
                    mskv_cuda_plan_upload(e.st, &wp, MSKV_POS_NONE, &dwp) || mskv_cuda_write_kv(e.st, 0, &dwp, dk, dv, NULL) ||
                    mskv_plan_build(a, &seg, 1, &pd, &ap) || mskv_cuda_plan_upload(e.st, &ap, MSKV_POS_NONE, &dap) ||
                    mskv_cuda_upload(e.st, dq, q.data(), q.size() * 2) ||
                    mskv_cuda_attention(e.st, 0, &ap, &dap, &at, dq, dout, dlse) ||
                    mskv_cuda_download(e.st, o.data(), dout, o.size() * 2) || mskv_cuda_download(e.st, lse.data(), dlse, EVX_NQ * 4)) {
                    failed = 1;
                    break;
                }
                if (pass == 1) {
                    for (int i = 0; i < EVX_NQ; i++) res.paged_off = std::max(res.paged_off, (double)std::fabs(lse[i] - lref[i]));
                    continue;
                }
                mskv_pools pools = {hk.data(), hv.data(), MSKV_DTYPE_BF16, pages, EVX_P, 1, EVX_D};
                if (mskv_cuda_download(e.st, hk.data(), mskv_cuda_store_pool(e.st, 0, 0), pool_bytes) ||
                    mskv_cuda_download(e.st, hv.data(), mskv_cuda_store_pool(e.st, 0, 1), pool_bytes) ||
                    mskv_cpu_attention_pools(NULL, &pools, &ap, &at, q.data(), ref.data(), lref.data())) {
                    failed = 1;
                    break;
                }
                for (size_t i = 0; i < o.size(); i++)
                    res.o_err = std::max(res.o_err, (double)std::fabs(mskv_bf16_to_f32(o[i]) - mskv_bf16_to_f32(ref[i])));
                for (int i = 0; i < EVX_NQ; i++) res.lse_err = std::max(res.lse_err, (double)std::fabs(lse[i] - lref[i]));
            }
        }
        if (failed || mskv_session_commit_chunk(&ses, NULL)) failed = 1;
    }
    mskv_cuda_free(e.cu, dk); mskv_cuda_free(e.cu, dv); mskv_cuda_free(e.cu, dq); mskv_cuda_free(e.cu, dout); mskv_cuda_free(e.cu, dlse);
    mskv_plan_free(a, &wp);
    mskv_plan_free(a, &ap);
    mskv_arena_destroy(a);
    res.ok = !failed;
    return res;
}

/* Sink 1 frame, windows of 4 and 5 frames (3k+1 and 3k+2): the window's
   start falls inside a page every other block and the sink ends inside one.
   The emulated device attends over exactly the keys the CPU backend does
   (which test_exact_window.c checks against a research-style rolling
   cache): the LSE agrees to 1e-4 (one key is ~1.5e-4 at these window sizes),
   o to bf16 rounding; whole-page visibility differs by more. */
TEST(cuda_token_exact_windows_match_the_cpu_backend_for_wan_frames_on_16_token_pages) {
    const int windows[2] = {4, 5};
    for (int w : windows) {
        evx_result r = evx_video(w, 4, 2, w == 4);
        ASSERT_TRUE(r.ok);
        printf("  window %d frames: device vs CPU backend: lse %.2g, o %.2g%s", w, r.lse_err, r.o_err, w == 4 ? "" : "\n");
        if (w == 4) printf("; whole-page visibility on the device vs exact: lse %.2g\n", r.paged_off);
        if (r.lse_err > 1e-4 || r.o_err > 2e-3)
            mt_fail(__FILE__, __LINE__, "window %d frames: device vs CPU backend: lse %.3g, o %.3g", w, r.lse_err, r.o_err);
        if (w == 4 && r.paged_off <= 1e-3)
            mt_fail(__FILE__, __LINE__, "window %d frames: whole-page visibility matched the exact keys (lse %.3g): the test would not see a wrong window",
                    w, r.paged_off);
    }
}

TEST(cuda_merge_wrapper_matches_cpu_merge) {
    ecu_env e;
    const int n = 3, heads = 2;
    const size_t on = (size_t)n * heads * 64, ln = (size_t)n * heads;
    std::mt19937 rng(4);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    std::vector<float> h(2 * on + 2 * ln);
    for (auto &x : h) x = 3.0f * uni(rng);
    h[2 * on + 1] = -INFINITY;
    ASSERT_EQ(MSKV_SUCCESS, e.open(MSKV_DTYPE_BF16, 16, 1, 4));
    mskv_cu_ptr d = 0;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(e.cu, h.size() * 4, &d));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_upload(e.st, d, h.data(), h.size() * 4));
    mskv_cu_ptr oa = d, ob = d + on * 4, la = d + 2 * on * 4, lb = la + ln * 4;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_merge(e.st, n, heads, 64, oa, la, ob, lb, oa, la));  /* in place */
    std::vector<float> got(h.size()), oc(on), lc(ln);
    mskv_cuda_download(e.st, got.data(), d, h.size() * 4);
    mskv_cuda_free(e.cu, d);
    ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_merge(n, heads, 64, h.data(), h.data() + 2 * on, h.data() + on, h.data() + 2 * on + ln, oc.data(), lc.data()));
    double err = 0;
    for (size_t i = 0; i < on; i++) err = std::max(err, (double)std::fabs(got[i] - oc[i]));
    for (size_t i = 0; i < ln; i++) err = std::max(err, (double)std::fabs(got[2 * on + i] - lc[i]));
    EXPECT_NEAR(0.0, err, 1e-5);
}

TEST(cuda_rope_wrapper_matches_cpu_rope) {
    ecu_env e;
    const int n = 5, heads = 3;
    std::mt19937 rng(6);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    std::vector<uint16_t> x((size_t)n * heads * 64);
    std::vector<int32_t> pos(n);
    for (auto &v : x) v = mskv_f32_to_bf16(uni(rng));
    for (auto &p : pos) p = (int)(rng() % 4000);
    ASSERT_EQ(MSKV_SUCCESS, e.open(MSKV_DTYPE_BF16, 16, 1, 4));
    mskv_cu_ptr dx = 0, dp = 0;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(e.cu, x.size() * 2, &dx));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(e.cu, pos.size() * 4, &dp));
    mskv_cuda_upload(e.st, dx, x.data(), x.size() * 2);
    mskv_cuda_upload(e.st, dp, pos.data(), pos.size() * 4);
    mskv_rope rope;
    std::memset(&rope, 0, sizeof rope);
    rope.mode = MSKV_POS_1D; rope.style = MSKV_ROPE_HALF;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_rope(e.st, &rope, dx, n, heads, dp));
    std::vector<uint16_t> got(x.size());
    mskv_cuda_download(e.st, got.data(), dx, x.size() * 2);
    mskv_cuda_free(e.cu, dx); mskv_cuda_free(e.cu, dp);
    ASSERT_EQ(MSKV_SUCCESS, mskv_rope_apply(&rope, x.data(), MSKV_DTYPE_BF16, n, heads, 64, pos.data()));
    double err = 0;
    for (size_t i = 0; i < x.size(); i++) err = std::max(err, (double)std::fabs(mskv_bf16_to_f32(got[i]) - mskv_bf16_to_f32(x[i])));
    EXPECT_NEAR(0.0, err, 1.6e-2);
}

/* >>K/V write dtypes ------------------------------------------------------ */

/* Source values that find rounding bugs: ties to even in f16 and bf16, f16
   subnormals and overflow, bf16's extremes, signed zeros, infinities and
   NaN; then random values over a wide range. In the source dtype. moderate:
   values in [-2, 2] only (what RoPE, which mixes pairs, is compared on). */
static std::vector<unsigned char> ecu_sources(int src, size_t n, uint64_t seed, bool moderate) {
    static const uint32_t special[] = {
        0x3f808000u, 0x3f818000u, 0x3f800001u, 0x3f807fffu,   /* bf16: ties, just above / below */
        0x3f801000u, 0x3f803000u, 0x3f802fffu,                /* f16: ties of 1 + 2^-11 */
        0x33800000u, 0x33c00000u, 0x387fc000u, 0x38800000u,   /* f16 subnormals and its smallest normal */
        0x477fe000u, 0x477ff000u, 0x47800000u, 0x7f7fffffu,   /* f16 max, the tie to inf, 65536, f32 max */
        0x00000001u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u};
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> uni(-8.0f, 8.0f);
    std::vector<float> f(n);
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        if (moderate) f[i] = uni(rng) / 4;
        else if (i < sizeof special / sizeof special[0]) std::memcpy(&f[i], &special[i], 4);
        else if (i % 7 == 0) { u = (uint32_t)rng(); std::memcpy(&f[i], &u, 4); if (!std::isfinite(f[i])) f[i] = 1.5f; }
        else f[i] = uni(rng) * std::ldexp(1.0f, (int)(rng() % 40) - 20);
    }
    std::vector<unsigned char> out(n * (src == 0 ? 4 : 2));
    for (size_t i = 0; i < n; i++) {
        if (src == 0) { std::memcpy(&out[4 * i], &f[i], 4); continue; }
        uint16_t h = src == 1 ? mskv_f32_to_f16(f[i]) : mskv_f32_to_bf16(f[i]);
        if (!moderate && i < sizeof special / sizeof special[0] && src == 1) {
            uint32_t u; std::memcpy(&u, &f[i], 4);
            h = (uint16_t)(0x3c00u + (u & 0x3ffu) + (uint32_t)i);   /* f16 near 1 with low bits bf16 must round, ties among them */
        }
        std::memcpy(&out[2 * i], &h, 2);
    }
    return out;
}

/* One write of n tokens (some slots -1) from src into a fresh store of dtype
   pool, by mskv_cuda_write_kv_ex and by mskv_cpu_write_kv_pools over the same
   plan; the pools come back in k_gpu/v_gpu and k_cpu/v_cpu. */
struct ecu_written { std::vector<unsigned char> k_gpu, v_gpu, k_cpu, v_cpu; mskv_result r = MSKV_ERROR_BAD_STATE; };  /* BAD_STATE: not run */
static ecu_written ecu_write_pair(int pool, int src, const mskv_rope *rope, uint64_t seed) {
    ecu_written w;
    ecu_env e;
    const int P = 4, kvh = 2, pages = 8, n = 7;
    const size_t pes = pool == 0 ? 4 : 2, ses = src == 0 ? 4 : 2, row = (size_t)kvh * 64;
    const size_t pool_bytes = (size_t)pages * P * row * pes;
    int64_t slots[n] = {4, 9, -1, 30, 5, 17, 31};
    int32_t pos[n] = {0, 1, 2, 77, 3, 4000, 1234};
    mskv_plan plan;
    mskv_cuda_dplan dp;
    mskv_cu_ptr dk = 0, dv = 0;
    if (e.open((mskv_dtype)pool, P, kvh, pages) != MSKV_SUCCESS) return w;
    std::vector<unsigned char> k = ecu_sources(src, n * row, seed, rope != NULL), v = ecu_sources(src, n * row, seed + 1, false);
    w.k_gpu.assign(pool_bytes, 0); w.v_gpu = w.k_gpu; w.k_cpu = w.k_gpu; w.v_cpu = w.k_gpu;
    std::memset(&plan, 0, sizeof plan);
    plan.total_q = n; plan.page_size = P; plan.slot_mapping = slots; plan.positions = pos;
    if (mskv_cuda_upload(e.st, mskv_cuda_store_pool(e.st, 1, 0), w.k_gpu.data(), pool_bytes) != MSKV_SUCCESS ||
        mskv_cuda_upload(e.st, mskv_cuda_store_pool(e.st, 1, 1), w.v_gpu.data(), pool_bytes) != MSKV_SUCCESS ||
        mskv_cuda_plan_upload(e.st, &plan, rope ? MSKV_POS_1D : MSKV_POS_NONE, &dp) != MSKV_SUCCESS ||
        mskv_cuda_malloc(e.cu, k.size(), &dk) != MSKV_SUCCESS || mskv_cuda_malloc(e.cu, v.size(), &dv) != MSKV_SUCCESS)
        return w;
    mskv_cuda_upload(e.st, dk, k.data(), k.size());
    mskv_cuda_upload(e.st, dv, v.data(), v.size());
    w.r = mskv_cuda_write_kv_ex(e.st, 1, &dp, dk, dv, (mskv_dtype)src, rope);
    mskv_cuda_download(e.st, w.k_gpu.data(), mskv_cuda_store_pool(e.st, 1, 0), pool_bytes);
    mskv_cuda_download(e.st, w.v_gpu.data(), mskv_cuda_store_pool(e.st, 1, 1), pool_bytes);
    mskv_cuda_free(e.cu, dk); mskv_cuda_free(e.cu, dv);
    mskv_pools pools = {w.k_cpu.data(), w.v_cpu.data(), (mskv_dtype)pool, pages, P, kvh, 64};
    if (mskv_cpu_write_kv_pools(&pools, &plan, k.data(), v.data(), (mskv_dtype)src, rope) != MSKV_SUCCESS) w.r = MSKV_ERROR_BAD_STATE;
    (void)ses;
    return w;
}

static float ecu_el(const std::vector<unsigned char> &b, int dt, size_t i) {
    if (dt == 0) { float f; std::memcpy(&f, &b[4 * i], 4); return f; }
    uint16_t h; std::memcpy(&h, &b[2 * i], 2);
    return dt == 1 ? mskv_f16_to_f32(h) : mskv_bf16_to_f32(h);
}

TEST(cuda_write_kv_converts_every_source_dtype_into_every_pool_dtype_bit_for_bit_as_the_cpu) {
    for (int pool = 0; pool < 3; pool++)
        for (int src = 0; src < 3; src++) {
            uint64_t seed = 100 + (uint64_t)(3 * pool + src);
            ecu_written w = ecu_write_pair(pool, src, NULL, seed);
            ASSERT_EQ(MSKV_SUCCESS, w.r);
            size_t bad_k = 0, bad_v = 0, first = SIZE_MAX;
            for (size_t i = 0; i < w.k_gpu.size(); i++) {
                if (w.k_gpu[i] != w.k_cpu[i]) { bad_k++; if (first == SIZE_MAX) first = i; }
                bad_v += w.v_gpu[i] != w.v_cpu[i];
            }
            if (bad_k || bad_v)
                mt_fail(__FILE__, __LINE__, "source dtype %d into pool dtype %d (seed %llu): %zu K and %zu V bytes differ, first K at byte %zu",
                        src, pool, (unsigned long long)seed, bad_k, bad_v, first);
        }
}

/* RoPE on the way in rotates the source values in f32 and rounds once into
   the pool: V is the plain conversion (bit for bit), K is the CPU's within
   a pool ulp plus the angles' f32 error (the two compute angles apart). */
TEST(cuda_write_kv_rotates_converted_sources_on_the_way_in_like_the_cpu) {
    static const int pairs[4][2] = {{1, 0}, {2, 0}, {2, 1}, {1, 2}};   /* (pool, source) */
    mskv_rope rope;
    std::memset(&rope, 0, sizeof rope);
    rope.mode = MSKV_POS_1D; rope.style = MSKV_ROPE_HALF;
    for (auto &pr : pairs) {
        int pool = pr[0], src = pr[1];
        uint64_t seed = 200 + (uint64_t)(3 * pool + src);
        ecu_written w = ecu_write_pair(pool, src, &rope, seed);
        ASSERT_EQ(MSKV_SUCCESS, w.r);
        EXPECT_TRUE(w.v_gpu == w.v_cpu);
        double ulp = pool == 1 ? 1.0 / 1024 : 1.0 / 128, worst = 0;
        size_t n = w.k_gpu.size() / (pool == 0 ? 4 : 2), rotated = 0;
        for (size_t i = 0; i < n; i++) {
            double a = ecu_el(w.k_gpu, pool, i), b = ecu_el(w.k_cpu, pool, i);
            /* one rounding each side (a pool ulp) and f32 angles at positions < 2^12 */
            worst = std::max(worst, std::isfinite(a) ? std::fabs(a - b) / (std::fabs(b) * ulp + 1e-3) : 1e9);
            rotated += a != 0;
        }
        if (worst > 1.0)
            mt_fail(__FILE__, __LINE__, "source %d into pool %d (seed %llu): K off by %.3g of the tolerance", src, pool,
                    (unsigned long long)seed, worst);
        EXPECT_GT(rotated, (size_t)100);
    }
}

TEST(cuda_write_kv_ex_refuses_a_source_dtype_it_does_not_know) {
    ecu_env e;
    mskv_plan plan;
    mskv_cuda_dplan dp;
    int64_t slots[1] = {4};
    ASSERT_EQ(MSKV_SUCCESS, e.open(MSKV_DTYPE_BF16, 4, 1, 4));
    std::memset(&plan, 0, sizeof plan);
    plan.total_q = 1; plan.page_size = 4; plan.slot_mapping = slots;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(e.st, &plan, MSKV_POS_NONE, &dp));
    mskv_cu_ptr buf = 0;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(e.cu, 4096, &buf));
    ecu.launches = 0;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_write_kv_ex(e.st, 1, &dp, buf, buf + 2048, (mskv_dtype)3, NULL));
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_write_kv_ex(e.st, 1, &dp, buf, buf + 2048, (mskv_dtype)-1, NULL));
    EXPECT_EQ(0, ecu.launches);
    EXPECT_EQ(MSKV_SUCCESS, mskv_cuda_write_kv_ex(e.st, 1, &dp, buf, buf + 2048, MSKV_DTYPE_F32, NULL));
    EXPECT_TRUE(ecu.last_options.find("-DMSKV_SRC_DTYPE=0") != std::string::npos);
    EXPECT_EQ(1, ecu.launches);
    mskv_cuda_free(e.cu, buf);
}

/* >>padded graph replay --------------------------------------------------- */

/* A step of the replay test: its segments' query counts (per request). */
struct ecu_step_rig {
    ecu_env e;
    mskv_arena *a = nullptr;
    mskv_request r[3];
    mskv_plan plan;
    mskv_cuda_dplan dp;
    mskv_cu_ptr dk = 0, dv = 0, dq = 0, dout = 0, dlse = 0;
    std::mt19937_64 rng{77};
    ~ecu_step_rig() {
        if (a) mskv_plan_free(a, &plan);
        if (e.cu) { mskv_cuda_free(e.cu, dk); mskv_cuda_free(e.cu, dv); mskv_cuda_free(e.cu, dq); mskv_cuda_free(e.cu, dout); mskv_cuda_free(e.cu, dlse); }
        if (e.st) { mskv_cuda_store_destroy(e.st); e.st = nullptr; }
        if (a) mskv_arena_destroy(a);
    }
    /* random f32 K/V and bf16 q for every row of the uploaded plan (padding rows too) */
    void fill(int kvh, int qh) {
        std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
        std::vector<float> kv((size_t)plan.total_q * kvh * 64);
        std::vector<uint16_t> q((size_t)plan.total_q * qh * 64);
        for (auto &x : kv) x = uni(rng);
        mskv_cuda_upload(e.st, dk, kv.data(), kv.size() * 4);
        for (auto &x : kv) x = uni(rng);
        mskv_cuda_upload(e.st, dv, kv.data(), kv.size() * 4);
        for (auto &x : q) x = mskv_f32_to_bf16(2.0f * uni(rng));
        mskv_cuda_upload(e.st, dq, q.data(), q.size() * 2);
    }
};

static mskv_result ecu_step_launches(ecu_step_rig &g, const mskv_attn *at) {
    mskv_result r = mskv_cuda_write_kv_ex(g.e.st, 1, &g.dp, g.dk, g.dv, MSKV_DTYPE_F32, NULL);
    return r != MSKV_SUCCESS ? r : mskv_cuda_attention(g.e.st, 1, &g.plan, &g.dp, at, g.dq, g.dout, g.dlse);
}

/* One capture at the largest step serves a sequence of smaller ones planned
   padded to its shape: the replay gives every row bit for bit what the same
   padded plan gives eagerly (the launch shape is the padded one, so the
   kernel layout does not change with the step), and a step past the shape
   is refused ("capture again"). Captured at batch 3 padded to 4, so every
   smaller step has a padding segment for its extra queries. */
TEST(cuda_graph_captured_at_the_largest_step_replays_smaller_padded_steps_as_eager_launches_do) {
    ecu_step_rig g;
    const int P = 16, kvh = 2, qh = 8, rows_cap = 12 * qh;   /* 4 query heads per kv head: 6 queries = 24 rows, the prefill layout */
    const std::vector<std::vector<int>> steps = {{6, 4, 2}, {5}, {1, 3}, {2, 2, 2}, {1, 1, 1}, {6}};
    mskv_plan_desc d;
    mskv_attn at;
    mskv_cuda_graph *graph = NULL;
    ecu.sms = 4;
    ASSERT_EQ(MSKV_SUCCESS, g.e.open(MSKV_DTYPE_BF16, P, kvh, 64));
    {
        mskv_arena_desc ad;
        std::memset(&ad, 0, sizeof ad);
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_store_arena_desc(g.e.st, &ad));
        ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&ad, &g.a));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_store_bind(g.e.st, g.a));
    }
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(g.a, 4, 128, 64, &g.plan));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(g.e.cu, 128 * kvh * 64 * 4, &g.dk));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(g.e.cu, 128 * kvh * 64 * 4, &g.dv));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(g.e.cu, 128 * qh * 64 * 2, &g.dq));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(g.e.cu, 64 * qh * 64 * 2, &g.dout));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(g.e.cu, 64 * qh * 4, &g.dlse));
    std::memset(&at, 0, sizeof at);
    at.q_heads = qh; at.mask = MSKV_MASK_CAUSAL; at.q_dtype = MSKV_DTYPE_BF16;
    /* histories of 40, 70 and 20 tokens, written unpadded */
    for (int i = 0; i < 3; i++) {
        mskv_segment s;
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(g.a, &g.r[i]));
        s.request = g.r[i]; s.n_tokens = i == 0 ? 40 : i == 1 ? 70 : 20;
        ASSERT_EQ(MSKV_SUCCESS, mskv_admit(g.a, &s, 1));
        ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(g.a, &s, 1, NULL, &g.plan));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(g.e.st, &g.plan, MSKV_POS_NONE, &g.dp));
        g.fill(kvh, qh);
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_write_kv_ex(g.e.st, 1, &g.dp, g.dk, g.dv, MSKV_DTYPE_F32, NULL));
        ASSERT_EQ(MSKV_SUCCESS, mskv_commit(g.a, &s, 1));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_publish(g.e.st, &s, 1, NULL));
    }
    std::memset(&d, 0, sizeof d);
    d.pad_batch = 4; d.pad_tokens = 12; d.pad_qo_len = 6; d.pad_kv_len = 128;
    for (size_t k = 0; k < steps.size(); k++) {
        mskv_segment s[3];
        int n = (int)steps[k].size(), real = 0;
        ecu.launched.clear();
        for (int i = 0; i < n; i++) { s[i].request = g.r[(i + k) % 3]; s[i].n_tokens = steps[k][i]; real += steps[k][i]; }
        ASSERT_EQ(MSKV_SUCCESS, mskv_admit(g.a, s, n));
        ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(g.a, s, n, &d, &g.plan));
        ASSERT_EQ(12, g.plan.total_q);
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(g.e.st, &g.plan, MSKV_POS_NONE, &g.dp));
        g.fill(kvh, qh);
        if (k == 0) {
            ASSERT_EQ(MSKV_SUCCESS, ecu_step_launches(g, &at));   /* compiles */
            ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_capture_begin(g.e.st));
            ASSERT_EQ(MSKV_SUCCESS, ecu_step_launches(g, &at));
            ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_capture_end(g.e.st, &graph));
        }
        std::vector<uint16_t> o_rep((size_t)rows_cap * 64), o_eager(o_rep.size()), nan_o(o_rep.size(), 0xffff);
        std::vector<float> l_rep((size_t)rows_cap), l_eager(l_rep.size());
        mskv_cuda_upload(g.e.st, g.dout, nan_o.data(), nan_o.size() * 2);
        int before = ecu.launches;
        ecu.launched.clear();
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_graph_launch(g.e.st, graph));
        EXPECT_EQ(2, ecu.launches - before);   /* the captured write and attention */
        std::vector<std::string> replayed = ecu.launched;
        mskv_cuda_download(g.e.st, o_rep.data(), g.dout, o_rep.size() * 2);
        mskv_cuda_download(g.e.st, l_rep.data(), g.dlse, l_rep.size() * 4);
        mskv_cuda_upload(g.e.st, g.dout, nan_o.data(), nan_o.size() * 2);
        ecu.launched.clear();
        ASSERT_EQ(MSKV_SUCCESS, ecu_step_launches(g, &at));
        mskv_cuda_download(g.e.st, o_eager.data(), g.dout, o_eager.size() * 2);
        mskv_cuda_download(g.e.st, l_eager.data(), g.dlse, l_eager.size() * 4);
        /* the step's rows (padding rows are no result) */
        if (std::memcmp(o_rep.data(), o_eager.data(), (size_t)real * qh * 64 * 2) != 0 ||
            std::memcmp(l_rep.data(), l_eager.data(), (size_t)real * qh * 4) != 0)
            mt_fail(__FILE__, __LINE__, "step %zu (%d segments, %d queries): replay and eager differ", k, n, real);
        size_t bad = 0;
        for (size_t i = 0; i < (size_t)real * qh; i++) bad += !std::isfinite(l_rep[i]);
        for (size_t i = 0; i < (size_t)real * qh * 64; i++) bad += !std::isfinite(mskv_bf16_to_f32(o_rep[i]));
        EXPECT_EQ((size_t)0, bad);
        /* the same kernels every time: the launch shape is the captured one */
        EXPECT_TRUE(replayed == ecu.launched);
        ASSERT_EQ(MSKV_SUCCESS, mskv_commit(g.a, s, n));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_publish(g.e.st, s, n, NULL));
    }
    {
        /* past the shape: the padded build refuses it; unpadded, the replay does */
        mskv_segment s[3];
        for (int i = 0; i < 3; i++) { s[i].request = g.r[i]; s[i].n_tokens = i == 2 ? 1 : 6; }   /* 13 queries */
        ASSERT_EQ(MSKV_SUCCESS, mskv_admit(g.a, s, 3));
        EXPECT_EQ(MSKV_ERROR_CAPACITY, mskv_plan_build(g.a, s, 3, &d, &g.plan));
        ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(g.a, s, 3, NULL, &g.plan));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(g.e.st, &g.plan, MSKV_POS_NONE, &g.dp));
        int before = ecu.launches;
        EXPECT_EQ(MSKV_ERROR_CAPACITY, mskv_cuda_graph_launch(g.e.st, graph));
        EXPECT_TRUE(std::strstr(mskv_cuda_last_error(g.e.cu), "capture again") != NULL);
        EXPECT_EQ(before, ecu.launches);
        /* smaller and not padded: INVALID_ARGUMENT, pad it */
        ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(g.a, s, 1, NULL, &g.plan));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(g.e.st, &g.plan, MSKV_POS_NONE, &g.dp));
        EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_graph_launch(g.e.st, graph));
        EXPECT_TRUE(std::strstr(mskv_cuda_last_error(g.e.cu), "pad it") != NULL);
        ASSERT_EQ(MSKV_SUCCESS, mskv_abort(g.a, s, 3));
    }
    mskv_cuda_graph_destroy(g.e.st, graph);
}

TEST(attn_geometry_picks_the_decode_layout_for_few_rows) {
    mskv_cuda_attn_geometry g;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_attn_geometry_get(64, 64, 1, 4096, 32, 8, 128, 132, 0, 2, &g));
    EXPECT_EQ(1, g.decode);
    EXPECT_EQ(16, g.block_rows);
    EXPECT_EQ(3 * 2 * 64 * 128 * 2, (int)g.smem_bytes);   /* 3 stages of K and V; Q waits in the last */
    EXPECT_EQ(1, (int)g.grid[0]); EXPECT_EQ(64, (int)g.grid[1]); EXPECT_EQ(8, (int)g.grid[2]);
    EXPECT_EQ(1, g.n_splits);       /* 512 blocks fill 132 SMs x 2 */
    EXPECT_EQ(0, (int)g.workspace_bytes);
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_attn_geometry_get(1, 5, 5, 100, 4, 1, 64, 132, 0, 2, &g));
    EXPECT_EQ(0, g.decode);         /* 20 rows: the prefill layout */
}

TEST(attn_geometry_prefill_takes_32_rows_per_warp_up_to_head_dim_128) {
    mskv_cuda_attn_geometry g;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_attn_geometry_get(1, 4680, 4680, 32760, 12, 12, 128, 132, 0, 2, &g));
    EXPECT_EQ(128, g.block_rows);
    EXPECT_EQ(64, g.block_keys);
    EXPECT_EQ(37, (int)g.grid[0]);  /* ceil(4680 / 128) */
    EXPECT_EQ(96 * 1024, (int)g.smem_bytes);
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_attn_geometry_get(1, 4680, 4680, 32760, 12, 12, 256, 132, 0, 2, &g));
    EXPECT_EQ(64, g.block_rows);    /* 32 rows of 256 f32 accumulators would not fit the registers */
    EXPECT_EQ(32, g.block_keys);
}

TEST(attn_geometry_splits_keys_only_when_blocks_are_few) {
    mskv_cuda_attn_geometry g;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_attn_geometry_get(1, 1, 1, 65536, 32, 8, 128, 132, 0, 2, &g));
    EXPECT_GT(g.n_splits, 8);
    EXPECT_EQ(0, g.kv_chunk % g.block_keys);
    EXPECT_GE((int64_t)g.kv_chunk * g.n_splits, 65536);
    EXPECT_LT((int64_t)g.kv_chunk * (g.n_splits - 1), 65536);
    EXPECT_EQ((size_t)g.n_splits * 1 * 32 * (128 + 1) * 4, g.workspace_bytes);
    EXPECT_EQ(8 * g.n_splits, (int)g.grid[2]);
    /* the video chunk: 37 row tiles x 12 heads = 444 blocks, no split */
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_attn_geometry_get(1, 4680, 4680, 32760, 12, 12, 128, 132, 0, 2, &g));
    EXPECT_EQ(1, g.n_splits);
    /* a short sequence is not split */
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_attn_geometry_get(1, 1, 1, 300, 8, 8, 128, 132, 0, 2, &g));
    EXPECT_EQ(1, g.n_splits);
}

TEST(attn_geometry_does_not_split_a_512_key_decode) {
    mskv_cuda_attn_geometry g;
    /* one block per (segment, kv head) reads 512 keys: one launch, no merge */
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_attn_geometry_get(1, 1, 1, 512, 32, 8, 128, 132, 0, 2, &g));
    EXPECT_EQ(1, g.n_splits);
    EXPECT_EQ(0, (int)g.workspace_bytes);
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_attn_geometry_get(1, 1, 1, 1023, 32, 8, 128, 132, 0, 2, &g));
    EXPECT_EQ(1, g.n_splits);       /* two splits would hold fewer than 512 keys each */
}

TEST(attn_geometry_splits_fill_whole_waves_of_resident_blocks) {
    /* 8 kv heads x 65536 keys on 132 SMs: the split count follows how many
       blocks an SM holds, and the blocks fill their last wave */
    for (int resident = 1; resident <= 4; resident++) {
        mskv_cuda_attn_geometry g;
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_attn_geometry_get(1, 1, 1, 65536, 32, 8, 128, 132, 0, resident, &g));
        const int64_t slots = 132 * resident, blocks = 8 * (int64_t)g.n_splits;
        const int64_t waves = (blocks + slots - 1) / slots;
        EXPECT_GT(g.n_splits, 1);
        if (blocks * 10 < waves * slots * 9)
            mt_fail(__FILE__, __LINE__, "resident %d: %lld blocks fill %lld waves of %lld slots below 90%%", resident,
                    (long long)blocks, (long long)waves, (long long)slots);
    }
    {
        mskv_cuda_attn_geometry g1, g3;
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_attn_geometry_get(1, 1, 1, 65536, 32, 8, 128, 132, 0, 1, &g1));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_attn_geometry_get(1, 1, 1, 65536, 32, 8, 128, 132, 0, 3, &g3));
        EXPECT_GT(g3.n_splits, g1.n_splits);
    }
}

TEST(cuda_attention_splits_by_the_residency_the_driver_reports) {
    const int P = 40, kvh = 1, qh = 4, pages = 40;
    ecu.sms = 4;
    for (int resident = 1; resident <= 3; resident += 2) {
        ecu_env e;
        ecu_problem p;
        mskv_cuda_attn_geometry g;
        ecu.resident = resident;
        ASSERT_EQ(MSKV_SUCCESS, e.open(MSKV_DTYPE_BF16, P, kvh, pages));
        ASSERT_EQ(MSKV_SUCCESS, ecu_make(e, p, P, kvh, qh, pages, {1}, {1500}, 2));
        ecu.splits_seen = 0;
        ecu.occupancy_queries = 0;
        EXPECT_NEAR(0.0, ecu_attention_error(e, p, P, kvh, qh, pages, MSKV_MASK_NONE, 0), 2.5e-2);
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_attn_geometry_get(1, 1, 1, 1500, qh, kvh, 64, 4, 227 * 1024, resident, &g));
        EXPECT_EQ(g.n_splits, ecu.splits_seen);
        EXPECT_EQ(1, ecu.occupancy_queries);
    }
    ecu.resident = 2;
}

TEST(cuda_attention_runs_a_512_key_decode_as_one_launch) {
    ecu_env e;
    ecu_problem p;
    const int P = 16, kvh = 1, qh = 4, pages = 40;
    ecu.sms = 4;
    ASSERT_EQ(MSKV_SUCCESS, e.open(MSKV_DTYPE_BF16, P, kvh, pages));
    ASSERT_EQ(MSKV_SUCCESS, ecu_make(e, p, P, kvh, qh, pages, {1}, {512}, 2));
    ecu.launched.clear();
    EXPECT_NEAR(0.0, ecu_attention_error(e, p, P, kvh, qh, pages, MSKV_MASK_NONE, 0), 2.5e-2);
    ASSERT_EQ(1, (int)ecu.launched.size());
    EXPECT_STREQ("mskv_attn", ecu.launched[0].c_str());
}

TEST(attn_geometry_falls_back_when_shared_memory_is_short) {
    mskv_cuda_attn_geometry g;
    /* head_dim 256 decode needs 200 KiB: on a 99 KiB part the prefill layout (96 KiB) runs */
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_attn_geometry_get(4, 4, 1, 1000, 8, 8, 256, 84, 99 * 1024, 1, &g));
    EXPECT_EQ(0, g.decode);
    EXPECT_EQ(32, g.block_keys);
    EXPECT_LE((int)g.smem_bytes, 99 * 1024);
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_attn_geometry_get(1, 1, 1, 1, 6, 4, 128, 1, 0, 1, &g));
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_attn_geometry_get(1, 1, 1, 1, 8, 8, 96, 1, 0, 1, &g));
}

TEST(gpu_bench_check_passes_on_the_emulated_device) {
    mskv_cuda_functions table = ecu_table();
    char a0[] = "gpu_bench", a1[] = "--check", a2[] = "--mini";
    char *argv[] = {a0, a1, a2};
    EXPECT_EQ(0, gb_main(3, argv, &table));
}

TEST(gpu_bench_check_fails_on_a_planted_fragment_bug) {
    mskv_cuda_functions table = ecu_table();
    char a0[] = "gpu_bench", a1[] = "--check", a2[] = "--mini";
    char *argv[] = {a0, a1, a2};
    std::printf("  a fragment bug is planted: the gpu_bench FAIL lines that follow are expected\n");
    mskv_emu::cfg().mma_swap_rows = 1;
    int rc = gb_main(3, argv, &table);
    mskv_emu::cfg().mma_swap_rows = 0;
    EXPECT_EQ(1, rc);
}

TEST(gpu_bench_default_run_checks_then_prints_figures_on_the_emulated_device) {
    mskv_cuda_functions table = ecu_table();
    char a0[] = "gpu_bench", a1[] = "--mini";
    char *argv[] = {a0, a1};
    EXPECT_EQ(0, gb_main(2, argv, &table));
}

/* A lost context (every launch failing from the N-th on, as after an illegal
   address) stops the parity sweep at once; a mismatch does not: every case
   still runs and is counted (tests/gpu_check.sh's mma and sm90a stages). */
static int ecu_fail_after = -1;   /* launches that still succeed; -1: never fail */
static mskv_cu_result ecu_launch_failing(mskv_cu_function f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                         unsigned int by, unsigned int bz, unsigned int smem, mskv_cu_stream s, void **a, void **x) {
    if (ecu_fail_after == 0) return 700;   /* CUDA_ERROR_ILLEGAL_ADDRESS, for good */
    if (ecu_fail_after > 0) ecu_fail_after--;
    return ecu_launch(f, gx, gy, gz, bx, by, bz, smem, s, a, x);
}

TEST(gpu_bench_sweep_stops_at_a_failed_call_and_goes_on_past_mismatches) {
    mskv_cuda_functions table = ecu_table();
    char a0[] = "gpu_bench", a1[] = "--check", a2[] = "--mini";
    char *argv[] = {a0, a1, a2};
    ASSERT_EQ(0, gb_main(3, argv, &table));
    const int full = gb_cases;
    EXPECT_EQ(0, gb_cuda_error);
    ASSERT_GT(full, 10);
    std::printf("  a fragment bug is planted: the gpu_bench FAIL lines that follow are expected\n");
    mskv_emu::cfg().mma_swap_rows = 1;
    EXPECT_EQ(1, gb_main(3, argv, &table));
    mskv_emu::cfg().mma_swap_rows = 0;
    EXPECT_EQ(full, gb_cases);
    EXPECT_GT(gb_failed, 0);
    EXPECT_EQ(0, gb_cuda_error);
    std::printf("  launches fail from the 6th on: the gpu_bench errors that follow are expected\n");
    table.cuLaunchKernel = ecu_launch_failing;
    ecu_fail_after = 5;
    EXPECT_EQ(1, gb_main(3, argv, &table));
    ecu_fail_after = -1;
    EXPECT_EQ(1, gb_cuda_error);
    EXPECT_LT(gb_cases, 5);
}

TEST(gpu_bench_figures_go_to_the_results_file_as_json_lines) {
    mskv_cuda_functions table = ecu_table();
    char a0[] = "gpu_bench", a1[] = "--figures", a2[] = "--mini";
    char *argv[] = {a0, a1, a2};
    char line[512];
    int chunk = 0, decode = 0, copy = 0, kvw = 0;
    gb_json = std::tmpfile();
    ASSERT_TRUE(gb_json != NULL);
    EXPECT_EQ(0, gb_main(3, argv, &table));
    std::rewind(gb_json);
    while (std::fgets(line, sizeof line, gb_json)) {
        auto starts = [&](const char *p) { return std::strncmp(line, p, std::strlen(p)) == 0; };
        if (starts("{\"figure\":\"chunk_") && std::strstr(line, "\"unit\":\"TFLOP/s\"")) chunk++;
        if (starts("{\"figure\":\"copy_dtod\",")) copy++;
        /* decode and kv_write carry the copy bandwidth as their peer, and the ratio */
        if (starts("{\"figure\":\"decode_batch\",") || starts("{\"figure\":\"decode_long\",")) decode += !std::strstr(line, "\"ratio\":null");
        if (starts("{\"figure\":\"kv_write_chunk\",")) kvw += !std::strstr(line, "\"peer\":null");
    }
    std::fclose(gb_json);
    gb_json = NULL;
    EXPECT_GE(chunk, 2);
    EXPECT_EQ(1, copy);
    EXPECT_EQ(2, decode);
    EXPECT_EQ(1, kvw);
}

/* >>head shards ------------------------------------------------------------ */
/* One arena over two emulated devices (2 of the 4 KV heads each) against a
   CPU arena of the same geometry making the same calls: the page ids agree
   (allocation is deterministic), so every byte and every output can be
   compared. Requests: A and B, written with 1-D RoPE, then a step that
   attends (GQA 8:4, causal). */
struct esh_env {
    static const int P = 8, L = 2, KVH = 4, QH = 8, D = 64, N = 2, PAGES = 40;
    mskv_cuda_functions table;
    mskv_cuda *cu[N] = {nullptr, nullptr};
    mskv_cuda_shards *sh = nullptr;
    mskv_arena *a = nullptr, *cpu = nullptr;   /* sharded, and the CPU reference */
    mskv_request ra[2], rc[2];
    mskv_rope rope;
    bool with_rope = true;
    std::mt19937_64 rng{77};   /* a fixed seed: the same data every run */
    ~esh_env() {
        if (a) mskv_arena_destroy(a);
        if (sh) mskv_cuda_shards_destroy(sh);
        for (auto *c : cu) if (c) mskv_cuda_destroy(c);
        if (cpu) mskv_arena_destroy(cpu);
        ecu.devices = 1;
    }
    mskv_result open() {
        mskv_cuda_desc d;
        mskv_cuda_shard_desc sd;
        mskv_arena_desc ad;
        mskv_result r;
        table = ecu_table();
        ecu.devices = N;
        std::memset(&d, 0, sizeof d);
        d.functions = &table;
        d.disable_disk_cache = 1;
        for (int s = 0; s < N; s++) {
            d.device = s;
            if ((r = mskv_cuda_create(&d, &cu[s])) != MSKV_SUCCESS) return r;
        }
        std::memset(&sd, 0, sizeof sd);
        sd.num_shards = N;
        sd.devices = cu;
        sd.store.num_pages = PAGES; sd.store.page_size = P; sd.store.num_layers = L; sd.store.kv_heads = KVH;
        sd.store.head_dim = D; sd.store.dtype = MSKV_DTYPE_BF16;
        sd.store.staging_bytes = 3 * (size_t)P * KVH / N * D * 2 * L * 2;   /* 3 pages a round */
        if ((r = mskv_cuda_shards_create(&sd, &sh)) != MSKV_SUCCESS) return r;
        std::memset(&ad, 0, sizeof ad);
        if ((r = mskv_cuda_shards_arena_desc(sh, &ad)) != MSKV_SUCCESS) return r;
        if ((r = mskv_arena_create(&ad, &a)) != MSKV_SUCCESS) return r;
        if ((r = mskv_cuda_shards_bind(sh, a)) != MSKV_SUCCESS) return r;
        std::memset(&ad, 0, sizeof ad);
        ad.num_pages = PAGES; ad.page_size = P; ad.num_layers = L; ad.kv_heads = KVH; ad.head_dim = D;
        ad.dtype = MSKV_DTYPE_BF16;
        if ((r = mskv_arena_create(&ad, &cpu)) != MSKV_SUCCESS) return r;
        std::memset(&rope, 0, sizeof rope);
        rope.style = MSKV_ROPE_HALF; rope.mode = MSKV_POS_1D; rope.theta = 10000.0f;
        for (int i = 0; i < 2; i++) {
            if ((r = mskv_request_add(a, &ra[i])) != MSKV_SUCCESS) return r;
            if ((r = mskv_request_add(cpu, &rc[i])) != MSKV_SUCCESS) return r;
        }
        return MSKV_SUCCESS;
    }
    std::vector<uint16_t> random(size_t n, float scale) {
        std::uniform_real_distribution<float> uni(-scale, scale);
        std::vector<uint16_t> x(n);
        for (auto &v : x) v = mskv_f32_to_bf16(uni(rng));
        return x;
    }
    /* heads [h0, h0 + hn) of x [rows][heads][D] */
    static std::vector<uint16_t> slice(const std::vector<uint16_t> &x, int heads, int h0, int hn) {
        size_t rows = x.size() / ((size_t)heads * D);
        std::vector<uint16_t> out(rows * hn * D);
        for (size_t t = 0; t < rows; t++)
            std::memcpy(&out[t * hn * D], &x[(t * heads + h0) * D], (size_t)hn * D * 2);
        return out;
    }
    mskv_result to_device(int s, const std::vector<uint16_t> &x, mskv_cu_ptr *out) {
        mskv_result r = mskv_cuda_malloc(cu[s], x.size() * 2 + 16, out);
        return r == MSKV_SUCCESS ? mskv_cuda_upload(mskv_cuda_shards_store(sh, s), *out, x.data(), x.size() * 2) : r;
    }
    /* One step in both arenas: n[i] new tokens of request i, K/V written to
       every layer (CPU: whole heads; devices: their slices); with q, each
       layer's attention too, the outputs returned (o [total_q][QH][D] and
       lse, the devices' slices put back together). */
    mskv_result step(const int n[2], bool attend, std::vector<uint16_t> *o_gpu, std::vector<uint16_t> *o_cpu,
                     std::vector<float> *l_gpu, std::vector<float> *l_cpu) {
        mskv_segment sg[2], sc[2];
        mskv_plan pg, pc;
        mskv_plan_desc pd;
        mskv_cuda_dplan dp[N];
        mskv_result r;
        int total = n[0] + n[1], m = 0;   /* m: the requests with new tokens (an offloaded one has none) */
        for (int i = 0; i < 2; i++)
            if (n[i]) { sg[m].request = ra[i]; sg[m].n_tokens = n[i]; sc[m].request = rc[i]; sc[m++].n_tokens = n[i]; }
        std::memset(&pd, 0, sizeof pd);
        pd.pos_mode = MSKV_POS_1D;
        if ((r = mskv_admit(a, sg, m)) != MSKV_SUCCESS || (r = mskv_admit(cpu, sc, m)) != MSKV_SUCCESS) return r;
        if ((r = mskv_plan_alloc(a, 2, 256, 64, &pg)) != MSKV_SUCCESS) return r;
        if ((r = mskv_plan_alloc(cpu, 2, 256, 64, &pc)) != MSKV_SUCCESS) return r;
        r = mskv_plan_build(a, sg, m, &pd, &pg);
        if (r == MSKV_SUCCESS) r = mskv_plan_build(cpu, sc, m, &pd, &pc);
        if (r == MSKV_SUCCESS) r = mskv_cuda_shards_plan_upload(sh, &pg, MSKV_POS_1D, dp);
        mskv_attn at;
        std::memset(&at, 0, sizeof at);
        at.q_heads = QH; at.mask = MSKV_MASK_CAUSAL; at.q_dtype = MSKV_DTYPE_BF16;
        if (o_gpu) { o_gpu->assign((size_t)L * total * QH * D, 0); o_cpu->assign(o_gpu->size(), 0); }
        if (l_gpu) { l_gpu->assign((size_t)L * total * QH, 0.0f); l_cpu->assign(l_gpu->size(), 0.0f); }
        for (int l = 0; l < L && r == MSKV_SUCCESS; l++) {
            std::vector<uint16_t> k = random((size_t)total * KVH * D, 1.0f), v = random(k.size(), 1.0f);
            std::vector<uint16_t> q = random((size_t)total * QH * D, 2.0f);
            r = mskv_cpu_write_kv(cpu, l, &pc, k.data(), v.data(), MSKV_DTYPE_BF16, with_rope ? &rope : nullptr);
            if (r == MSKV_SUCCESS && attend)
                r = mskv_cpu_attention(NULL, cpu, l, &pc, &at, q.data(), &(*o_cpu)[(size_t)l * total * QH * D],
                                       &(*l_cpu)[(size_t)l * total * QH]);
            for (int s = 0; s < N && r == MSKV_SUCCESS; s++) {
                mskv_cu_ptr dk = 0, dv = 0, dq = 0, dout = 0, dlse = 0;
                const int hk = KVH / N, hq = QH / N;
                r = to_device(s, slice(k, KVH, s * hk, hk), &dk);
                if (r == MSKV_SUCCESS) r = to_device(s, slice(v, KVH, s * hk, hk), &dv);
                if (r == MSKV_SUCCESS) r = mskv_cuda_shards_write_kv(sh, s, l, &dp[s], dk, dv, with_rope ? &rope : nullptr);
                if (r == MSKV_SUCCESS && attend) {
                    std::vector<uint16_t> os((size_t)total * hq * D);
                    std::vector<float> ls((size_t)total * hq);
                    r = to_device(s, slice(q, QH, s * hq, hq), &dq);
                    if (r == MSKV_SUCCESS) r = mskv_cuda_malloc(cu[s], os.size() * 2, &dout);
                    if (r == MSKV_SUCCESS) r = mskv_cuda_malloc(cu[s], ls.size() * 4, &dlse);
                    if (r == MSKV_SUCCESS) r = mskv_cuda_shards_attention(sh, s, l, &pg, &dp[s], &at, dq, dout, dlse);
                    if (r == MSKV_SUCCESS) r = mskv_cuda_download(mskv_cuda_shards_store(sh, s), os.data(), dout, os.size() * 2);
                    if (r == MSKV_SUCCESS) r = mskv_cuda_download(mskv_cuda_shards_store(sh, s), ls.data(), dlse, ls.size() * 4);
                    for (int t = 0; t < total && r == MSKV_SUCCESS; t++) {
                        std::memcpy(&(*o_gpu)[(((size_t)l * total + t) * QH + s * hq) * D], &os[(size_t)t * hq * D], (size_t)hq * D * 2);
                        std::memcpy(&(*l_gpu)[((size_t)l * total + t) * QH + s * hq], &ls[(size_t)t * hq], (size_t)hq * 4);
                    }
                }
                for (mskv_cu_ptr p : {dk, dv, dq, dout, dlse}) if (p) mskv_cuda_free(cu[s], p);
            }
        }
        mskv_plan_free(a, &pg);
        mskv_plan_free(cpu, &pc);
        if (r != MSKV_SUCCESS) return r;
        if ((r = mskv_commit(a, sg, m)) != MSKV_SUCCESS || (r = mskv_commit(cpu, sc, m)) != MSKV_SUCCESS) return r;
        if ((r = mskv_cuda_shards_publish(sh, sg, m, NULL)) != MSKV_SUCCESS) return r;
        return mskv_publish(cpu, sc, m, NULL);
    }
    /* Tokens [0, n) of request i: the largest difference between a device's
       heads and the CPU arena's (as floats), K (kind 0) or V (kind 1). */
    double kv_diff(int i, int64_t n, int kind) {
        double worst = 0;
        for (int64_t t = 0; t < n; t++) {
            int64_t sg = -1, sc = -1;
            if (mskv_request_slot(a, ra[i], t, &sg) != MSKV_SUCCESS || mskv_request_slot(cpu, rc[i], t, &sc) != MSKV_SUCCESS) return 1e9;
            for (int l = 0; l < L; l++) {
                const uint16_t *host = (const uint16_t *)mskv_store_pool(cpu, l, kind);
                for (int s = 0; s < N; s++) {
                    const int hk = KVH / N;
                    std::vector<uint16_t> dev((size_t)hk * D);
                    mskv_cuda_store *st = mskv_cuda_shards_store(sh, s);
                    if (mskv_cuda_download(st, dev.data(), mskv_cuda_store_pool(st, l, kind) + (mskv_cu_ptr)(sg * hk * D * 2), dev.size() * 2) != MSKV_SUCCESS) return 1e9;
                    for (int x = 0; x < hk * D; x++) {
                        double g = mskv_bf16_to_f32(dev[(size_t)x]), c = mskv_bf16_to_f32(host[((size_t)sc * KVH + (size_t)s * hk) * D + (size_t)x]);
                        worst = std::max(worst, std::isfinite(g) ? std::fabs(g - c) : 1e9);
                    }
                }
            }
        }
        return worst;
    }
};

TEST(cuda_shards_write_kv_with_rope_and_attention_equal_the_unsharded_cpu_result) {
    esh_env e;
    std::vector<uint16_t> og, oc;
    std::vector<float> lg, lc;
    const int prefill[2] = {37, 13}, next[2] = {5, 3};
    ASSERT_EQ(MSKV_SUCCESS, e.open());
    ASSERT_EQ(MSKV_SUCCESS, e.step(prefill, false, nullptr, nullptr, nullptr, nullptr));
    ASSERT_EQ(MSKV_SUCCESS, e.step(next, true, &og, &oc, &lg, &lc));
    for (int i = 0; i < 2; i++) {
        /* rotated K: the CPU path in use may round its sin/cos products differently (0 here) */
        EXPECT_NEAR(0.0, e.kv_diff(i, prefill[i] + next[i], 0), 1.6e-2);
        EXPECT_EQ(0.0, e.kv_diff(i, prefill[i] + next[i], 1));             /* V: copied bit for bit */
    }
    double err = 0;
    for (size_t x = 0; x < og.size(); x++) {
        double g = mskv_bf16_to_f32(og[x]), c = mskv_bf16_to_f32(oc[x]);
        err = std::max(err, std::isfinite(g) ? std::fabs(g - c) : 1e9);
    }
    for (size_t x = 0; x < lg.size(); x++) err = std::max(err, std::isfinite(lg[x]) ? (double)std::fabs(lg[x] - lc[x]) : 1e9);
    EXPECT_NEAR(0.0, err, 2.5e-2);
}

/* Offload and reload through every device's gather and scatter kernels: the
   request comes back byte for byte (elsewhere in the pools), and the blob
   exported in between is the CPU arena's blob of the same request (K/V
   written without RoPE: both sides hold the same bytes). */
TEST(cuda_shards_offload_reload_round_trip_is_byte_identical_and_exports_the_unsharded_blob) {
    esh_env e;
    const int prefill[2] = {37, 13}, grow[2] = {0, 20};
    e.with_rope = false;
    ASSERT_EQ(MSKV_SUCCESS, e.open());
    ASSERT_EQ(MSKV_SUCCESS, e.step(prefill, false, nullptr, nullptr, nullptr, nullptr));
    ASSERT_EQ(0.0, e.kv_diff(0, 37, 0));
    ASSERT_EQ(0.0, e.kv_diff(0, 37, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(e.a, e.ra[0]));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(e.cpu, e.rc[0]));
    /* B takes A's pages meanwhile, in both arenas alike */
    ASSERT_EQ(MSKV_SUCCESS, e.step(grow, false, nullptr, nullptr, nullptr, nullptr));
    size_t ng = 0, nc = 0, cap = (size_t)4 << 20;
    std::vector<unsigned char> bg(cap), bc(cap);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_export(e.a, e.ra[0], bg.data(), cap, &ng));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_export(e.cpu, e.rc[0], bc.data(), cap, &nc));
    ASSERT_EQ((long long)nc, (long long)ng);
    EXPECT_EQ(0, std::memcmp(bg.data(), bc.data(), ng));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(e.a, e.ra[0]));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(e.cpu, e.rc[0]));
    for (int kind = 0; kind < 2; kind++) {
        EXPECT_EQ(0.0, e.kv_diff(0, 37, kind));
        EXPECT_EQ(0.0, e.kv_diff(1, 33, kind));
    }
    char why[256] = "";
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_audit(e.a, why, sizeof why));
}

/* ---- prefix views on the device (issue 12, item 1): the protected prefix
   gathered into device buffers by the store, attended without a page table
   by both kernels, refused once the prefix changed, refreshed in place ---- */

enum { EPV_P = 16, EPV_KVH = 2, EPV_QH = 8, EPV_D = 64, EPV_PAGES = 96, EPV_CAP = 512, EPV_NQ = 8 };

static float epv_val(int kind, int layer, int64_t pos, int h, int d) {
    uint32_t x = (uint32_t)(pos * 2654435761u) ^ (uint32_t)(kind * 40503 + layer * 7919 + h * 131 + d * 9973);
    x ^= x >> 15; x *= 0x2c1b3c6du; x ^= x >> 12;
    return (float)((int32_t)(x % 2001) - 1000) / 1000.0f;
}

/* A store-bound arena with one request on the emulated device, its K/V
   written by mskv_cuda_write_kv, and a device view of it. */
struct epv_rig {
    ecu_env e;
    mskv_arena *a = nullptr;
    mskv_request r{};
    mskv_prefix_view v{};
    mskv_cu_ptr vk = 0, vv = 0;
    std::vector<uint16_t> q;
    ~epv_rig() {
        if (vk) mskv_cuda_free(e.cu, vk);
        if (vv) mskv_cuda_free(e.cu, vv);
        if (a) mskv_arena_destroy(a);
    }
    bool open(mskv_cuda_attn_path path) {
        mskv_arena_desc ad;
        const size_t bytes = (size_t)2 * EPV_CAP * EPV_KVH * EPV_D * 2;
        e.path = path;
        if (e.open(MSKV_DTYPE_BF16, EPV_P, EPV_KVH, EPV_PAGES) != MSKV_SUCCESS) return false;
        std::memset(&ad, 0, sizeof ad);
        if (mskv_cuda_store_arena_desc(e.st, &ad) || mskv_arena_create(&ad, &a) || mskv_cuda_store_bind(e.st, a) ||
            mskv_request_add(a, &r) || mskv_cuda_malloc(e.cu, bytes, &vk) || mskv_cuda_malloc(e.cu, bytes, &vv))
            return false;
        std::memset(&v, 0, sizeof v);
        v.request = r;
        v.k = (void *)(uintptr_t)vk;
        v.v = (void *)(uintptr_t)vv;
        v.cap_tokens = EPV_CAP;
        q.resize((size_t)EPV_NQ * EPV_QH * EPV_D);
        for (size_t i = 0; i < q.size(); i++) q[i] = mskv_f32_to_bf16(2.0f * epv_val(2, 0, (int64_t)i, 0, 0));
        return true;
    }
    /* admits n tokens of `req`, writes both layers' K/V through the device, commits */
    bool grow(mskv_request req, int n) {
        mskv_segment s;
        mskv_plan p;
        mskv_cuda_dplan dp;
        mskv_cu_ptr dk = 0, dv = 0;
        std::vector<uint16_t> k((size_t)n * EPV_KVH * EPV_D), vb(k.size());
        s.request = req; s.n_tokens = n;
        std::memset(&p, 0, sizeof p);
        bool ok = mskv_admit(a, &s, 1) == MSKV_SUCCESS && mskv_plan_alloc(a, 1, n, EPV_PAGES, &p) == MSKV_SUCCESS &&
                  mskv_plan_build(a, &s, 1, NULL, &p) == MSKV_SUCCESS &&
                  mskv_cuda_plan_upload(e.st, &p, MSKV_POS_NONE, &dp) == MSKV_SUCCESS &&
                  mskv_cuda_malloc(e.cu, k.size() * 2, &dk) == MSKV_SUCCESS && mskv_cuda_malloc(e.cu, k.size() * 2, &dv) == MSKV_SUCCESS;
        for (int l = 0; ok && l < 2; l++) {
            for (int t = 0; t < n; t++)
                for (int h = 0; h < EPV_KVH; h++)
                    for (int d = 0; d < EPV_D; d++) {
                        k[((size_t)t * EPV_KVH + h) * EPV_D + d] = mskv_f32_to_bf16(epv_val(0, l, p.q_pos[t], h, d));
                        vb[((size_t)t * EPV_KVH + h) * EPV_D + d] = mskv_f32_to_bf16(epv_val(1, l, p.q_pos[t], h, d));
                    }
            ok = mskv_cuda_upload(e.st, dk, k.data(), k.size() * 2) == MSKV_SUCCESS &&
                 mskv_cuda_upload(e.st, dv, vb.data(), vb.size() * 2) == MSKV_SUCCESS &&
                 mskv_cuda_write_kv(e.st, l, &dp, dk, dv, NULL) == MSKV_SUCCESS;
        }
        ok = ok && mskv_commit(a, &s, 1) == MSKV_SUCCESS;
        if (dk) mskv_cuda_free(e.cu, dk);
        if (dv) mskv_cuda_free(e.cu, dv);
        mskv_plan_free(a, &p);
        return ok;
    }
    /* builds a plan for the newest EPV_NQ tokens, uploads it, attends on the
       device over the pools (kv NULL) or dense K/V; o as f32 */
    mskv_result attend(const mskv_plan_desc *pd, int layer, const mskv_dense_kv *kv, mskv_mask m, std::vector<float> &o,
                       std::vector<float> &lse) {
        mskv_segment s;
        mskv_plan p;
        mskv_cuda_dplan dp;
        mskv_attn at;
        mskv_cu_ptr dq = 0, dout = 0, dlse = 0;
        const size_t n = q.size(), rows = n / EPV_D;
        std::vector<uint16_t> ob(n);
        mskv_result res;
        s.request = r; s.n_tokens = EPV_NQ;
        std::memset(&at, 0, sizeof at);
        at.q_heads = EPV_QH; at.mask = m; at.q_dtype = MSKV_DTYPE_BF16;
        if ((res = mskv_plan_alloc(a, 1, EPV_NQ, EPV_PAGES, &p)) != MSKV_SUCCESS) return res;
        res = mskv_plan_build(a, &s, 1, pd, &p);
        if (!res) res = mskv_cuda_plan_upload(e.st, &p, MSKV_POS_NONE, &dp);
        if (!res) res = mskv_cuda_malloc(e.cu, n * 2, &dq);
        if (!res) res = mskv_cuda_malloc(e.cu, n * 2, &dout);
        if (!res) res = mskv_cuda_malloc(e.cu, rows * 4, &dlse);
        if (!res) res = mskv_cuda_upload(e.st, dq, q.data(), n * 2);
        if (!res) res = kv ? mskv_cuda_attention_dense(e.st, kv, &p, &dp, &at, dq, dout, dlse)
                           : mskv_cuda_attention(e.st, layer, &p, &dp, &at, dq, dout, dlse);
        lse.assign(rows, 0.0f);
        if (!res) res = mskv_cuda_download(e.st, ob.data(), dout, n * 2);
        if (!res) res = mskv_cuda_download(e.st, lse.data(), dlse, rows * 4);
        if (dq) mskv_cuda_free(e.cu, dq);
        if (dout) mskv_cuda_free(e.cu, dout);
        if (dlse) mskv_cuda_free(e.cu, dlse);
        mskv_plan_free(a, &p);
        o.resize(n);
        for (size_t i = 0; i < n; i++) o[i] = mskv_bf16_to_f32(ob[i]);
        return res;
    }
    /* the paged attention over the prefix alone (caller bounds hide the rest) */
    mskv_result paged_prefix(int layer, mskv_mask m, std::vector<float> &o, std::vector<float> &lse) {
        mskv_request_info info;
        mskv_plan_desc pd;
        int64_t se, ws = INT32_MAX;
        mskv_result res = mskv_request_info_get(a, r, &info);
        if (res) return res;
        se = info.prefix_tokens;
        std::memset(&pd, 0, sizeof pd);
        pd.visibility = MSKV_VIS_CALLER; pd.vis_sink_end = &se; pd.vis_window_start = &ws;
        return attend(&pd, layer, NULL, m, o, lse);
    }
    /* the same through the view: a PREFIX plan over its layer */
    mskv_result dense_prefix(int layer, mskv_mask m, std::vector<float> &o, std::vector<float> &lse) {
        mskv_plan_desc pd;
        mskv_dense_kv kv;
        mskv_result res = mskv_prefix_view_layer(&v, a, layer, &kv);
        if (res) return res;
        std::memset(&pd, 0, sizeof pd);
        pd.kind = MSKV_PLAN_PREFIX;
        return attend(&pd, layer, &kv, m, o, lse);
    }
    /* both layers, no mask and causal: the view's result is the paged one,
       bit for bit (the same keys in the same tiles), and o differs from
       the CPU backend over the host view by bf16 rounding only */
    bool same(int line) {
        for (int l = 0; l < 2; l++)
            for (int m = 0; m < 2; m++) {
                std::vector<float> po, pl, dn, dl;
                mskv_result r1 = paged_prefix(l, (mskv_mask)m, po, pl), r2 = dense_prefix(l, (mskv_mask)m, dn, dl);
                if (r1 || r2) {
                    mt_fail(__FILE__, line, "layer %d mask %d: paged %s, dense %s", l, m, mskv_result_string(r1), mskv_result_string(r2));
                    return false;
                }
                if (po != dn || pl != dl) {
                    mt_fail(__FILE__, line, "layer %d mask %d: the device view's result differs from the paged one", l, m);
                    return false;
                }
            }
        return true;
    }
    /* the device view's bytes equal the host gather's (through store_ops) */
    bool bytes_match(int line) {
        mskv_prefix_view h = v;
        const size_t n = (size_t)2 * EPV_CAP * EPV_KVH * EPV_D;
        std::vector<uint16_t> hk(n), hv(n), dk(n), dv(n);
        h.k = hk.data(); h.v = hv.data();
        if (mskv_prefix_view_gather(a, &h) || mskv_cuda_download(e.st, dk.data(), vk, n * 2) ||
            mskv_cuda_download(e.st, dv.data(), vv, n * 2)) {
            mt_fail(__FILE__, line, "gather or download failed");
            return false;
        }
        if (h.epoch != v.epoch || h.tokens != v.tokens) {
            mt_fail(__FILE__, line, "host view epoch %llu / %lld tokens, device view %llu / %lld", (unsigned long long)h.epoch,
                    (long long)h.tokens, (unsigned long long)v.epoch, (long long)v.tokens);
            return false;
        }
        for (int l = 0; l < 2; l++) {
            const size_t at = (size_t)l * EPV_CAP * EPV_KVH * EPV_D, len = (size_t)v.tokens * EPV_KVH * EPV_D * 2;
            if (std::memcmp(hk.data() + at, dk.data() + at, len) || std::memcmp(hv.data() + at, dv.data() + at, len)) {
                mt_fail(__FILE__, line, "layer %d: the device view's bytes differ from the host gather", l);
                return false;
            }
        }
        return true;
    }
};

TEST(cuda_prefix_view_attention_equals_paged_attention_exactly_and_stale_views_are_refused) {
    const mskv_cuda_attn_path paths[2] = {MSKV_CUDA_ATTN_MMA, MSKV_CUDA_ATTN_WGMMA};
    for (mskv_cuda_attn_path path : paths) {
        const char *kernel = path == MSKV_CUDA_ATTN_WGMMA ? "mskv_attn_sm90" : "mskv_attn";
        epv_rig g;
        mskv_request filler;
        mskv_dense_kv kv;
        std::vector<float> o, lse;
        uint64_t epoch;
        printf("  %s\n", kernel);
        ASSERT_TRUE(g.open(path));
        ASSERT_TRUE(g.grow(g.r, 330));
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(g.a, g.r, 300));   /* mid-page; two whole 128-key tiles */
        EXPECT_EQ(MSKV_ERROR_STALE_VIEW, mskv_prefix_view_check(g.a, &g.v));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_prefix_view_gather(g.e.st, &g.v));
        EXPECT_EQ(300, (int)g.v.tokens);
        EXPECT_EQ(1, g.v.device);
        EXPECT_EQ(MSKV_SUCCESS, mskv_prefix_view_check(g.a, &g.v));
        EXPECT_TRUE(g.bytes_match(__LINE__));
        ASSERT_TRUE(g.grow(g.r, EPV_NQ));   /* the queries are the newest tokens */
        ecu.launched.clear();
        ecu.tma_seen = -1;
        EXPECT_TRUE(g.same(__LINE__));
        EXPECT_STREQ(kernel, ecu.launched.empty() ? "" : ecu.launched.back().c_str());
        if (path == MSKV_CUDA_ATTN_WGMMA) EXPECT_EQ(1, ecu.tma_seen);   /* the view's whole tiles by TMA */

        /* a new length: the attention refuses the view, a gather refreshes it in place */
        epoch = g.v.epoch;
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(g.a, g.r, 170));
        EXPECT_EQ(MSKV_ERROR_STALE_VIEW, g.dense_prefix(0, MSKV_MASK_NONE, o, lse));
        EXPECT_TRUE(g.e.log.find("gather the view again") != std::string::npos || std::string(mskv_cuda_last_error(g.e.cu)).find("gather the view again") != std::string::npos);
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_prefix_view_gather(g.e.st, &g.v));
        EXPECT_NE_U64(epoch, g.v.epoch);
        EXPECT_EQ(170, (int)g.v.tokens);
        EXPECT_TRUE(g.bytes_match(__LINE__));
        EXPECT_TRUE(g.same(__LINE__));

        /* reloaded onto other pages */
        epoch = g.v.epoch;
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(g.a, g.r));
        EXPECT_EQ(MSKV_ERROR_OFFLOADED, mskv_cuda_prefix_view_gather(g.e.st, &g.v));
        EXPECT_EQ_U64(epoch, g.v.epoch);   /* a refused gather changes nothing */
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(g.a, &filler));
        ASSERT_TRUE(g.grow(filler, 5 * EPV_P));
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(g.a, g.r));
        ASSERT_EQ(MSKV_SUCCESS, mskv_prefix_view_layer(&g.v, g.a, 1, &kv));
        EXPECT_EQ(MSKV_ERROR_STALE_VIEW, g.dense_prefix(1, MSKV_MASK_CAUSAL, o, lse));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_prefix_view_gather(g.e.st, &g.v));
        EXPECT_NE_U64(epoch, g.v.epoch);
        EXPECT_TRUE(g.bytes_match(__LINE__));
        EXPECT_TRUE(g.same(__LINE__));

        /* imported as another request: the old handle is refused, the view
           pointed at the new one is stale until gathered again */
        size_t size = 0;
        mskv_request x;
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_export(g.a, g.r, NULL, 0, &size));
        std::vector<unsigned char> blob(size);
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_export(g.a, g.r, blob.data(), size, &size));
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(g.a, g.r));
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_import(g.a, blob.data(), size, &x));
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(g.a, x));
        EXPECT_EQ(MSKV_ERROR_INVALID_HANDLE, g.dense_prefix(0, MSKV_MASK_NONE, o, lse));
        g.r = x;
        g.v.request = x;
        EXPECT_EQ(MSKV_ERROR_STALE_VIEW, g.dense_prefix(0, MSKV_MASK_NONE, o, lse));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_prefix_view_gather(g.e.st, &g.v));
        EXPECT_TRUE(g.bytes_match(__LINE__));
        EXPECT_TRUE(g.same(__LINE__));
        /* a prefix that ends on a page boundary: no partial last page */
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(g.a, x, 160));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_prefix_view_gather(g.e.st, &g.v));
        EXPECT_EQ(160, (int)g.v.tokens);
        EXPECT_TRUE(g.bytes_match(__LINE__));
        EXPECT_TRUE(g.same(__LINE__));

        ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(g.a, filler));
        char why[256] = "";
        EXPECT_EQ(MSKV_SUCCESS, mskv_arena_audit(g.a, why, sizeof why));
    }
}

/* The dense prefix and the paged rest (exclude_prefix), both on the device,
   merged by their LSE, equal the paged attention over the whole sequence. */
TEST(cuda_prefix_view_plus_the_paged_rest_merge_to_the_whole_attention) {
    const mskv_cuda_attn_path paths[2] = {MSKV_CUDA_ATTN_MMA, MSKV_CUDA_ATTN_WGMMA};
    for (mskv_cuda_attn_path path : paths) {
        epv_rig g;
        ASSERT_TRUE(g.open(path));
        ASSERT_TRUE(g.grow(g.r, 260));
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(g.a, g.r, 150));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_prefix_view_gather(g.e.st, &g.v));
        ASSERT_TRUE(g.grow(g.r, EPV_NQ));
        for (int m = 0; m < 2; m++) {
            mskv_plan_desc rest;
            std::vector<float> ow, lw, od, ld, orr, lr;
            std::memset(&rest, 0, sizeof rest);
            rest.exclude_prefix = 1;
            ASSERT_EQ(MSKV_SUCCESS, g.attend(NULL, 1, NULL, (mskv_mask)m, ow, lw));
            ASSERT_EQ(MSKV_SUCCESS, g.dense_prefix(1, (mskv_mask)m, od, ld));
            ASSERT_EQ(MSKV_SUCCESS, g.attend(&rest, 1, NULL, (mskv_mask)m, orr, lr));
            std::vector<float> om(ow.size()), lm(lw.size());
            ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_merge((int64_t)EPV_NQ, EPV_QH, EPV_D, od.data(), ld.data(), orr.data(), lr.data(), om.data(), lm.data()));
            double oe = 0, le = 0;
            for (size_t i = 0; i < ow.size(); i++) oe = std::max(oe, (double)std::fabs(om[i] - ow[i]));
            for (size_t i = 0; i < lw.size(); i++) le = std::max(le, (double)std::fabs(lm[i] - lw[i]));
            printf("  %s mask %d: merged vs whole: o %.2g, lse %.2g\n", path == MSKV_CUDA_ATTN_WGMMA ? "wgmma" : "mma.sync", m, oe, le);
            EXPECT_NEAR(0.0, oe, 1e-2);
            EXPECT_NEAR(0.0, le, 1e-3);
        }
    }
}

/* A DENSE plan over a caller's device buffer of two segments' rows (the
   second from row 300: the kernels' row offsets, by cp.async and by TMA),
   against mskv_cpu_attention_dense over the same bytes on the host. */
TEST(cuda_attention_dense_over_a_caller_buffer_of_two_segments_matches_the_cpu) {
    const mskv_cuda_attn_path paths[2] = {MSKV_CUDA_ATTN_MMA, MSKV_CUDA_ATTN_WGMMA};
    const int rows = 500, qo[2] = {24, 9};
    const int64_t lens[2] = {300, 200};
    for (mskv_cuda_attn_path path : paths) {
        epv_rig g;
        std::mt19937_64 rng(77);
        std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
        std::vector<uint16_t> hk((size_t)rows * EPV_KVH * EPV_D), hv(hk.size()), q((size_t)(qo[0] + qo[1]) * EPV_QH * EPV_D);
        std::vector<uint16_t> ob(q.size()), oc(q.size());
        std::vector<float> lg(q.size() / EPV_D), lc(lg.size());
        mskv_cu_ptr dk = 0, dv = 0, dq = 0, dout = 0, dlse = 0;
        mskv_segment segs[2];
        mskv_plan_desc pd;
        mskv_plan p;
        mskv_cuda_dplan dp;
        mskv_attn at;
        ASSERT_TRUE(g.open(path));
        for (size_t i = 0; i < hk.size(); i++) { hk[i] = mskv_f32_to_bf16(uni(rng)); hv[i] = mskv_f32_to_bf16(uni(rng)); }
        for (auto &x : q) x = mskv_f32_to_bf16(2.0f * uni(rng));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(g.e.cu, hk.size() * 2, &dk));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(g.e.cu, hv.size() * 2, &dv));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(g.e.cu, q.size() * 2, &dq));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(g.e.cu, q.size() * 2, &dout));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(g.e.cu, lg.size() * 4, &dlse));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_upload(g.e.st, dk, hk.data(), hk.size() * 2));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_upload(g.e.st, dv, hv.data(), hv.size() * 2));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_upload(g.e.st, dq, q.data(), q.size() * 2));
        std::memset(&pd, 0, sizeof pd);
        pd.kind = MSKV_PLAN_DENSE;
        pd.dense_kv_len = lens;
        segs[0].request = g.r; segs[0].n_tokens = qo[0];
        segs[1].request = g.r; segs[1].n_tokens = qo[1];
        ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(g.a, 2, qo[0] + qo[1], EPV_PAGES, &p));
        ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(g.a, segs, 2, &pd, &p));
        EXPECT_EQ(300, (int)p.kv_token_indptr[1]);
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(g.e.st, &p, MSKV_POS_NONE, &dp));
        for (int m = 0; m < 3; m++) {
            mskv_dense_kv kv;
            std::memset(&kv, 0, sizeof kv);
            std::memset(&at, 0, sizeof at);
            at.q_heads = EPV_QH; at.q_dtype = MSKV_DTYPE_BF16; at.mask = (mskv_mask)m; at.window_left = 70;
            kv.dtype = MSKV_DTYPE_BF16; kv.kv_heads = EPV_KVH; kv.head_dim = EPV_D; kv.tokens = rows;
            kv.k = hk.data(); kv.v = hv.data();
            ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_attention_dense(NULL, &kv, &p, &at, q.data(), oc.data(), lc.data()));
            kv.k = (const void *)(uintptr_t)dk; kv.v = (const void *)(uintptr_t)dv; kv.device = 1;
            ecu.tma_seen = -1;
            ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_attention_dense(g.e.st, &kv, &p, &dp, &at, dq, dout, dlse));
            ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_download(g.e.st, ob.data(), dout, ob.size() * 2));
            ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_download(g.e.st, lg.data(), dlse, lg.size() * 4));
            double oe = 0, le = 0;
            for (size_t i = 0; i < ob.size(); i++) {
                double x = mskv_bf16_to_f32(ob[i]), y = mskv_bf16_to_f32(oc[i]);
                oe = std::max(oe, std::isfinite(x) ? std::fabs(x - y) : 1e9);
            }
            for (size_t i = 0; i < lg.size(); i++) le = std::max(le, std::isfinite(lg[i]) ? (double)std::fabs(lg[i] - lc[i]) : 1e9);
            printf("  %s mask %d: device vs CPU: o %.2g, lse %.2g\n", path == MSKV_CUDA_ATTN_WGMMA ? "wgmma" : "mma.sync", m, oe, le);
            EXPECT_NEAR(0.0, oe, 2.5e-2);
            EXPECT_NEAR(0.0, le, 2e-3);
            if (path == MSKV_CUDA_ATTN_WGMMA) EXPECT_EQ(1, ecu.tma_seen);
        }
        mskv_plan_free(g.a, &p);
        mskv_cuda_free(g.e.cu, dk); mskv_cuda_free(g.e.cu, dv); mskv_cuda_free(g.e.cu, dq);
        mskv_cuda_free(g.e.cu, dout); mskv_cuda_free(g.e.cu, dlse);
    }
}

/* A step with prefix attention captured into a CUDA graph: the replay gives
   the eager result; once the prefix changed the replay is refused
   (STALE_VIEW) until the view is gathered again in place; a plan whose rows
   reach past the captured buffer is refused. */
TEST(cuda_graph_with_prefix_view_attention_replays_and_checks_the_view) {
    epv_rig g;
    mskv_plan_desc pd;
    mskv_segment s;
    mskv_plan p;
    mskv_cuda_dplan dp;
    mskv_dense_kv kv;
    mskv_attn at;
    mskv_cuda_graph *graph = nullptr;
    mskv_cu_ptr dq = 0, dout = 0, dlse = 0;
    std::vector<uint16_t> eager(g.q.size()), replay(g.q.size());
    ASSERT_TRUE(g.open(MSKV_CUDA_ATTN_AUTO));
    ASSERT_TRUE(g.grow(g.r, 300));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(g.a, g.r, 200));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_prefix_view_gather(g.e.st, &g.v));
    ASSERT_TRUE(g.grow(g.r, EPV_NQ));
    std::memset(&pd, 0, sizeof pd);
    pd.kind = MSKV_PLAN_PREFIX;
    s.request = g.r; s.n_tokens = EPV_NQ;
    std::memset(&at, 0, sizeof at);
    at.q_heads = EPV_QH; at.q_dtype = MSKV_DTYPE_BF16; at.mask = MSKV_MASK_CAUSAL;
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(g.a, 1, EPV_NQ, EPV_PAGES, &p));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(g.a, &s, 1, &pd, &p));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(g.e.cu, g.q.size() * 2, &dq));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(g.e.cu, g.q.size() * 2, &dout));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(g.e.cu, g.q.size() / EPV_D * 4, &dlse));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_upload(g.e.st, dq, g.q.data(), g.q.size() * 2));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(g.e.st, &p, MSKV_POS_NONE, &dp));
    ASSERT_EQ(MSKV_SUCCESS, mskv_prefix_view_layer(&g.v, g.a, 1, &kv));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_attention_dense(g.e.st, &kv, &p, &dp, &at, dq, dout, dlse));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_download(g.e.st, eager.data(), dout, eager.size() * 2));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_capture_begin(g.e.st));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_attention_dense(g.e.st, &kv, &p, &dp, &at, dq, dout, dlse));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_capture_end(g.e.st, &graph));
    std::vector<uint16_t> poison(g.q.size(), 0x7fc0);
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_upload(g.e.st, dout, poison.data(), poison.size() * 2));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_graph_launch(g.e.st, graph));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_download(g.e.st, replay.data(), dout, replay.size() * 2));
    EXPECT_TRUE(eager == replay);
    /* the prefix changes: the captured launch would read a stale view */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(g.a, g.r, 100));
    EXPECT_EQ(MSKV_ERROR_STALE_VIEW, mskv_cuda_graph_launch(g.e.st, graph));
    /* a plan reaching past the captured 200 rows: refused */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(g.a, g.r, 250));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(g.a, &s, 1, &pd, &p));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(g.e.st, &p, MSKV_POS_NONE, &dp));
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_graph_launch(g.e.st, graph));
    /* back to 200 tokens, gathered again in place (the same buffers the graph holds): the replay runs */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(g.a, g.r, 200));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_prefix_view_gather(g.e.st, &g.v));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(g.a, &s, 1, &pd, &p));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(g.e.st, &p, MSKV_POS_NONE, &dp));
    EXPECT_EQ(MSKV_ERROR_STALE_VIEW, mskv_cuda_graph_launch(g.e.st, graph));   /* the graph keeps the epoch it was captured with */
    mskv_cuda_graph_destroy(g.e.st, graph);
    graph = nullptr;
    ASSERT_EQ(MSKV_SUCCESS, mskv_prefix_view_layer(&g.v, g.a, 1, &kv));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_capture_begin(g.e.st));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_attention_dense(g.e.st, &kv, &p, &dp, &at, dq, dout, dlse));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_capture_end(g.e.st, &graph));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_upload(g.e.st, dout, poison.data(), poison.size() * 2));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_graph_launch(g.e.st, graph));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_download(g.e.st, replay.data(), dout, replay.size() * 2));
    EXPECT_TRUE(eager == replay);   /* the same prefix bytes, gathered again */
    mskv_cuda_graph_destroy(g.e.st, graph);
    mskv_plan_free(g.a, &p);
    mskv_cuda_free(g.e.cu, dq); mskv_cuda_free(g.e.cu, dout); mskv_cuda_free(g.e.cu, dlse);
}

/* A model's layer loop over a view's layers: the sm_90a kernel's tensor maps
   of each layer's buffers are made once, then found again (no encode per
   call), and the results do not depend on whether the maps were cached. */
TEST(cuda_attention_dense_makes_each_buffers_tensor_maps_once_over_a_layer_loop) {
    epv_rig g;
    std::vector<float> first[2], lfirst[2];
    ASSERT_TRUE(g.open(MSKV_CUDA_ATTN_WGMMA));
    ASSERT_TRUE(g.grow(g.r, 300));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(g.a, g.r, 260));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_prefix_view_gather(g.e.st, &g.v));
    ASSERT_TRUE(g.grow(g.r, EPV_NQ));
    int before = ecu.tmap_encodes;
    for (int step = 0; step < 3; step++)
        for (int l = 0; l < 2; l++) {
            std::vector<float> o, lse;
            ecu.tma_seen = -1;
            ASSERT_EQ(MSKV_SUCCESS, g.dense_prefix(l, MSKV_MASK_NONE, o, lse));
            EXPECT_EQ(1, ecu.tma_seen);
            if (step == 0) { first[l] = o; lfirst[l] = lse; }
            else EXPECT_TRUE(o == first[l] && lse == lfirst[l]);
        }
    EXPECT_EQ(4, ecu.tmap_encodes - before);   /* K and V of two layers, once each */
    /* a refreshed view of another length is another map (its rows changed) */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(g.a, g.r, 200));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_prefix_view_gather(g.e.st, &g.v));
    std::vector<float> o, lse, po, pl;
    before = ecu.tmap_encodes;
    ASSERT_EQ(MSKV_SUCCESS, g.dense_prefix(0, MSKV_MASK_NONE, o, lse));
    EXPECT_EQ(2, ecu.tmap_encodes - before);
    ASSERT_EQ(MSKV_SUCCESS, g.paged_prefix(0, MSKV_MASK_NONE, po, pl));
    EXPECT_TRUE(o == po && lse == pl);
}

TEST(cuda_prefix_view_calls_refuse_bad_input_and_change_nothing) {
    epv_rig g;
    mskv_prefix_view w;
    mskv_dense_kv kv;
    std::vector<float> o, lse;
    ASSERT_TRUE(g.open(MSKV_CUDA_ATTN_AUTO));
    ASSERT_TRUE(g.grow(g.r, 100));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(g.a, g.r, 40));
    EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_cuda_prefix_view_gather(NULL, &g.v));
    EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_cuda_prefix_view_gather(g.e.st, NULL));
    w = g.v; w.cap_tokens = 39;
    EXPECT_EQ(MSKV_ERROR_CAPACITY, mskv_cuda_prefix_view_gather(g.e.st, &w));
    EXPECT_EQ_U64(0, w.epoch);
    w = g.v; w.cap_tokens = -1;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_prefix_view_gather(g.e.st, &w));
    w = g.v; w.k = (void *)((uintptr_t)w.k + 2);
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_prefix_view_gather(g.e.st, &w));
    w = g.v; w.group = 1;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_prefix_view_gather(g.e.st, &w));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_prefix_view_gather(g.e.st, &g.v));
    ASSERT_TRUE(g.grow(g.r, EPV_NQ));
    ASSERT_EQ(MSKV_SUCCESS, mskv_prefix_view_layer(&g.v, g.a, 0, &kv));
    EXPECT_EQ(1, kv.device);
    {
        /* the CPU refuses device K/V; the device refuses host K/V, other strides, misaligned or short buffers */
        mskv_plan_desc pd;
        mskv_segment s;
        mskv_plan p;
        mskv_attn at;
        mskv_cuda_dplan dp;
        std::vector<uint16_t> oh(g.q.size());
        std::memset(&pd, 0, sizeof pd);
        pd.kind = MSKV_PLAN_PREFIX;
        s.request = g.r; s.n_tokens = EPV_NQ;
        std::memset(&at, 0, sizeof at);
        at.q_heads = EPV_QH; at.q_dtype = MSKV_DTYPE_BF16;
        ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(g.a, 1, EPV_NQ, EPV_PAGES, &p));
        ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(g.a, &s, 1, &pd, &p));
        EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cpu_attention_dense(NULL, &kv, &p, &at, g.q.data(), oh.data(), NULL));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(g.e.st, &p, MSKV_POS_NONE, &dp));
        /* a paged launch over a dense plan would read no pages for its keys */
        EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_attention(g.e.st, 0, &p, &dp, &at, 16, 16, 0));
        mskv_dense_kv bad = kv;
        bad.device = 0;
        EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_attention_dense(g.e.st, &bad, &p, &dp, &at, 16, 16, 0));
        bad = kv; bad.token_stride = 3 * EPV_KVH * EPV_D;
        EXPECT_EQ(MSKV_ERROR_UNSUPPORTED, mskv_cuda_attention_dense(g.e.st, &bad, &p, &dp, &at, 16, 16, 0));
        bad = kv; bad.k = (const void *)((uintptr_t)bad.k + 8);
        EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_attention_dense(g.e.st, &bad, &p, &dp, &at, 16, 16, 0));
        bad = kv; bad.tokens = 39;
        EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mskv_cuda_attention_dense(g.e.st, &bad, &p, &dp, &at, 16, 16, 0));
        bad = kv; bad.kv_heads = 1;
        EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_attention_dense(g.e.st, &bad, &p, &dp, &at, 16, 16, 0));
        EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_cuda_attention_dense(g.e.st, NULL, &p, &dp, &at, 16, 16, 0));
        ecu.launched.clear();
        bad = kv; bad.epoch = kv.epoch + 1;
        EXPECT_EQ(MSKV_ERROR_STALE_VIEW, mskv_cuda_attention_dense(g.e.st, &bad, &p, &dp, &at, 16, 16, 0));
        EXPECT_EQ(0, (int)ecu.launched.size());   /* nothing launched for any refusal */
        mskv_plan_free(g.a, &p);
    }
    /* a store bound to no arena has no prefix to read */
    {
        ecu_env e2;
        mskv_prefix_view u = g.v;
        ASSERT_EQ(MSKV_SUCCESS, e2.open(MSKV_DTYPE_BF16, EPV_P, EPV_KVH, 8));
        EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_cuda_prefix_view_gather(e2.st, &u));
        EXPECT_EQ_U64(g.v.epoch, u.epoch);
    }
    EXPECT_EQ(MSKV_SUCCESS, mskv_prefix_view_check(g.a, &g.v));   /* the refusals left the view current */
}

/* Prefix views of a head-sharded arena: each device's store gathers its own
   heads of the prefix (the same page ids on every device), equal to those
   heads of the host gather (which reads every shard through the arena's
   store ops), and attends over them densely like the CPU over the whole. */
TEST(cuda_shards_prefix_views_hold_each_devices_heads_and_attend_like_the_cpu) {
    esh_env e;
    const int n[2] = {37, 13}, CAP = 64, hk = esh_env::KVH / esh_env::N, hq = esh_env::QH / esh_env::N, D = esh_env::D;
    const int L = esh_env::L;
    e.with_rope = false;
    ASSERT_EQ(MSKV_SUCCESS, e.open());
    const int n2[2] = {40, 3}, PT = 61;   /* 7 whole pages and 5 rows: three rounds of the 3-page staging */
    ASSERT_EQ(MSKV_SUCCESS, e.step(n, false, nullptr, nullptr, nullptr, nullptr));
    ASSERT_EQ(MSKV_SUCCESS, e.step(n2, false, nullptr, nullptr, nullptr, nullptr));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(e.a, e.ra[0], PT));
    std::vector<uint16_t> hkb((size_t)L * CAP * esh_env::KVH * D), hvb(hkb.size());
    mskv_prefix_view hv;
    std::memset(&hv, 0, sizeof hv);
    hv.request = e.ra[0]; hv.k = hkb.data(); hv.v = hvb.data(); hv.cap_tokens = CAP;
    ASSERT_EQ(MSKV_SUCCESS, mskv_prefix_view_gather(e.a, &hv));
    /* this step's queries: 5 tokens at the end of request 0, its prefix attended densely */
    mskv_segment seg;
    mskv_plan p;
    mskv_plan_desc pd;
    mskv_attn at;
    seg.request = e.ra[0]; seg.n_tokens = 5;
    std::memset(&pd, 0, sizeof pd);
    pd.kind = MSKV_PLAN_PREFIX;
    std::memset(&at, 0, sizeof at);
    at.q_heads = esh_env::QH; at.mask = MSKV_MASK_CAUSAL; at.q_dtype = MSKV_DTYPE_BF16;
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(e.a, 1, 5, 8, &p));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(e.a, &seg, 1, &pd, &p));
    std::vector<uint16_t> q = e.random((size_t)5 * esh_env::QH * D, 2.0f), oc(q.size());
    std::vector<float> lc((size_t)5 * esh_env::QH);
    mskv_dense_kv hkv;
    ASSERT_EQ(MSKV_SUCCESS, mskv_prefix_view_layer(&hv, e.a, 1, &hkv));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_attention_dense(NULL, &hkv, &p, &at, q.data(), oc.data(), lc.data()));
    double oe = 0, le = 0;
    for (int s = 0; s < esh_env::N; s++) {
        mskv_cuda_store *st = mskv_cuda_shards_store(e.sh, s);
        mskv_cu_ptr dk = 0, dv = 0, dq = 0, dout = 0, dlse = 0;
        const size_t bytes = (size_t)L * CAP * hk * D * 2;
        mskv_prefix_view v;
        mskv_cuda_dplan dp;
        mskv_dense_kv kv;
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(e.cu[s], bytes, &dk));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(e.cu[s], bytes, &dv));
        std::memset(&v, 0, sizeof v);
        v.request = e.ra[0]; v.k = (void *)(uintptr_t)dk; v.v = (void *)(uintptr_t)dv; v.cap_tokens = CAP;
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_prefix_view_gather(st, &v));
        EXPECT_EQ(hk, v.kv_heads);
        EXPECT_EQ_U64(hv.epoch, v.epoch);
        std::vector<uint16_t> gk(bytes / 2), gv(bytes / 2);
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_download(st, gk.data(), dk, bytes));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_download(st, gv.data(), dv, bytes));
        for (int l = 0; l < L; l++)
            for (int t = 0; t < PT; t++) {
                const size_t dev = (((size_t)l * CAP + t) * hk) * D, host = (((size_t)l * CAP + t) * esh_env::KVH + (size_t)s * hk) * D;
                EXPECT_EQ(0, std::memcmp(&gk[dev], &hkb[host], (size_t)hk * D * 2));
                EXPECT_EQ(0, std::memcmp(&gv[dev], &hvb[host], (size_t)hk * D * 2));
            }
        /* this device's q heads over its K/V heads */
        std::vector<uint16_t> os((size_t)5 * hq * D);
        std::vector<float> ls((size_t)5 * hq);
        mskv_attn as = at;
        as.q_heads = hq;
        ASSERT_EQ(MSKV_SUCCESS, e.to_device(s, esh_env::slice(q, esh_env::QH, s * hq, hq), &dq));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(e.cu[s], os.size() * 2, &dout));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(e.cu[s], ls.size() * 4, &dlse));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(st, &p, MSKV_POS_NONE, &dp));
        ASSERT_EQ(MSKV_SUCCESS, mskv_prefix_view_layer(&v, e.a, 1, &kv));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_attention_dense(st, &kv, &p, &dp, &as, dq, dout, dlse));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_download(st, os.data(), dout, os.size() * 2));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_download(st, ls.data(), dlse, ls.size() * 4));
        for (int t = 0; t < 5; t++)
            for (int h = 0; h < hq; h++) {
                le = std::max(le, (double)std::fabs(ls[(size_t)t * hq + h] - lc[(size_t)t * esh_env::QH + s * hq + h]));
                for (int d = 0; d < D; d++)
                    oe = std::max(oe, (double)std::fabs(mskv_bf16_to_f32(os[((size_t)t * hq + h) * D + d]) -
                                                        mskv_bf16_to_f32(oc[((size_t)t * esh_env::QH + s * hq + h) * D + d])));
            }
        for (mskv_cu_ptr x : {dk, dv, dq, dout, dlse}) mskv_cuda_free(e.cu[s], x);
    }
    printf("  devices vs CPU over the whole prefix: o %.2g, lse %.2g\n", oe, le);
    EXPECT_NEAR(0.0, oe, 2.5e-2);
    EXPECT_NEAR(0.0, le, 2e-3);
    mskv_plan_free(e.a, &p);
}

/* >>self-test ---------------------------------------------------------------
   Each attention and K/V write variant is run once on a known problem
   against the CPU backend the first time the context loads it. Faults are
   planted in the emulated device: the sm_90a kernel's wgmma reading shared
   memory with another swizzle than the one the copies wrote, a kernel run
   with a wrong softmax scale or RoPE theta. */

static mskv_cuda_info ecu_info(ecu_env &e) {
    mskv_cuda_info i;
    std::memset(&i, 0, sizeof i);
    mskv_cuda_info_get(e.cu, &i);
    return i;
}

TEST(cuda_selftest_passes_each_variant_once_and_reports_it) {
    ecu_env e;
    ecu_problem p, d;
    const int P = 16, kvh = 2, qh = 4, pages = 32;
    e.selftest = MSKV_CUDA_SELFTEST_ON;
    ASSERT_EQ(MSKV_SUCCESS, e.open(MSKV_DTYPE_BF16, P, kvh, pages));
    ASSERT_EQ(MSKV_SUCCESS, ecu_make(e, p, P, kvh, qh, pages, {30, 5}, {100, 37}, 41));
    EXPECT_NEAR(0.0, ecu_attention_error(e, p, P, kvh, qh, pages, MSKV_MASK_CAUSAL, 0), 2.5e-2);   /* sm_90a */
    mskv_cuda_info i1 = ecu_info(e);
    EXPECT_EQ(1, i1.selftests_passed);
    EXPECT_EQ(0, i1.selftests_failed);
    EXPECT_TRUE(std::strstr(i1.selftest_report, "mskv_attn_sm90 bf16 d64: pass") != NULL);
    /* the same variant again: not tested again */
    ecu.launched.clear();
    EXPECT_NEAR(0.0, ecu_attention_error(e, p, P, kvh, qh, pages, MSKV_MASK_NONE, 0), 2.5e-2);
    EXPECT_EQ(1, (int)ecu.launched.size());
    EXPECT_EQ(1, ecu_info(e).selftests_passed);
    /* a decode shape: the mma.sync decode layout, tested on its first use */
    ASSERT_EQ(MSKV_SUCCESS, ecu_make(e, d, P, kvh, qh, pages, {1, 1}, {150, 37}, 42));
    EXPECT_NEAR(0.0, ecu_attention_error(e, d, P, kvh, qh, pages, MSKV_MASK_CAUSAL, 0), 2.5e-2);
    mskv_cuda_info i2 = ecu_info(e);
    EXPECT_EQ(2, i2.selftests_passed);
    EXPECT_TRUE(std::strstr(i2.selftest_report, "mskv_attn bf16 d64 decode: pass") != NULL);
    EXPECT_TRUE(i2.selftest_ms >= i1.selftest_ms);
    printf("  self-test report:\n%s", i2.selftest_report);
}

TEST(cuda_selftest_catches_a_planted_wrong_scale_in_the_sm90a_kernel) {
    ecu_env e;
    ecu_problem p;
    const int P = 16, kvh = 2, qh = 4, pages = 32;
    e.selftest = MSKV_CUDA_SELFTEST_ON;
    ASSERT_EQ(MSKV_SUCCESS, e.open(MSKV_DTYPE_BF16, P, kvh, pages));
    ASSERT_EQ(MSKV_SUCCESS, ecu_make(e, p, P, kvh, qh, pages, {30, 5}, {100, 37}, 44));
    ecu.plant_kernel = "mskv_attn_sm90"; ecu.plant_factor = 1.25f;
    double err = ecu_attention_error(e, p, P, kvh, qh, pages, MSKV_MASK_CAUSAL, 0);
    ecu.plant_kernel.clear();
    EXPECT_NEAR(0.0, err, 2.5e-2);
    EXPECT_EQ(1, ecu_info(e).selftests_failed);
    EXPECT_EQ(0, ecu_info(e).wgmma);
}

/* Nothing to fall back to: the call fails, says so, and launches nothing. */
TEST(cuda_selftest_failing_mma_sync_fails_the_call_with_the_reason) {
    ecu_env e;
    ecu_problem p;
    const int P = 16, kvh = 2, qh = 4, pages = 32;
    e.selftest = MSKV_CUDA_SELFTEST_ON;
    e.path = MSKV_CUDA_ATTN_MMA;
    ASSERT_EQ(MSKV_SUCCESS, e.open(MSKV_DTYPE_BF16, P, kvh, pages));
    ASSERT_EQ(MSKV_SUCCESS, ecu_make(e, p, P, kvh, qh, pages, {30, 5}, {100, 37}, 45));
    ecu.plant_kernel = "mskv_attn"; ecu.plant_factor = 0.8f;
    mskv_attn at;
    std::memset(&at, 0, sizeof at);
    at.q_heads = qh; at.mask = MSKV_MASK_CAUSAL; at.q_dtype = MSKV_DTYPE_BF16;
    mskv_cu_ptr dq = 0, dout = 0, dlse = 0;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(e.cu, p.q.size() * 2, &dq));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(e.cu, p.q.size() * 2, &dout));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(e.cu, p.q.size() / 64 * 4, &dlse));
    int before = ecu.launches;
    EXPECT_EQ(MSKV_ERROR_CUDA, mskv_cuda_attention(e.st, 1, &p.plan, &p.dplan, &at, dq, dout, dlse));
    int tested = ecu.launches - before;
    EXPECT_TRUE(std::strstr(mskv_cuda_last_error(e.cu), "no attention kernel passed its self-test on emulated") != NULL);
    EXPECT_TRUE(std::strstr(mskv_cuda_last_error(e.cu), "mskv_attn bf16 d64 prefill failed its self-test") != NULL);
    /* a second call: refused at once, nothing launched, not tested again */
    before = ecu.launches;
    EXPECT_EQ(MSKV_ERROR_CUDA, mskv_cuda_attention(e.st, 1, &p.plan, &p.dplan, &at, dq, dout, dlse));
    EXPECT_EQ(0, ecu.launches - before);
    ecu.plant_kernel.clear();
    EXPECT_EQ(1, tested);          /* the self-test's own launch, not the caller's */
    EXPECT_EQ(1, ecu_info(e).selftests_failed);
    for (mskv_cu_ptr x : {dq, dout, dlse}) mskv_cuda_free(e.cu, x);
}

/* The same planted bug with the self-test off goes through: what the test is for. */
TEST(cuda_selftest_off_lets_a_planted_bug_through) {
    ecu_env e;
    ecu_problem p;
    const int P = 16, kvh = 2, qh = 4, pages = 32;
    e.path = MSKV_CUDA_ATTN_MMA;
    ASSERT_EQ(MSKV_SUCCESS, e.open(MSKV_DTYPE_BF16, P, kvh, pages));
    ASSERT_EQ(MSKV_SUCCESS, ecu_make(e, p, P, kvh, qh, pages, {30, 5}, {100, 37}, 45));
    ecu.plant_kernel = "mskv_attn"; ecu.plant_factor = 0.8f;
    ecu.launched.clear();
    double err = ecu_attention_error(e, p, P, kvh, qh, pages, MSKV_MASK_CAUSAL, 0);
    ecu.plant_kernel.clear();
    printf("  planted scale x0.8 without the self-test: worst error %.3g (%d launches, first %s)\n", err,
           (int)ecu.launched.size(), ecu.launched.empty() ? "none" : ecu.launched[0].c_str());
    EXPECT_TRUE(err > 2.5e-2);
    EXPECT_EQ(0, ecu_info(e).selftests_passed + ecu_info(e).selftests_failed);
}

/* A K/V write variant with a wrong RoPE: refused before it writes anything. */
TEST(cuda_selftest_catches_a_planted_rope_bug_in_kv_write_and_writes_nothing) {
    ecu_env e;
    const int P = 16, kvh = 2, pages = 16, n = 3;
    e.selftest = MSKV_CUDA_SELFTEST_ON;
    ASSERT_EQ(MSKV_SUCCESS, e.open(MSKV_DTYPE_BF16, P, kvh, pages));
    mskv_rope rope;
    std::memset(&rope, 0, sizeof rope);
    rope.mode = MSKV_POS_1D;
    int64_t slots[n] = {17, 18, 40};
    int32_t pos[n] = {5, 6, 7};
    mskv_plan plan;
    mskv_cuda_dplan dp;
    std::memset(&plan, 0, sizeof plan);
    plan.total_q = n; plan.page_size = P; plan.slot_mapping = slots; plan.positions = pos;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(e.st, &plan, MSKV_POS_1D, &dp));
    std::vector<uint16_t> src((size_t)n * kvh * 64, mskv_f32_to_bf16(0.5f)), pool((size_t)pages * P * kvh * 64, 0);
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_upload(e.st, mskv_cuda_store_pool(e.st, 0, 0), pool.data(), pool.size() * 2));
    mskv_cu_ptr dk = 0;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(e.cu, src.size() * 2, &dk));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_upload(e.st, dk, src.data(), src.size() * 2));
    ecu.plant_kernel = "mskv_kv_write"; ecu.plant_factor = 3.0f;
    EXPECT_EQ(MSKV_ERROR_CUDA, mskv_cuda_write_kv(e.st, 0, &dp, dk, dk, &rope));
    ecu.plant_kernel.clear();
    EXPECT_TRUE(std::strstr(mskv_cuda_last_error(e.cu), "mskv_kv_write bf16 d64 from bf16 rope 1d (0,0,0) failed its self-test on emulated") != NULL);
    std::vector<uint16_t> back(pool.size(), 1);
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_download(e.st, back.data(), mskv_cuda_store_pool(e.st, 0, 0), back.size() * 2));
    EXPECT_TRUE(back == pool);
    /* without RoPE: another variant, which passes and writes */
    EXPECT_EQ(MSKV_SUCCESS, mskv_cuda_write_kv(e.st, 0, &dp, dk, dk, NULL));
    mskv_cuda_info i = ecu_info(e);
    EXPECT_EQ(1, i.selftests_failed);
    EXPECT_EQ(1, i.selftests_passed);
    mskv_cuda_free(e.cu, dk);
}

/* The sm_90a kernel reads shared memory with another swizzle than the
   copies wrote: the emulator stops it as a fault (it reads shared memory
   nothing has written), as a GPU may. A fault loses the CUDA context, so
   the call fails with the reason and nothing else is tested in this
   context; the variant is recorded as failed beside its disk-cache entry,
   and the next process (a new context on the same cache; the emulator's
   sticky error cleared, as a new process would start) refuses it without
   running it and attends through mma.sync, correctly. */
TEST(cuda_selftest_fault_loses_the_context_and_the_next_process_skips_the_variant) {
    char dir[256], rm[300];
    std::snprintf(dir, sizeof dir, "build/test-emu-selftest-%lu", (unsigned long)getpid());
    std::snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    if (std::system(rm) != 0) mt_fail(__FILE__, __LINE__, "could not clear %s", dir);
    const int P = 16, kvh = 2, qh = 4, pages = 32;
    {
        ecu_env e;
        ecu_problem p;
        e.selftest = MSKV_CUDA_SELFTEST_ON;
        e.cache_dir = dir;
        ASSERT_EQ(MSKV_SUCCESS, e.open(MSKV_DTYPE_BF16, P, kvh, pages));
        ASSERT_EQ(MSKV_SUCCESS, ecu_make(e, p, P, kvh, qh, pages, {30, 5}, {100, 37}, 46));
        mskv_emu::cfg().wgmma_swizzle_override = 2;
        double err = ecu_attention_error(e, p, P, kvh, qh, pages, MSKV_MASK_CAUSAL, 0);
        mskv_emu::cfg().wgmma_swizzle_override = -1;
        EXPECT_EQ(1e9, err);   /* the call failed */
        EXPECT_TRUE(std::strstr(mskv_cuda_last_error(e.cu), "mskv_attn_sm90 bf16 d64 faulted in its self-test on emulated") != NULL);
        EXPECT_TRUE(std::strstr(mskv_cuda_last_error(e.cu), "the CUDA context is lost") != NULL);
        mskv_cuda_info i = ecu_info(e);
        EXPECT_EQ(1, i.selftests_failed);
        EXPECT_EQ(0, i.selftests_passed);   /* mma.sync was not tested in a lost context */
        EXPECT_TRUE(std::strstr(i.selftest_report, "mskv_attn_sm90 bf16 d64: FAULT, faulted: ") != NULL);
        mskv_emu::clear_error();
    }
    {
        ecu_env e;
        ecu_problem p;
        e.selftest = MSKV_CUDA_SELFTEST_ON;
        e.cache_dir = dir;
        ASSERT_EQ(MSKV_SUCCESS, e.open(MSKV_DTYPE_BF16, P, kvh, pages));
        ASSERT_EQ(MSKV_SUCCESS, ecu_make(e, p, P, kvh, qh, pages, {30, 5}, {100, 37}, 47));
        ecu.launched.clear();
        EXPECT_NEAR(0.0, ecu_attention_error(e, p, P, kvh, qh, pages, MSKV_MASK_CAUSAL, 0), 2.5e-2);
        mskv_cuda_info i = ecu_info(e);
        EXPECT_TRUE(i.disk_hits >= 1);
        EXPECT_EQ(1, i.selftests_failed);
        EXPECT_EQ(1, i.selftests_passed);   /* mskv_attn prefill */
        EXPECT_EQ(0, i.wgmma);
        EXPECT_TRUE(ecu_count(e.log, "failed its self-test on emulated (recorded beside its cache entry") >= 1);
        /* no sm_90a launch at all: the mma.sync self-test and the caller's call */
        ASSERT_EQ(2, (int)ecu.launched.size());
        EXPECT_STREQ("mskv_attn", ecu.launched[0].c_str());
        EXPECT_STREQ("mskv_attn", ecu.launched[1].c_str());
    }
    if (std::system(rm) != 0) mt_fail(__FILE__, __LINE__, "could not remove %s", dir);
}
