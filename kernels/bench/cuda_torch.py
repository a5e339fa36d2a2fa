"""kernels/bench/cuda_torch.py — PyTorch baselines for kernels/bench/cuda-bench.

Times, on the same GPU and shapes as cuda-bench, torch.matmul (bf16),
F.scaled_dot_product_attention restricted to its flash backend (causal, bf16,
head dim 128, GQA 32/8 with K/V expanded outside the timed region), the
same SDPA for one query token per sequence over a contiguous (not paged)
K/V cache as the decode baseline (GQA through enable_gqa where torch has
it, else expanded K/V, which reads 4x the bytes), and the
memory-bound ops of cuda-bench as eager PyTorch writes them: RMSNorm
(torch's fused F.rms_norm where it exists, else x * rsqrt(mean(x^2) + eps)
* w), with a residual add, and its backward through autograd; LayerNorm
forward and backward; SiLU, GELU (tanh), SwiGLU (F.silu(g) * u); a
bf16 -> f32 cast; softmax; cross-entropy (reduction='none'); RoPE
half-split (x * cos + rotate_half(x) * sin with cos/sin precomputed);
embedding; fused AdamW (torch.optim.AdamW(fused=True) on f32 params and
f32 grads: 28 bytes per parameter, the same as kk's bf16-grad, bf16-copy
step); the gradient norm (torch.linalg.vector_norm); int8 weight-only GEMV
(torch._weight_int8pack_mm, where this torch has it).  Prints "key milliseconds" lines that
cuda-bench --torch FILE reads.  Exits 0 without output when torch or CUDA is
missing.
"""
import sys

try:
    import torch
    import torch.nn.functional as F
except Exception:
    sys.exit(0)
if not torch.cuda.is_available():
    sys.exit(0)

quick = "--quick" in sys.argv
dev = "cuda"
bf16 = torch.bfloat16


def timeit(fn, min_iters=10, min_s=0.3):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    iters, total = 0, 0.0
    while iters < min_iters or total < min_s * 1e3:
        start.record()
        for _ in range(min_iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        total += start.elapsed_time(end)
        iters += min_iters
    return total / iters


def emit(key, ms):
    print(f"{key} {ms:.4f}", flush=True)


for m, n, k in [(8192, 8192, 8192), (4096, 4096, 4096), (16, 4096, 4096)]:
    a = torch.randn(m, k, device=dev, dtype=bf16)
    b = torch.randn(n, k, device=dev, dtype=bf16)
    emit(f"gemm:{m}x{n}x{k}", timeit(lambda: torch.matmul(a, b.t())))
    del a, b

def bwd_timer(fn, inputs):
    """Time the backward of fn(*inputs) for a fixed upstream gradient."""
    out = fn(*inputs)
    g = torch.randn_like(out)
    return timeit(lambda: torch.autograd.grad(out, inputs, g, retain_graph=True))


R, D = 16384, 4096
x = torch.randn(R, D, device=dev, dtype=bf16)
res = torch.randn(R, D, device=dev, dtype=bf16)
w = torch.randn(D, device=dev, dtype=bf16)
b = torch.randn(D, device=dev, dtype=bf16)


def rms(t):
    if hasattr(F, "rms_norm"):
        return F.rms_norm(t, (D,), w, 1e-5)
    tf = t.float()
    return (tf * torch.rsqrt(tf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(bf16) * w


emit(f"rmsnorm:{R}x{D}", timeit(lambda: rms(x)))
emit(f"rmsnorm_res:{R}x{D}", timeit(lambda: rms(x + res)))
emit(f"layernorm:{R}x{D}", timeit(lambda: F.layer_norm(x, (D,), w, b, 1e-5)))
xg = x.detach().clone().requires_grad_(True)
emit(f"rmsnorm_bwd:{R}x{D}", bwd_timer(rms, (xg,)))
emit(f"layernorm_bwd:{R}x{D}", bwd_timer(lambda t: F.layer_norm(t, (D,), w, b, 1e-5), (xg,)))
del x, res, xg

N = (16384, 11008)
g_ = torch.randn(*N, device=dev, dtype=bf16)
u_ = torch.randn(*N, device=dev, dtype=bf16)
emit("silu:16384x11008", timeit(lambda: F.silu(g_)))
emit("gelu:16384x11008", timeit(lambda: F.gelu(g_, approximate="tanh")))
emit("swiglu:16384x11008", timeit(lambda: F.silu(g_) * u_))
emit("cast:16384x11008", timeit(lambda: g_.float()))
del g_, u_

lg = torch.randn(4096, 32000, device=dev, dtype=bf16)
tg = torch.randint(0, 32000, (4096,), device=dev)
emit("softmax:4096x32000", timeit(lambda: torch.softmax(lg, -1)))
emit("xent:4096x32000", timeit(lambda: F.cross_entropy(lg, tg, reduction="none")))
del lg, tg

q = torch.randn(16384, 32, 128, device=dev, dtype=bf16)
pos = torch.arange(16384, device=dev) % 8192
inv = 10000.0 ** (-torch.arange(0, 128, 2, device=dev, dtype=torch.float32) / 128)
ang = pos[:, None].float() * inv[None, :]
cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :].to(bf16)
sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None, :].to(bf16)


def rope():
    x1, x2 = q[..., :64], q[..., 64:]
    return q * cos + torch.cat([-x2, x1], -1) * sin


emit("rope:16384x32x128", timeit(rope))
del q

table = torch.randn(128256, 4096, device=dev, dtype=bf16)
ids = (torch.arange(16384, device=dev) * 7919) % 128256
emit("embed:16384x4096", timeit(lambda: F.embedding(ids, table)))
del table

n = 100 << 20
p = torch.nn.Parameter(torch.randn(n, device=dev))
p.grad = torch.randn(n, device=dev)
try:
    opt = torch.optim.AdamW([p], lr=1e-4, fused=True)
    emit("adamw:100M", timeit(opt.step))
except Exception as e:  # no fused AdamW in this torch
    print(f"# fused adamw: {e}", file=sys.stderr)
gb = torch.randn(n, device=dev, dtype=bf16)
emit("gradnorm:100M", timeit(lambda: torch.linalg.vector_norm(gb)))
del p, gb

if hasattr(torch, "_weight_int8pack_mm"):
    wq = torch.randint(-127, 128, (14336, 4096), device=dev, dtype=torch.int8)
    sc = torch.rand(14336, device=dev, dtype=bf16)
    for m in (1, 4, 8):
        xm = torch.randn(m, 4096, device=dev, dtype=bf16)
        try:
            emit(f"qgemv_i8:14336x4096m{m}", timeit(lambda: torch._weight_int8pack_mm(xm, wq, sc)))
        except Exception as e:
            print(f"# int8pack_mm: {e}", file=sys.stderr)
            break
    del wq


def sdpa_flash():
    try:
        from torch.nn.attention import sdpa_kernel, SDPBackend
        return sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    except Exception:
        return torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False,
                                              enable_mem_efficient=False)


