/* Which NVRTC does mstar_kv_cuda.h's loader find from this process's
   environment? The loader runs once per process, so tests/test_cuda.c runs
   this in a fresh process per layout.
     nvrtc-find                 compiles an empty kernel to PTX (no driver)
                                and prints its first lines (they name the
                                compiler), or why no NVRTC loaded
     nvrtc-find create [DRIVER] creates a context (with DRIVER as
                                mskv_cuda_desc.driver_path, else the default
                                driver search) and prints the result, the
                                chosen NVRTC and why
     nvrtc-find compile-create DIR [DRIVER]
                                a compile into the cache DIR first (no
                                driver yet), then create, then the same
                                compile again: each compile prints its key
                                and whether it came from the disk
     nvrtc-find create-compile DIR [DRIVER]
                                create, then the compile into DIR */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>
#define MSTAR_KV_IMPLEMENTATION
#include "../mstar_kv.h"
#define MSTAR_KV_CUDA_IMPLEMENTATION
#include "../mstar_kv_cuda.h"

static void nf_log(void *user, mskv_log_level level, const char *msg) {
    (void)user;
    if (level >= MSKV_LOG_INFO) printf("log: %s\n", msg);
}

static const char nf_src[] = "extern \"C\" __global__ void mskv_nothing(void) {}\n";

static mskv_result nf_compile(const char *dir, int show_text) {
    mskv_cuda_desc cd;
    mskv_cuda_compile_info ci;
    mskv_cuda_image img;
    mskv_result r;
    memset(&cd, 0, sizeof cd);
    memset(&ci, 0, sizeof ci);
    cd.kernel_source = nf_src;
    cd.cache_dir = dir;
    cd.disable_disk_cache = dir == NULL;
    cd.log = nf_log;
    ci.arch = 80;
    ci.ptx = 1;
    r = mskv_cuda_compile(&cd, &ci, &img);
    if (r == MSKV_SUCCESS && show_text) printf("nvrtc: loaded\n%.400s\n", (const char *)img.data);
    else if (r == MSKV_SUCCESS)
        printf("compile: key %016llx from_disk %d\n%.200s\n", (unsigned long long)img.key, (int)img.from_disk,
               (const char *)img.data);
    else printf("nvrtc: %s\n", mskv_result_string(r));
    mskv_cuda_image_free(&cd, &img);
    return r;
}

static mskv_result nf_create(const char *driver) {
    mskv_cuda_desc cd;
    mskv_cuda_info info;
    mskv_cuda *cu = NULL;
    mskv_result r;
    memset(&cd, 0, sizeof cd);
    cd.driver_path = driver;
    cd.disable_disk_cache = 1;
    cd.log = nf_log;
    r = mskv_cuda_create(&cd, &cu);
    printf("create: %s\n", mskv_result_string(r));
    if (r != MSKV_SUCCESS) return r;
    mskv_cuda_info_get(cu, &info);
    printf("driver_version: %d\nnvrtc_version: %d\nnvrtc_path: %s\nnvrtc_choice: %s\n", (int)info.driver_version,
           (int)info.nvrtc_version, info.nvrtc_path, info.nvrtc_choice);
    mskv_cuda_destroy(cu);
    return r;
}

int main(int argc, char **argv) {
    mskv_result r;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 1) return nf_compile(NULL, 1) == MSKV_SUCCESS ? 0 : 1;
    if (strcmp(argv[1], "create") == 0) return nf_create(argc > 2 ? argv[2] : NULL) == MSKV_SUCCESS ? 0 : 1;
    if (argc < 3) { fprintf(stderr, "usage: see the comment at the top of tests/nvrtc_find.c\n"); return 2; }
    if (strcmp(argv[1], "compile-create") == 0) {
        nf_compile(argv[2], 0);
        r = nf_create(argc > 3 ? argv[3] : NULL);
        if (r == MSKV_SUCCESS) r = nf_compile(argv[2], 0);
        return r == MSKV_SUCCESS ? 0 : 1;
    }
    if (strcmp(argv[1], "create-compile") == 0) {
        r = nf_create(argc > 3 ? argv[3] : NULL);
        if (r == MSKV_SUCCESS) r = nf_compile(argv[2], 0);
        return r == MSKV_SUCCESS ? 0 : 1;
    }
    fprintf(stderr, "nvrtc-find: unknown mode %s\n", argv[1]);
    return 2;
}
