# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The DFlash run's settings: the ``dflash_*`` variables, checked and rendered (controller side).

Every ``dflash_<name>`` variable is one of: a trainer flag (FLAGS, in the order the trainer's
command line has them), the passthrough list (``extra_args``), the environment (``env``,
``secret_env``) or the resume choice (``resume``). Anything else is a mistake, and a
misspelt key must never be ignored in silence: it fails, naming the nearest known key.
Every failure is one line that names the variable, the value and the rule.

``argv(settings)`` returns a list of strings, never a shell string: whoever writes it into a
script quotes each element (``ansible.builtin.quote``).
"""

from __future__ import annotations

import difflib
import posixpath
import re

from ansible_collections.dflash.lifecycle.plugins.module_utils.launch import launchers

NOISE_TYPES = ("uniform", "gaussian", "none")
# name -> (kind, rule); kind decides the rendering, rule the validation. In flag order.
FLAGS = (
    ("target_model", "path", None),
    ("data_dir", "path", None),
    ("output_dir", "path", None),
    ("target_gpus", "gpus", None),
    ("drafter_gpus", "gpus", None),
    ("epochs", "int", ">=1"),
    ("lr", "float", ">0"),
    ("warmup_ratio", "float", "[0,1)"),
    ("weight_decay", "float", ">=0"),
    ("grad_accum", "int", ">=1"),
    ("grad_clip", "float", ">0"),
    ("token_budget", "int", ">=1"),
    ("max_seq_len", "int", ">=1"),
    ("max_batch_size", "int", ">=1"),
    ("block_size", "int", ">=1"),
    ("max_anchors", "int", ">=1"),
    ("num_draft_layers", "int", ">=1"),
    ("gamma", "float", ">0"),
    ("noise_start", "float", "[0,1]"),
    ("noise_end", "float", "[0,1]"),
    ("noise_type", "choice", NOISE_TYPES),
    ("use_soft_labels", "switch", None),
    ("profile_interval", "int", ">=1"),
)
OPTIONAL = {"profile_interval"}
NOT_FLAGS = ("extra_args", "env", "secret_env", "resume")
KNOWN = tuple(name for name, _kind, _rule in FLAGS) + NOT_FLAGS
RESUME_CHOICES = (True, False, "auto")
# job settings that lived under dflash_ before they got their own namespace
RENAMED = {"serial": "redeploy_serial", "lock_ttl": "redeploy_lock_ttl",
           "lock_takeover": "redeploy_lock_takeover"}
FLAG_RE = re.compile(r"^--[a-z0-9][a-z0-9-]*$")
RULE_WORDS = {">=1": ">= 1", ">0": "> 0", ">=0": ">= 0", "[0,1)": "in [0, 1)", "[0,1]": "in [0, 1]"}


class SettingsError(ValueError):
    """One bad setting: the message names the variable, the value and the rule."""


def _fail(name, message):
    raise SettingsError(f"dflash_{name}: {message}")


def strip_prefix(settings):
    """{name: value} from {dflash_name: value} (a name without the prefix is accepted too)."""
    if not isinstance(settings, dict):
        raise SettingsError(f"the DFlash settings must be a dict, got {type(settings).__name__}")
    return {(k[len("dflash_"):] if k.startswith("dflash_") else k): v for k, v in settings.items()}


def unknown(names):
    """One line per dflash_* name that is no setting, with the nearest known one."""
    errors = []
    for name in sorted(names):
        short = name[len("dflash_"):] if name.startswith("dflash_") else name
        if short in KNOWN:
            continue
        if short in RENAMED:
            errors.append(f"{name}: renamed to {RENAMED[short]} (a job setting, not a trainer flag)")
            continue
        near = difflib.get_close_matches(short, KNOWN, n=1, cutoff=0.6)
        hint = f"; did you mean dflash_{near[0]}?" if near else ""
        errors.append(f"{name}: not a DFlash setting (a trainer flag, dflash_extra_args, dflash_env, "
                      f"dflash_secret_env or dflash_resume){hint}")
    return errors


def _number(name, value, kind):
    """The value and its rendering: a string keeps its spelling ('6e-4' stays '6e-4')."""
    if isinstance(value, bool):
        _fail(name, f"expected a number, got {value!r}")
    try:
        number = int(value) if kind == "int" else float(value)
    except (TypeError, ValueError):
        _fail(name, f"expected {'an integer' if kind == 'int' else 'a number'}, got {value!r}")
    if kind == "int" and isinstance(value, float) and not value.is_integer():
        _fail(name, f"expected an integer, got {value!r}")
    text = value.strip() if isinstance(value, str) else str(value)
    if kind == "float" and not re.match(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$", text):
        _fail(name, f"expected a plain decimal number, got {value!r}")
    return number, text


def _check_rule(name, number, rule):
    ok = {
        ">=1": number >= 1, ">0": number > 0, ">=0": number >= 0,
        "[0,1)": 0 <= number < 1, "[0,1]": 0 <= number <= 1,
    }[rule]
    if not ok:
        _fail(name, f"must be {RULE_WORDS[rule]}, got {number}")


def _gpus(name, value):
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value:
        _fail(name, f"expected a non-empty list of GPU ids, got {value!r}")
    ids = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            _fail(name, f"GPU ids are integers >= 0, got {item!r}")
        if item in ids:
            _fail(name, f"GPU {item} is listed twice")
        ids.append(item)
    return ids


def resume_choice(value):
    """True, False or 'auto' from a setting's spelling (a survey answers in strings)."""
    text = str(value).strip().lower()
    if text in ("true", "yes", "1"):
        return True
    if text in ("false", "no", "0"):
        return False
    if text == "auto":
        return "auto"
    _fail("resume", f"must be true, false or auto, got {value!r}")


