"""kernels/bench/cuda_torch.py — PyTorch baselines for kernels/bench/cuda-bench.

Times, on the same GPU and shapes as cuda-bench, torch.matmul (bf16),
F.scaled_dot_product_attention restricted to its flash backend (causal, bf16,
head dim 128, GQA 32/8 with K/V expanded outside the timed region), the
same SDPA for one query token per sequence over a contiguous (not paged)
K/V cache as the decode baseline (GQA through enable_gqa where torch has
it, else expanded K/V, which reads 4x the bytes), and an
RMSNorm (torch's fused F.rms_norm where it exists, else the usual
x * rsqrt(mean(x^2) + eps) * w).  Prints "key milliseconds" lines that
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

x = torch.randn(16384, 4096, device=dev, dtype=bf16)
w = torch.randn(4096, device=dev, dtype=bf16)
if hasattr(F, "rms_norm"):
    emit("rmsnorm:16384x4096", timeit(lambda: F.rms_norm(x, (4096,), w, 1e-5)))
else:
    def rms():
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(bf16) * w
    emit("rmsnorm:16384x4096", timeit(rms))
del x, w


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
