"""Who may call which internal RPC.

Every internal gRPC service (scheduler, pending-registry, telemetry-agent,
notifier) requires a caller credential on every RPC except health checking and
reflection. A caller presents ``authorization: Bearer <secret>``; each caller
identity has its own secret and the allow-list below. The interceptor in
``libs.grpc_server`` applies it: unknown or missing credential ->
UNAUTHENTICATED, a method outside the caller's list -> PERMISSION_DENIED.

Secrets come from ``TASKGATE_SECRET_<IDENTITY>`` or from
``<secrets_dir>/<identity>.secret`` (mode 0600, made by ``ensure_secrets`` on
first use of ``make run``). Servers keep only SHA-256 digests and compare them in
constant time; secrets are never logged.

Workers are not callers here: they reach only ``WorkerService`` on the
scheduler's worker listener, authenticated by their per-attempt token.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

AUTHORIZATION_KEY = "authorization"
EXEMPT_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")

_SCHEDULER = "/taskgate.scheduler.v1.SchedulerService/"
_CRONS = "/taskgate.scheduler.v1.CronService/"
_PENDING = "/taskgate.pending.v1.PendingRegistryService/"
_TELEMETRY = "/taskgate.telemetry.v1.TelemetryAgentService/"
_NOTIFIER = "/taskgate.notifier.v1.NotifierService/"


def _methods(prefix: str, *names: str) -> set[str]:
    return {prefix + name for name in names}


# A trailing "*" allows every method of that service.
POLICY: dict[str, frozenset[str]] = {
    # The HTTP edge: task control for REST clients, answers, pending snapshots, conversations.
    "gateway": frozenset(
        _methods(
            _SCHEDULER,
            "CreateTask",
            "CreateTasks",
            "StreamCreateTasks",
            "GetTask",
            "ListTasks",
            "CancelTask",
            "RetryCleanup",
            "WatchTasks",
            "PauseTask",
            "ResumeTask",
            "GetWorkerLog",
            "RecordDispatchOutcome",
        )
        | _methods(_PENDING, "AnswerQuestion", "GetQuestion", "GetSessionTask")
        | {_NOTIFIER + "*"}
        | _methods(_CRONS, "ListCrons", "ListCronRuns", "RunCron")
    ),
    # The scheduler relays a worker's questions and registers process trees.
    "scheduler": frozenset(
        _methods(_PENDING, "AskQuestion", "GetQuestion", "AwaitAnswer", "CancelQuestions", "CancelSession")
        | _methods(_TELEMETRY, "Watch", "Unwatch", "ListWatches", "StreamObservations")
        | _methods(_NOTIFIER, "EnqueueNotification", "ClaimUnreportedFailure")
    ),
    # The notifier follows task events and looks at a session's tasks.
    "notifier": frozenset(_methods(_SCHEDULER, "WatchTasks", "GetTask", "ListTasks")),
    # Front-ends of the pending-registry (`taskgate pending listen`, chat bots) and the
    # agent runtimes that produce asks and confirms. Never task answers: those go
    # through the gateway, where a person's key and membership are checked.
    "frontend": frozenset(
        _methods(
            _PENDING,
            "Ask",
            "Listen",
            "PickNext",
            "PickNextMatch",
            "Reply",
            "HasListener",
            "CancelSession",
            "GetSessionTask",
        )
    ),
    # The local operator (whoever can read the secrets directory): everything.
    "operator": frozenset({_SCHEDULER + "*", _CRONS + "*", _PENDING + "*", _TELEMETRY + "*", _NOTIFIER + "*"}),
}
IDENTITIES = tuple(POLICY)
# Scheduler-host administration (list hosts, resolve a lost one on the operator's word): the
# operator's alone, even should another identity's list grow a wildcard.
OPERATOR_ONLY: frozenset[str] = frozenset(_methods(_SCHEDULER, "ListHosts", "ResolveLostHost"))


def allowed(identity: str, method: str) -> bool:
    if method in OPERATOR_ONLY and identity != "operator":
        return False
    rules = POLICY.get(identity, frozenset())
    if method in rules:
        return True
    service = method.rsplit("/", 1)[0] + "/"
    return service + "*" in rules


def exempt(method: str) -> bool:
    """Health checking and reflection: open to anyone who can connect."""
    return method.startswith(EXEMPT_PREFIXES)


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


@dataclass(frozen=True)
class CallerAuth:
    """The server side: which identity a presented secret belongs to."""

    digests: tuple[tuple[str, bytes], ...]

    @classmethod
    def from_secrets(cls, secrets_by_identity: Mapping[str, str]) -> CallerAuth:
        return cls(tuple((identity, _digest(secret)) for identity, secret in secrets_by_identity.items() if secret))

    def identify(self, authorization: str | None) -> str | None:
        """The caller identity for an ``authorization`` header value, or None."""
        if not authorization:
            return None
        scheme, _, secret = authorization.partition(" ")
        if scheme.lower() != "bearer" or not secret:
            return None
        # Judged afresh on every call (about 1 us): a verdict cache keyed by the presented secret
        # would keep secrets in the server's memory, where only their digests live.
        presented = _digest(secret.strip())
        found = None
        # Compare with every digest (no early exit): the time taken says nothing about which matched.
        for identity, digest in self.digests:
            if hmac.compare_digest(presented, digest):
                found = identity
        return found


class SecretsMissing(Exception):
    """No secret for an identity: neither the environment nor the secrets directory has it."""


def secret_file(secrets_dir: Path, identity: str) -> Path:
    return secrets_dir / f"{identity}.secret"


def read_secret(identity: str, secrets_dir: Path, configured: Mapping[str, str]) -> str | None:
    """An identity's secret: one set in settings (``TASKGATE_SECRET_<IDENTITY>``) wins over the file."""
    if configured.get(identity):
        return configured[identity].strip()
    try:
        return secret_file(secrets_dir, identity).read_text().strip() or None
    except FileNotFoundError:
        return None


def load_caller_auth(secrets_dir: Path, configured: Mapping[str, str]) -> CallerAuth:
    """Every identity's digest a server accepts; fails when there is none at all."""
    found = {identity: read_secret(identity, secrets_dir, configured) for identity in IDENTITIES}
    present = {identity: secret for identity, secret in found.items() if secret}
    if not present:
        raise SecretsMissing(
            f"no internal caller secrets in {secrets_dir} or TASKGATE_SECRET_*; "
            "create them with `taskgate admin secrets init` (make run does this on first use)"
        )
    return CallerAuth.from_secrets(present)


def ensure_secrets(secrets_dir: Path) -> list[str]:
    """Create the secrets directory (0700) and any missing secret (0600); returns the identities created."""
    secrets_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(secrets_dir, 0o700)
    created = []
    for identity in IDENTITIES:
        path = secret_file(secrets_dir, identity)
        if path.exists():
            continue
        # O_EXCL: two processes racing on first use keep one secret, never two.
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
        created.append(identity)
    return created