def validated(settings, visible_gpus=None):
    """(the --flag value list, the checked numbers and GPU ids by name); fails naming the first
    bad dflash_* key. dflash_resume must be resolved to true or false by the caller."""
    settings = strip_prefix(settings)
    flags, values = [], {}
    for name, kind, rule in FLAGS:
        value = settings.get(name)
        if value is None or value == "":
            if name in OPTIONAL:
                continue
            _fail(name, "is required")
        flag = "--" + name.replace("_", "-")
        if kind == "path":
            if not isinstance(value, str) or not value.startswith("/"):
                _fail(name, f"must be an absolute path, got {value!r}")
            if "\n" in value or "\0" in value:
                _fail(name, "must not contain a newline or NUL")
            flags += [flag, value]
        elif kind == "gpus":
            values[name] = _gpus(name, value)
            flags += [flag, ",".join(str(i) for i in values[name])]
        elif kind in ("int", "float"):
            number, text = _number(name, value, kind)
            _check_rule(name, number, rule)
            values[name] = number
            flags += [flag, text]
        elif kind == "choice":
            if value not in rule:
                _fail(name, f"must be one of {', '.join(rule)}, got {value!r}")
            flags += [flag, value]
        elif kind == "switch":
            if not isinstance(value, bool):
                _fail(name, f"must be true or false, got {value!r}")
            if value:
                flags.append(flag)
    _cross_checks(values, visible_gpus)
    extra = settings.get("extra_args") or []
    if not isinstance(extra, list) or not all(isinstance(a, (str, int, float)) for a in extra):
        _fail("extra_args", f"must be a list of strings, got {extra!r}")
    if extra and not FLAG_RE.match(str(extra[0])):
        _fail("extra_args", f"must start with a --flag, got {extra[0]!r}")
    flags += [str(a) for a in extra]
    resume = resume_choice(settings.get("resume", False))
    if resume == "auto":
        _fail("resume", "auto must be resolved (a checkpoint exists or not) before the command line is rendered")
    if resume:
        flags.append("--resume")
    return flags, values


def _cross_checks(values, visible_gpus):
    overlap = sorted(set(values["target_gpus"]) & set(values["drafter_gpus"]))
    if overlap:
        _fail("drafter_gpus", f"GPUs {overlap} are also in dflash_target_gpus; the sets must be disjoint")
    if visible_gpus is not None:
        for name in ("target_gpus", "drafter_gpus"):
            beyond = [i for i in values[name] if i >= int(visible_gpus)]
            if beyond:
                _fail(name, f"GPU ids {beyond} are not visible: the CT sees {visible_gpus} GPUs "
                            f"(ids 0-{int(visible_gpus) - 1})")
    if values["noise_end"] > values["noise_start"]:
        _fail("noise_end", f"must be <= dflash_noise_start ({values['noise_start']}), "
                           f"got {values['noise_end']}")
    if values["max_seq_len"] % values["block_size"]:
        _fail("max_seq_len", f"must be a multiple of dflash_block_size ({values['block_size']}), "
                             f"got {values['max_seq_len']}")
    if values["token_budget"] < values["max_seq_len"]:
        _fail("token_budget", f"must be >= dflash_max_seq_len ({values['max_seq_len']}), "
                              f"got {values['token_budget']}")


