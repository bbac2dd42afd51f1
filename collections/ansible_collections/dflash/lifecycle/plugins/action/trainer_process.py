# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin of dflash.lifecycle.trainer_process: runs the module and, while its wait for
health and for the canary's progress lines passes 10 seconds, shows its progress on the
controller (plugin_utils/progress_watch.py); with stop_first, the stop's progress before it."""

from __future__ import annotations

import os

from ansible_collections.dflash.lifecycle.plugins.plugin_utils.payload_cache import CachedPayloadAction
from ansible_collections.dflash.lifecycle.plugins.plugin_utils.progress_watch import (
    ProgressWatch, launch_words, stop_progress_file, stop_words)


class ActionModule(CachedPayloadAction):
    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        if not args.get("progress_file"):
            run_dir = args.get("run_dir") or os.path.dirname(args.get("pidfile") or "/run/dflash/trainer.pid")
            args["progress_file"] = os.path.join(run_dir, "launch.progress.json")
        more = []
        if isinstance(args.get("stop_first"), dict):  # the stop before the launch writes its own
            stop = args["stop_first"] = dict(args["stop_first"], progress_file=stop_progress_file(args["stop_first"]))
            more.append((stop["progress_file"], stop_words))
        watch = ProgressWatch(self._connection, args["progress_file"], launch_words, task_vars.get("inventory_hostname"),
                              more)
        result.update(watch.run(lambda: self._execute_module(
            module_name="dflash.lifecycle.trainer_process", module_args=args, task_vars=task_vars)))
        return result
