"""How long each task took on each host, and when it began, as JSON lines in $DFLASH_BENCH_TASK_SECONDS: the benches
read a phase's own cost from it (the preflight task, the stop task). Enabled by the benches only
(ANSIBLE_CALLBACKS_ENABLED=task_seconds, ANSIBLE_CALLBACK_PLUGINS=bench/callback_plugins)."""

import json
import os
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: task_seconds
type: aggregate
short_description: each task's seconds per host, for the benches
description: >-
  Writes one JSON line per task and host (task name, host, seconds, began_at, and the moment of the
  first signal of a stop the task ran) to $DFLASH_BENCH_TASK_SECONDS.
requirements: [DFLASH_BENCH_TASK_SECONDS in the environment]
"""


def signalled_at(res):
    """When the stop in this task's result sent its first signal (the node's clock), or None: a stop
    task's, a launch's stop_first, or the stop of a preflight that also launched."""
    for stop in (res, res.get("stop"), (res.get("launch") or {}).get("stop")):
        if isinstance(stop, dict) and stop.get("signalled_at") is not None:
            return stop["signalled_at"]
    return None


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "task_seconds"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._started = {}
        self._out = os.environ.get("DFLASH_BENCH_TASK_SECONDS")

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._started[task._uuid] = (time.monotonic(), time.time())

    def _done(self, result, status="done"):
        if not self._out:
            return
        began, began_at = self._started.get(result._task._uuid, (None, None))
        with open(self._out, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"task": result._task.get_name(), "host": result._host.get_name(),
                                     "seconds": None if began is None else round(time.monotonic() - began, 3),
                                     "began_at": began_at,
                                     "stop_signalled_at": signalled_at(result._result),
                                     "status": status}) + "\n")

    v2_runner_on_ok = v2_runner_on_failed = _done

    def v2_runner_on_skipped(self, result):
        self._done(result, "skipped")
