#!/usr/bin/python3
"""Plain PyTorch Llama training loop: the peer for bench/train_vs_torch.

Same architecture as scalelab's Llama (GQA, RoPE rotate-half, RMSNorm, SwiGLU, tied
embeddings), fp32, eager attention, AdamW, synthetic data as DESIGN.md defines it.
Prints one JSON line with tokens/s (after warm-up) and peak RSS.
"""
import argparse, json, math, resource, time
import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {
    "llama-small": dict(hidden=512, layers=8, heads=8, kv_heads=2, inter=2048, vocab=32768, theta=500000.0, eps=1e-5),
    "llama-tiny": dict(hidden=64, layers=2, heads=4, kv_heads=2, inter=128, vocab=256, theta=10000.0, eps=1e-5),
}

class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__(); self.weight = nn.Parameter(torch.ones(d)); self.eps = eps
    def forward(self, x):
        v = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(v + self.eps))

def rotate_half(x):
    a, b = x.chunk(2, dim=-1); return torch.cat((-b, a), dim=-1)

class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, nh, nkv = c["hidden"], c["heads"], c["kv_heads"]; hd = h // nh
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.ln1 = RMSNorm(h, c["eps"]); self.ln2 = RMSNorm(h, c["eps"])
        self.q = nn.Linear(h, nh * hd, bias=False); self.k = nn.Linear(h, nkv * hd, bias=False)
        self.v = nn.Linear(h, nkv * hd, bias=False); self.o = nn.Linear(nh * hd, h, bias=False)
        self.g = nn.Linear(h, c["inter"], bias=False); self.u = nn.Linear(h, c["inter"], bias=False)
        self.d = nn.Linear(c["inter"], h, bias=False)
    def forward(self, x, cos, sin, mask):
        B, S, H = x.shape
        y = self.ln1(x)
        q = self.q(y).view(B, S, self.nh, self.hd).transpose(1, 2)
        k = self.k(y).view(B, S, self.nkv, self.hd).transpose(1, 2)
        v = self.v(y).view(B, S, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin; k = k * cos + rotate_half(k) * sin
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=1); v = v.repeat_interleave(rep, dim=1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd) + mask
        p = torch.softmax(s, dim=-1)
        a = (p @ v).transpose(1, 2).reshape(B, S, H)
        x = x + self.o(a)
        y = self.ln2(x)
        return x + self.d(F.silu(self.g(y)) * self.u(y))

class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c["vocab"], c["hidden"])
        self.layers = nn.ModuleList(Block(c) for _ in range(c["layers"]))
        self.norm = RMSNorm(c["hidden"], c["eps"])
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)): nn.init.normal_(m.weight, 0.0, 0.02)
    def forward(self, ids):
        B, S = ids.shape; hd = self.c["hidden"] // self.c["heads"]
        inv = 1.0 / (self.c["theta"] ** (torch.arange(0, hd, 2).float() / hd))
        f = torch.outer(torch.arange(S).float(), inv); emb = torch.cat((f, f), -1)
        cos, sin = emb.cos(), emb.sin()
        mask = torch.full((S, S), float("-inf")).triu(1)
        x = self.embed(ids)
        for l in self.layers: x = l(x, cos, sin, mask)
        return self.norm(x) @ self.embed.weight.t()

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-small"); ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--micro-batch-size", type=int, default=4); ap.add_argument("--max-steps", type=int, default=8)
    ap.add_argument("--warmup-steps", type=int, default=2); ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads); torch.manual_seed(0)
    c = PRESETS[a.model]; m = Llama(c)
    opt = torch.optim.AdamW(m.parameters(), lr=5e-5, weight_decay=0.0)
    g = torch.Generator().manual_seed(0)
    times, losses = [], []
    for step in range(a.max_steps):
        t0 = time.perf_counter()
        d = torch.randint(0, 1000, (a.micro_batch_size, a.seq_len + 1), generator=g)
        logits = m(d[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, c["vocab"]), d[:, 1:].reshape(-1))
        loss.backward(); torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step(); opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0); losses.append(loss.item())
    t = sum(times[a.warmup_steps:]) if a.max_steps > a.warmup_steps else sum(times)
    n = max(1, a.max_steps - a.warmup_steps) if a.max_steps > a.warmup_steps else a.max_steps
    tps = n * a.micro_batch_size * a.seq_len / t
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(dict(peer="pytorch", torch=torch.__version__, tokens_per_s=tps, peak_rss_bytes=rss,
                          step_times=times, losses=losses)))

if __name__ == "__main__":
    main()
