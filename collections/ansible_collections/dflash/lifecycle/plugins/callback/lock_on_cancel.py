# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: lock_on_cancel
type: aggregate
short_description: Give the per-CT locks back at once when a job is cancelled before its first signal
version_added: 0.3.0
author: DFlash lifecycle maintainers (@dflash-lifecycle)
description:
  - A cancelled job (Ctrl-C, an AWX cancel - SIGINT, then SIGTERM - or a SIGTERM of its own) ends
    without its C(always) sections, so the lock its preflight took stays until its lease ends. On
    SIGINT or SIGTERM this callback first gives back, through the module
    M(dflash.lifecycle.redeploy_lock) run by C(ansible) on those CTs, the lock of every CT where the
    job holds it and no call that may stop the trainer has started - nothing was touched there - and
    says so; then ansible-core's own handling of the signal goes on.
  - A CT whose stop or launch call has started (its first signal may have gone) keeps its lock; the
    CT's worker finishes the redeploy and gives it back itself. The callback says that for each.
  - A SIGKILL runs nothing; the lease (C(redeploy_lock_ttl)) ends the lock.
  - The lock it gives back is the one the job's own task arguments name (C(lock_holder),
    C(lock_path)), never what a CT's answer says; they reach C(ansible) as unsafe extra variables
    (C(!unsafe)), so nothing in them is templated.
  - The project's C(ansible.cfg) enables it (C(callbacks_enabled)); AWX reads that file from the
    project.
requirements: []
"""

import json
import os
import signal
import subprocess
import sys
import tempfile

from ansible import context
from ansible.plugins.callback import CallbackBase

from ansible_collections.dflash.lifecycle.plugins.module_utils.node.installed_hookscript import printable

# the calls whose work may send the stop's first signal (the preflight's too, when it launches)
STOPPING = ("staged_stop", "trainer_process", "trainer_preflight")
RELEASE_TIMEOUT = 30
DEFAULT_LOCK_PATH = "/run/dflash/redeploy.lock"
# the module call that gives a lock back: its arguments are unsafe extra variables (release_vars)
RELEASE_ARGS = json.dumps({"holder": "{{ dflash_cancel_holder }}", "path": "{{ dflash_cancel_path }}",
                           "state": "released"})


def release_vars(holder, path):
    """The extra variables of the release call, as YAML: each value !unsafe (never templated), in
    JSON's quoting, which YAML reads as its own."""
    return "".join(f"{name}: !unsafe {json.dumps(value)}\n"
                   for name, value in (("dflash_cancel_holder", holder), ("dflash_cancel_path", path)))


def _short(action):
    return (action or "").rsplit(".", 1)[-1]


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "dflash.lifecycle.lock_on_cancel"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.locked = {}  # host -> (holder, path) of a lock this job holds there
        self.stopping = set()  # hosts where a call that may signal has started
        self.previous = {}

    def v2_playbook_on_start(self, playbook):
        # after ansible-core's task queue manager set its own handlers, which ours then call
        for signum in (signal.SIGINT, signal.SIGTERM):
            self.previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._on_signal)

    def v2_runner_on_start(self, host, task):
        if _short(task.action) in STOPPING and not (
                _short(task.action) == "trainer_preflight" and not task.args.get("launch")):
            self.stopping.add(host.get_name())

    def _lock_of(self, result):
        """Whether host holds a lock of this job after the result: its task's own arguments (the
        controller's, templated on the controller) say which; the CT's answer says only whether it
        was given back."""
        host = result._host.get_name()
        action = _short(result._task.action)
        args = result._task_fields.get("args") or {}
        if action == "trainer_preflight" and not isinstance(result._result.get("launch"), dict):
            self.stopping.discard(host)  # its checks only: it sent nothing
        if action == "redeploy_lock" and args.get("state") == "released":
            self.locked.pop(host, None)
        held = result._result.get("lock")
        if not isinstance(held, dict):
            return
        if held.get("released") is True:
            self.locked.pop(host, None)
            return
        holder, path = args.get("lock_holder"), args.get("lock_path") or DEFAULT_LOCK_PATH
        if isinstance(holder, str) and holder and isinstance(path, str):
            self.locked[host] = (holder, path)

    def v2_runner_on_ok(self, result):
        self._lock_of(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._lock_of(result)

    def _on_signal(self, signum, frame):
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second signal goes straight to ansible-core
            signal.signal(sig, self.previous.get(sig) or signal.SIG_DFL)
        name = signal.Signals(signum).name
        for host in sorted(set(self.locked) & self.stopping):
            self._display.display(f"{host}: {name} after this job's stop or launch began: the CT's worker finishes "
                                  "the redeploy and gives the lock back; `make status` says how it ended")
        idle = {host: lock for host, lock in self.locked.items() if host not in self.stopping}
        for host, (holder, path) in sorted(idle.items()):
            self._display.display(f"{host}: {name} before the first signal: {self._release(host, holder, path)}")
        handler = self.previous.get(signum)
        if callable(handler):
            handler(signum, frame)
        else:
            os.kill(os.getpid(), signum)

    def _release(self, host, holder, path):
        """Give host's lock back through a module call of its own (ansible, the job's inventory)."""
        with tempfile.TemporaryDirectory(prefix="dflash-cancel-") as private:  # 0700
            extra = os.path.join(private, "release.yml")
            with open(extra, "w", encoding="utf-8") as handle:
                handle.write(release_vars(holder, path))
            command = [os.path.join(os.path.dirname(sys.argv[0]), "ansible"), host, "-o",
                       "-m", "dflash.lifecycle.redeploy_lock", "-a", RELEASE_ARGS, "-e", f"@{extra}"]
            for source in context.CLIARGS.get("inventory") or ():
                command += ["-i", source]
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=RELEASE_TIMEOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True, check=False)
            except (OSError, subprocess.TimeoutExpired) as err:
                return f"the lock could not be given back ({err}); it ends with its lease"
        if done.returncode == 0:
            return "nothing was touched, the lock is given back"
        return (f"the lock could not be given back ({printable(done.stdout.strip()[-300:])}); "
                "it ends with its lease")
