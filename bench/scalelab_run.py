"""What the side-by-side benches of the trainer share: one `scalelab <subcommand>` run read back
from its run record, and a part of the record's memory plan (imported by lora_vs_full.py,
qlora_vs_lora.py, qat_vs_plain.py and dpo_vs_lora.py, which run from this folder)."""
import json
import os
import subprocess
import tempfile


def run(build, args, common, cmd="train"):
    """Runs `<build>/scalelab <cmd> <common> <args> --quiet --json FILE` and returns the record."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    try:
        subprocess.run([os.path.join(build, "scalelab"), cmd] + common + args + ["--quiet", "--json", path],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(path) as f:
            return json.load(f)
    finally:
        os.unlink(path)


def part(record, name):
    """Bytes of the memory plan's item `name` ("weights", "optimizer states", ...); 0 when absent."""
    for it in record["memory_plan"]["items"]:
        if it["name"] == name:
            return it["bytes"]
    return 0
