# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin of dflash.lifecycle.trainer_preflight: ansible-core's normal action, the CT's answer checked
and the module's payload kept (plugin_utils/ct_action.py); with launch, the launch's progress shown
as trainer_process's action shows it (plugin_utils/progress_watch.py), and the CT told when this job's
ansible-playbook died while the module ran (ControllerWatch). A CT that answers that it is privileged
is warned of on the controller, in the controller's words (docs/security.md)."""

from __future__ import annotations

from ansible.plugins.action import ActionBase
from ansible.plugins.action.normal import ActionModule as NormalAction
from ansible.utils.display import Display

from ansible_collections.dflash.lifecycle.plugins.plugin_utils.ct_action import CTModuleAction
from ansible_collections.dflash.lifecycle.plugins.plugin_utils.progress_watch import ControllerWatch, launch_watch

display = Display()
PRIVILEGED = ("{}: a privileged CT - its root is the node's root, and nothing the project does contains it "
              "(docs/security.md); run the trainer in an unprivileged CT, or refuse privileged CTs with "
              "trainer_preflight_privileged=refuse")


class ActionModule(CTModuleAction, NormalAction):
    def run(self, tmp=None, task_vars=None):
        result = self._preflight(tmp, task_vars)
        if result.get("privileged") is True:
            display.warning(PRIVILEGED.format(task_vars.get("inventory_hostname")))
        return result

    def _preflight(self, tmp, task_vars):
        if not isinstance(self._task.args.get("launch"), dict):
            return super().run(tmp, task_vars)
        result = ActionBase.run(self, tmp, task_vars)  # what trainer_process's action runs
        controller = ControllerWatch()
        args = dict(self._task.args)
        args["launch"], watch = launch_watch(self._connection, args["launch"], task_vars.get("inventory_hostname"))
        try:
            result.update(watch.run(lambda: self._execute_module(
                module_name="dflash.lifecycle.trainer_preflight", module_args=args, task_vars=task_vars)))
        finally:  # a call that raised still leaves the CT to be told
            controller.tell_if_gone(self, dict(args, change_record=args["launch"].get("change_record")), task_vars)
        return result
