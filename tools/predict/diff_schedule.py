#!/usr/bin/env python3
"""Compares a recorded GPU run's allocation requests with the generated schedule's, phase by phase.

    python3 tools/predict/trace_to_events.py RUN.trace.json.gz run.events
    ./build/scalelab plan --stack hf-trainer ... --steps 3 --schedule-out sched.txt
    python3 tools/predict/diff_schedule.py run.events sched.txt [--min-bytes 1048576] [--max 40]
    python3 tools/predict/free_identity.py run.events sched.txt   # then: which tensor each free releases

Both files are in the replay form (`a BYTES [CATEGORY LABEL]`, `f N`, `# PHASE`). The run's
phase markers are mapped onto the schedule's phases (train -> load, forward_end -> forward,
backward_end -> clip_grad_norm, optimizer_step_end -> zero_grad); within each phase of each step
the two sequences of events, each an allocation or a free written with its size rounded to the
allocator's 512 bytes (`a 8388608`, `f 8388608`), are aligned (difflib) and what differs is printed,
with the schedule's labels. --min-bytes hides the differences that touch only smaller requests.
Standard library only.
"""
import argparse
import difflib
import os
import sys

RUN_PHASES = {"train": "load", "forward_end": "forward", "backward_end": "clip_grad_norm",
              "optimizer_step_end": "zero_grad"}


def rounded(n):
    return max(512, (n + 511) // 512 * 512)


def parse(path, recorded):
    phases = [["load", []]]
    sizes, labels = [], []
    with open(path) as f:
        for ln, line in enumerate(f, 1):
            p = line.split()
            if not p:
                continue
            if p[0] == "#":
                if len(p) != 2 or not p[1].replace("_", "").isalpha():
                    continue  # a header comment
                name = RUN_PHASES.get(p[1], p[1]) if recorded else p[1]
                if name != phases[-1][0]:
                    phases.append([name, []])
            elif p[0] == "a":
                sizes.append(rounded(int(p[1])))
                labels.append(" ".join(p[2:]))
                phases[-1][1].append(("a", sizes[-1], len(sizes) - 1))
            elif p[0] == "f":
                i = int(p[1])
                if i >= len(sizes):
                    sys.exit(f"{path}:{ln}: frees allocation {i}, which is not made yet")
                phases[-1][1].append(("f", sizes[i], i))
    return phases, labels


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", help="the recorded run (trace_to_events.py's output)")
    ap.add_argument("schedule", help="the schedule (plan --schedule-out)")
    ap.add_argument("--min-bytes", type=int, default=0)
    ap.add_argument("--max", type=int, default=40, help="differences printed per phase")
    a = ap.parse_args()
    for p in (a.run, a.schedule):
        if not os.path.isfile(p):
            print(f"diff_schedule.py: no file {p}", file=sys.stderr)
            sys.exit(2)
    run, _ = parse(a.run, True)
    sched, labels = parse(a.schedule, False)
    if [p for p, _ in run] != [p for p, _ in sched]:
        print("the phases differ:\n  run:      " + " ".join(p for p, _ in run) +
              "\n  schedule: " + " ".join(p for p, _ in sched), file=sys.stderr)
        sys.exit(2)
    step = 0
    for (phase, r), (_, s) in zip(run, sched):
        step += phase == "forward"
        ra = [f"{k} {n}" for k, n, _ in r]
        sa = [f"{k} {n}" for k, n, _ in s]
        ops = [o for o in difflib.SequenceMatcher(None, ra, sa, autojunk=False).get_opcodes() if o[0] != "equal"]
        ops = [o for o in ops if any(r[i][1] >= a.min_bytes for i in range(o[1], o[2])) or
               any(s[j][1] >= a.min_bytes for j in range(o[3], o[4]))]
        print(f"== step {step} {phase}: run {len(ra)} events, schedule {len(sa)}, {len(ops)} differences")
        for tag, i1, i2, j1, j2 in ops[:a.max]:
            print(f"  {tag} run@{i1}: {' '.join(ra[i1:i2][:8])}{' ...' if i2 - i1 > 8 else ''}")
            print(f"     schedule@{j1}: " + "; ".join(f"{sa[j]} [{labels[s[j][2]]}]" for j in range(j1, min(j2, j1 + 8))) +
                  (" ..." if j2 - j1 > 8 else ""))


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:  # piped into head
        sys.stderr.close()
