#!/usr/bin/python3
"""The PyTorch baseline of bench-train: the same tiny Llama (dim 128, hidden
352, 4 layers, 4 heads / 2 kv heads, vocab 512, shared classifier,
interleaved RoPE), the same batch shape (4 x 128), AdamW with the same
hyper-parameters and global-norm clipping, on torch's CPU backend with the
thread count of the kiln run.  Written here from the architecture, not
taken from any project.  Prints the same rows as bench-train:
    IMPL MS_PER_STEP TOKENS_PER_S
usage: bench_torch.py [--quick] [--cpu-time]"""
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

DIM, HIDDEN, LAYERS, HEADS, KV, VOCAB, BATCH, SEQ = 128, 352, 4, 4, 2, 512, 4, 128
HD = DIM // HEADS


def rope(x, cos, sin):
    # x [B, T, H, HD]: rotate adjacent pairs (x[2i], x[2i+1])
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        lin = lambda o, i: torch.nn.Linear(i, o, bias=False)
        self.wq, self.wk, self.wv, self.wo = lin(DIM, DIM), lin(KV * HD, DIM), lin(KV * HD, DIM), lin(DIM, DIM)
        self.w1, self.w2, self.w3 = lin(HIDDEN, DIM), lin(DIM, HIDDEN), lin(HIDDEN, DIM)
        self.n1 = torch.nn.Parameter(torch.ones(DIM))
        self.n2 = torch.nn.Parameter(torch.ones(DIM))

    @staticmethod
    def norm(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * g

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        h = self.norm(x, self.n1)
        q = rope(self.wq(h).view(B, T, HEADS, HD), cos, sin)
        k = rope(self.wk(h).view(B, T, KV, HD), cos, sin)
        v = self.wv(h).view(B, T, KV, HD)
        k = k.repeat_interleave(HEADS // KV, dim=2)
        v = v.repeat_interleave(HEADS // KV, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(HD) + mask
        a = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, DIM)
        x = x + self.wo(a)
        h = self.norm(x, self.n2)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, DIM)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.nf = torch.nn.Parameter(torch.ones(DIM))
        freqs = 10000.0 ** (-torch.arange(0, HD, 2).float() / HD)
        ang = torch.arange(SEQ).float()[:, None] * freqs[None, :]
        self.cos = ang.cos()[None, :, None, :]
        self.sin = ang.sin()[None, :, None, :]
        self.mask = torch.full((SEQ, SEQ), float("-inf")).triu(1)

    def forward(self, tok, tgt):
        x = self.emb(tok)
        for b in self.blocks:
            x = b(x, self.cos, self.sin, self.mask)
        logits = Block.norm(x, self.nf) @ self.emb.weight.t()
        return F.cross_entropy(logits.view(-1, VOCAB), tgt.view(-1), ignore_index=-1)


def main():
    steps = 20
    clock = time.perf_counter
    for a in sys.argv[1:]:
        if a == "--quick":
            steps = 4
        elif a == "--cpu-time":
            clock = time.process_time
        else:
            print(__doc__, file=sys.stderr)
            return 2
    torch.set_num_threads(int(os.environ.get("KK_CPU_THREADS", "1")))
    torch.manual_seed(1)
    m = Llama()
    decay = [p for n, p in m.named_parameters() if p.dim() == 2]
    nodecay = [p for n, p in m.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": nodecay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    g = torch.Generator().manual_seed(7)
    tok = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    tgt = torch.roll(tok, -1, 1)
    tgt[:, -1] = -1

    def step():
        opt.zero_grad(set_to_none=True)
        loss = m(tok, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        return loss

    with torch.no_grad():
        m(tok, tgt)
    step()
    t0 = clock()
    with torch.no_grad():
        for _ in range(steps):
            m(tok, tgt)
    fwd = (clock() - t0) / steps
    t0 = clock()
    for _ in range(steps):
        step()
    st = (clock() - t0) / steps
    toks = BATCH * SEQ
    print(f"torch-{torch.__version__}-forward {fwd * 1e3:.2f} {toks / fwd:.0f}")
    print(f"torch-{torch.__version__}-train-step {st * 1e3:.2f} {toks / st:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
