"""A small Wan-style causal video DiT in PyTorch, generating block by block
with mstar_kv's paged KV cache, checked against the same model with the
contiguous rolling cache research code keeps (plain torch).

What it shows, in the order research code (Self-Forcing's CausalWanModel
and its inference pipeline) does it:
  - the retention from the model's own parameters (local_attn_size frames
    incl. the block being generated, sink_size frames, frames per block);
  - an arena sized by mk.pages_needed (the page size, 8, does not divide a
    frame's 12 tokens: visibility is token-exact anyway);
  - per-layer handles, kv_cache[i], where the research dicts stood: the
    model calls kv_cache[i].attention(q, k, v, current_start=...) and
    crossattn_cache[i].cross_attention(q); the same current_start again
    (denoise steps, the clean pass) overwrites the open block, a new one
    commits it; RoPE (Wan's interleaved 3-D) goes on q and k inside;
  - classifier-free guidance as a batch of two requests in one plan, the
    text K/V of each in a sealed keyed entry;
  - offload and reload of both requests between blocks.
Random weights. Prints the pages in use after every block (flat once the
window is full) and the largest difference from the rolling cache.

    python python/examples/causal_video_dit.py [--device cpu|cuda] [--blocks 13]
"""
import argparse
import math

import torch

import mstar_kv as mk

# geometry: latents [frames, C, H, W], 2x2 patches -> a 3 x 4 token grid per frame
C, H, W, PATCH = 4, 6, 8, 2
GH, GW = H // PATCH, W // PATCH
TPF = GH * GW                                  # 12 tokens per latent frame
HEADS, HD = 4, 16                              # Wan: as many K/V heads as query heads
D = HEADS * HD
LAYERS = 2
TEXT_TOKENS, TEXT_DIM = 8, 24
# the research parameters
LOCAL_ATTN_SIZE, SINK_SIZE, FRAMES_PER_BLOCK = 7, 1, 2
BLOCK = FRAMES_PER_BLOCK * TPF                 # 24 tokens per block
PAGE = 8
STEPS = (1.0, 0.6, 0.3)                        # denoise timesteps, then the clean pass at t = 0
GUIDANCE = 3.0


# ---- the model ----------------------------------------------------------------------------------

def _lin(g, i, o):
    return torch.randn((i, o), generator=g, dtype=torch.float64).float() / math.sqrt(i)


class Block:
    """One Wan-style block: adaLN modulation from the timestep, self-attention
    (RMS-normed q, k; 3-D RoPE), cross-attention to the text, an MLP."""

    def __init__(self, g):
        self.mod = _lin(g, D, 6 * D) * 0.1
        self.wq, self.wk, self.wv, self.wo = (_lin(g, D, D) for _ in range(4))
        self.wqc, self.woc = _lin(g, D, D), _lin(g, D, D)
        self.wkc, self.wvc = _lin(g, TEXT_DIM, D), _lin(g, TEXT_DIM, D)
        self.w1, self.w2 = _lin(g, D, 2 * D), _lin(g, 2 * D, D)

    def text_kv(self, text):                   # [B, L, TEXT_DIM] -> k, v [B, L, HEADS, HD]
        b = text.shape[0]
        return ((text @ self.wkc).reshape(b, TEXT_TOKENS, HEADS, HD).contiguous(),
                (text @ self.wvc).reshape(b, TEXT_TOKENS, HEADS, HD).contiguous())

    def __call__(self, x, e, current_start, self_cache, cross_cache):
        b, n, _ = x.shape
        sh1, sc1, g1, sh2, sc2, g2 = (e @ self.mod).chunk(6, dim=-1)
        h = _ln(x) * (1 + sc1) + sh1
        q = _rms(h @ self.wq).reshape(b, n, HEADS, HD)
        k = _rms(h @ self.wk).reshape(b, n, HEADS, HD)
        v = (h @ self.wv).reshape(b, n, HEADS, HD)
        x = x + g1 * (self_cache.attention(q, k, v, current_start=current_start).reshape(b, n, D) @ self.wo)
        qc = (_ln(x) @ self.wqc).reshape(b, n, HEADS, HD)
        x = x + cross_cache.cross_attention(qc).reshape(b, n, D) @ self.woc
        h = _ln(x) * (1 + sc2) + sh2
        return x + g2 * (torch.nn.functional.gelu(h @ self.w1, approximate="tanh") @ self.w2)


def _ln(x):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), eps=1e-6)