for T in ([1024] if quick else [1024, 4096, 16384]):
    q = torch.randn(1, 32, T, 128, device=dev, dtype=bf16, requires_grad=True)
    k = torch.randn(1, 8, T, 128, device=dev, dtype=bf16).repeat_interleave(4, dim=1)
    v = torch.randn(1, 8, T, 128, device=dev, dtype=bf16).repeat_interleave(4, dim=1)
    k.requires_grad_(True)
    v.requires_grad_(True)
    try:
        with sdpa_flash():
            emit(f"attn:{T}", timeit(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)))
            if T == 4096:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                g = torch.randn_like(o)
                emit(f"attnbwd:{T}", timeit(lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True)))
    except Exception as e:  # no flash kernel for this GPU/torch build
        print(f"# sdpa flash T={T}: {e}", file=sys.stderr)
    del q, k, v


# Decode: one query token per sequence over ctx keys (cuda-bench's paged
# decode rows).  torch has no paged cache: contiguous K/V [ns, 8, ctx, 128].
for ns, ctx in ([(1, 32768), (8, 4096)] if quick else [(1, 32768), (8, 4096), (8, 32768), (32, 4096)]):
    q = torch.randn(ns, 32, 1, 128, device=dev, dtype=bf16)
    k = torch.randn(ns, 8, ctx, 128, device=dev, dtype=bf16)
    v = torch.randn(ns, 8, ctx, 128, device=dev, dtype=bf16)
    try:
        try:
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            fn = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        except TypeError:  # torch < 2.5: no enable_gqa
            ke, ve = k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1)
            fn = lambda: F.scaled_dot_product_attention(q, ke, ve)
        emit(f"decode:{ns}x{ctx}", timeit(fn))
    except Exception as e:
        print(f"# sdpa decode {ns}x{ctx}: {e}", file=sys.stderr)
    del q, k, v
