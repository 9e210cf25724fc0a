"""`make bench`: run every benchmark in turn and print its figures, then the peer comparison.

Arguments are passed to the comparison (bench/compare_peers.py), e.g. `--quick`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    failed = []
    for script in sorted(HERE.glob("bench_*.py")):
        print(f"\n=== {script.name}  (reproduce: .venv/bin/python bench/{script.name})", flush=True)
        if subprocess.run([sys.executable, str(script)], cwd=HERE.parent, check=False).returncode != 0:
            failed.append(script.name)
    print("\n=== compare_peers.py  (reproduce: make bench-peers)", flush=True)
    compare = [sys.executable, str(HERE / "compare_peers.py"), *sys.argv[1:]]
    if subprocess.run(compare, cwd=HERE.parent, check=False).returncode != 0:
        failed.append("compare_peers.py")
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")
