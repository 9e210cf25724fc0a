"""Skill tasks: a task made from an operator-declared ``[skills.NAME]``.

What leaves the scheduler: the skill's name, its validated arguments and (a CLI skill) the
invocation. What never does: the skill's body (the instructions file's text) and the file's
host path — not in snapshots, events, notifications, error messages or info logs. The body
is read when the worker asks for its assignment and handed only to that worker.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, cast

from libs.settings import SkillArg, SkillConfig
from services.scheduler.domain import MAX_INSTRUCTIONS_BYTES, InvalidArgument, SkillRef

MAX_ARGS_JSON_BYTES = 16 * 1024
ArgValue = str | int | float | bool


class SkillUnavailable(InvalidArgument):
    pass


def _check_arg(skill: str, name: str, spec: SkillArg, value: Any) -> ArgValue:
    kinds: dict[str, tuple[type, ...]] = {
        "string": (str,),
        "integer": (int,),
        "number": (int, float),
        "boolean": (bool,),
    }
    # bool is an int in Python: keep true/false out of number and integer arguments.
    if not isinstance(value, kinds[spec.type]) or (spec.type != "boolean" and isinstance(value, bool)):
        raise InvalidArgument("INVALID_SKILL_ARGS", f"skill {skill!r}: argument {name!r} must be a {spec.type}")
    if isinstance(value, str) and len(value) > spec.max_length:
        raise InvalidArgument(
            "INVALID_SKILL_ARGS", f"skill {skill!r}: argument {name!r} is longer than {spec.max_length} characters"
        )
    if spec.enum is not None and value not in spec.enum:
        raise InvalidArgument("INVALID_SKILL_ARGS", f"skill {skill!r}: argument {name!r} is not one of {spec.enum}")
    return cast(ArgValue, value)


def validate_args(name: str, skill: SkillConfig, args_json: str | None) -> dict[str, ArgValue]:
    """The arguments as the skill's ``args_schema`` allows them (unknown names refused)."""
    raw = args_json or "{}"
    if len(raw.encode()) > MAX_ARGS_JSON_BYTES:
        raise InvalidArgument("INVALID_SKILL_ARGS", f"skill arguments exceed {MAX_ARGS_JSON_BYTES} bytes")
    try:
        args = json.loads(raw)
    except ValueError:
        raise InvalidArgument("INVALID_SKILL_ARGS", "skill arguments must be a JSON object") from None
    if not isinstance(args, dict):
        raise InvalidArgument("INVALID_SKILL_ARGS", "skill arguments must be a JSON object")
    unknown = sorted(set(args) - set(skill.args_schema))
    if unknown:
        raise InvalidArgument("INVALID_SKILL_ARGS", f"skill {name!r} takes no argument {unknown[0]!r}")
    checked: dict[str, ArgValue] = {}
    for arg, spec in skill.args_schema.items():
        if arg not in args:
            if spec.required:
                raise InvalidArgument("INVALID_SKILL_ARGS", f"skill {name!r} needs argument {arg!r}")
            continue
        checked[arg] = _check_arg(name, arg, spec, args[arg])
    return checked


def skill_ref(name: str, skill: SkillConfig, args: dict[str, ArgValue]) -> SkillRef:
    invocation = f"/{name} {json.dumps(args, sort_keys=True)}" if skill.cli else None
    return SkillRef(name=name, args=args, invocation=invocation)


def lookup(skills: dict[str, SkillConfig], name: str) -> SkillConfig:
    skill = skills.get(name)
    if skill is None:
        raise InvalidArgument("UNKNOWN_SKILL", f"no skill named {name!r}", field="skill")
    return skill


def _read(path: Path) -> str:
    data = path.read_bytes()[: MAX_INSTRUCTIONS_BYTES + 1]
    if len(data) > MAX_INSTRUCTIONS_BYTES:
        raise ValueError("too large")
    return data.decode()


async def body(name: str, skill: SkillConfig) -> str:
    """The skill's instructions, read off the event loop. An unreadable file is refused
    without naming its path (the message reaches clients)."""
    try:
        return await asyncio.to_thread(_read, Path(skill.instructions_file))
    except (OSError, ValueError):
        raise SkillUnavailable(
            "SKILL_UNAVAILABLE",
            f"skill {name!r} cannot be read by the scheduler (missing, unreadable, not UTF-8 or over 64 KiB); "
            "ask the operator",
        ) from None
