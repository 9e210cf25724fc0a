"""`make bench`: the peer comparison, then every benchmark in turn, each printing its figures.

The comparison goes first: the benchmarks create and delete thousands of files, and on a disk
that charges a file create for recent deletions (ext4 without a journal) the comparison would
measure them. Arguments are passed to the comparison (bench/compare_peers.py), e.g. `--quick`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    failed = []
    print("=== compare_peers.py  (reproduce: make bench-peers)", flush=True)
    compare = [sys.executable, str(HERE / "compare_peers.py"), *sys.argv[1:]]
    if subprocess.run(compare, cwd=HERE.parent, check=False).returncode != 0:
        failed.append("compare_peers.py")
    for script in sorted(HERE.glob("bench_*.py")):
        print(f"\n=== {script.name}  (reproduce: .venv/bin/python bench/{script.name})", flush=True)
        if subprocess.run([sys.executable, str(script)], cwd=HERE.parent, check=False).returncode != 0:
            failed.append(script.name)
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")