def _rms(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class CausalDiT:
    def __init__(self, seed=2024):
        g = torch.Generator().manual_seed(seed)
        pdim = C * PATCH * PATCH
        self.embed, self.head = _lin(g, pdim, D), _lin(g, D, pdim)
        self.t1, self.t2 = _lin(g, 32, D), _lin(g, D, D)
        self.blocks = [Block(g) for _ in range(LAYERS)]
        self.text = torch.randn((2, TEXT_TOKENS, TEXT_DIM), generator=g)   # [prompt, negative prompt]

    def to(self, device):
        for obj in [self] + self.blocks:
            for name, value in list(vars(obj).items()):
                if isinstance(value, torch.Tensor):
                    setattr(obj, name, value.to(device))
        return self

    def t_embed(self, t):
        f = torch.exp(-math.log(1000.0) * torch.arange(16, dtype=torch.float64) / 16)
        e = torch.cat([torch.cos(t * 1000 * f), torch.sin(t * 1000 * f)]).float().to(self.t1.device)
        return torch.nn.functional.gelu(e @ self.t1, approximate="tanh") @ self.t2

    def __call__(self, x, t, current_start, kv_cache, crossattn_cache):
        """x [B, frames, C, H, W] at time t; current_start: the block's first token."""
        b, f = x.shape[:2]
        tok = _patchify(x) @ self.embed
        e = self.t_embed(t)
        for i, blk in enumerate(self.blocks):
            tok = blk(tok, e, current_start, kv_cache[i], crossattn_cache[i])
        return _unpatchify(_ln(tok) @ self.head, f)


def _patchify(x):                              # [B, F, C, H, W] -> [B, F*GH*GW, C*P*P]
    b, f = x.shape[:2]
    x = x.reshape(b, f, C, GH, PATCH, GW, PATCH).permute(0, 1, 3, 5, 2, 4, 6)
    return x.reshape(b, f * TPF, C * PATCH * PATCH).contiguous()


def _unpatchify(t, f):
    b = t.shape[0]
    x = t.reshape(b, f, GH, GW, C, PATCH, PATCH).permute(0, 1, 4, 2, 5, 3, 6)
    return x.reshape(b, f, C, H, W).contiguous()


# ---- the reference: research's contiguous rolling cache, in plain torch --------------------------

def wan_rope(x, start_frame):
    """Wan's causal rope_apply: adjacent channel pairs as complex numbers,
    head_dim split into frame, row, col parts, theta 10000."""
    n = x.shape[1]
    c = HD // 2
    parts = (c - 2 * (c // 3), c // 3, c // 3)
    j = torch.arange(n, device=x.device)
    pos = (start_frame + j // TPF, (j % TPF) // GW, j % GW)
    angles = []
    for axis, p in enumerate(parts):
        freq = 1.0 / (10000.0 ** (torch.arange(p, dtype=torch.float64, device=x.device) * 2 / (2 * p)))
        angles.append(pos[axis].to(torch.float64)[:, None] * freq[None])
    rot = torch.polar(torch.ones_like(torch.cat(angles, 1)), torch.cat(angles, 1))      # [n, c]
    xc = torch.view_as_complex(x.to(torch.float64).reshape(*x.shape[:-1], c, 2).contiguous())
    return torch.view_as_real(xc * rot[None, :, None, :]).reshape(x.shape).float()


def _sdpa(q, k, v):                            # [B, n, H, D] x [B, m, H, D]
    s = torch.einsum("bnhd,bmhd->bhnm", q, k) / math.sqrt(HD)
    return torch.einsum("bhnm,bmhd->bnhd", s.softmax(-1), v)


class RollingLayer:
    """kv_cache[i] as research code keeps it: a contiguous buffer holding the
    sink frames and the most recent frames, rolled by copying; the same
    current_start overwrites the block, a new one keeps the previous."""

    def __init__(self, text_k, text_v, batch):
        self.k = self.v = None
        self.kept_end = 0                      # tokens committed
        self.open = None                       # (start, k, v) of the block being written
        self.text_k, self.text_v = text_k, text_v
        self.sink = SINK_SIZE * TPF
        self.size = LOCAL_ATTN_SIZE * TPF      # keys attended: the cache, the block included

    def _commit(self):
        start, k, v = self.open
        self.k = k if self.k is None else torch.cat([self.k, k], 1)
        self.v = v if self.v is None else torch.cat([self.v, v], 1)
        keep = self.size - BLOCK               # room left for the next block
        if self.k.shape[1] > keep:
            cut = self.k.shape[1] - keep
            self.k = torch.cat([self.k[:, :self.sink], self.k[:, self.sink + cut:]], 1)
            self.v = torch.cat([self.v[:, :self.sink], self.v[:, self.sink + cut:]], 1)
        self.kept_end = start + k.shape[1]
        self.open = None

    def attention(self, q, k, v, current_start):
        if self.open is not None and current_start != self.open[0]:
            self._commit()
        frame = current_start // TPF
        q, k = wan_rope(q, frame), wan_rope(k, frame)
        self.open = (current_start, k, v)
        keys = k if self.k is None else torch.cat([self.k, k], 1)
        vals = v if self.v is None else torch.cat([self.v, v], 1)
        return _sdpa(q, keys, vals)

    def cross_attention(self, q):
        return _sdpa(q, self.text_k, self.text_v)

    def finish(self):
        if self.open is not None:
            self._commit()


# ---- generation -----------------------------------------------------------------------------------

def generate(model, kv_cache, crossattn_cache, blocks, between_blocks=None, device="cpu"):
    """Self-Forcing's inference loop: per block, denoise from noise with the
    same current_start at every step, then a clean pass at t = 0 whose K/V
    are the ones kept. CFG: sample 0 with the prompt, sample 1 without."""
    outs = []
    for blk in range(blocks):
        current_start = blk * BLOCK
        g = torch.Generator().manual_seed(100 + blk)
        x = torch.randn((1, FRAMES_PER_BLOCK, C, H, W), generator=g).to(device).expand(2, -1, -1, -1, -1)
        for i, t in enumerate(STEPS):
            t_next = STEPS[i + 1] if i + 1 < len(STEPS) else 0.0
            vel = model(x, t, current_start, kv_cache, crossattn_cache)
            guided = vel[1] + GUIDANCE * (vel[0] - vel[1])
            x = (x + (t_next - t) * guided).contiguous()
        model(x, 0.0, current_start, kv_cache, crossattn_cache)      # the clean pass
        outs.append(x[0])
        if between_blocks is not None:
            between_blocks(blk)
    return torch.stack(outs)


def run(device="cpu", blocks=13, verbose=True):
    """Both caches over `blocks` blocks; returns (max error, pages in use after each block, offloaded pages)."""
    model = CausalDiT().to(device)
    text_kv = [blk.text_kv(model.text) for blk in model.blocks]

    # the reference
    ref_layers = [RollingLayer(k, v, 2) for k, v in text_kv]
    with torch.no_grad():
        ref = generate(model, ref_layers, ref_layers, blocks, device=device)

    # mstar_kv: the retention from the research parameters, an arena sized for it
    retention = mk.Retention.from_research(local_attn_size=LOCAL_ATTN_SIZE, sink_size=SINK_SIZE,
                                           frames_per_block=FRAMES_PER_BLOCK, tokens_per_frame=TPF)
    pages = mk.pages_needed(retention, block_tokens=BLOCK, page_size=PAGE, batch=2, extra_tokens=TEXT_TOKENS)
    store = cu = None
    if device == "cuda":
        cu = mk.Cuda()
        store = mk.CudaStore(cu, num_pages=pages, page_size=PAGE, num_layers=LAYERS, kv_heads=HEADS, head_dim=HD,
                             dtype="f16")   # the GPU attends in f16 / bf16: f32 q and K/V are converted
        arena = store.arena()
    else:
        arena = mk.Arena(num_pages=pages, page_size=PAGE, num_layers=LAYERS, kv_heads=HEADS, head_dim=HD)
    cpu = mk.Cpu() if device == "cpu" else None
    cache = mk.CausalKVCache(arena, retention, batch=2, grid=(GH, GW), rope=mk.Rope("3d", style="interleaved"),
                             cpu=cpu)
    cache.write_text([k for k, _ in text_kv], [v for _, v in text_kv])
    offloaded = []

    def park(blk):                                   # offload both samples between blocks, then reload
        cache.offload()
        offloaded.append(arena.stats().offloaded_pages)
        cache.reload()

    with torch.no_grad():
        out = generate(model, cache.layers, cache.layers, blocks, between_blocks=park, device=device)
    cache.finish()
    err = float((out - ref).abs().max())
    per_block = list(cache.pages_per_block)
    if verbose:
        print("arena: %d pages of %d tokens for %r, batch 2" % (pages, PAGE, retention))
        print("pages in use after each block:", " ".join(str(p) for p in per_block))
        print("max |mstar_kv - rolling cache| = %.3g over %d blocks (%s)" % (err, blocks, device))
    arena.close()
    if cpu is not None:
        cpu.close()
    if store is not None:
        store.close()
        cu.close()
    return err, per_block, offloaded, (out, ref)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() and mk.cuda_probe()[0] else "cpu")
    p.add_argument("--blocks", type=int, default=13)
    p.add_argument("--threads", type=int, default=1,
                   help="torch (and so mk.Cpu()) threads; a model this small runs fastest on one")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    err = run(a.device, a.blocks)[0]
    return 0 if err <= (1e-5 if a.device == "cpu" else 5e-2) else 1   # f32 on the CPU, f16 on the GPU


if __name__ == "__main__":
    raise SystemExit(main())
