#!/usr/bin/env python3
"""A fake nvidia-smi for the telemetry tests (plain python3, no packages).

Answers `--query-gpu=<fields> --format=csv,noheader,nounits [-lms N]` from the JSON file named by
$FAKE_NVIDIA_SMI_DATA:
  {"gpus": [{"index": 0, "uuid": "GPU-...", "name": "..."}, ...],
   "ticks": [[{"utilization.gpu": "10", ...}, ...per gpu], ...],  # one list per loop iteration
   "hold": true,          # after the ticks, repeat the last one until killed (else exit 0)
   "fail": "message"}     # print this and exit 9, as nvidia-smi does without a driver
A field a tick does not give prints as "[N/A]". Without -lms it prints the first tick once.
"""
import json
import os
import sys
import time


def main(argv):
    query = None
    fmt = None
    loop_ms = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--query-gpu="):
            query = a.split("=", 1)[1].split(",")
        elif a.startswith("--format="):
            fmt = a.split("=", 1)[1]
        elif a in ("-lms", "--loop-ms"):
            i += 1
            loop_ms = int(argv[i])
        else:
            print("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.")
            return 2
        i += 1
    if query is None or fmt != "csv,noheader,nounits":
        print("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.")
        return 2
    with open(os.environ["FAKE_NVIDIA_SMI_DATA"]) as f:
        data = json.load(f)
    if "fail" in data:
        print(data["fail"])
        return 9
    gpus = data["gpus"]
    ticks = data.get("ticks") or [[{} for _ in gpus]]

    def emit(tick):
        for gpu, values in zip(gpus, tick):
            cols = []
            for field in query:
                if field in ("index", "uuid", "name"):
                    cols.append(str(gpu[field]))
                else:
                    cols.append(str(values.get(field, "[N/A]")))
            sys.stdout.write(", ".join(cols) + "\n")
        sys.stdout.flush()

    if loop_ms is None:
        emit(ticks[0])
        return 0
    for n, tick in enumerate(ticks):
        if n:
            time.sleep(loop_ms / 1000.0)
        emit(tick)
    if data.get("hold"):
        while True:
            time.sleep(loop_ms / 1000.0)
            emit(ticks[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
