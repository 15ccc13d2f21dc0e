/* mstar_kv_cuda.h declares the CUDA driver and NVRTC types and constants it
   uses itself, so that it builds without CUDA. This program holds them
   against a CUDA toolkit's own cuda.h and nvrtc.h, compiled in the same
   file, and the layer's loader against the toolkit's libraries:

   - every mirrored constant and type size is a _Static_assert (a wrong one
     does not build; the compiler names it), and a run-time test reads
     mstar_kv_cuda.h and fails for a MSKV_CU_* / MSKV_NVRTC_* define or a
     mskv_cu_* / mskv_nvrtc_* typedef that has no row here;
   - every name of MSKV_CUDA_DRIVER_FUNCTIONS resolves in the toolkit's
     lib64/stubs/libcuda.so and every name of MSKV_CUDA_NVRTC_FUNCTIONS in
     its libnvrtc, through the loader's own open and lookup; the stub's
     cuInit fails and the layer says so (CUDA_UNAVAILABLE, the stub's
     error); the real libnvrtc compiles through the layer.

   The prototypes are checked by tests/cuda_sig_check.cpp. make builds this
   with MSKV_HAVE_CUDA_HEADERS when $(CUDA_HOME)/include has cuda.h and
   nvrtc.h (CUDA_HOME defaults to /usr/local/cuda); without, it skips,
   saying why. C11: _Static_assert, _Generic, and CUtensorMap's _Alignas. */
#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif
#define MSKV_TEST_IMPLEMENTATION
#define MSKV_TEST_MAIN
#include "mskv_test.h"
#include <stdlib.h>
#include <ctype.h>
#define MSTAR_KV_IMPLEMENTATION
#include "../mstar_kv.h"
#define MSTAR_KV_CUDA_IMPLEMENTATION
#include "../mstar_kv_cuda.h"

#ifndef MTA_CUDA_HOME
#define MTA_CUDA_HOME "/usr/local/cuda"
#endif

#ifndef MSKV_HAVE_CUDA_HEADERS

TEST(cuda_mirrors_match_the_real_cuda_headers) {
    SKIP("no CUDA toolkit: cuda.h and nvrtc.h not found in %s/include (set CUDA_HOME)", MTA_CUDA_HOME);
}

#else
/* after the layer: cuda.h's version macros (cuMemAlloc -> cuMemAlloc_v2 ...)
   must not rename the layer's own declarations */
#include <cuda.h>
#include <nvrtc.h>

#ifndef MTA_HEADER
#define MTA_HEADER "mstar_kv_cuda.h"
#endif

/* X(the layer's constant, the real one) */
#define MTA_CONSTANTS(X)                                                                \
    X(MSKV_CU_SUCCESS, CUDA_SUCCESS)                                                    \
    X(MSKV_CU_ERROR_OUT_OF_MEMORY, CUDA_ERROR_OUT_OF_MEMORY)                            \
    X(MSKV_CU_ERROR_NOT_INITIALIZED, CUDA_ERROR_NOT_INITIALIZED)                        \
    X(MSKV_CU_ERROR_STUB_LIBRARY, CUDA_ERROR_STUB_LIBRARY)                              \
    X(MSKV_CU_ERROR_NO_DEVICE, CUDA_ERROR_NO_DEVICE)                                    \
    X(MSKV_CU_ERROR_INVALID_IMAGE, CUDA_ERROR_INVALID_IMAGE)                            \
    X(MSKV_CU_ERROR_NOT_FOUND, CUDA_ERROR_NOT_FOUND)                                    \
    X(MSKV_CU_ERROR_NOT_READY, CUDA_ERROR_NOT_READY)                                    \
    X(MSKV_CU_ERROR_LAUNCH_FAILED, CUDA_ERROR_LAUNCH_FAILED)                            \
    X(MSKV_CU_ERROR_STREAM_CAPTURE_UNSUPPORTED, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)      \
    X(MSKV_CU_ATTR_MULTIPROCESSOR_COUNT, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)      \
    X(MSKV_CU_ATTR_CC_MAJOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)              \
    X(MSKV_CU_ATTR_CC_MINOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)              \
    X(MSKV_CU_ATTR_MAX_SMEM_OPTIN, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN) \
    X(MSKV_CU_FUNC_ATTR_MAX_DYNAMIC_SMEM, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) \
    X(MSKV_CU_STREAM_NON_BLOCKING, CU_STREAM_NON_BLOCKING)                              \
    X(MSKV_CU_EVENT_DISABLE_TIMING, CU_EVENT_DISABLE_TIMING)                            \
    X(MSKV_CU_CAPTURE_MODE_RELAXED, CU_STREAM_CAPTURE_MODE_RELAXED)                     \
    X(MSKV_CU_GET_PROC_ADDRESS_LEGACY_STREAM, CU_GET_PROC_ADDRESS_LEGACY_STREAM)        \
    X(MSKV_CU_TENSOR_MAP_DATA_TYPE_FLOAT16, CU_TENSOR_MAP_DATA_TYPE_FLOAT16)            \
    X(MSKV_CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16)          \
    X(MSKV_CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_INTERLEAVE_NONE)                \
    X(MSKV_CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_SWIZZLE_128B)                      \
    X(MSKV_CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B)      \
    X(MSKV_CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)        \
    X(MSKV_CU_TENSOR_MAP_BYTES, sizeof(CUtensorMap))                                    \
    X(MSKV_CU_TENSOR_MAP_ALIGN, 64 /* see below */)                                      \
    X(MSKV_NVRTC_SUCCESS, NVRTC_SUCCESS)                                                \
    X(MSKV_NVRTC_ERROR_OUT_OF_MEMORY, NVRTC_ERROR_OUT_OF_MEMORY)                        \
    X(MSKV_NVRTC_ERROR_COMPILATION, NVRTC_ERROR_COMPILATION)

