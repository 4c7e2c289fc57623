#!/usr/bin/env python3
"""Finds where a recorded GPU run and the generated schedule free a *different* tensor of the same
size: diff_schedule.py compares sizes (`f 16777216` = `f 16777216`), which cannot tell which of two
equal tensors a free released, yet the allocator's segments depend on it (the freed block's address).

    python3 tools/predict/free_identity.py RUN.events SCHEDULE.txt [--max 12]

Both in the replay form (trace_to_events.py's output; `scalelab plan --stack hf-trainer ...
--schedule-out`). Only large-pool requests (over 1 MiB, rounded to 512 bytes) are compared: the
small pool is separate, so they alone decide the large segments. The two streams are walked side by
side; the first place where the kinds or sizes differ stops the walk, and each free that releases
another allocation (numbered in order among the large ones) is printed with the schedule's labels
of both. Two adjacent frees swapped are harmless (no request comes between them, and freed
neighbours merge the same either way). Standard library only.
"""
import argparse
import sys


def load(path):
    seq, labels, number = [], {}, {}
    n = large = 0
    with open(path) as f:
        for line in f:
            p = line.split()
            if not p or p[0] == "#":
                continue
            if p[0] == "a":
                size = max(512, (int(p[1]) + 511) // 512 * 512)
                if size > 1 << 20:
                    number[n] = large
                    labels[large] = " ".join(p[2:])[:60]
                    seq.append(("a", size))
                    large += 1
                n += 1
            elif p[0] == "f" and int(p[1]) in number:
                seq.append(("f", number[int(p[1])]))
    return seq, labels


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run")
    ap.add_argument("schedule")
    ap.add_argument("--max", type=int, default=12)
    a = ap.parse_args()
    run, _ = load(a.run)
    sched, labels = load(a.schedule)
    print(f"large-pool events: run {len(run)}, schedule {len(sched)}")
    shown = 0
    for k, (x, y) in enumerate(zip(run, sched)):
        if x[0] != y[0] or (x[0] == "a" and x[1] != y[1]):
            print(f"event {k}: the streams part (run {x}, schedule {y}); compare sizes with diff_schedule.py")
            return
        if x[0] == "f" and x[1] != y[1]:
            print(f"event {k}: the run frees allocation {x[1]} [{labels.get(x[1])}], "
                  f"the schedule {y[1]} [{labels.get(y[1])}]")
            shown += 1
            if shown >= a.max:
                return
    if shown == 0:
        print("every free releases the same allocation in both, as far as the streams agree")


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:
        sys.stderr.close()
