"""`make bench`: run every benchmark in turn and print its figures."""

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
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")
