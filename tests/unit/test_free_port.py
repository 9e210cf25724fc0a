"""tests.support.procs.free_port: the ports services of a test bind later."""

from __future__ import annotations

import socket

import pytest

from tests.support import procs


def test_ports_come_from_below_the_ephemeral_range_and_are_free(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    high = procs._ephemeral_low()
    ports = [procs.free_port() for _ in range(50)]
    assert len(set(ports)) == 50, "no port handed out twice in a row"
    assert all(max(1024, high - procs._PORTS_BELOW_EPHEMERAL) <= p < high for p in ports)
    for port in ports[:5]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # nobody listens there


def test_a_port_someone_listens_on_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    # One worker of 2000: its slice holds six ports; occupy five of them.
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2000")
    high = procs._ephemeral_low()
    low = max(1024, high - procs._PORTS_BELOW_EPHEMERAL)
    span = (high - low) // 2000
    held = []
    try:
        for port in range(low, low + span - 1):
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()  # already taken by someone else: taken either way
                continue
            sock.listen()
            held.append(sock)
        procs._handed.clear()
        assert procs.free_port() == low + span - 1
    finally:
        for sock in held:
            sock.close()


def test_test_workers_draw_from_separate_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    picked = {}
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        picked[worker] = {procs.free_port() for _ in range(30)}
    assert max(picked["gw0"]) < min(picked["gw1"])
