"""One typed settings object for every taskgate process.

Sources, later ones winning: built-in defaults, the operator TOML file named by
``TASKGATE_CONFIG`` (or ``config/default.toml`` of the repository), then
environment variables prefixed ``TASKGATE_``. ``TASKGATE_<FIELD>`` sets a top-level
field; ``TASKGATE_TASKS_<NAME>`` sets ``[tasks] <name>``, ``TASKGATE_NOTIFIER_<NAME>`` sets
``[notifier] <name>``. Built once in each
``__main__`` from an injectable mapping; nothing reads the environment at import.
"""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from libs.ids import ID_PATTERN

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO_ROOT / "config" / "default.toml"
ENV_PREFIX = "TASKGATE_"


class SettingsError(Exception):
    """Configuration that cannot be used; the message lists every problem."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TaskSettings(_Frozen):
    max_running: int = Field(default=4, ge=1, le=1024)
    idle_timeout_ms: int = Field(default=300_000, ge=0)
    first_report_timeout_ms: int = Field(default=120_000, ge=0)
    progress_stale_limit_ms: int = Field(default=7_200_000, ge=0)
    max_duration_ms: int = Field(default=0, ge=0)
    background_grace_ms: int = Field(default=900_000, ge=0)
    cancel_grace_ms: int = Field(default=5_000, ge=0)
    # How long after SIGKILL the scheduler looks for proof that the tree is gone.
    cleanup_confirm_ms: int = Field(default=3_000, ge=0)
    observation_interval_ms: int = Field(default=15_000, ge=50)
    # Period of the one supervisor loop (timers and descendant recording).
    supervisor_interval_ms: int = Field(default=1_000, ge=10)
    recent_tools: int = Field(default=20, ge=1, le=1000)
    observed_paths: int = Field(default=200, ge=1, le=10_000)
    # How the scheduler proves a stopped attempt left nothing behind: "cgroup" (a
    # cgroup per attempt — v2, else the v1 freezer — plus the subreaper),
    # "cgroup_v1" (the v1 freezer only), "subreaper" (the child subreaper and
    # recorded descendants only) or "auto" (cgroup where the host allows it).
    proof_mode: Literal["auto", "cgroup", "cgroup_v1", "subreaper"] = "auto"
    # What holds a spawned worker until its cgroup and identity are committed: "compiled"
    # (services/scheduler/hold/taskgate-hold, built by `make`; the scheduler refuses to
    # start without it), "sh" (/bin/sh) or "auto" (the compiled one where it is built, safe
    # and runs, else /bin/sh).
    worker_hold: Literal["auto", "compiled", "sh"] = "auto"
    # Who spawns workers: "helper" (services/scheduler/hold/taskgate-spawn, built by `make`,
    # a child of the scheduler that starts them as the scheduler's children; the scheduler
    # refuses to start without it), "scheduler" (the scheduler itself, on a thread) or
    # "auto" (the helper where it is built, safe and starts, else the scheduler).
    worker_spawn: Literal["auto", "helper", "scheduler"] = "auto"
    # How many spawn helpers: each serves one spawn at a time (it waits for the worker's exec),
    # and under load launches queue for it; a launch goes to the one with the fewest waiting.
    spawn_helpers: int = Field(default=2, ge=1, le=8)
    # The Git project an "isolated-worktree" profile makes each task's worktree from
    # (a profile's own project_root wins). Empty: no project.
    project_root: str = ""
    # Worker logs (one file per attempt) not written to for this long are deleted, unless
    # their task runs on this host now; checked hourly. 0 keeps every log.
    worker_log_retention_ms: int = Field(default=7 * 86_400_000, ge=0)
    # Finished tasks (completed, failed, cancelled) are deleted with their events and
    # attempts this long after they finished; checked hourly. 0 (the default) keeps them all.
    finished_task_retention_ms: int = Field(default=0, ge=0)
    # Sub-task trees: how deep a worker's sub-tasks may nest (a root task is depth 0) and
    # how many sub-tasks one task may start.
    max_subtask_depth: int = Field(default=3, ge=0, le=32)
    max_subtasks_per_task: int = Field(default=8, ge=0, le=1000)
    # FAULT INJECTION, tests only (0 = off): hold each launch this long after the
    # worker was released (its identity and `running` committed) and before its exit
    # is waited for, so a test can kill the scheduler exactly there.
    fault_hold_launch_ms: int = Field(default=0, ge=0)
    # Several scheduler hosts on one PostgreSQL: a host's claim on its tasks lasts
    # lease_ms past its last renewal (renewed every lease_ms / 3); another replica
    # marks a silent host's tasks HOST_LOST once host_lost_grace_ms more has passed.
    lease_ms: int = Field(default=15_000, ge=300)
    host_lost_grace_ms: int = Field(default=15_000, ge=0)
    # The slow safety poll behind LISTEN/NOTIFY wake-ups (PostgreSQL).
    safety_poll_ms: int = Field(default=5_000, ge=50)

    @classmethod
    def _aliases(cls, raw: dict[str, Any]) -> dict[str, Any]:
        # `default_timeout_ms` is the documented alias of the idle (inspection) threshold.
        if "default_timeout_ms" in raw:
            raw = dict(raw)
            alias = raw.pop("default_timeout_ms")
            raw.setdefault("idle_timeout_ms", alias)
        return raw


class ContainerSpec(_Frozen):
    """``container = {engine, image, mounts, ...}`` on a profile: the worker's command runs in a
    container. Admission inspects the created container before it starts; a stop is proven by
    the engine (see ``services/scheduler/containers.py``)."""

    engine: Literal["docker", "podman"]
    image: str = Field(min_length=1)
    # The only bind mounts admitted: "HOST:CONTAINER" or "HOST:CONTAINER:ro".
    mounts: list[str] = Field(default_factory=list)
    # More `create` options, in order (admission judges their effect, e.g. a later
    # `--security-opt no-new-privileges=false`).
    options: list[str] = Field(default_factory=list)
    # Global engine options before the subcommand (e.g. ["--runtime", "runc"]).
    engine_args: list[str] = Field(default_factory=list)
    # The engine's executable, when not on PATH under its name.
    engine_path: str | None = None

    @field_validator("mounts")
    @classmethod
    def _mount_syntax(cls, v: list[str]) -> list[str]:
        for mount in v:
            parts = mount.split(":")
            if len(parts) not in (2, 3) or not all(parts[:2]) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
                raise ValueError(f"a mount is HOST:CONTAINER[:ro|rw], got {mount!r}")
        return v


class WorkerProfile(_Frozen):
    command: list[str] = Field(min_length=1)
    # What the profile really runs (routing, not a label): a caller asks for a harness
    # only by choosing a profile that has it.
    harness: Literal["claude", "codex"] | None = None
    harness_model: str | None = Field(default=None, min_length=1, max_length=100)
    # Working directory; default is the agent's workspace folder.
    workspace: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    # Names of the scheduler's own environment variables passed on to the worker
    # (besides the fixed allow-list PATH, HOME, LANG, LC_*, TZ, TMPDIR).
    inherit_env: list[str] = Field(default_factory=list)
    # Run the worker as this user/group (needs a scheduler running as root).
    user: str | None = None
    group: str | None = None
    # The worker uses the SDK and must make first contact within first_report_timeout_ms.
    uses_sdk: bool = False
    # Run the command in a container (admission and proof by the engine).
    container: ContainerSpec | None = None
    # "shared": the profile's workspace or the agent's folder (no Git needed).
    # "isolated-worktree": a Git worktree per task from project_root (else [tasks] project_root);
    # a task is refused (WORKER_GIT_PROJECT_REQUIRED) when that is not a Git project.
    workspace_policy: Literal["shared", "isolated-worktree"] = "shared"
    project_root: str | None = None

    @field_validator("command")
    @classmethod
    def _no_empty_words(cls, v: list[str]) -> list[str]:
        if any(not w for w in v):
            raise ValueError("command words must not be empty")
        return v


class CronJob(_Frozen):
    """An operator-declared ``[crons.ID]`` job: a task from this template on each tick of
    ``schedule`` (cron syntax, UTC; a sixth field is seconds), and on a manual run."""

    schedule: str
    agent: str = Field(pattern=ID_PATTERN.pattern)
    session: str = Field(pattern=ID_PATTERN.pattern)
    title: str = Field(min_length=1, max_length=200)
    instructions: str = ""
    # Empty: the default worker profile.
    profile: str = ""
    # Bounds a run: past it the task is cancelled and the run ends timed_out (and a
    # manual run's wait ends with it).
    timeout_ms: int = Field(default=3_600_000, ge=100)
    # false: never fired on its schedule; manual runs still work.
    enabled: bool = True

    @field_validator("schedule")
    @classmethod
    def _cron_syntax(cls, v: str) -> str:
        from croniter import croniter  # only settings that declare crons need it

        if not croniter.is_valid(v):
            raise ValueError(f"not a cron schedule: {v!r}")
        return v


class SkillArg(_Frozen):
    """One argument of a skill: its JSON type, whether it must be given, bounds."""

    type: Literal["string", "integer", "number", "boolean"] = "string"
    required: bool = False
    max_length: int = Field(default=1000, ge=1, le=65536)
    enum: list[str | int | float | bool] | None = None


class SkillConfig(_Frozen):
    """A ``[skills.NAME]`` an operator declares: a task made from it runs ``profile`` with the
    body of ``instructions_file`` as its instructions. The body and the file's path stay in
    the scheduler and the worker: snapshots show only the name, the arguments and (``cli``)
    the invocation."""

    profile: str
    instructions_file: str = Field(min_length=1)
    args_schema: dict[str, SkillArg] = Field(default_factory=dict)
    # A CLI skill: the snapshot shows how it was invoked (``/NAME {args}``).
    cli: bool = False


class TargetConfig(_Frozen):
    """A ``[targets.NAME]``: an external agent session a gateway-managed task is dispatched to.

    ``http``: the scheduler POSTs the request (signed with ``secret``, HMAC-SHA256 in
    ``X-Taskgate-Signature``, as webhooks are) to ``url``; the target reports the outcome to
    ``POST /api/v1/dispatch/{requestId}/outcome`` on the gateway, signed the same way.
    """

    adapter: Literal["http"] = "http"
    url: str
    secret: str = Field(min_length=16)
    options: dict[str, str] = Field(default_factory=dict)
    display_name: str | None = None
    # Discoverable and dispatchable only with a live grant and a local assignment (issue 13
    # item 2, not built yet: a safemode target refuses every dispatch).
    safemode: bool = False
    # One POST of the request / how long an acknowledged request may wait for its outcome.
    dispatch_timeout_ms: int = Field(default=10_000, ge=50)
    outcome_timeout_ms: int = Field(default=3_600_000, ge=100)
    # > 0: also ask the target for the outcome (GET <url>/<requestId>) at this period.
    poll_interval_ms: int = Field(default=0, ge=0)

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("a url starts with http:// or https://")
        return v


class AgentConfig(_Frozen):
    workspace: str | None = None
    orchestration_enabled: bool = True
    # The [channels.NAME] the notifier delivers this agent's notifications to.
    channel: str | None = None


class ChannelConfig(_Frozen):
    """A ``[channels.NAME]`` the notifier delivers an agent's notifications to.

    ``webhook``: POSTed to ``url``. ``telegram``: POSTed (same signed contract) to the
    gateway's Telegram adapter, which sends them with the Bot API's sendMessage to the
    chats bound to the session, and long-polls the bot's updates for commands and menus.
    """

    kind: Literal["webhook", "telegram"]
    url: str = ""
    # HMAC-SHA256 key for X-Taskgate-Signature.
    secret: str = Field(min_length=16)
    # Telegram: the bot's token (kept out of reprs and logs) and the Bot API's base URL.
    bot_token: SecretStr | None = None
    api_base_url: str = "https://api.telegram.org"
    # Telegram: long-poll wait of getUpdates, the live menu's refresh period.
    poll_timeout_s: int = Field(default=25, ge=0, le=50)
    menu_refresh_ms: int = Field(default=3000, ge=50)

    @field_validator("url", "api_base_url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        if v and not v.startswith(("http://", "https://")):
            raise ValueError("a url starts with http:// or https://")
        return v

    @model_validator(mode="after")
    def _kind_fields(self) -> ChannelConfig:
        if self.kind == "webhook" and not self.url:
            raise ValueError("a webhook channel needs url")
        if self.kind == "telegram" and (self.bot_token is None or not self.bot_token.get_secret_value()):
            raise ValueError("a telegram channel needs bot_token")
        return self

    def delivery_url(self, name: str, http_addr: str) -> str:
        if self.kind == "telegram":
            return f"http://{http_addr}/internal/channels/{name}/deliveries"
        return self.url


class NotifierSettings(_Frozen):
    sse_heartbeat_ms: int = Field(default=15_000, ge=50)
    # Frames buffered per SSE client; a client that lets it fill is disconnected.
    sse_client_buffer: int = Field(default=256, ge=8, le=100_000)
    retry_initial_ms: int = Field(default=5_000, ge=10)
    retry_max_ms: int = Field(default=300_000, ge=10)
    delivery_timeout_ms: int = Field(default=10_000, ge=50)
    # Conversations delivered to at once (one notification in flight per conversation).
    delivery_concurrency: int = Field(default=16, ge=1, le=1024)
    # Activity frames kept per conversation for Last-Event-ID resume, and for how long.
    activity_retention_frames: int = Field(default=1000, ge=1)
    activity_retention_ms: int = Field(default=86_400_000, ge=1000)
    # Notifications done with (delivered; stopped and taken up by the conversation's next
    # user message) are deleted with their delivery attempts this long after they were made;
    # checked hourly. 0 (the default) keeps them all. The conversation's messages stay.
    notification_retention_ms: int = Field(default=0, ge=0)
    # The conversation's history messages (with the final response snapshots behind them) and
    # its conversation events are deleted this long after they happened; checked hourly. 0
    # (the default) keeps the history whole.
    conversation_retention_ms: int = Field(default=0, ge=0)
    # Base of a question reminder's cooldown: 1x, 3x, then 6x for later reminders.
    question_reminder_ms: int = Field(default=600_000, ge=1)
    # How long a snooze defers a question's reminders (one hour).
    question_snooze_ms: int = Field(default=3_600_000, ge=1)


class Settings(_Frozen):
    data_dir: Path = Path("var")
    scheduler_addr: str = "127.0.0.1:50051"
    pending_addr: str = "127.0.0.1:50052"
    telemetry_addr: str = "127.0.0.1:50053"
    notifier_addr: str = "127.0.0.1:50054"
    http_addr: str = "127.0.0.1:8080"
    # Directory for the worker API's Unix socket(s); empty means a fresh private
    # directory under the system's temporary folder per scheduler incarnation.
    worker_socket_dir: str = ""
    # Empty means SQLite under data_dir.
    scheduler_db_url: str = ""
    # This scheduler replica's name among those sharing one database; empty derives
    # it from the hostname and the data dir (see services.scheduler.hosts).
    scheduler_host_id: str = ""
    pending_db_url: str = ""
    # The pending-registry deletes a task's questions this long after the scheduler closed them
    # because the task ended for good (a paused task's stay); checked hourly. 0 (the default)
    # keeps them all.
    pending_question_retention_ms: int = Field(default=0, ge=0)
    notifier_db_url: str = ""
    gateway_db_url: str = ""
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    rpc_timeout_ms: int = Field(default=10_000, ge=100)
    max_body_bytes: int = Field(default=256 * 1024, ge=1024)
    # Internal gRPC: caller secrets live in secrets_dir (default <data_dir>/secrets);
    # TASKGATE_SECRET_<IDENTITY> sets one directly (kept out of reprs and logs).
    secrets_dir: Path | None = None
    caller_secrets: dict[str, SecretStr] = Field(default_factory=dict)
    # TLS on the internal links: a server certificate and key turn it on for a
    # service; tls_ca_file is what clients verify it with. tls_client_auth also
    # requires clients to present that certificate (mutual TLS).
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_ca_file: Path | None = None
    tls_client_auth: bool = False
    # gRPC keep-alive ping interval; servers accept pings at twice this rate, so
    # an idle stream (a quiet watcher) is never cut for "too many pings".
    grpc_keepalive_ms: int = Field(default=30_000, ge=100)
    # Prometheus /metrics of each process (TASKGATE_<SERVICE>_METRICS_PORT); 0 = no endpoint.
    metrics_host: str = "127.0.0.1"
    scheduler_metrics_port: int = Field(default=9451, ge=0, le=65535)
    pending_metrics_port: int = Field(default=9452, ge=0, le=65535)
    telemetry_metrics_port: int = Field(default=9453, ge=0, le=65535)
    notifier_metrics_port: int = Field(default=9454, ge=0, le=65535)
    gateway_metrics_port: int = Field(default=9455, ge=0, le=65535)
    config_path: Path | None = None
    tasks: TaskSettings = Field(default_factory=TaskSettings)  # type: ignore[arg-type]
    workers: dict[str, WorkerProfile] = Field(default_factory=dict)
    agents: dict[str, AgentConfig] = Field(default_factory=dict)
    notifier: NotifierSettings = Field(default_factory=NotifierSettings)  # type: ignore[arg-type]
    channels: dict[str, ChannelConfig] = Field(default_factory=dict)
    crons: dict[str, CronJob] = Field(default_factory=dict)
    # How often the scheduler looks for due cron ticks and finished or timed-out runs.
    cron_poll_ms: int = Field(default=1_000, ge=10)

    @model_validator(mode="after")
    def _crons_valid(self) -> Settings:
        for cron_id, cron in self.crons.items():
            if not ID_PATTERN.fullmatch(cron_id):
                raise ValueError(f"crons.{cron_id}: a cron id is 1-128 id characters")
            if cron.profile and cron.profile not in self.workers:
                raise ValueError(f"crons.{cron_id}.profile names {cron.profile!r}, which is not a [workers] entry")
        return self

    skills: dict[str, SkillConfig] = Field(default_factory=dict)
    targets: dict[str, TargetConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _skills_name_profiles(self) -> Settings:
        for name, skill in self.skills.items():
            if skill.profile not in self.workers:
                raise ValueError(f"skills.{name}.profile names {skill.profile!r}, which is not a [workers] entry")
        return self

    @model_validator(mode="after")
    def _channels_exist(self) -> Settings:
        for agent_id, agent in self.agents.items():
            if agent.channel is not None and agent.channel not in self.channels:
                raise ValueError(f"agents.{agent_id}.channel names {agent.channel!r}, which is not a [channels] entry")
        return self

    @field_validator("scheduler_addr", "pending_addr", "telemetry_addr", "notifier_addr", "http_addr")
    @classmethod
    def _host_port(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"expected HOST:PORT, got {v!r}")
        return v

    def db_url(self, service: str) -> str:
        url: str = getattr(self, f"{service}_db_url")
        return url or f"sqlite:///{(self.data_dir / f'{service}.db').resolve()}"

    @property
    def secrets_path(self) -> Path:
        return (self.secrets_dir or self.data_dir / "secrets").resolve()

    def configured_secrets(self) -> dict[str, str]:
        return {identity: secret.get_secret_value() for identity, secret in self.caller_secrets.items()}

    def agent(self, agent_id: str) -> AgentConfig:
        return self.agents.get(agent_id, AgentConfig())

    def agent_workspace(self, agent_id: str) -> Path:
        config = self.agents.get(agent_id)
        if config is not None and config.workspace:
            return Path(config.workspace)
        return default_agent_workspace(self.data_dir, agent_id)


@functools.lru_cache(maxsize=64)
def resolved_dir(path: Path) -> Path:
    """The absolute, symlink-free form of a service's own folder, resolved once: a resolve
    is a syscall per path component, and hot paths (each task's workspace and log) need it."""
    return path.resolve()


@functools.lru_cache(maxsize=1024)
def default_agent_workspace(data_dir: Path, agent_id: str) -> Path:
    """``<data dir>/workspaces/<agent>``, built once per agent: every task of a shared-workspace
    profile asks, and two pathlib joins cost more than the rest of its admission."""
    return resolved_dir(data_dir) / "workspaces" / agent_id


def load_settings(environ: Mapping[str, str]) -> Settings:
    """Build and validate settings; raises SettingsError naming each bad value."""
    config_path = Path(environ["TASKGATE_CONFIG"]) if environ.get("TASKGATE_CONFIG") else DEFAULT_CONFIG
    raw: dict[str, Any] = {}
    if config_path.exists():
        try:
            raw = tomllib.loads(config_path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise SettingsError(f"cannot read config {config_path}: {exc}") from exc
    elif environ.get("TASKGATE_CONFIG"):
        raise SettingsError(f"TASKGATE_CONFIG names {config_path}, which does not exist")
    raw["config_path"] = str(config_path) if config_path.exists() else None
    tasks = TaskSettings._aliases(dict(raw.get("tasks", {})))
    top_fields = set(Settings.model_fields) - {
        "tasks",
        "workers",
        "agents",
        "config_path",
        "caller_secrets",
        "notifier",
        "channels",
        "crons",
        "skills",
    }
    caller_secrets: dict[str, str] = {}
    notifier = dict(raw.get("notifier", {}))
    for key, value in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        name = key[len(ENV_PREFIX) :].lower()
        # pydantic converts the strings; other TASKGATE_* names (the worker
        # contract, the CLI's URL and key) are not service settings.
        if name.startswith("tasks_"):
            tasks[name[len("tasks_") :]] = value
        elif name.startswith("secret_"):
            caller_secrets[name[len("secret_") :]] = value
        elif name in top_fields:
            raw[name] = value
        elif name.startswith("notifier_") and name[len("notifier_") :] in NotifierSettings.model_fields:
            # TASKGATE_NOTIFIER_ADDR / _DB_URL are top-level fields, matched above.
            notifier[name[len("notifier_") :]] = value
    raw["tasks"] = tasks
    raw["caller_secrets"] = caller_secrets
    raw["notifier"] = notifier
    try:
        return Settings.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors())
        raise SettingsError(f"invalid configuration ({config_path}): {problems}") from exc
