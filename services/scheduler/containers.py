"""Container workers: admission from the engine's own ``inspect``, and stop proof from the engine.

A profile with ``container = {engine, image, mounts, ...}`` runs its command in a container
named ``taskgate-<attemptId>``. Before anything starts, the container is *created* and
``inspect``ed: a privileged container, a bind mount the profile does not list, or a
disabled ``no-new-privileges`` (the effective value: the last such option wins, absent
means disabled) is refused and removed — never run on the host instead. The worker
process taskgate launches is the engine's client (``start --attach``); its exit proves
nothing about the container, so a stop asks the engine to stop the container and then
``inspect``s it: proven only when the engine says it is not running and has no pid.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from libs.settings import ContainerSpec
from services.scheduler import helper_children

log = structlog.get_logger("scheduler.containers")

ENGINE_TIMEOUT_S = 60.0


class ContainerRefused(Exception):
    """Admission refused the container (it was removed; nothing ran)."""


# --- admission (pure) ---------------------------------------------------------------


@dataclass(frozen=True)
class AllowedMount:
    source: str
    destination: str
    writable: bool

    @classmethod
    def parse(cls, text: str) -> AllowedMount:
        parts = text.split(":")
        return cls(parts[0], parts[1], len(parts) < 3 or parts[2] == "rw")


def no_new_privileges(security_opts: Sequence[str]) -> bool:
    """The effective ``no-new-privileges`` of options in the order given: the last one wins;
    none at all is disabled (the engines' default)."""
    effective = False
    for opt in security_opts:
        name, sep, value = opt.replace(":", "=", 1).partition("=")
        if name.strip() != "no-new-privileges":
            continue
        effective = (value.strip().lower() in ("true", "1", "yes")) if sep else True
    return effective


def refusals(inspected: dict[str, Any], allowed: Sequence[AllowedMount]) -> list[str]:
    """Why the inspected container may not run (empty: admitted)."""
    host = inspected.get("HostConfig") or {}
    found: list[str] = []
    if host.get("Privileged"):
        found.append("privileged mode")
    if not no_new_privileges(host.get("SecurityOpt") or []):
        found.append("no-new-privileges is disabled")
    for mount in inspected.get("Mounts") or []:
        kind = mount.get("Type", "")
        source, destination = mount.get("Source", ""), mount.get("Destination", "")
        writable = bool(mount.get("RW", True))
        ok = any(a.source == source and a.destination == destination and (a.writable or not writable) for a in allowed)
        if not ok:
            found.append(f"unknown {kind or ''} mount {source or '?'} -> {destination}".replace("  ", " "))
    return found


# --- the engine ----------------------------------------------------------------------


def container_name(attempt_id: str) -> str:
    return f"taskgate-{attempt_id}"


class ContainerEngine:
    """One profile's engine client (docker or podman CLI), each call a subprocess off the loop."""

    def __init__(self, spec: ContainerSpec) -> None:
        self.spec = spec
        self.base = [spec.engine_path or spec.engine, *spec.engine_args]

    async def _run(self, *args: str, timeout_s: float = ENGINE_TIMEOUT_S) -> tuple[int, str, str]:
        # Announced to the subreaper: the engine CLI's exit status is ours, not an orphan's to reap.
        with helper_children.running():
            proc = await asyncio.create_subprocess_exec(
                *self.base,
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                async with asyncio.timeout(timeout_s):
                    out, err = await proc.communicate()
            except TimeoutError:
                proc.kill()
                await proc.wait()
                return -1, "", f"{self.spec.engine} {args[0]} timed out"
        return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")

    def create_args(self, name: str, command: Sequence[str], workdir: Path) -> list[str]:
        args = ["create", "--name", name, "--security-opt", "no-new-privileges"]
        for mount in self.spec.mounts:
            args += ["-v", mount]
        return [*args, *self.spec.options, self.spec.image, *command]

    async def inspect(self, name: str) -> dict[str, Any] | None:
        return (await self._inspect(name))[0]

    async def _inspect(self, name: str) -> tuple[dict[str, Any] | None, bool]:
        """(the container's inspect document or None, whether the engine says it does not exist)."""
        code, out, err = await self._run("inspect", "--type", "container", name)
        if code != 0:
            return None, code > 0 and "no such" in err.lower()
        found = json.loads(out)
        return (found[0] if isinstance(found, list) and found else None), False

    async def prepare(self, name: str, command: Sequence[str], workdir: Path) -> list[str]:
        """Create and admit the container; the host-side command that runs it (attached)."""
        code, _, err = await self._run(*self.create_args(name, command, workdir))
        if code != 0:
            raise ContainerRefused(f"{self.spec.engine} create failed: {err.strip()[:500]}")
        inspected = await self.inspect(name)
        why = ["the engine cannot inspect it"] if inspected is None else refusals(inspected, self.allowed())
        if why:
            await self.remove(name)
            log.warning("container_refused", container=name, reasons=why)
            raise ContainerRefused("container admission refused: " + "; ".join(why))
        return [*self.base, "start", "--attach", name]

    def allowed(self) -> list[AllowedMount]:
        return [AllowedMount.parse(m) for m in self.spec.mounts]

    async def remove(self, name: str) -> None:
        await self._run("rm", "--force", name)

    async def stop_and_prove(self, name: str, grace_s: float) -> str:
        """Stop the container; "" once the engine shows it stopped (then it is removed),
        else why it is not proven."""
        inspected, absent = await self._inspect(name)
        if inspected is None:
            # The engine saying there is no such container is proof; no answer is not.
            return "" if absent else f"the engine cannot inspect container {name}"
        if _running(inspected):
            await self._run("stop", "--time", str(max(0, int(grace_s))), name)
            inspected = await self.inspect(name)
            if inspected is None or _running(inspected):
                return f"the engine does not show container {name} stopped"
        await self.remove(name)
        return ""


def _running(inspected: dict[str, Any]) -> bool:
    state = inspected.get("State") or {}
    return bool(state.get("Running")) or bool(state.get("Pid"))
