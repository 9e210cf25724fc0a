"""libs.startup.settle_heap: start-up's objects leave the collector, start-up's garbage does not stay."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from libs.startup import YOUNG_GENERATION_THRESHOLD

REPO = Path(__file__).resolve().parents[3]

# Run in a fresh interpreter: freezing would otherwise change the test runner's own collector.
PROBE = """
import gc, json, weakref
class Node: pass
garbage = Node(); garbage.me = garbage          # a cycle only the collector can free
dead = weakref.ref(garbage); del garbage
kept = Node(); kept.me = kept                    # a cycle still referenced: start-up state
before = gc.get_freeze_count()
from libs.startup import settle_heap
settle_heap()
print(json.dumps({
    "before": before,
    "frozen": gc.get_freeze_count(),
    "threshold": gc.get_threshold(),
    "garbage_collected": dead() is None,
    "kept_is_frozen": all(o is not kept for o in gc.get_objects()),  # frozen: no generation holds it
}))
"""


def test_settle_heap_freezes_what_start_up_built_and_collects_its_garbage_first() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, check=True)
    seen = json.loads(out.stdout)
    assert seen["before"] == 0
    assert seen["frozen"] > 1_000  # the interpreter's and the imported modules' objects
    assert seen["garbage_collected"], "a cycle dropped before the freeze must not be frozen for good"
    assert seen["kept_is_frozen"], "a live start-up object is no longer walked by collections"
    assert seen["threshold"] == [YOUNG_GENERATION_THRESHOLD, 20, 20]
