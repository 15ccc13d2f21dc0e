/* MSKV_STATIC: every header as a private copy in one file, with every warning
   an error, although this file uses only a few of their functions. Built by
   `make tests` as C99, and as C++ with MSKV_NO_THREADS; nothing runs it. */
#define MSKV_STATIC
#define MSTAR_KV_IMPLEMENTATION
#include "../mstar_kv.h"
#define MSTAR_KV_CUDA_IMPLEMENTATION
#include "../mstar_kv_cuda.h"
#define MSTAR_KV_UCX_IMPLEMENTATION
#include "../mstar_kv_ucx.h"

int main(void) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    memset(&d, 0, sizeof d);
    d.num_pages = 4;
    d.page_size = 1;
    if (mskv_arena_create(&d, &a) != MSKV_SUCCESS) return 1;
    mskv_arena_destroy(a);
    return 0;
}
