"""The committed stubs are exactly what the .proto files generate (CI fails on drift)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.procs import REPO

PROTOS = REPO / "protos"


def test_committed_stubs_match_the_protos(tmp_path: Path) -> None:
    protos = sorted(PROTOS.rglob("*.proto"))
    shutil.copytree(PROTOS, tmp_path / "protos", ignore=shutil.ignore_patterns("*_pb2*", "__pycache__"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I",
            str(tmp_path / "protos"),
            f"--python_out={tmp_path / 'protos'}",
            f"--pyi_out={tmp_path / 'protos'}",
            f"--grpc_python_out={tmp_path / 'protos'}",
            *[str(tmp_path / "protos" / p.relative_to(PROTOS)) for p in protos],
        ],
        check=True,
    )
    # Compiled bytecode (__pycache__, e.g. written by a worker importing the stubs) is not a stub.
    generated = sorted(p.relative_to(tmp_path / "protos") for p in (tmp_path / "protos").rglob("*_pb2*.py*"))
    committed = sorted(p.relative_to(PROTOS) for p in PROTOS.rglob("*_pb2*.py*") if "__pycache__" not in p.parts)
    assert generated == committed, "stub files differ: run `make proto` and commit"
    stale = [str(p) for p in generated if (tmp_path / "protos" / p).read_bytes() != (PROTOS / p).read_bytes()]
    assert not stale, f"stale generated code (run `make proto`): {stale}"
