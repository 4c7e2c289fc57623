#!/usr/bin/env python3
"""Turns a caching-allocator event history from bench/gpu/hf_memory.py --trace (NAME.trace.json.gz)
into the plain-text replay golden that tests/predict/trace_replay_test.cpp feeds to the allocator
replica: one line per request, `a BYTES` (an allocation, numbered from 0 in order) or `f N` (the
free of allocation N); `s ADDR` before an allocation for which the GPU's allocator cudaMalloc'd a
new segment (the base address the driver gave it); the trace's phase markers (hf_memory.py's
`train`, `forward`, `forward_end`, `backward`, ..., `step_end`) as `# PHASE` comment lines where
they fell, so that the requests can be compared phase by phase with the generated schedule
(`scalelab plan --stack hf-trainer ... --schedule-out`); all after a header with the measured
torch.cuda.max_memory_reserved of that run (from hf_memory.jsonl beside the trace). The first
request and free (`a 4`, `f 0`) are the 4-byte torch.empty(1) that created the CUDA context
before the recording started: a temporary, freed at once, so the recording starts with that 2 MiB
small-pool segment cached and empty (the GPU's first small blocks sit at its offset 0).

    python3 tools/predict/trace_to_events.py TRACE.json.gz OUT.events
"""
import gzip
import json
import sys


def main():
    src, dst = sys.argv[1], sys.argv[2]
    d = json.load(gzip.open(src, "rt"))
    import os
    name = os.path.basename(src).replace(".trace.json.gz", "")
    measured = None
    for line in open(os.path.join(os.path.dirname(src), "hf_memory.jsonl")):
        r = json.loads(line)
        if r["name"] == name:
            measured = r["max_reserved_bytes"]
    live, n, out = {}, 1, ["a 4", "f 0"]
    reserved = allocated = peak_r = peak_a = 0
    sizes = {}
    markers = sorted(d.get("markers", []))
    mi = 0
    for t, action, size, addr, stream in d["events"]:
        while mi < len(markers) and markers[mi][0] <= t:
            out.append(f"# {markers[mi][1]}")
            mi += 1
        if action == "segment_alloc":
            out.append(f"s {addr}")
            reserved += size
            peak_r = max(peak_r, reserved)
        elif action == "segment_free":
            reserved -= size
        elif action == "alloc":
            live[addr] = n
            sizes[n] = size
            out.append(f"a {size}")
            n += 1
        elif action == "free_completed":
            i = live.pop(addr)
            out.append(f"f {i}")
    out.extend(f"# {m[1]}" for m in markers[mi:])
    tmp = dst + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"# replay of {name}: {n} allocations; torch.cuda.max_memory_reserved measured by hf_memory.py\n")
        f.write(f"max_reserved {measured}\n")
        f.write("\n".join(out) + "\n")
    os.replace(tmp, dst)


if __name__ == "__main__":
    main()
