/* GPU attention, merge and RoPE launch wrappers: implementation (part of
   mstar_kv_cuda.h's implementation; uses its internal launch API:
   mskv__cuda_function, mskv__cuda_launch, mskv__cuda_workspace,
   mskv__cuda_defines_base / _rope / mskv__cuda_define). */

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

MSKV_API mskv_result mskv_cuda_attention(mskv_cuda_store *st, int32_t layer, const mskv_plan *plan,
                                         const mskv_cuda_dplan *dplan, const mskv_attn *attn,
                                         mskv_cu_ptr q, mskv_cu_ptr o, mskv_cu_ptr lse) {
    mskv_cuda_attn_geometry g;
    mskv__cuda_defines defs;
    mskv_cu_function f, fm;
    mskv_result res;
    mskv_cu_ptr k_pool, v_pool, ws = 0, o_part = 0, lse_part = 0, null_ptr = 0;
    int32_t b, max_qo = 0, max_kv = 0, smem_optin = 0;
    int q_heads, kv_heads, page_size, mask, window_left, kv_chunk, n_splits;
    float scale, scale_log2;
    unsigned int block[3] = {128, 1, 1};
    void *args[21];
    if (!st || !plan || !dplan || !attn) return MSKV_ERROR_NULL_POINTER;
    if (layer < 0 || layer >= st->d.num_layers) return MSKV_ERROR_OUT_OF_RANGE;
    if (st->d.dtype != MSKV_DTYPE_F16 && st->d.dtype != MSKV_DTYPE_BF16) return MSKV_ERROR_UNSUPPORTED;
    if (attn->q_dtype != st->d.dtype) return MSKV_ERROR_INVALID_ARGUMENT;
    if ((int)attn->mask < 0 || (int)attn->mask > 2 || attn->window_left < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (!(attn->scale >= 0.0f) || attn->scale > 3.0e38f) return MSKV_ERROR_INVALID_ARGUMENT;  /* the kernel needs scale > 0 */
    if (plan->batch != dplan->batch || plan->total_q != dplan->total_q) return MSKV_ERROR_INVALID_ARGUMENT;
    if (plan->page_size != st->d.page_size) return MSKV_ERROR_INVALID_ARGUMENT;
    if (plan->total_q == 0 || plan->batch == 0) return MSKV_SUCCESS;
    if (!q || !o) return MSKV_ERROR_NULL_POINTER;
    /* the kernel reads q with 16-byte copies and writes o in 4-byte pairs */
    if ((q & 15) || (o & 3) || (lse & 3)) return MSKV_ERROR_INVALID_ARGUMENT;
    if (!plan->qo_indptr || !plan->kv_indptr || !plan->kv_len) return MSKV_ERROR_NULL_POINTER;
    /* masks need positions; the device buffers would hold a previous plan's */
    if (attn->mask != MSKV_MASK_NONE && (!plan->kv_pos_split || !plan->kv_pos_shift)) return MSKV_ERROR_INVALID_ARGUMENT;
    for (b = 0; b < plan->batch; b++) {
        int32_t qo = plan->qo_indptr[b + 1] - plan->qo_indptr[b];
        if (qo > max_qo) max_qo = qo;
        if (plan->kv_len[b] > max_kv) max_kv = plan->kv_len[b];
    }
    if ((res = mskv__cuda_enter(st->cu)) != MSKV_SUCCESS) return res;
    if (st->cu->fn.cuDeviceGetAttribute(&smem_optin, MSKV_CU_ATTR_MAX_SMEM_OPTIN, st->cu->device) != MSKV_CU_SUCCESS)
        smem_optin = 0;
    res = mskv_cuda_attn_geometry_get(plan->batch, plan->total_q, max_qo, max_kv, attn->q_heads, st->d.kv_heads,
                                      st->d.head_dim, st->cu->info.multiprocessors, smem_optin, &g);
    if (res != MSKV_SUCCESS) return res;
    if (g.n_splits > 1) {
        if ((res = mskv__cuda_workspace(st, g.workspace_bytes, &ws)) != MSKV_SUCCESS) return res;
        o_part = ws;
        lse_part = ws + (mskv_cu_ptr)((size_t)g.n_splits * (size_t)plan->total_q * (size_t)attn->q_heads * (size_t)st->d.head_dim * 4);
    }
    mskv__cuda_defines_base(st, &defs);
    mskv__cuda_define(&defs, "MSKV_ATTN_WARP_KEYS", g.decode);
    if ((res = mskv__cuda_function(st->cu, "mskv_attn", &defs, &f)) != MSKV_SUCCESS) return res;
    k_pool = mskv_cuda_store_pool(st, layer, 0);
    v_pool = mskv_cuda_store_pool(st, layer, 1);
    q_heads = attn->q_heads; kv_heads = st->d.kv_heads; page_size = st->d.page_size;
    scale = attn->scale > 0.0f ? attn->scale : 1.0f / sqrtf((float)st->d.head_dim);
    scale_log2 = scale * 1.44269504088896341f;
    mask = (int)attn->mask; window_left = attn->window_left;
    kv_chunk = g.kv_chunk; n_splits = g.n_splits;
    args[0] = &q; args[1] = &k_pool; args[2] = &v_pool;
    args[3] = (void *)&dplan->qo_indptr; args[4] = (void *)&dplan->kv_indptr; args[5] = (void *)&dplan->kv_indices;
    args[6] = (void *)&dplan->kv_len; args[7] = (void *)&dplan->kv_pos_split; args[8] = (void *)&dplan->kv_pos_shift;
    args[9] = &q_heads; args[10] = &kv_heads; args[11] = &page_size; args[12] = &scale_log2;
    args[13] = &mask; args[14] = &window_left; args[15] = &kv_chunk; args[16] = &n_splits;
    args[17] = &o; args[18] = lse ? &lse : &null_ptr; args[19] = &o_part; args[20] = &lse_part;
    res = mskv__cuda_launch(st, f, g.grid, block, g.smem_bytes, args);
    if (res != MSKV_SUCCESS || g.n_splits == 1) return res;
    {
        long long rows = (long long)plan->total_q * attn->q_heads, part_rows = rows;
        unsigned int grid[3];
        void *margs[7];
        grid[0] = (unsigned int)((rows + 3) / 4); grid[1] = 1; grid[2] = 1;
        if ((res = mskv__cuda_function(st->cu, "mskv_lse_merge", &defs, &fm)) != MSKV_SUCCESS) return res;
        margs[0] = &o_part; margs[1] = &lse_part; margs[2] = &n_splits; margs[3] = &part_rows; margs[4] = &rows;
        margs[5] = &o; margs[6] = lse ? &lse : &null_ptr;
        return mskv__cuda_launch(st, fm, grid, block, 0, margs);
    }
}

MSKV_API mskv_result mskv_cuda_merge(mskv_cuda_store *st, int64_t n, int32_t heads, int32_t head_dim,
                                     mskv_cu_ptr o_a, mskv_cu_ptr lse_a, mskv_cu_ptr o_b, mskv_cu_ptr lse_b,
                                     mskv_cu_ptr o, mskv_cu_ptr lse) {
    mskv__cuda_defines defs;
    mskv_cu_function f;
    mskv_result res;
    long long rows;
    unsigned int grid[3], block[3] = {128, 1, 1};
    void *args[7];
    if (!st) return MSKV_ERROR_NULL_POINTER;
    if (n < 0 || heads <= 0 || (head_dim != 64 && head_dim != 128 && head_dim != 256)) return MSKV_ERROR_INVALID_ARGUMENT;
    if (n == 0) return MSKV_SUCCESS;
    if (!o_a || !lse_a || !o_b || !lse_b || !o || !lse) return MSKV_ERROR_NULL_POINTER;
    if (n > (int64_t)0x7fffffff * 4 / heads) return MSKV_ERROR_OVERFLOW;
    if ((res = mskv__cuda_enter(st->cu)) != MSKV_SUCCESS) return res;
    mskv__cuda_defines_base(st, &defs);
    mskv__cuda_define(&defs, "MSKV_DTYPE", 0);
    mskv__cuda_define(&defs, "MSKV_HEAD_DIM", head_dim);
    if ((res = mskv__cuda_function(st->cu, "mskv_state_merge", &defs, &f)) != MSKV_SUCCESS) return res;
    rows = (long long)n * heads;
    grid[0] = (unsigned int)((rows + 3) / 4); grid[1] = 1; grid[2] = 1;
    args[0] = &o_a; args[1] = &lse_a; args[2] = &o_b; args[3] = &lse_b; args[4] = &rows; args[5] = &o; args[6] = &lse;
    return mskv__cuda_launch(st, f, grid, block, 0, args);
}

MSKV_API mskv_result mskv_cuda_rope(mskv_cuda_store *st, const mskv_rope *rope, mskv_cu_ptr x, int64_t n,
                                    int32_t heads, mskv_cu_ptr positions) {
    mskv__cuda_defines defs;
    mskv_cu_function f;
    mskv_result res;
    long long nn = (long long)n;
    int h = heads;
    float theta;
    unsigned int grid[3], block[3] = {128, 1, 1};
    void *args[5];
    if (!st || !rope) return MSKV_ERROR_NULL_POINTER;
    if (n < 0 || heads <= 0 || (rope->mode != MSKV_POS_1D && rope->mode != MSKV_POS_3D)) return MSKV_ERROR_INVALID_ARGUMENT;
    if (st->d.head_dim != 64 && st->d.head_dim != 128 && st->d.head_dim != 256) return MSKV_ERROR_UNSUPPORTED;
    if (n == 0) return MSKV_SUCCESS;
    if (!x || !positions) return MSKV_ERROR_NULL_POINTER;
    if (n > (int64_t)0x7fffffff * 4 / heads) return MSKV_ERROR_OVERFLOW;
    if ((res = mskv__cuda_enter(st->cu)) != MSKV_SUCCESS) return res;
    mskv__cuda_defines_base(st, &defs);
    mskv__cuda_defines_rope(&defs, rope);
    if ((res = mskv__cuda_function(st->cu, "mskv_rope", &defs, &f)) != MSKV_SUCCESS) return res;
    theta = rope->theta > 0.0f ? rope->theta : 10000.0f;
    grid[0] = (unsigned int)((nn * h + 3) / 4); grid[1] = 1; grid[2] = 1;
    args[0] = &x; args[1] = &nn; args[2] = &h; args[3] = &positions; args[4] = &theta;
    return mskv__cuda_launch(st, f, grid, block, 0, args);
}
