/* Which NVRTC does mstar_kv_cuda.h's loader find from this process's
   environment? Compiles an empty kernel to PTX and prints its first lines
   (they name the compiler), or why no NVRTC loaded. The loader runs once per
   process, so tests/test_cuda.c runs this in a fresh process per layout. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>
#define MSTAR_KV_IMPLEMENTATION
#include "../mstar_kv.h"
#define MSTAR_KV_CUDA_IMPLEMENTATION
#include "../mstar_kv_cuda.h"

static void nf_log(void *user, mskv_log_level level, const char *msg) {
    (void)user;
    if (level >= MSKV_LOG_ERROR) printf("log: %s\n", msg);
}

int main(void) {
    mskv_cuda_desc cd;
    mskv_cuda_compile_info ci;
    mskv_cuda_image img;
    mskv_result r;
    memset(&cd, 0, sizeof cd);
    memset(&ci, 0, sizeof ci);
    cd.kernel_source = "extern \"C\" __global__ void mskv_nothing(void) {}\n";
    cd.disable_disk_cache = 1;
    cd.log = nf_log;
    ci.arch = 80;
    ci.ptx = 1;
    r = mskv_cuda_compile(&cd, &ci, &img);
    if (r == MSKV_SUCCESS) printf("nvrtc: loaded\n%.400s\n", (const char *)img.data);
    else printf("nvrtc: %s\n", mskv_result_string(r));
    mskv_cuda_image_free(&cd, &img);
    return r == MSKV_SUCCESS ? 0 : 1;
}
