# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The options of a staged stop, checked once and read as attributes (Python 3.8 compatible).

ARGUMENT_SPEC is the module's argument spec: every default lives here and nowhere else.
StopOptions fills what a caller left out from it (unit tests, the launch's own use of the
finding rules), validates the ladder, and is what the finding, target-set, ladder and
checkpoint code read.
"""

from __future__ import annotations

import signal

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoint_formats
from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint.checkpoints import DEFAULT_TEMP_PATTERNS

DEFAULT_LADDER = (
    {"signal": "SIGINT", "scope": "main", "wait": 120},
    {"signal": "SIGTERM", "scope": "tree", "wait": 30},
    {"signal": "SIGKILL", "scope": "tree", "wait": 10},
)
SCOPES = ("main", "group", "tree")
NO_GRACEFUL = ("wait_for_checkpoint", "fail", "proceed")
ON_MISSING_CHECKPOINT = ("fail", "proceed")
DEPRECATED_IN = "0.3.0"


def _renamed(old):
    return {"aliases": [old], "deprecated_aliases": [
        {"name": old, "version": DEPRECATED_IN, "collection_name": "dflash.lifecycle"}]}


ARGUMENT_SPEC = {
    "pidfile": {"type": "path"},
    "pattern": {"type": "str"},
    "pid": {"type": "int"},
    "select": {"type": "str", "choices": ["only", "oldest", "newest"], "default": "only"},
    "include_wrapper": {"type": "bool", "default": False},
    "ladder": {"type": "list", "elements": "dict", "default": [dict(s) for s in DEFAULT_LADDER]},
    "skip_ignored_stage": {"type": "bool", "default": True},
    "device_glob": {"type": "str", "default": "/dev/nvidia*"},
    "leftover_pids": {"type": "list", "elements": "int", "default": []},
    "leftover_pattern": {"type": "str"},
    "checkpoint_dir": {"type": "path"},
    "checkpoint_dir_flag": {"type": "str", "default": "--output-dir"},
    **checkpoint_formats.ARGUMENT_SPEC,
    "saves_on": {"type": "str", "choices": list(checkpoint_formats.SAVES_ON), "default": "auto"},
    "checkpoint_temp_patterns": {"type": "list", "elements": "str",
                                 "default": list(DEFAULT_TEMP_PATTERNS)},
    "checkpoint_activity_window": {"type": "float", "default": 5},
    "checkpoint_stable_window": {"type": "float", "default": 0.5},
    "graceful_wait_cap": dict({"type": "float", "default": 900}, **_renamed("checkpoint_max_wait")),
    "require_checkpoint": {"type": "bool", "default": False},
    "on_missing_checkpoint": {"type": "str", "choices": list(ON_MISSING_CHECKPOINT),
                              "default": "fail"},
    "no_graceful": {"type": "str", "choices": list(NO_GRACEFUL), "default": "wait_for_checkpoint"},
    "next_checkpoint_timeout": dict({"type": "float", "default": 1800},
                                    **_renamed("checkpoint_wait_max")),
    "log_file": {"type": "path"},
    "step_regex": {"type": "str", "default": r"\bstep (\d+)\b"},
    "py_spy": {"type": "path"},
    "py_spy_timeout": {"type": "float", "default": 10},
    "signal_at": {"type": "float"},
    "request_path": {"type": "path"},
    "request_ack_timeout": {"type": "float", "default": 30},
    "detach": {"type": "bool", "default": False},
    "detach_dir": {"type": "path", "default": "/run/dflash"},
    "progress_file": {"type": "path"},
    "lifecycle_dir": {"type": "path"},
    # what the CT's history counts this stop's loss and the GPUs' idle under (ct/history.py CAUSES)
    "cause": {"type": "str", "choices": ["stop", "redeploy"], "default": "stop"},
}


class InvalidParameter(ValueError):
    """A parameter is wrong; the message names it."""


def signal_number(value, where):
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        number = int(value)
        if number in {s.value for s in signal.Signals}:
            return signal.Signals(number)
    elif isinstance(value, str):
        name = value.upper()
        name = name if name.startswith("SIG") else "SIG" + name
        if name in signal.Signals.__members__:
            return signal.Signals[name]
    raise InvalidParameter(f"{where}: unknown signal {value!r}")


def validate_ladder(ladder):
    """Normalised stages; errors name the offending entry, e.g. ``ladder[1].scope``."""
    if not ladder:
        raise InvalidParameter("ladder: needs at least one stage")
    stages = []
    for index, stage in enumerate(ladder):
        where = f"ladder[{index}]"
        if not isinstance(stage, dict):
            raise InvalidParameter(f"{where}: must be a mapping with signal, scope and wait")
        unknown = set(stage) - {"signal", "scope", "wait"}
        if unknown:
            raise InvalidParameter(f"{where}: unknown keys {sorted(unknown)}")
        if "signal" not in stage:
            raise InvalidParameter(f"{where}.signal: required")
        scope = stage.get("scope", "tree")
        if scope not in SCOPES:
            raise InvalidParameter(f"{where}.scope: {scope!r} is not one of {', '.join(SCOPES)}")
        try:
            wait = float(stage.get("wait", 10))
        except (TypeError, ValueError):
            raise InvalidParameter(f"{where}.wait: {stage.get('wait')!r} is not a number") from None
        if wait < 0:
            raise InvalidParameter(f"{where}.wait: must be >= 0, got {wait}")
        stages.append({"signal": signal_number(stage["signal"], f"{where}.signal"),
                       "scope": scope, "wait": wait})
    return stages


def given(options, name):
    """Option name of a mapping of the stop's options, its default where the mapping leaves it out."""
    value = options.get(name)
    return ARGUMENT_SPEC[name]["default"] if value is None else value


