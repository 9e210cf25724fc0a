"""Internal gRPC authentication: the policy, the secrets, and the interceptor on a real aio server."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from libs import grpc_server, internal_auth, proctree
from libs.grpc_client import ClientSecurity, aio_channel
from libs.grpc_server import ServerSecurity, serve, start_server
from libs.internal_auth import CallerAuth, allowed, ensure_secrets, load_caller_auth
from libs.settings import load_settings
from libs.startup import StopSignal
from services.telemetry_agent.agent import Agent
from services.telemetry_agent.procread import ProcfsReader
from services.telemetry_agent.sampler import Sampler
from services.telemetry_agent.servicer import SERVICE_NAME, TelemetryAgentServicer
from taskgate.notifier.v1 import notifier_pb2
from taskgate.pending.v1 import pending_pb2
from taskgate.scheduler.v1 import crons_pb2, scheduler_pb2
from taskgate.telemetry.v1 import telemetry_pb2 as pb
from taskgate.telemetry.v1 import telemetry_pb2_grpc as pb_grpc
from tests.support.procs import free_port

SECRETS = {"scheduler": "scheduler-secret", "gateway": "gateway-secret", "frontend": "frontend-secret"}


def _all_methods() -> set[str]:
    methods = set()
    for module in (scheduler_pb2, crons_pb2, pending_pb2, notifier_pb2, pb):
        for service in module.DESCRIPTOR.services_by_name.values():
            if service.name == "WorkerService":
                continue  # token-authenticated, on the worker listener
            methods |= {f"/{service.full_name}/{m.name}" for m in service.methods}
    return methods


def test_every_policy_entry_names_a_real_method() -> None:
    methods = _all_methods()
    services = {m.rsplit("/", 1)[0] + "/*" for m in methods}
    for identity, rules in internal_auth.POLICY.items():
        unknown = {r for r in rules if r not in methods and r not in services}
        assert not unknown, f"{identity}: {unknown}"


def test_least_privilege_where_it_matters() -> None:
    answer = "/taskgate.pending.v1.PendingRegistryService/AnswerQuestion"
    assert allowed("gateway", answer) and allowed("operator", answer)
    # Only a person's key (through the gateway) or the operator answers a task's question.
    assert not allowed("frontend", answer) and not allowed("scheduler", answer) and not allowed("notifier", answer)
    assert not allowed("notifier", "/taskgate.scheduler.v1.SchedulerService/CancelTask")
    assert not allowed("scheduler", "/taskgate.scheduler.v1.SchedulerService/CreateTask")
    assert not allowed("gateway", "/taskgate.telemetry.v1.TelemetryAgentService/Watch")
    assert not allowed("nobody", "/taskgate.scheduler.v1.SchedulerService/GetTask")
    assert allowed("gateway", "/taskgate.notifier.v1.NotifierService/ListMessages")


def test_host_administration_is_the_operators_alone() -> None:
    assert internal_auth.OPERATOR_ONLY and internal_auth.OPERATOR_ONLY <= _all_methods()
    for method in internal_auth.OPERATOR_ONLY:
        assert allowed("operator", method)
        assert not [i for i in internal_auth.IDENTITIES if i != "operator" and allowed(i, method)], method
    # Even a wildcard elsewhere would not reach them.
    rules = internal_auth.POLICY["gateway"]
    try:
        internal_auth.POLICY["gateway"] = rules | {"/taskgate.scheduler.v1.SchedulerService/*"}
        assert not allowed("gateway", "/taskgate.scheduler.v1.SchedulerService/ResolveLostHost")
    finally:
        internal_auth.POLICY["gateway"] = rules


def test_identify_takes_only_a_bearer_with_a_known_secret() -> None:
    auth = CallerAuth.from_secrets(SECRETS)
    assert auth.identify("Bearer gateway-secret") == "gateway"
    assert auth.identify("bearer frontend-secret") == "frontend"
    assert auth.identify("Bearer gateway-secretX") is None
    assert auth.identify("Basic gateway-secret") is None
    assert auth.identify("gateway-secret") is None
    assert auth.identify("") is None and auth.identify(None) is None
    assert "gateway-secret" not in repr(auth)  # only digests are kept


def test_secrets_are_made_once_with_private_modes(tmp_path: Path) -> None:
    secrets_dir = tmp_path / "secrets"
    assert set(ensure_secrets(secrets_dir)) == set(internal_auth.IDENTITIES)
    first = {p.name: p.read_text() for p in secrets_dir.iterdir()}
    assert ensure_secrets(secrets_dir) == []  # kept, not replaced
    assert {p.name: p.read_text() for p in secrets_dir.iterdir()} == first
    assert stat.S_IMODE(secrets_dir.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in secrets_dir.iterdir())
    assert len(set(first.values())) == len(first)  # one secret per identity


def test_settings_take_secrets_from_the_environment_and_never_show_them(tmp_path: Path) -> None:
    settings = load_settings({"TASKGATE_DATA_DIR": str(tmp_path), "TASKGATE_SECRET_GATEWAY": "from-env"})
    assert settings.configured_secrets() == {"gateway": "from-env"}
    assert "from-env" not in repr(settings)
    auth = load_caller_auth(settings.secrets_path, settings.configured_secrets())
    assert auth.identify("Bearer from-env") == "gateway"
    with pytest.raises(internal_auth.SecretsMissing):
        load_caller_auth(tmp_path / "empty", {})


@pytest.fixture
async def agent() -> AsyncIterator[Agent]:
    agent = Agent(Sampler(ProcfsReader()), 0.1)
    await agent.start()
    yield agent
    await agent.stop()


async def _telemetry_server(agent: Agent, keepalive_ms: int = 30_000) -> grpc_server.ServiceHost:
    def register(server: grpc.aio.Server) -> None:
        pb_grpc.add_TelemetryAgentServiceServicer_to_server(TelemetryAgentServicer(agent), server)

    security = ServerSecurity(auth=CallerAuth.from_secrets(SECRETS), keepalive_ms=keepalive_ms)
    return await start_server("127.0.0.1:0", [register], [SERVICE_NAME], security=security)


def _stub(port: int, identity: str, secret: str, keepalive_ms: int = 30_000) -> pb_grpc.TelemetryAgentServiceStub:
    channel = aio_channel(f"127.0.0.1:{port}", ClientSecurity(identity, secret, keepalive_ms=keepalive_ms))
    stub = pb_grpc.TelemetryAgentServiceStub(channel)
    stub.channel = channel  # type: ignore[attr-defined]  # a channel nobody holds is closed
    return stub


async def _code(call: object) -> grpc.StatusCode:
    try:
        if hasattr(call, "read"):
            await call.read()  # a stream: the refusal comes with the first read
        else:
            await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def test_the_interceptor_refuses_unknown_callers_and_methods_outside_the_list(agent: Agent) -> None:
    host = await _telemetry_server(agent)
    try:
        port = host.port
        list_watches = pb.ListWatchesRequest()
        scheduler = _stub(port, "scheduler", "scheduler-secret")
        assert await _code(scheduler.ListWatches(list_watches, timeout=5)) == grpc.StatusCode.OK
        for identity, secret in (("scheduler", "wrong"), ("gateway", "")):
            stub = _stub(port, identity, secret)
            assert await _code(stub.ListWatches(list_watches, timeout=5)) == grpc.StatusCode.UNAUTHENTICATED
            stream = stub.StreamObservations(pb.StreamObservationsRequest(), timeout=5)
            assert await _code(stream) == grpc.StatusCode.UNAUTHENTICATED
        # A known caller outside its allow-list: the gateway has no business with telemetry.
        gateway = _stub(port, "gateway", "gateway-secret")
        assert await _code(gateway.ListWatches(list_watches, timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
        stream = gateway.StreamObservations(pb.StreamObservationsRequest(), timeout=5)
        assert await _code(stream) == grpc.StatusCode.PERMISSION_DENIED
        # Health checking needs no credential at all.
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as bare:
            reply = await health_pb2_grpc.HealthStub(bare).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            raw = bare.unary_unary(
                "/taskgate.telemetry.v1.TelemetryAgentService/ListWatches",
                request_serializer=pb.ListWatchesRequest.SerializeToString,
                response_deserializer=pb.ListWatchesResponse.FromString,
            )
            assert await _code(raw(list_watches, timeout=5)) == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await host.stop(0)


def _rpc_count(method: str, code: str) -> float:
    labels = {"method": method, "code": code}
    return REGISTRY.get_sample_value("taskgate_rpc_duration_seconds_count", labels) or 0.0


async def test_every_call_is_checked_on_its_own_credential(agent: Agent) -> None:
    """Nothing of an earlier verdict carries over: a good call, then the same identity with a
    changed (or revoked) secret, then the good one again — each judged on what it presents; a
    server started with rotated secrets refuses the old one at once."""
    host = await _telemetry_server(agent)
    try:
        request = pb.ListWatchesRequest()
        good = _stub(host.port, "scheduler", "scheduler-secret")
        changed = _stub(host.port, "scheduler", "scheduler-secret-2")
        for _ in range(3):
            assert await _code(good.ListWatches(request, timeout=5)) == grpc.StatusCode.OK
            assert await _code(changed.ListWatches(request, timeout=5)) == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await host.stop(0)
    rotated = {**SECRETS, "scheduler": "scheduler-secret-2"}
    host = await start_server(
        "127.0.0.1:0",
        [lambda server: pb_grpc.add_TelemetryAgentServiceServicer_to_server(TelemetryAgentServicer(agent), server)],
        [SERVICE_NAME],
        security=ServerSecurity(auth=CallerAuth.from_secrets(rotated)),
    )
    try:
        old = _stub(host.port, "scheduler", "scheduler-secret")
        new = _stub(host.port, "scheduler", "scheduler-secret-2")
        assert await _code(old.ListWatches(pb.ListWatchesRequest(), timeout=5)) == grpc.StatusCode.UNAUTHENTICATED
        assert await _code(new.ListWatches(pb.ListWatchesRequest(), timeout=5)) == grpc.StatusCode.OK
    finally:
        await host.stop(0)


async def test_each_call_is_counted_by_method_and_code(agent: Agent) -> None:
    """The RPC histogram keeps its labels (the interceptor reuses each method's child)."""
    method = "/taskgate.telemetry.v1.TelemetryAgentService/ListWatches"
    codes = ("OK", "UNAUTHENTICATED", "PERMISSION_DENIED")
    before = {code: _rpc_count(method, code) for code in codes}
    host = await _telemetry_server(agent)
    try:
        request = pb.ListWatchesRequest()
        scheduler = _stub(host.port, "scheduler", "scheduler-secret")
        for _ in range(3):
            assert await _code(scheduler.ListWatches(request, timeout=5)) == grpc.StatusCode.OK
        unknown = _stub(host.port, "scheduler", "wrong")
        gateway = _stub(host.port, "gateway", "gateway-secret")
        for _ in range(2):
            assert await _code(unknown.ListWatches(request, timeout=5)) == grpc.StatusCode.UNAUTHENTICATED
        assert await _code(gateway.ListWatches(request, timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
    finally:
        await host.stop(0)
    after = {code: _rpc_count(method, code) - before[code] for code in codes}
    assert after == {"OK": 3, "UNAUTHENTICATED": 2, "PERMISSION_DENIED": 1}


@pytest.mark.parametrize("server_policy", ["agreeing", "grpc_default"])
async def test_an_idle_stream_outlives_the_ping_policy_window(
    agent: Agent, server_policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Client pings every 200 ms on a quiet stream. With our server settings the stream
    lives; with gRPC's default server policy (pings at most every 5 min) the server
    answers GOAWAY too_many_pings within a few pings — the failure this guards against."""
    if server_policy == "grpc_default":
        monkeypatch.setattr(grpc_server, "server_keepalive_options", lambda keepalive_ms: [])
    host = await _telemetry_server(agent, keepalive_ms=200)
    try:
        stub = _stub(host.port, "scheduler", "scheduler-secret", keepalive_ms=200)
        stream = stub.StreamObservations(pb.StreamObservationsRequest(batch=True), timeout=60)
        await stream.initial_metadata()
        idle_s = 4.0  # 20 client pings, far past three strikes
        started = time.monotonic()
        # Not wait_for: cancelling a read would cancel the call itself.
        first = asyncio.ensure_future(stream.read())
        done, _ = await asyncio.wait({first}, timeout=idle_s)
        if done:
            error = first.exception()
            assert isinstance(error, grpc.aio.AioRpcError), f"unexpected item on an idle stream: {first.result()}"
            assert server_policy == "grpc_default", f"idle stream died after {time.monotonic() - started:.1f}s: {error}"
            assert error.code() == grpc.StatusCode.UNAVAILABLE
            return
        assert server_policy == "agreeing", "the default server policy was expected to cut the stream"
        # Still alive: a watch now reaches this very stream.
        start_time = proctree.start_time_of(os.getpid())
        assert start_time is not None
        await stub.Watch(pb.WatchRequest(task_id="idle", pid=os.getpid(), pid_start_time=start_time), timeout=5)
        response = await asyncio.wait_for(first, timeout=10)
        assert [o.task_id for o in response.observations] == ["idle"]
    finally:
        await host.stop(0)


async def test_serving_only_after_start_up_and_a_stop_during_start_up_is_honoured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    addr = f"127.0.0.1:{free_port()}"
    settings = load_settings({"TASKGATE_DATA_DIR": str(tmp_path), "TASKGATE_SECRET_OPERATOR": "op"})
    release = asyncio.Event()
    started = asyncio.Event()

    async def slow_start() -> None:
        started.set()
        await release.wait()

    async def health() -> int:
        async with grpc.aio.insecure_channel(addr) as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            return int(reply.status)

    stop = StopSignal()
    serving = asyncio.create_task(
        serve(addr=addr, settings=settings, stop=stop, registrars=[], service_names=[], on_started=slow_start)
    )
    await asyncio.wait_for(started.wait(), 10)
    assert await health() == health_pb2.HealthCheckResponse.NOT_SERVING  # listening, not ready
    release.set()
    for _ in range(100):
        if await health() == health_pb2.HealthCheckResponse.SERVING:
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("never SERVING after start-up")
    stop._received(signal.SIGTERM)
    await asyncio.wait_for(serving, 10)

    # A stop that arrives while start-up still runs: start-up finishes, the service never says SERVING.
    said_serving: list[bool] = []
    real_set_serving = grpc_server.ServiceHost.set_serving

    async def spy(host: grpc_server.ServiceHost) -> None:
        said_serving.append(True)
        await real_set_serving(host)

    monkeypatch.setattr(grpc_server.ServiceHost, "set_serving", spy)
    stop, release, started = StopSignal(), asyncio.Event(), asyncio.Event()
    serving = asyncio.create_task(
        serve(addr=addr, settings=settings, stop=stop, registrars=[], service_names=[], on_started=slow_start)
    )
    await asyncio.wait_for(started.wait(), 10)
    stop._received(signal.SIGTERM)
    release.set()
    await asyncio.wait_for(serving, 10)
    assert said_serving == []