/* Constants the layer defines that are not integer constant expressions:
   each has a run-time test below. */
static const char *const mta_runtime_checked[] = { "MSKV_CU_STREAM_LEGACY" };

/* X(the layer's type, the real one): size and alignment (the handles are
   distinct struct pointers by design; the prototypes' check maps them) */
#define MTA_TYPES(X)                        \
    X(mskv_cu_result, CUresult)             \
    X(mskv_cu_device, CUdevice)             \
    X(mskv_cu_ptr, CUdeviceptr)             \
    X(mskv_cu_context, CUcontext)           \
    X(mskv_cu_module, CUmodule)             \
    X(mskv_cu_function, CUfunction)         \
    X(mskv_cu_stream, CUstream)             \
    X(mskv_cu_event, CUevent)               \
    X(mskv_cu_graph, CUgraph)               \
    X(mskv_cu_graph_exec, CUgraphExec)      \
    X(mskv_nvrtc_result, nvrtcResult)       \
    X(mskv_nvrtc_program, nvrtcProgram)

#define MTA_ASSERT_CONSTANT(mine, theirs) \
    _Static_assert((long long)(mine) == (long long)(theirs), #mine " differs from " #theirs);
MTA_CONSTANTS(MTA_ASSERT_CONSTANT)

#define MTA_ASSERT_TYPE(mine, theirs)                                                             \
    _Static_assert(sizeof(mine) == sizeof(theirs), "sizeof(" #mine ") differs from sizeof(" #theirs ")"); \
    _Static_assert(_Alignof(mine) == _Alignof(theirs), "_Alignof(" #mine ") differs from _Alignof(" #theirs ")");
MTA_TYPES(MTA_ASSERT_TYPE)

/* cuTensorMapEncodeTiled asks for a map address aligned to 64 bytes (its
   documented requirement, CUDA 12 and 13), which is what the layer gives
   its maps: the constant above is that number. The type's own alignment
   was 64 in CUDA 12's cuda.h and is 128 from CUDA 13 on; any other value
   is news to look into. */
_Static_assert(_Alignof(CUtensorMap) == 64 || (CUDA_VERSION >= 13000 && _Alignof(CUtensorMap) == 128),
               "CUtensorMap's alignment is neither CUDA 12's 64 nor CUDA 13's 128");
_Static_assert(_Alignof(CUtensorMap) % MSKV_CU_TENSOR_MAP_ALIGN == 0, "CUtensorMap is less aligned than the layer's maps");

/* the integer types are the very same types (CUdevice is int, CUdeviceptr
   unsigned long long on 64-bit targets): passed by pointer, a pointer to
   one is a pointer to the other */
_Static_assert(_Generic((mskv_cu_device)0, CUdevice: 1, default: 0), "mskv_cu_device is not CUdevice");
_Static_assert(_Generic((mskv_cu_ptr)0, CUdeviceptr: 1, default: 0), "mskv_cu_ptr is not CUdeviceptr");
/* the version the driver functions are asked for (cuGetProcAddress_v2) is
   one these headers know */
_Static_assert(MSKV__CUDA_ABI_VERSION <= CUDA_VERSION, "MSKV__CUDA_ABI_VERSION is newer than cuda.h");

#define MTA_NAME(mine, theirs) #mine,
static const char *const mta_constant_names[] = { MTA_CONSTANTS(MTA_NAME) };
static const char *const mta_type_names[] = { MTA_TYPES(MTA_NAME) };

static int mta_listed(const char *name, size_t len, const char *const *list, size_t n) {
    size_t i;
    for (i = 0; i < n; i++)
        if (strlen(list[i]) == len && memcmp(list[i], name, len) == 0) return 1;
    return 0;
}

static int mta_ident(int c) { return isalnum(c) || c == '_'; }

/* Every "#define MSKV_CU_x" / "#define MSKV_NVRTC_x" and every typedef
   ending in "mskv_cu_x;" / "mskv_nvrtc_x;" of the header has a row above. */
TEST(cuda_every_mirrored_constant_and_type_has_a_check) {
    FILE *f = fopen(MTA_HEADER, "r");
    char line[4096], missing[2048] = "";
    int defines = 0, typedefs = 0, unchecked = 0, unchecked_types = 0, unchecked_defines;
    if (!f) {
        mt_fail(__FILE__, __LINE__, "cannot open %s", MTA_HEADER);
        return;
    }
    while (fgets(line, sizeof line, f)) {
        const char *p = line, *name = NULL;
        size_t len = 0;
        while (*p == ' ' || *p == '\t') p++;
        if (strncmp(p, "#define ", 8) == 0) {
            p += 8;
            while (*p == ' ') p++;
            if (strncmp(p, "MSKV_CU_", 8) != 0 && strncmp(p, "MSKV_NVRTC_", 11) != 0) continue;
            name = p;
            while (mta_ident((unsigned char)p[len])) len++;
            if (p[len] == '(') continue;   /* a function-like macro is no mirror */
            defines++;
            if (mta_listed(name, len, mta_constant_names, sizeof mta_constant_names / sizeof *mta_constant_names) ||
                mta_listed(name, len, mta_runtime_checked, sizeof mta_runtime_checked / sizeof *mta_runtime_checked))
                continue;
        } else if (strncmp(p, "typedef ", 8) == 0) {
            const char *end;
            char *comment = strstr(line, "/*");
            if (comment) *comment = 0;
            end = strrchr(p, ';');
            if (!end) continue;
            name = end;
            while (name > p && mta_ident((unsigned char)name[-1])) name--;
            len = (size_t)(end - name);
            if (strncmp(name, "mskv_cu_", 8) != 0 && strncmp(name, "mskv_nvrtc_", 11) != 0) continue;
            typedefs++;
            if (mta_listed(name, len, mta_type_names, sizeof mta_type_names / sizeof *mta_type_names)) continue;
            unchecked_types++;
        } else {
            continue;
        }
        unchecked++;
        if (strlen(missing) + len + 3 < sizeof missing)
            snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%.*s", missing[0] ? ", " : "",
                     (int)len, name);
    }
    fclose(f);
    unchecked_defines = unchecked - unchecked_types;
    printf("  %s: %d mirrored constants, %d mirrored types\n", MTA_HEADER, defines, typedefs);
    /* every row was found once: a parser that finds less has gone wrong */
    EXPECT_EQ((int)(sizeof mta_constant_names / sizeof *mta_constant_names +
                    sizeof mta_runtime_checked / sizeof *mta_runtime_checked), defines - unchecked_defines);
    EXPECT_EQ((int)(sizeof mta_type_names / sizeof *mta_type_names), typedefs - unchecked_types);
    EXPECT_EQ(0, unchecked);
    if (unchecked) printf("  no check in tests/cuda_abi_check.c for: %s\n", missing);
}

TEST(cuda_legacy_stream_handle_is_cuda_h_s) {
    EXPECT_EQ_U64((uint64_t)(uintptr_t)MSKV_CU_STREAM_LEGACY, (uint64_t)(uintptr_t)CU_STREAM_LEGACY);
    /* the Python package's copy (python/mstar_kv/_cuda.py) says 1 too */
    EXPECT_EQ_U64(1, (uint64_t)(uintptr_t)CU_STREAM_LEGACY);
}

/* ---- the loader against the toolkit's libraries ---- */

static int mta_exists(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    return f != NULL;
}

static const char *mta_stub(void) {
    static char path[512];
    static const char *const where[] = { "lib64/stubs/libcuda.so", "targets/x86_64-linux/lib/stubs/libcuda.so",
                                         "targets/sbsa-linux/lib/stubs/libcuda.so", "lib/stubs/libcuda.so" };
    size_t i;
    for (i = 0; i < sizeof where / sizeof *where; i++) {
        snprintf(path, sizeof path, "%s/%s", MTA_CUDA_HOME, where[i]);
        if (mta_exists(path)) return path;
    }
    return NULL;
}

/* the toolkit's libnvrtc: libnvrtc.so, else the versioned name of its CUDA major */
static const char *mta_nvrtc(void) {
    static char path[512];
    snprintf(path, sizeof path, "%s/lib64/libnvrtc.so", MTA_CUDA_HOME);
    if (mta_exists(path)) return path;
    snprintf(path, sizeof path, "%s/lib64/libnvrtc.so.%d", MTA_CUDA_HOME, CUDA_VERSION / 1000);
    if (mta_exists(path)) return path;
    return NULL;
}

/* Looks up each symbol of a table in lib with the loader's own lookup;
   the names it lacks go to missing. Returns how many it lacks. */
typedef struct mta_entry { const char *name, *sym; } mta_entry;
#define MTA_ENTRY(ret, name, sym, params) { #name, sym },
static const mta_entry mta_driver[] = { MSKV_CUDA_DRIVER_FUNCTIONS(MTA_ENTRY) };
static const mta_entry mta_nvrtc_fns[] = { MSKV_CUDA_NVRTC_FUNCTIONS(MTA_ENTRY) };

static int mta_resolve_all(void *lib, const mta_entry *e, size_t n, char *missing, size_t cap) {
    size_t i;
    int lacking = 0;
    missing[0] = 0;
    for (i = 0; i < n; i++) {
        if (mskv__cuda_sym(lib, e[i].sym)) continue;
        lacking++;
        mskv__cuda_appendf(missing, cap, "%s%s (%s)", missing[0] ? ", " : "", e[i].sym, e[i].name);
    }
    return lacking;
}

TEST(cuda_every_driver_function_resolves_in_the_toolkit_stub) {
    const char *stub = mta_stub();
    char err[512] = "", missing[2048];
    void *lib;
    int lacking;
    if (!stub) SKIP("no stub libcuda.so under %s", MTA_CUDA_HOME);
    lib = mskv__cuda_lib_open(stub, err, sizeof err);
    ASSERT_TRUE(lib != NULL);
    lacking = mta_resolve_all(lib, mta_driver, sizeof mta_driver / sizeof *mta_driver, missing, sizeof missing);
    /* the loader asks the driver for the rest through this one when it has it */
    EXPECT_TRUE(mskv__cuda_sym(lib, "cuGetProcAddress_v2") != NULL);
    printf("  %s: %d of %d driver symbols\n", stub, (int)(sizeof mta_driver / sizeof *mta_driver) - lacking,
           (int)(sizeof mta_driver / sizeof *mta_driver));
    EXPECT_EQ(0, lacking);
    if (lacking) printf("  missing: %s\n", missing);
    mskv__cuda_lib_close(lib);
}

TEST(cuda_every_nvrtc_function_resolves_in_the_toolkit_libnvrtc) {
    const char *path = mta_nvrtc();
    char err[512] = "", missing[2048];
    void *lib, *p;
    int lacking, major = 0, minor = 0;
    mskv_nvrtc_result (*version)(int *, int *) = NULL;
    if (!path) SKIP("no libnvrtc.so under %s/lib64", MTA_CUDA_HOME);
    lib = mskv__cuda_lib_open(path, err, sizeof err);
    ASSERT_TRUE(lib != NULL);
    lacking = mta_resolve_all(lib, mta_nvrtc_fns, sizeof mta_nvrtc_fns / sizeof *mta_nvrtc_fns, missing, sizeof missing);
    printf("  %s: %d of %d NVRTC symbols\n", path, (int)(sizeof mta_nvrtc_fns / sizeof *mta_nvrtc_fns) - lacking,
           (int)(sizeof mta_nvrtc_fns / sizeof *mta_nvrtc_fns));
    EXPECT_EQ(0, lacking);
    if (lacking) printf("  missing: %s\n", missing);
    /* the library is the headers' own: its version is cuda.h's */
    p = mskv__cuda_sym(lib, "nvrtcVersion");
    if (p) {
        memcpy((void *)&version, &p, sizeof p);
        EXPECT_EQ(MSKV_NVRTC_SUCCESS, version(&major, &minor));
        EXPECT_EQ(CUDA_VERSION / 1000, major);
        EXPECT_EQ(CUDA_VERSION / 10 % 100, minor);
    }
    mskv__cuda_lib_close(lib);
}

/* why with every copy of path taken out: what the layer says, not the file name */
static void mta_without(char *why, const char *path) {
    size_t n = strlen(path);
    char *at;
    while (n && (at = strstr(why, path)) != NULL) memmove(at, at + n, strlen(at + n) + 1);
}

/* the stub's error as the layer reports it: its code as a number of its
   own ("... 34 ...") or its name */
static int mta_names_stub_error(const char *s) {
    const char *p = s;
    if (strstr(s, "STUB_LIBRARY")) return 1;
    while ((p = strstr(p, "34")) != NULL) {
        if ((p == s || !mta_ident((unsigned char)p[-1])) && !mta_ident((unsigned char)p[2])) return 1;
        p += 2;
    }
    return 0;
}

static int mta_has_stub(const char *s) {
    for (; *s; s++)
        if (tolower((unsigned char)s[0]) == 's' && tolower((unsigned char)s[1]) == 't' &&
            tolower((unsigned char)s[2]) == 'u' && tolower((unsigned char)s[3]) == 'b') return 1;
    return 0;
}

static char mta_logged[4096];
static void mta_log(void *user, mskv_log_level level, const char *msg) {
    (void)user;
    (void)level;
    mskv__cuda_appendf(mta_logged, sizeof mta_logged, "%s\n", msg);
}

TEST(cuda_stub_driver_fails_cleanly_with_the_layer_s_message) {
    const char *stub = mta_stub(), *nvrtc = mta_nvrtc();
    mskv_cuda_desc cd;
    mskv_cuda *cu = (mskv_cuda *)&cd;   /* not NULL: create must clear it */
    char why[3072];
    int32_t devices = -1, version = -1;
    if (!stub) SKIP("no stub libcuda.so under %s", MTA_CUDA_HOME);
    memset(&cd, 0, sizeof cd);
    cd.driver_path = stub;
    cd.nvrtc_path = nvrtc;
    cd.log = mta_log;

    EXPECT_EQ(MSKV_ERROR_CUDA_UNAVAILABLE, mskv_cuda_probe_driver(&cd, &devices, &version, why, sizeof why));
    EXPECT_EQ(0, devices);
    EXPECT_EQ(0, version);
    printf("  probe_driver: %s\n", why);
    mta_without(why, stub);
    EXPECT_TRUE(strstr(why, "cuInit") != NULL);
    EXPECT_TRUE(mta_names_stub_error(why));
    EXPECT_TRUE(mta_has_stub(why));

    EXPECT_EQ(MSKV_ERROR_CUDA_UNAVAILABLE, mskv_cuda_probe(&cd, why, sizeof why));
    mta_without(why, stub);
    EXPECT_TRUE(mta_names_stub_error(why));
    EXPECT_TRUE(mta_has_stub(why));

    mta_logged[0] = 0;
    EXPECT_EQ(MSKV_ERROR_CUDA_UNAVAILABLE, mskv_cuda_create(&cd, &cu));
    EXPECT_TRUE(cu == NULL);
    printf("  create logged: %s", mta_logged[0] ? mta_logged : "(nothing)\n");
    mta_without(mta_logged, stub);
    EXPECT_TRUE(mta_names_stub_error(mta_logged));
    EXPECT_TRUE(mta_has_stub(mta_logged));
}

/* The toolkit's libnvrtc through the layer's NVRTC loader (every name of
   the table resolved, or it refuses) compiles a kernel to a CUBIN. */
TEST(cuda_toolkit_libnvrtc_compiles_through_the_layer) {
    const char *nvrtc = mta_nvrtc();
    mskv_cuda_desc cd;
    mskv_cuda_compile_info ci;
    mskv_cuda_image img;
    mskv_result r;
    if (!nvrtc) SKIP("no libnvrtc.so under %s/lib64", MTA_CUDA_HOME);
    memset(&cd, 0, sizeof cd);
    memset(&ci, 0, sizeof ci);
    memset(&img, 0, sizeof img);
    cd.nvrtc_path = nvrtc;
    cd.kernel_source = "extern \"C\" __global__ void mskv_abi_probe(int *p) { *p = 1; }\n";
    cd.disable_disk_cache = 1;
    cd.log = mta_log;
    mta_logged[0] = 0;
    ci.arch = 90;
    r = mskv_cuda_compile(&cd, &ci, &img);
    EXPECT_EQ(MSKV_SUCCESS, r);
    if (r != MSKV_SUCCESS) printf("  logged: %s", mta_logged);
    EXPECT_FALSE(img.is_ptx);
    ASSERT_TRUE(img.data != NULL && img.size > 4);
    EXPECT_EQ(0, memcmp(img.data, "\177ELF", 4));
    mskv_cuda_image_free(&cd, &img);
}

#endif