def worst_case_s(options):
    """The longest a staged stop with these options (a mapping of them; defaults for the others) can
    take: the stop request's acknowledgement and the save after it, or the wait for the next
    periodic checkpoint (no_graceful wait_for_checkpoint), whichever is longer; then every stage of
    the ladder, the graceful first one grown up to graceful_wait_cap while its checkpoint is
    written, each after its diagnostics."""
    stages = validate_ladder(given(options, "ladder"))
    cap = float(given(options, "graceful_wait_cap"))
    before = float(given(options, "request_ack_timeout")) + cap
    if given(options, "no_graceful") == "wait_for_checkpoint":
        before = max(before, float(given(options, "next_checkpoint_timeout")))
    ladder = sum(stage["wait"] for stage in stages) + max(0.0, cap - stages[0]["wait"])
    return before + ladder + len(stages) * float(given(options, "py_spy_timeout"))


def checked(params, where):
    """StopOptions from a mapping of staged_stop's options given to another module (the launch's
    stop_first), validated as staged_stop's own; errors name the option as where.<name>."""
    if not isinstance(params, dict):
        raise InvalidParameter(f"{where}: must be a mapping of dflash.lifecycle.staged_stop's options")
    validated = ArgumentSpecValidator(ARGUMENT_SPEC, required_one_of=[("pidfile", "pattern")]).validate(params)
    if validated.error_messages:
        raise InvalidParameter("; ".join(f"{where}: {message}" for message in validated.error_messages))
    try:
        return StopOptions(validated.validated_parameters)
    except InvalidParameter as err:
        raise InvalidParameter(f"{where}.{err}") from None


class StopOptions:
    """The module's parameters with every default filled in and the ladder validated
    (``stages``); ``exclude_pids`` are processes never to touch (the module's own chain)."""

    def __init__(self, params, exclude_pids=()):
        for name, spec in ARGUMENT_SPEC.items():
            value = params.get(name)
            setattr(self, name, spec.get("default") if value is None else value)
        self.stages = validate_ladder(self.ladder)
        self.exclude_pids = set(exclude_pids)

    def describe_ladder(self):
        return [dict(s, signal=s["signal"].name) for s in self.stages]
