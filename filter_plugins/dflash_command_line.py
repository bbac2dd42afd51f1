# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Render and validate the DFlash trainer's command line from group_vars.

``{{ settings | dflash_argv(visible_gpus=8) }}``, where settings maps ``dflash_<name>``
(or ``<name>``) to values, returns the argv (a list of
strings, never a shell string), after checking every value; a bad value raises an error
that names its group_vars key (``dflash_<name>``).  Nothing here quotes for a shell:
whoever writes the argv into a script quotes each element (``ansible.builtin.quote``).
"""

from __future__ import annotations

import re

from ansible.errors import AnsibleFilterError

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
FLAG_RE = re.compile(r"^--[a-z0-9][a-z0-9-]*$")


def _fail(name, message):
    raise AnsibleFilterError(f"dflash_{name}: {message}")


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
        _fail(name, f"must be {rule.replace('[0,1)', 'in [0, 1)').replace('[0,1]', 'in [0, 1]')}, "
                    f"got {number}")


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


def dflash_argv(settings, visible_gpus=None, python="python3", script=None):
    """argv of the trainer: [python, -u, script, --flag, value, ...]."""
    flags, _values = _validated(settings, visible_gpus)
    return ([python, "-u", script] if script else []) + flags


def dflash_gpus_needed(settings):
    """GPUs the run needs (its highest GPU id + 1), from settings that pass every rule of
    dflash_argv: a value that would make a bad command line fails here, before the preflight
    call that takes this number is made."""
    _flags, values = _validated(settings, None)
    return max(values["target_gpus"] + values["drafter_gpus"]) + 1


def _validated(settings, visible_gpus):
    """(the --flag value list, the checked numbers and GPU ids by name); fails naming the
    first bad dflash_* key."""
    if not isinstance(settings, dict):
        raise AnsibleFilterError(f"the DFlash settings must be a dict, got {type(settings).__name__}")
    # group_vars spell the keys dflash_<name>; both spellings are accepted
    settings = {(k[len("dflash_"):] if k.startswith("dflash_") else k): v
                for k, v in settings.items()}
    flags = []
    values = {}
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
    resume = settings.get("resume", False)
    if not isinstance(resume, bool):
        _fail("resume", f"must be true or false, got {resume!r}")
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


def dflash_env_pairs(env, name="env"):
    """KEY=value pairs checked for sane names (the values are quoted by the caller)."""
    if not isinstance(env, dict):
        _fail(name, f"must be a mapping of NAME: value, got {env!r}")
    for key in env:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", str(key)):
            _fail(name, f"{key!r} is not a valid environment variable name")
    return [[str(k), str(v)] for k, v in env.items()]


class FilterModule:
    """DFlash command-line filters."""

    def filters(self):
        return {"dflash_argv": dflash_argv, "dflash_gpus_needed": dflash_gpus_needed,
                "dflash_env_pairs": dflash_env_pairs}
