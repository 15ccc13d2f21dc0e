"""FlashInfer itself over mstar_kv's pages, on the GPU (run by hand, or by
tests/gpu_check.sh's flashinfer stage):

    build/venv/bin/python python/tests/gpu_flashinfer_check.py

A windowed video session (sink + sliding window, 24-token chunks on
16-token pages, GQA 8 q heads over 2 kv heads, f16) in a CudaStore: every
chunk's plan is token-exact, mstar_kv.interop makes FlashInfer's
arguments, BatchPrefillWithPagedKVCacheWrapper runs over the store's own
pools (no copy), and its output is compared with the store's attention on
the same plan. Decode steps go through BatchDecodeWithPagedKVCacheWrapper
where interop says it can express them. Exit status: 0 pass, 1 a mismatch
(a "why:" line says which), 77 skipped (flashinfer or a GPU missing: the
"skip:" line says which)."""
import ctypes
import sys

TOL = 2e-2   # f16 inputs, f32 accumulation in both kernels


def skip(why):
    print("skip: %s" % why)
    print("why: %s" % why)   # the line tests/gpu_check.sh puts in its verdict
    sys.exit(77)


try:
    import torch
except Exception as e:   # noqa: BLE001 -- any import failure is a skip with its reason
    skip("torch not importable (%s)" % e)
try:
    import flashinfer
except Exception as e:   # noqa: BLE001
    skip("flashinfer not importable (%s)" % e)
try:
    import mstar_kv as mk
    from mstar_kv import _ffi, interop
except Exception as e:   # noqa: BLE001
    skip("mstar_kv not importable (%s): make python, or pip install ./python" % e)

if not torch.cuda.is_available():
    skip("torch sees no CUDA device")
ok, why = mk.cuda_probe()
if not ok:
    skip("mstar_kv sees no CUDA device (%s)" % why)

PAGE, CHUNK, KVH, QH, DIM = 16, 24, 2, 8, 128


def exact_plan(arena, segments):
    plan = mk.Plan(4, 256, 256)
    d, _ = arena._plan_desc("self", None, None, "1d", 0, None)
    d.visibility = _ffi.CONSTANTS["MSKV_VIS_EXACT"]
    arena._call("mskv_plan_build", arena.ptr, *arena._segments(segments), ctypes.byref(d), ctypes.byref(plan._s))
    plan._pos_mode = d.pos_mode
    return plan


def main():
    seed = 2105
    print("seed %d" % seed)
    torch.manual_seed(seed)
    dev = torch.device("cuda")
    work = torch.empty(128 << 20, dtype=torch.uint8, device=dev)
    prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(work, "NHD")
    decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(work, "NHD")
    cuda = mk.Cuda()
    worst, checks, masked, refused = 0.0, 0, 0, 0
    with mk.CudaStore(cuda, 128, PAGE, 1, KVH, DIM, dtype="f16", max_batch=4, max_tokens=256,
                      max_page_ids=256) as st:
        arena = st.arena()
        pools = interop.cuda_store_pools(st, 0)
        ret = mk.Retention(CHUNK, sink_chunks=1, window_chunks=2)
        sessions = [mk.Session(arena, arena.add_request(), ret) for _ in range(2)]
        for chunk in range(7):
            for s in sessions:
                s.begin_chunk(CHUNK)
            plan = exact_plan(arena, [(s.request, CHUNK) for s in sessions])
            dplan = st.upload_plan(plan)
            k = torch.randn(plan.total_q, KVH, DIM, device=dev, dtype=torch.float16)
            v = torch.randn(plan.total_q, KVH, DIM, device=dev, dtype=torch.float16)
            st.write_kv(0, dplan, k, v)
            q = torch.randn(plan.total_q, QH, DIM, device=dev, dtype=torch.float16)
            for mask in ("none", "causal"):
                ours = st.attention(0, dplan, q, torch.empty_like(q), mask=mask)
                a = interop.flashinfer_prefill_args(plan, mask=mask)
                masked += a.custom_mask is not None
                prefill.plan(a.qo_indptr.to(dev), a.kv_indptr.to(dev), a.kv_indices.to(dev),
                             a.kv_last_page_len.to(dev), QH, KVH, DIM, PAGE, causal=a.causal,
                             window_left=a.window_left,
                             custom_mask=None if a.custom_mask is None else a.custom_mask.to(dev),
                             q_data_type=torch.float16)
                theirs = prefill.run(q, pools)
                torch.cuda.synchronize()
                err = (theirs.float() - ours.float()).abs().max().item()
                worst, checks = max(worst, err), checks + 1
                print("chunk %d %-6s hidden=%s custom_mask=%s max|diff|=%.3g" % (
                    chunk, mask, list(zip(plan.vis_sink_end.tolist(), plan.vis_window_start.tolist())),
                    a.custom_mask is not None, err))
                if not err <= TOL:
                    print("why: FlashInfer prefill differs from mstar_kv by %.3g at chunk %d, mask %s"
                          % (err, chunk, mask))
                    return 1
            for s in sessions:
                s.commit_chunk()
        # decode: one query per request after the windows
        arena.admit([(s.request, 1) for s in sessions])
        plan = exact_plan(arena, [(s.request, 1) for s in sessions])
        dplan = st.upload_plan(plan)
        kv = torch.randn(plan.total_q, KVH, DIM, device=dev, dtype=torch.float16)
        st.write_kv(0, dplan, kv, kv)
        q = torch.randn(plan.total_q, QH, DIM, device=dev, dtype=torch.float16)
        ours = st.attention(0, dplan, q, torch.empty_like(q), mask="causal")
        try:
            a = interop.flashinfer_decode_args(plan, mask="causal")
            decode.plan(a.kv_indptr.to(dev), a.kv_indices.to(dev), a.kv_last_page_len.to(dev), QH, KVH, DIM, PAGE,
                        window_left=a.window_left, q_data_type=torch.float16)
            theirs = decode.run(q, pools)
            what = "decode"
        except interop.UnsupportedCase as e:
            refused += 1
            print("decode refused (%s): %s; through prefill with its mask instead" % (e.case, e))
            a = interop.flashinfer_prefill_args(plan, mask="causal")
            prefill.plan(a.qo_indptr.to(dev), a.kv_indptr.to(dev), a.kv_indices.to(dev), a.kv_last_page_len.to(dev),
                         QH, KVH, DIM, PAGE, causal=a.causal, window_left=a.window_left,
                         custom_mask=None if a.custom_mask is None else a.custom_mask.to(dev),
                         q_data_type=torch.float16)
            theirs = prefill.run(q, pools)
            what = "decode via prefill"
        torch.cuda.synchronize()
        err = (theirs.float() - ours.float()).abs().max().item()
        worst, checks = max(worst, err), checks + 1
        print("%s max|diff|=%.3g" % (what, err))
        if not err <= TOL:
            print("why: FlashInfer %s differs from mstar_kv by %.3g" % (what, err))
            return 1
    if not masked:
        print("why: no plan needed a custom_mask: the session hid no key, the check proved nothing")
        return 1
    print("flashinfer %s over mstar_kv pages: %d checks, %d with a custom_mask, %d decode refusals, "
          "worst |diff| %.3g <= %.0e" % (getattr(flashinfer, "__version__", "?"), checks, masked, refused, worst, TOL))
    return 0


if __name__ == "__main__":
    sys.exit(main())
