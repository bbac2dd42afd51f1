# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin of dflash.lifecycle.model_stage: runs the module and, while a copy passes 10
seconds (54 GB take a minute or more), shows its bytes, rate and ETA on the controller
(plugin_utils/progress_watch.py)."""

from __future__ import annotations

from ansible_collections.dflash.lifecycle.plugins.plugin_utils.ct_action import CTModuleAction
from ansible_collections.dflash.lifecycle.plugins.plugin_utils.progress_watch import ProgressWatch, stage_words


class ActionModule(CTModuleAction):
    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        args.setdefault("progress_file", "/run/dflash/stage.progress.json")
        watch = ProgressWatch(self._connection, args["progress_file"], stage_words, task_vars.get("inventory_hostname"))
        result.update(watch.run(lambda: self._execute_module(
            module_name="dflash.lifecycle.model_stage", module_args=args, task_vars=task_vars)))
        return result
