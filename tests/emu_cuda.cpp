/* The launch wrappers of mstar_kv_cuda.h (mskv_cuda_attention,
   mskv_cuda_merge, mskv_cuda_rope, mskv_cuda_attn_geometry_get) end to end
   without a GPU: an injected driver/NVRTC table whose "device memory" is host
   memory and whose cuLaunchKernel runs the emulated kernels, so the wrappers'
   variant choice, geometry, split-KV and argument order are checked against
   the CPU backend. */
#include "mskv_test.h"
#include "emu/mskv_emu.h"
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

/* >>mock device ---------------------------------------------------------- */
struct ecu_module { int dtype, head_dim, warp_keys, rope, style, d0, sm90a; };
struct ecu_func { std::string name; ecu_module mod; };
static struct {
    int sms = 4;
    int cc_major = 9, cc_minor = 0;
    int resident = 2;   /* cuOccupancyMaxActiveBlocksPerMultiprocessor's answer */
    int launches = 0, splits_seen = 0, occupancy_queries = 0;
    int fail_sm90a = 0;        /* NVRTC refuses sm_90a compiles */
    int tma_seen = -1;         /* use_tma of the last mskv_attn_sm90 launch */
    std::vector<std::string> launched;
    std::string last_options;
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
    (void)by; (void)bz; (void)s; (void)extra;
    ecu.launches++;
    ecu.launched.push_back(fn->name);
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
    } else if (fn->name == "mskv_kv_write") {
        if (m.dtype != 2 || m.head_dim != 64 || m.rope != 0) return 700;
        body = [=] {
            ecu_p_bf16_64::mskv_kv_write(ecu_ptr<const void *>(a[0]), ecu_ptr<const void *>(a[1]), ecu_ptr<const mskv_i64 *>(a[2]),
                                         ecu_i32(a[3]), ecu_i32(a[4]), ecu_ptr<void *>(a[5]), ecu_ptr<void *>(a[6]),
                                         (mskv_i64)ecu_u64(a[7]), ecu_ptr<const int *>(a[8]), ecu_f32(a[9]));
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
    f.cuDeviceGetCount = [](int *n) -> mskv_cu_result { *n = 1; return 0; };
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
                                         img.find("sm_90a") != std::string::npos};
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
        return mskv_emu::tmap_encode(map, dt, rank, g, dims, strides, box, es, il, sw, l2, oob);
    };
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
        d.disable_disk_cache = 1;
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
