#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention alone, forward and forward+backward, on the GPU, for the
attention shape of a training step (default: llama-3.2-1b at micro-batch 8, seq 1024: 32 query
heads, 8 KV heads, head_dim 64, bf16, causal), per backend PyTorch offers (flash, cuDNN,
efficient). scalelab's own per-call times for the same shape come from `scalelab train --profile`
(attention forward / backward per call); bench/gpu/run.sh prints both.

    python3 bench/gpu/attention_op.py [--batch 8 --seq 1024 --heads 32 --kv-heads 8 --head-dim 64]

Time: CUDA events, median of --iters after --warmup; FLOPs counted for the causal half:
forward 2·2·B·H·S²·D/2, backward 2.5× the forward.
"""
import argparse
import statistics

import torch
import torch.nn.functional as F


def timed(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    B, S, H, KV, D = a.batch, a.seq, a.heads, a.kv_heads, a.head_dim
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(B, H, S, D, device=dev, dtype=dt, requires_grad=True)
    k = torch.randn(B, KV, S, D, device=dev, dtype=dt, requires_grad=True)
    v = torch.randn(B, KV, S, D, device=dev, dtype=dt, requires_grad=True)
    do = torch.randn(B, H, S, D, device=dev, dtype=dt)
    fwd_flops = 2 * 2 * B * H * S * S * D / 2
    from torch.nn.attention import SDPBackend, sdpa_kernel
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}: B={B} S={S} H={H} KV={KV} D={D} bf16 causal")
    print(f"{'backend':<12} {'fwd ms':>8} {'fwd+bwd ms':>11} {'bwd ms':>8} {'fwd TFLOP/s':>12} {'bwd TFLOP/s':>12}")
    for name, be in [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                     ("efficient", SDPBackend.EFFICIENT_ATTENTION)]:
        try:
            with sdpa_kernel(be):
                f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                tf = timed(f, a.warmup, a.iters)

                def fb():
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                    o.backward(do)
                tfb = timed(fb, a.warmup, a.iters)
            tb = tfb - tf
            print(f"{name:<12} {tf:8.3f} {tfb:11.3f} {tb:8.3f} {fwd_flops / tf / 1e9:12.1f} {2.5 * fwd_flops / tb / 1e9:12.1f}")
        except Exception as e:  # noqa: BLE001 - a backend PyTorch cannot run here
            print(f"{name:<12} unavailable: {type(e).__name__}: {str(e).splitlines()[0][:100]}")


if __name__ == "__main__":
    main()
