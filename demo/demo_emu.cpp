/* demo_emu.cpp - the demo with --backend cuda on an emulated device, so the
   CUDA backend of demo.c runs end to end on a machine without a GPU.

   The device is an injected mskv_cuda_functions table (mskv_cuda_desc.functions):
   "device memory" is host memory, copies are memcpy, NVRTC returns a fake
   image naming its -D defines, and cuLaunchKernel runs the matching kernel of
   kernels.cu under the emulation layer of tests/emu/mskv_emu.h (one fibre per
   GPU thread, mma.sync and ldmatrix by the PTX fragment layouts). Everything
   between the demo and the table (store, plans, fences, offload copies,
   attention launch geometry and splits) is the real mstar_kv_cuda.h.

   Build and run (C++17, no FFmpeg: writes .y4m; slow, so keep it small):
     g++ -std=c++17 -O2 -DMSKV_DEMO_NO_FFMPEG demo/demo_emu.cpp -o build/demo-emu -ldl -lpthread -lm
     ./build/demo-emu --backend cuda --width 128 --height 64 --frames 41 --check -o /tmp/emu.y4m */
#include "../tests/emu/mskv_emu.h"
#include "../mstar_kv.h"
#include "../mstar_kv_cuda.h"
#include <deque>
#include <string>

namespace demu_f16 {
#define MSKV_DTYPE 1
#define MSKV_HEAD_DIM 64
#include "../kernels.cu"
}
namespace demu_f16_decode {
#define MSKV_DTYPE 1
#define MSKV_HEAD_DIM 64
#define MSKV_ATTN_WARP_KEYS 1
#include "../kernels.cu"
}
namespace demu_bf16 {
#define MSKV_DTYPE 2
#define MSKV_HEAD_DIM 64
#include "../kernels.cu"
}
namespace demu_bf16_decode {
#define MSKV_DTYPE 2
#define MSKV_HEAD_DIM 64
#define MSKV_ATTN_WARP_KEYS 1
#include "../kernels.cu"
}

