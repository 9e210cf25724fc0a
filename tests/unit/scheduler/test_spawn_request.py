"""A spawn request's bytes (``spawner.encode_request``): what the helper reads, and what it
must never be given — a string with a NUL inside, which C would cut short."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.scheduler import spawner


def _strings(request: bytes) -> list[bytes]:
    body = request[spawner._REQUEST.size :]
    assert body.endswith(b"\0")
    return body[:-1].split(b"\0")


def test_a_request_carries_its_paths_argv_and_environment_each_ended_by_one_nul(tmp_path: Path) -> None:
    request = spawner.encode_request(
        7, ["/bin/echo", "a b", "é"], tmp_path, {"PATH": "/bin", "X": "1=2"}, tmp_path / "log", None, False, 0o077
    )
    assert _strings(request) == [
        str(tmp_path / "log").encode(),
        b"",  # no cgroup
        str(tmp_path).encode(),
        b"/bin/echo",
        b"a b",
        "é".encode(),
        b"PATH=/bin",
        b"X=1=2",
    ]
    magic, request_id, flags, umask, argc, envc, uid, gid = spawner._REQUEST.unpack(request[: spawner._REQUEST.size])
    assert (magic, request_id, flags, umask, argc, envc, uid, gid) == (spawner._MAGIC, 7, 0, 0o077, 3, 2, 0, 0)


@pytest.mark.parametrize(
    "argv, env, log_name",
    [
        (["/bin/echo", "a\0b"], {}, "log"),
        (["/bin/echo"], {"X": "1\0"}, "log"),
        (["/bin/echo"], {"X\0Y": "1"}, "log"),
        (["/bin/echo"], {}, "lo\0g"),
    ],
)
def test_a_nul_inside_any_string_is_refused(
    tmp_path: Path, argv: list[str], env: dict[str, str], log_name: str
) -> None:
    with pytest.raises(ValueError, match="embedded null byte"):
        spawner.encode_request(1, argv, tmp_path, env, Path(f"{tmp_path}/{log_name}"), None, False, 0o077)


def test_an_environment_name_with_an_equals_sign_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="illegal environment variable name"):
        spawner.encode_request(1, ["/bin/true"], tmp_path, {"A=B": "1"}, tmp_path / "log", None, False, 0o077)
