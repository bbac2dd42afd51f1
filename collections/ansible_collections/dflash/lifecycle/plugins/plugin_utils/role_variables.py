# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The variables the project's roles know, read from the roles themselves (controller side).

A variable in a role's namespace (``trainer_stop_*``, ``trainer_run_*`` ...) or a job setting
(``redeploy_*``) that no role knows is a mistake - a typo, or a name from an older version -
and would be ignored in silence. Known are: every option of a role's argument specs (any entry
point), the keys of its defaults and vars, the results its tasks register, and the takeover code
(TAKEOVER_VARIABLE).
"""

from __future__ import annotations

import difflib
import glob
import os
import re

import yaml

# the C loader where PyYAML has it: the roles' files are read on every job (0.08 s of a job's
# controller CPU with the Python loader, 0.01 s with the C one, measured)
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
OURS = re.compile(r"^(dflash|trainer_[a-z]+|redeploy)_")
ROLE_PREFIX = "trainer_"
REGISTER = re.compile(r"^\s*register:\s*([A-Za-z_][A-Za-z0-9_]*)\s*$", re.M)
# the job setting no role holds and no template reads: the CT modules' action plugin reads it as the
# job gave it (plugin_utils/ct_action.py): in a role's defaults or argument spec, it would be templated
TAKEOVER_VARIABLE = "redeploy_lock_takeover"
# names that work for one more version, with a deprecation warning
DEPRECATED = {
    "trainer_stop_checkpoint_max_wait": "trainer_stop_graceful_wait_cap",
    "trainer_stop_checkpoint_wait_max": "trainer_stop_next_checkpoint_timeout",
}
# names that are gone: the run's paths are set once, in trainer_run
RENAMED = {
    "trainer_stop_pidfile": "trainer_run_pidfile",
    "trainer_launch_pidfile": "trainer_run_pidfile",
    "trainer_stop_pattern": "trainer_run_pattern",
    "trainer_launch_pattern": "trainer_run_pattern",
    "trainer_stop_checkpoint_dir": "trainer_run_checkpoint_dir",
    "trainer_stop_log_file": "trainer_run_log_file",
    "trainer_launch_log_file": "trainer_run_log_file",
    "trainer_launch_run_dir": "trainer_run_dir",
    "trainer_stop_detach_dir": "trainer_run_dir",
    "trainer_preflight_min_free_gb": "trainer_run_min_free_gb",
    "trainer_launch_health_regex": "trainer_run_step_regex",
    "trainer_launch_script": "trainer_run_script",
    "trainer_launch_python": "trainer_run_python",
    "trainer_code_base": "trainer_run_release_base",
}

# names that are gone, with what replaced them
_LAYOUT = ("trainer_run_checkpoint_format: a checkpoint is what its layout says (auto recognises "
           "it); a glob of your own is trainer_run_checkpoint_format=custom with "
           "trainer_run_checkpoint_custom.pattern")
REPLACED = {
    "trainer_run_checkpoint_pattern": _LAYOUT,
    "trainer_stop_checkpoint_pattern": _LAYOUT,
    "trainer_preflight_checkpoint_pattern": _LAYOUT,
}


def find_roles_dir(task_vars):
    """The project's roles directory: beside the playbook, or one level up (playbooks/)."""
    base = task_vars.get("playbook_dir") or os.getcwd()
    for candidate in (os.path.join(base, "roles"), os.path.join(base, os.pardir, "roles")):
        if os.path.isdir(os.path.join(candidate, "trainer_run")):
            return os.path.normpath(candidate)
    raise ValueError(f"no roles directory with trainer_run beside {base}")


def _load(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.load(handle, Loader=SAFE_LOADER) or {}
    except FileNotFoundError:
        return {}


class Project:
    """The roles under roles_dir whose names start with trainer_."""

    def __init__(self, roles_dir):
        self.specs = {}
        self.known = {TAKEOVER_VARIABLE}
        for role_dir in sorted(glob.glob(os.path.join(roles_dir, ROLE_PREFIX + "*"))):
            role = os.path.basename(role_dir)
            entry_points = _load(os.path.join(role_dir, "meta", "argument_specs.yml")).get("argument_specs", {})
            for entry, spec in entry_points.items():
                self.specs[f"{role}.{entry}"] = (spec or {}).get("options", {})
                self.known.update(self.specs[f"{role}.{entry}"])
            for name in ("defaults", "vars"):
                self.known.update(_load(os.path.join(role_dir, name, "main.yml")))
            for tasks in glob.glob(os.path.join(role_dir, "tasks", "*.yml")):
                with open(tasks, encoding="utf-8") as handle:
                    self.known.update(REGISTER.findall(handle.read()))
        if not self.specs:
            raise ValueError(f"{roles_dir} holds no trainer_* role")

    def options(self, role):
        """The options of a role's entry point, ``role`` (main) or ``role.entry``."""
        key = role if "." in role else f"{role}.main"
        if key not in self.specs:
            raise ValueError(f"no role entry point {key} in the project")
        return self.specs[key]

    def unknown(self, names):
        """One line per name in a role's namespace (or a job setting) that no role knows."""
        errors = []
        for name in sorted(names):
            if name in self.known or name in DEPRECATED:
                continue
            if name in REPLACED:
                errors.append(f"{name}: replaced by {REPLACED[name]}")
                continue
            if name in RENAMED:
                errors.append(f"{name}: renamed to {RENAMED[name]} (the run's paths are set once, "
                              "for the stop, the launch and the status alike)")
                continue
            near = difflib.get_close_matches(name, sorted(self.known), n=1, cutoff=0.75)
            errors.append(f"{name}: no role of this project knows this variable"
                          + (f"; did you mean {near[0]}?" if near else ""))
        return errors

    @staticmethod
    def deprecated(names):
        return [f"{old} is renamed to {new}; the old name still works until 0.3.0"
                for old, new in sorted(DEPRECATED.items()) if old in names]
