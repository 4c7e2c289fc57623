"""Generates tests/profile/data/torch_cpu_trace.json: a PyTorch profiler Chrome trace
(torch.profiler.profile(...).export_chrome_trace) of three optimizer steps of a tiny MLP on the
CPU, with a profiler schedule so that the steps carry "ProfilerStep#N" annotations.

Run with PyPI torch (CPU is enough):  python tests/profile/data/make_torch_trace.py
The test (tests/profile/summary_test.cpp) recomputes what it checks from the file itself, so a
regenerated trace with other timings still passes."""
import os

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(16, 64)

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_cpu_trace.json")
with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=3, repeat=1)) as prof:
    for _ in range(4):
        with record_function("train_step"):
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        prof.step()
prof.export_chrome_trace(out)
print("wrote", out, os.path.getsize(out), "bytes")
