"""The in-run peer of gpu_bench's chunk-attention figure: PyTorch's
scaled_dot_product_attention on the same shape (bf16, one sequence, contiguous
K/V, non-causal), on each backend PyTorch offers for it; prints the fastest as
"sdpa_tflops X" (4 * head_dim FLOPs per query-head-key triple).
Usage: python3 bench/sdpa_peer.py --q 4680 --k 32760 --heads 12 --dim 128"""
import argparse
import contextlib
import sys

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--q", type=int, default=4680)
    ap.add_argument("--k", type=int, default=32760)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # no PyTorch: gpu_bench prints the figure without its ratio
        print("PyTorch unavailable: %s" % e)
        return 1
    if not torch.cuda.is_available():
        print("PyTorch sees no CUDA device")
        return 1
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(1, a.heads, a.q, a.dim, device=dev, dtype=dt)
    k = torch.randn(1, a.heads, a.k, a.dim, device=dev, dtype=dt)
    v = torch.randn(1, a.heads, a.k, a.dim, device=dev, dtype=dt)
    flops = 4.0 * a.q * a.k * a.heads * a.dim
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        names = ["CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"]
        backends = [(n, getattr(SDPBackend, n)) for n in names if hasattr(SDPBackend, n)]
    except Exception:
        sdpa_kernel, backends = None, [("default", None)]
    best, best_name = 0.0, None
    for name, be in backends:
        try:
            # a with-block leaves the backend selection even when the backend raises:
            # a context left open would restrict every backend tried after it
            with sdpa_kernel([be]) if be is not None else contextlib.nullcontext():
                for _ in range(3):
                    F.scaled_dot_product_attention(q, k, v)
                torch.cuda.synchronize()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                for _ in range(a.iters):
                    F.scaled_dot_product_attention(q, k, v)
                e.record()
                torch.cuda.synchronize()
            t = s.elapsed_time(e) / 1e3 / a.iters
            tf = flops / t / 1e12
            print("backend %s: %.1f TFLOP/s" % (name, tf), file=sys.stderr)
            if tf > best:
                best, best_name = tf, name
        except Exception as ex:
            print("backend %s unavailable: %s" % (name, str(ex).splitlines()[0] if str(ex) else ex), file=sys.stderr)
    if best_name is None:
        print("no SDPA backend ran")
        return 1
    print("sdpa_tflops %.2f" % best)
    return 0

if __name__ == "__main__":
    sys.exit(main())
