# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin of dflash.lifecycle.trainer_process: runs the module and, while its wait for
health and for the canary's progress lines passes 10 seconds, shows its progress on the
controller (plugin_utils/progress_watch.py); with stop_first, the stop's progress before it; and tells
the CT when this job's ansible-playbook died while the module ran (ControllerWatch)."""

from __future__ import annotations

from ansible_collections.dflash.lifecycle.plugins.plugin_utils.ct_action import CTModuleAction
from ansible_collections.dflash.lifecycle.plugins.plugin_utils.progress_watch import ControllerWatch, launch_watch


class ActionModule(CTModuleAction):
    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        controller = ControllerWatch()
        args, watch = launch_watch(self._connection, self._task.args, task_vars.get("inventory_hostname"))
        try:
            result.update(watch.run(lambda: self._execute_module(
                module_name="dflash.lifecycle.trainer_process", module_args=args, task_vars=task_vars)))
        finally:  # a call that raised still leaves the CT to be told
            controller.tell_if_gone(self, args, task_vars)
        return result
