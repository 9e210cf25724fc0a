"""What holding a worker until its release costs: the compiled hold, the shell, and no hold.

Run: .venv/bin/python bench/bench_hold.py [N]
Spawns N `/bin/true` workers one after another the way the scheduler does (a new session, the
hold pipe on stdin, released with "go\\n", waited for) under each hold — `taskgate-hold`
(services/scheduler/hold, built by `make hold`), the `/bin/sh` trampoline — and bare, with no
hold at all (the spawn floor). Prints, per worker, the CPU of the spawned processes (the hold
and `/bin/true`, user + system), the CPU of this spawning process, and spawns per second;
medians of 5 rounds taken in turn (hold A, B, bare, A, B, bare…).
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.scheduler import processes  # noqa: E402

ROUNDS = 5


def one_round(prefix: list[str] | None, n: int) -> tuple[float, float, float]:
    """(children CPU ms per worker, own CPU ms per worker, workers per second)."""
    kids0, own0 = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
    began = time.perf_counter()
    for _ in range(n):
        if prefix is None:
            code = subprocess.Popen(["/bin/true"], start_new_session=True).wait()
        else:
            go_r, go_w = os.pipe()
            try:
                worker = subprocess.Popen([*prefix, "/bin/true"], stdin=go_r, start_new_session=True)
            finally:
                os.close(go_r)
            os.write(go_w, b"go\n")
            os.close(go_w)
            code = worker.wait()
        assert code == 0, code
    elapsed = time.perf_counter() - began
    kids1, own1 = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)

    def ms(a: resource.struct_rusage, b: resource.struct_rusage) -> float:
        return (b.ru_utime + b.ru_stime - a.ru_utime - a.ru_stime) * 1000 / n

    return ms(kids0, kids1), ms(own0, own1), n / elapsed


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    kinds: dict[str, list[str] | None] = {}
    compiled = processes.choose_hold("auto")
    if compiled.kind == "compiled":
        kinds["taskgate-hold (compiled)"] = list(compiled.prefix)
    else:
        print(f"the compiled hold is not measured: {compiled.fallback_reason}")
    kinds["/bin/sh trampoline"] = list(processes.SH_HOLD)
    kinds["no hold (the spawn floor)"] = None
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in kinds}
    for _ in range(ROUNDS):
        for name, prefix in kinds.items():
            results[name].append(one_round(prefix, n))
    print(f"N={n} /bin/true workers spawned one after another, median of {ROUNDS} rounds:")
    print(f"  {'held by':28} {'workers CPU ms':>15} {'spawner CPU ms':>15} {'workers/s':>10}")
    for name, rounds in results.items():
        kids, own, rate = (statistics.median(r[i] for r in rounds) for i in range(3))
        print(f"  {name:28} {kids:15.3f} {own:15.3f} {rate:10.1f}")


if __name__ == "__main__":
    main()
