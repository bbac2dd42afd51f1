# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin of dflash.lifecycle.validate_settings: every variable a job will apply, checked
on the controller before anything is touched, each failure one line."""

from __future__ import annotations

from ansible.errors import AnsibleError
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase

from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import policy
from ansible_collections.dflash.lifecycle.plugins.plugin_utils import gang, role_variables, run_settings

ARGUMENT_SPEC = {
    "roles": {"type": "list", "elements": "str", "required": True},
    "roles_dir": {"type": "path"},
    "settings": {"type": "bool", "default": True},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _spec, params = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        task_vars = task_vars or {}
        roles_dir = params["roles_dir"] or role_variables.find_roles_dir(task_vars)
        try:
            project = role_variables.Project(roles_dir)
        except (OSError, ValueError) as err:
            return dict(result, failed=True, msg=f"roles_dir: {err}")
        errors, warnings = [], []
        defined = [name for name in task_vars if role_variables.OURS.match(name)]
        errors += project.unknown([n for n in defined if not n.startswith("dflash_")])
        warnings += project.deprecated(defined)
        for role in params["roles"]:
            try:
                spec = project.options(role)
            except ValueError as err:
                return dict(result, failed=True, msg=f"roles: {err}")
            provided = {name: self._value(task_vars, name) for name in spec if name in task_vars}
            checked = ArgumentSpecValidator(spec).validate(provided)
            errors += [" ".join(str(m).split()) for m in checked.error_messages]
        if "trainer_launch" in params["roles"] and not errors:
            # the supervisor's numbers, by the rules its launch option has (module_utils/agent/policy.py)
            given = {key: self._value(task_vars, f"trainer_launch_supervise_{key}") for key in policy.RULES
                     if f"trainer_launch_supervise_{key}" in task_vars}
            if "trainer_launch_supervise_webhook" in task_vars:
                given["webhook"] = self._value(task_vars, "trainer_launch_supervise_webhook")
            errors += policy.policy_problems({key: _number(value) for key, value in given.items()},
                                             lambda key: f"trainer_launch_supervise_{key}")
        if params["settings"]:
            names = [n for n in defined if n.startswith("dflash_")]
            errors += run_settings.unknown(names)
            if not errors:
                settings = {name: self._value(task_vars, name) for name in names}
                try:
                    result["gpus_needed"] = run_settings.gpus_needed(settings)
                    gpus = run_settings.gpus_given(settings)
                    run_settings.launcher_checked(
                        self._value(task_vars, "trainer_run_launcher") if "trainer_run_launcher" in task_vars else "python",
                        self._value(task_vars, "trainer_run_launcher_options")
                        if "trainer_run_launcher_options" in task_vars else None,
                        self._value(task_vars, "trainer_launch_shutdown_timeout")
                        if "trainer_launch_shutdown_timeout" in task_vars else 900, gpus,
                        self._value(task_vars, "trainer_stop_graceful_wait_cap")
                        if "trainer_stop_graceful_wait_cap" in task_vars else 900)
                    if "trainer_run_stop_request_path" in task_vars:
                        run_settings.stop_request_path_checked(
                            self._value(task_vars, "trainer_run_stop_request_path"),
                            self._value(task_vars, "trainer_run_dir") if "trainer_run_dir" in task_vars else None)
                    if "trainer_run_gang" in task_vars and self._value(task_vars, "trainer_run_gang"):
                        names = list(gang.IDENTITY)
                        values = {n: self._value(task_vars, n) for n in names + gang.agreed_names(task_vars)
                                  if n in task_vars}
                        result["gang"] = gang.identity(task_vars.get("inventory_hostname"), values,
                                                       task_vars.get("groups"), gpus)
                except (run_settings.SettingsError, gang.GangError) as err:
                    errors.append(str(err))
        for warning in warnings:
            self._display.deprecated(warning, version="0.3.0", collection_name="dflash.lifecycle")
        if errors:
            # one line per failure; the first names the job's first problem
            return dict(result, failed=True, errors=errors, msg="; ".join(errors))
        return dict(result, changed=False, msg=f"settings of {', '.join(params['roles'])} checked")

    def _value(self, task_vars, name):
        try:
            return self._templar.template(task_vars[name])
        except AnsibleError as err:
            raise AnsibleError(f"{name}: {' '.join(str(err).split())}") from None


def _number(value):
    """A number given as a string in an inventory ("10") as the argument spec reads it."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value