def argv(settings, visible_gpus=None, python="python3", script=None, launcher="python", launcher_options=None,
         shutdown_timeout=900, shutdown_flag=True, graceful_cap=900):
    """argv of the trainer: [python, -u, script, --flag, value, ...], or through a launcher
    [python, -u, -m, <launcher>, --option, value, ..., script, --flag, ...] with the options that
    keep it safe for a graceful stop (module_utils/launch/launchers.py)."""
    flags, values = validated(settings, visible_gpus)
    if not script:
        return flags
    chosen = launcher_checked(launcher, launcher_options, shutdown_timeout,
                              len(set(values["target_gpus"] + values["drafter_gpus"])), graceful_cap)
    if chosen is None:
        return [python, "-u", script] + flags
    return chosen.render(python, script, flags, launcher_options, float(shutdown_timeout), bool(shutdown_flag))


def launcher_checked(name, options, shutdown_timeout, gpus, graceful_cap=900):
    """The launcher of trainer_run_launcher with its options checked (None for python): known
    options with values of their kind, a deadline no shorter than the stop's graceful cap, and
    ranks that divide the GPUs the run is given (which the CT must show: validated())."""
    try:
        chosen = launchers.named(name or "python")
        if chosen is None:
            if options:
                raise launchers.LauncherError("trainer_run_launcher_options: set, but trainer_run_launcher is "
                                              "python (no launcher)")
            return None
        if options is not None and not isinstance(options, dict):
            raise launchers.LauncherError(f"trainer_run_launcher_options: a mapping, got {options!r}")
        options = dict(options or {})
        if float(shutdown_timeout) < float(graceful_cap):
            raise launchers.LauncherError(
                f"trainer_launch_shutdown_timeout: {shutdown_timeout} s is shorter than the stop's graceful wait "
                f"cap (trainer_stop_graceful_wait_cap, {float(graceful_cap):.0f} s): the agent would SIGKILL the "
                "workers in the middle of their save")
        chosen.check(dict(chosen.forced_options(float(shutdown_timeout), True), **options), float(graceful_cap))
        ranks = chosen.ranks(options)
        if ranks is not None:
            launchers.gpus_per_rank(chosen.rank_options[0], ranks, int(gpus))
    except launchers.LauncherError as err:
        raise SettingsError(str(err)) from None
    return chosen


def stop_request_path_checked(path, run_dir):
    """trainer_run_stop_request_path: empty, or a file inside trainer_run_dir or /dev/shm - places
    in the CT that the trainer and the stop both reach and nothing else writes."""
    if not path:
        return
    where = f"trainer_run_stop_request_path: {path}"
    if not posixpath.isabs(path):
        raise SettingsError(f"{where} is not an absolute path")
    normal = posixpath.normpath(path)
    homes = [posixpath.normpath(run_dir)] if run_dir else []
    if not any(normal.startswith(home.rstrip("/") + "/") for home in homes + ["/dev/shm"]):
        raise SettingsError(f"{where} is not inside trainer_run_dir ({run_dir}) or /dev/shm")


def launcher_env(name, shutdown_timeout):
    """The environment a launcher's run needs for a graceful stop ({} for python)."""
    chosen = launchers.named(name or "python")
    return chosen.environment(float(shutdown_timeout)) if chosen else {}


def gpus_needed(settings):
    """GPUs the run needs (its highest GPU id + 1), from settings that pass every rule."""
    _flags, values = validated(dict(strip_prefix(settings), resume=False))
    return max(values["target_gpus"] + values["drafter_gpus"]) + 1


def gpus_given(settings):
    """How many GPUs the run is given (its target and drafter GPU ids)."""
    _flags, values = validated(dict(strip_prefix(settings), resume=False))
    return len(set(values["target_gpus"] + values["drafter_gpus"]))


def env_pairs(env, name="env"):
    """[NAME, value] pairs checked for sane names (the values are quoted by the caller)."""
    if not isinstance(env, dict):
        _fail(name, f"must be a mapping of NAME: value, got {env!r}")
    for key in env:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", str(key)):
            _fail(name, f"{key!r} is not a valid environment variable name")
    return [[str(k), str(v)] for k, v in env.items()]
