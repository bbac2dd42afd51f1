# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The launch's options: trainer_process's argument spec (its DOCUMENTATION documents it, less the
lock's options), their validation where another module is given them (the preflight's launch), and
when the preflight's call may launch (Python 3.8 compatible).

Kept apart from the transaction: a preflight that launches nothing validates its launch option
without compiling the launch.
"""

from __future__ import annotations

from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import policy
from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoint_formats
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import change_record, progress


# the models staged between the stop and the launch, and before a relaunch after a CT restart
STAGE_MODELS = {"type": "dict", "options": {
    "models": {"type": "dict", "required": True},
    "reserve_gb": {"type": "float", "default": 32},
    "workers": {"type": "int", "default": 4},
    "progress_file": {"type": "path"},
}}


ARGUMENT_SPEC = {
    "command": {"type": "list", "elements": "str", "required": True},
    "cwd": {"type": "path", "default": "/"},
    "pidfile": {"type": "path", "required": True},
    "pattern": {"type": "str"},
    "run_dir": {"type": "path"},
    "wrapper_script": {"type": "str"},
    "secrets_env": {"type": "str", "no_log": True},
    "create_dirs": {"type": "list", "elements": "path", "default": []},
    "stop_first": {"type": "dict"},
    "refuse_busy": {"type": "bool", "default": True},
    "device_paths": {"type": "list", "elements": "str", "default": []},
    "gpus": {"type": "list", "elements": "int", "default": []},
    "nvidia_smi": {"type": "path", "default": "/usr/bin/nvidia-smi"},
    "gpu_free_threshold_mib": {"type": "int", "default": 1024},
    "gpu_free_timeout": {"type": "float", "default": 60},
    "log_file": {"type": "path", "required": True},
    "model_dirs": {"type": "list", "elements": "path", "default": []},
    "log_keep": {"type": "int", "default": 5},
    "checkpoint_dir": {"type": "path"},
    **checkpoint_formats.ARGUMENT_SPEC,
    "min_free_gb": {"type": "float", "default": 0},
    "resume_auto": {"type": "bool", "default": False},
    "resumes": {"type": "bool", "default": False},
    "incomplete_checkpoint": {"type": "str", "choices": ["move_aside", "fail"], "default": "move_aside"},
    "resume_args": {"type": "list", "elements": "str", "default": ["--resume"]},
    "health_seconds": {"type": "float", "default": 5},
    "gang": {"type": "bool", "default": False},
    "gang_health": {"type": "dict", "options": {
        "dir": {"type": "path", "required": True},
        "me": {"type": "str", "required": True},
        "members": {"type": "list", "elements": "str", "required": True},
    }},
    "step_regex": {"type": "str", "default": progress.STEP_REGEX, "aliases": ["health_regex"],
                   "deprecated_aliases": [{"name": "health_regex", "version": "0.3.0",
                                           "collection_name": "dflash.lifecycle"}]},
    "throughput_patterns": {"type": "list", "elements": "str", "default": list(progress.THROUGHPUT_PATTERNS)},
    "profile_line_regex": {"type": "str", "default": progress.PROFILE_LINE_REGEX},
    "profile_stage_regex": {"type": "str", "default": progress.PROFILE_STAGE_REGEX},
    "throughput_lines": {"type": "int", "default": 5},
    "throughput_warmup_lines": {"type": "int", "default": 1},
    "throughput_timeout": {"type": "float", "default": 300},
    "progress_file": {"type": "path"},
    "health_timeout": {"type": "float", "default": 300},
    "release_base": {"type": "path"},
    "stage_models": STAGE_MODELS,
    "rollback_on_failure": {"type": "bool", "default": False},
    "settings_from": {"type": "str", "choices": ["job", "last_launch", "launch_before_last"], "default": "job"},
    "rollback_launch": {"type": "dict", "options": {
        "wrapper_script": {"type": "str", "required": True},
        "gang_health_dir": {"type": "path"},
    }},
    "gang_stop": {"type": "dict", "options": {
        "name": {"type": "str", "required": True},
        "dir": {"type": "path", "required": True},
        "me": {"type": "str", "required": True},
        "members": {"type": "list", "elements": "str", "required": True},
        "wait": {"type": "float", "default": 960},
        "on_missing_checkpoint": {"type": "str", "default": "fail"},
    }},
    "change_record": {"type": "path", "default": change_record.DEFAULT_PATH},
    "supervise": policy.POLICY,
    "metrics": {"type": "dict", "options": {
        "listen": {"type": "str", "required": True},
        "canary_threshold_pct": {"type": "float"},
        "exposed_steps_limit": {"type": "int"},
        "gpu_roles": {"type": "dict", "default": {}},
    }},
    "lifecycle": {"type": "dict", "options": {
        "dir": {"type": "path"},
        "gang_base": {"type": "path"},
        "rounds_dir": {"type": "path"},
        "round": {"type": "int"},
        "stop": {"type": "dict", "default": {}},
        "stage_models": STAGE_MODELS,
        "lock_path": {"type": "path"},
    }},
    "activate": {"type": "dict", "options": {
        "base": {"type": "path", "required": True},
        "release": {"type": "str", "required": True},
        "legacy_links": {"type": "list", "elements": "dict", "default": []},
    }},
}


class InvalidLaunch(ValueError):
    """Launch options given to another module that trainer_process would refuse."""


class LaunchFailed(Exception):
    """The launch ended without a healthy trainer; details are the task result's other keys
    (the stop's result among them once it ran: a rescue reads it)."""

    def __init__(self, msg, **details):
        super().__init__(msg)
        self.msg, self.details = msg, details


def checked(options, where):
    """(params, secret values) of launch options given to another module (the preflight's launch),
    validated as trainer_process validates its own; errors name the option as where.<name>."""
    # only a validation pays for importing it (a supervisor or a hook that raises LaunchFailed does not)
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    if not isinstance(options, dict):
        raise InvalidLaunch(f"{where}: must be a mapping of dflash.lifecycle.trainer_process's options")
    validated = ArgumentSpecValidator(ARGUMENT_SPEC).validate(options)
    messages = validated.error_messages or problems(validated.validated_parameters)
    if messages:
        raise InvalidLaunch("; ".join(f"{where}: {message}" for message in messages))
    # the secret values AnsibleModule itself takes from its own validation (basic.py reads the same)
    return validated.validated_parameters, validated._no_log_values


def split_listen(listen):
    """(host, port) of ``HOST:PORT`` or ``[V6]:PORT``; ValueError with the reason."""
    host, sep, port = str(listen).rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{listen!r} is not HOST:PORT (a port from 1 to 65535)")
    bracketed = host.startswith("[") and host.endswith("]")
    host = host[1:-1] if bracketed else host
    if not host or (":" in host and not bracketed):
        raise ValueError(f"{listen!r} is not HOST:PORT (an IPv6 address goes in brackets: [::]:9733)")
    return host, int(port)


def problems(params):
    """The lines naming each validated option that the argument spec lets through and the launch
    refuses; [] when all hold."""
    found = policy.policy_problems(params.get("supervise") or {})
    listen = (params.get("metrics") or {}).get("listen")
    if listen is not None:
        try:
            split_listen(listen)
        except ValueError as err:
            found.append(f"metrics.listen: {err}")
        if not (params.get("lifecycle") or {}).get("dir"):
            found.append("metrics: needs lifecycle.dir, where the metrics are read from")
    return found


def deferred(check_mode, release, preflight, launch):
    """Why a launch asked of the preflight's call cannot run in it, or None: what redeploy.yml does
    between the checks and the launch - the push of a release not installed (trainer_code's push.yml),
    the staging of a model the launch does not stage itself (trainer_model's stage.yml). release: the
    preflight's release option; preflight: its result; launch: the launch's options."""
    if check_mode:
        return "check mode: the launch's own task reports what it would do"
    if release and not preflight["release_status"]["present"]:
        return f"release {release['release']} is to be pushed first"
    if preflight["model_stage_needed"] and not launch.get("stage_models"):
        return "a model is to be staged between the stop and the launch"
    return None