namespace {

struct demu_module { int dtype, head_dim, warp_keys, rope; };
struct demu_func { std::string name; demu_module mod; };

int demu_sms = 4;   /* few SMs: the attention splits its keys, as on a big GPU with small steps */
long demu_launches;

template <typename F> struct demu_shim;
template <typename R, typename... A> struct demu_shim<R (*)(A...)> {
    static R fn(A...) { return R(); }
};

int demu_define(const std::string &img, const char *name) {
    size_t p = img.find(std::string(name) + "=");
    return p == std::string::npos ? 0 : std::atoi(img.c_str() + p + std::strlen(name) + 1);
}
unsigned long long demu_u64(void *p) { unsigned long long v; std::memcpy(&v, p, 8); return v; }
int demu_i32(void *p) { int v; std::memcpy(&v, p, 4); return v; }
float demu_f32(void *p) { float v; std::memcpy(&v, p, 4); return v; }
template <typename T> T demu_ptr(void *p) { return (T)(uintptr_t)demu_u64(p); }

typedef void (*demu_attn_fn)(const void *, const void *, const void *, const int *, const int *, const int *,
                             const int *, const int *, const int *, int, int, int, unsigned int, int, float, int, int, int, int,
                             void *, float *, float *, float *, const int *, const int *, const int *);

mskv_cu_result demu_launch(mskv_cu_function f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                           unsigned int by, unsigned int bz, unsigned int smem, mskv_cu_stream s, void **a, void **extra) {
    const demu_func *fn = (const demu_func *)(const void *)f;
    const demu_module &m = fn->mod;
    bool b16 = m.dtype == 2;
    std::function<void()> body;
    (void)by; (void)bz; (void)s; (void)extra;
    demu_launches++;
    if ((m.dtype != 1 && m.dtype != 2) || m.head_dim != 64 || m.rope != 0) return 700;   /* not a variant the demo uses */
    if (fn->name == "mskv_attn") {
        demu_attn_fn k = m.warp_keys ? (b16 ? demu_bf16_decode::mskv_attn : demu_f16_decode::mskv_attn)
                                     : (b16 ? demu_bf16::mskv_attn : demu_f16::mskv_attn);
        body = [=] {
            k(demu_ptr<const void *>(a[0]), demu_ptr<const void *>(a[1]), demu_ptr<const void *>(a[2]),
              demu_ptr<const int *>(a[3]), demu_ptr<const int *>(a[4]), demu_ptr<const int *>(a[5]),
              demu_ptr<const int *>(a[6]), demu_ptr<const int *>(a[7]), demu_ptr<const int *>(a[8]), demu_i32(a[9]),
              demu_i32(a[10]), demu_i32(a[11]), (unsigned int)demu_i32(a[12]), demu_i32(a[13]), demu_f32(a[14]),
              demu_i32(a[15]), demu_i32(a[16]), demu_i32(a[17]), demu_i32(a[18]), demu_ptr<void *>(a[19]),
              demu_ptr<float *>(a[20]), demu_ptr<float *>(a[21]), demu_ptr<float *>(a[22]), demu_ptr<const int *>(a[23]),
              demu_ptr<const int *>(a[24]), demu_ptr<const int *>(a[25]));
        };
    } else if (fn->name == "mskv_lse_merge") {
        auto k = b16 ? demu_bf16::mskv_lse_merge : demu_f16::mskv_lse_merge;
        body = [=] {
            k(demu_ptr<const float *>(a[0]), demu_ptr<const float *>(a[1]), demu_i32(a[2]), (mskv_i64)demu_u64(a[3]),
              (mskv_i64)demu_u64(a[4]), demu_ptr<void *>(a[5]), demu_ptr<float *>(a[6]));
        };
    } else if (fn->name == "mskv_kv_write") {
        auto k = b16 ? demu_bf16::mskv_kv_write : demu_f16::mskv_kv_write;
        body = [=] {
            k(demu_ptr<const void *>(a[0]), demu_ptr<const void *>(a[1]), demu_ptr<const mskv_i64 *>(a[2]),
              demu_i32(a[3]), demu_i32(a[4]), demu_ptr<void *>(a[5]), demu_ptr<void *>(a[6]), (mskv_i64)demu_u64(a[7]),
              demu_ptr<const int *>(a[8]), demu_f32(a[9]));
        };
    } else if (fn->name == "mskv_page_gather") {
        body = [=] {
            demu_f16::mskv_page_gather(demu_ptr<const unsigned char *>(a[0]), demu_ptr<const int *>(a[1]), demu_i32(a[2]),
                                       (mskv_i64)demu_u64(a[3]), demu_ptr<unsigned char *>(a[4]), (mskv_i64)demu_u64(a[5]));
        };
    } else if (fn->name == "mskv_page_scatter") {
        body = [=] {
            demu_f16::mskv_page_scatter(demu_ptr<unsigned char *>(a[0]), demu_ptr<const int *>(a[1]), demu_i32(a[2]),
                                        (mskv_i64)demu_u64(a[3]), demu_ptr<const unsigned char *>(a[4]),
                                        (mskv_i64)demu_u64(a[5]));
        };
    } else {
        return 500;
    }
    if (!mskv_emu::launch(mskv_emu::Dim3{(int)gx, (int)gy, (int)gz}, (int)bx, smem, body)) {
        std::fprintf(stderr, "demo-emu: %s: %s\n", fn->name.c_str(), mskv_emu::error().c_str());
        return 719;
    }
    return 0;
}

mskv_cuda_functions demu_make_table() {
    mskv_cuda_functions f;
#define DEMU_SHIM(ret, name, sym, params) f.name = demu_shim<decltype(f.name)>::fn;
    MSKV_CUDA_DRIVER_FUNCTIONS(DEMU_SHIM)
    MSKV_CUDA_NVRTC_FUNCTIONS(DEMU_SHIM)
#undef DEMU_SHIM
    f.cuDriverGetVersion = [](int *v) -> mskv_cu_result { *v = 13000; return 0; };
    f.cuDeviceGetCount = [](int *n) -> mskv_cu_result { *n = 1; return 0; };
    f.cuDeviceGetAttribute = [](int *v, int at, mskv_cu_device) -> mskv_cu_result {
        *v = at == MSKV_CU_ATTR_CC_MAJOR ? 9 : at == MSKV_CU_ATTR_MULTIPROCESSOR_COUNT ? demu_sms
           : at == MSKV_CU_ATTR_MAX_SMEM_OPTIN ? 227 * 1024 : 0;
        return 0;
    };
    f.cuDeviceGetName = [](char *name, int len, mskv_cu_device) -> mskv_cu_result { std::snprintf(name, (size_t)len, "emulated"); return 0; };
    f.cuDevicePrimaryCtxRetain = [](mskv_cu_context *c, mskv_cu_device) -> mskv_cu_result { *c = (mskv_cu_context)(void *)&demu_sms; return 0; };
    f.cuOccupancyMaxActiveBlocksPerMultiprocessor = [](int *n, mskv_cu_function, int, size_t) -> mskv_cu_result { *n = 2; return 0; };
    f.cuTensorMapEncodeTiled = NULL;   /* a driver without TMA (the sm_90a kernel is not emulated here anyway) */
    f.cuMemAlloc = [](mskv_cu_ptr *p, size_t n) -> mskv_cu_result {
        void *m = std::malloc(n ? n : 1);
        if (!m) return MSKV_CU_ERROR_OUT_OF_MEMORY;
        std::memset(m, 0xff, n);   /* fresh device memory holds NaN bytes */
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
        *m = (mskv_cu_module)(void *)new demu_module{demu_define(img, "-DMSKV_DTYPE"), demu_define(img, "-DMSKV_HEAD_DIM"),
                                                     demu_define(img, "-DMSKV_ATTN_WARP_KEYS"), demu_define(img, "-DMSKV_ROPE")};
        return 0;
    };
    f.cuModuleUnload = [](mskv_cu_module m) -> mskv_cu_result { delete (demu_module *)(void *)m; return 0; };
    f.cuModuleGetFunction = [](mskv_cu_function *out, mskv_cu_module m, const char *name) -> mskv_cu_result {
        static std::deque<demu_func> funcs;   /* the runtime keeps functions for the context's life */
        /* the sm_90a kernel is not emulated here: the runtime falls back to mskv_attn */
        if (std::strcmp(name, "mskv_attn_sm90") == 0) return MSKV_CU_ERROR_NOT_FOUND;
        funcs.push_back(demu_func{name, *(const demu_module *)(const void *)m});
        *out = (mskv_cu_function)(void *)&funcs.back();
        return 0;
    };
    f.cuLaunchKernel = demu_launch;
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
        return 0;
    };
    f.nvrtcGetProgramLogSize = [](mskv_nvrtc_program, size_t *n) -> mskv_nvrtc_result { *n = 0; return 0; };
    f.nvrtcGetCUBINSize = [](mskv_nvrtc_program p, size_t *n) -> mskv_nvrtc_result { *n = ((std::string *)(void *)p)->size() + 1; return 0; };
    f.nvrtcGetCUBIN = [](mskv_nvrtc_program p, char *out) -> mskv_nvrtc_result {
        const std::string *img = (const std::string *)(void *)p;
        std::memcpy(out, img->c_str(), img->size() + 1);
        return 0;
    };
    return f;
}

}  // namespace

static const mskv_cuda_functions *demu_functions(void) {
    static mskv_cuda_functions table = demu_make_table();
    return &table;
}

/* demo.c with its CUDA context on the table above and no disk cache */
#define DEMO_CUDA_FUNCTIONS demu_functions()
#define main demo_main
#include "demo.c"
#undef main

int main(int argc, char **argv) {
    int rc = demo_main(argc, argv);
    if (demu_launches) std::fprintf(stderr, "demo-emu: %ld emulated kernel launches\n", demu_launches);
    return rc;
}
