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
  - Where a launch call has started and its result has not reached the job, the callback first
    tells the CT that the job was cancelled (M(dflash.lifecycle.redeploy_lock) with
    C(state=cancelled)). The CT's record of the change then says that its controller did not see
    it end, and C(make status) and the next redeploy report how it ended. The CT cannot know that
    itself when its worker finished and answered before the signal, whose result then never
    reaches the job's output.
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
# those of them that run the launch's transaction, which the CT records (module_utils/ct/change_record.py)
LAUNCHING = ("trainer_process", "trainer_preflight")
CALL_TIMEOUT = 30
DEFAULT_LOCK_PATH = "/run/dflash/redeploy.lock"


def lock_args(state):
    """The arguments of the redeploy_lock call for state: holder and path are unsafe extra
    variables (release_vars)."""
    return json.dumps({"holder": "{{ dflash_cancel_holder }}", "path": "{{ dflash_cancel_path }}", "state": state})


def release_vars(holder, path):
    """The extra variables of the redeploy_lock call, as YAML: each value !unsafe (never templated),
    in JSON's quoting, which YAML reads as its own."""
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
        self.launching = set()  # hosts where a launch call has started and its result has not come
        self.previous = {}

    def v2_playbook_on_start(self, playbook):
        # after ansible-core's task queue manager set its own handlers, which ours then call
        for signum in (signal.SIGINT, signal.SIGTERM):
            self.previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._on_signal)

    def v2_runner_on_start(self, host, task):
        action = _short(task.action)
        if action in STOPPING and not (action == "trainer_preflight" and not task.args.get("launch")):
            self.stopping.add(host.get_name())
            if action in LAUNCHING:
                self.launching.add(host.get_name())

    def _lock_of(self, result):
        """Whether host holds a lock of this job after the result: its task's own arguments (the
        controller's, templated on the controller) say which; the CT's answer says only whether it
        was given back."""
        host = result._host.get_name()
        action = _short(result._task.action)
        args = result._task_fields.get("args") or {}
        if action in LAUNCHING:
            self.launching.discard(host)  # its result is the job's: shown, and the report's
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

    def v2_runner_on_skipped(self, result):
        if _short(result._task.action) in LAUNCHING:
            self.launching.discard(result._host.get_name())  # it never ran

    def _on_signal(self, signum, frame):
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second signal goes straight to ansible-core
            signal.signal(sig, self.previous.get(sig) or signal.SIG_DFL)
        name = signal.Signals(signum).name
        # told before ansible-core's handler ends the calls: a result under way never reaches the job
        unseen = {host: lock for host, lock in self.locked.items() if host in self.launching}
        told = self._call(unseen, "cancelled")
        for host in sorted(set(self.locked) & self.stopping):
            said = f"{host}: {name} after this job's stop or launch began: the CT's worker finishes the redeploy and gives the lock back"
            if host not in told:
                self._display.display(f"{said}; `make status` says how it ended")
            elif told[host] is None:
                self._display.display(f"{said}; the CT's record says that this job did not see the end, and "
                                      "`make status` and the next redeploy say how it ended")
            else:
                self._display.display(f"{said}; the CT could not be told that this job did not see the end "
                                      f"({told[host]}): `make status` says what runs there")
        idle = {host: lock for host, lock in self.locked.items() if host not in self.stopping}
        for host, error in sorted(self._call(idle, "released").items()):
            words = "nothing was touched, the lock is given back" if error is None else \
                f"the lock could not be given back ({error}); it ends with its lease"
            self._display.display(f"{host}: {name} before the first signal: {words}")
        handler = self.previous.get(signum)
        if callable(handler):
            handler(signum, frame)
        else:
            os.kill(os.getpid(), signum)

    def _call(self, locks, state):
        """dflash.lifecycle.redeploy_lock with state on each host of locks (host -> (holder, path)),
        one `ansible` run (the job's inventory) per holder and path. Returns host -> None where it
        succeeded, else what went wrong, in a few words."""
        done = {}
        for (holder, path) in sorted(set(locks.values())):
            hosts = sorted(host for host, lock in locks.items() if lock == (holder, path))
            done.update(self._run_ansible(hosts, state, holder, path))
        return done

    def _run_ansible(self, hosts, state, holder, path):
        with tempfile.TemporaryDirectory(prefix="dflash-cancel-") as private:  # 0700
            extra = os.path.join(private, "lock.yml")
            with open(extra, "w", encoding="utf-8") as handle:
                handle.write(release_vars(holder, path))
            command = [os.path.join(os.path.dirname(sys.argv[0]), "ansible"), ":".join(hosts), "-o",
                       "-m", "dflash.lifecycle.redeploy_lock", "-a", lock_args(state), "-e", f"@{extra}"]
            for source in context.CLIARGS.get("inventory") or ():
                command += ["-i", source]
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=CALL_TIMEOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True, check=False)
            except (OSError, subprocess.TimeoutExpired) as err:
                return dict.fromkeys(hosts, str(err))
        return {host: host_outcome(done.stdout, host) for host in hosts}


def host_outcome(output, host):
    """None when `ansible -o`'s output says that the call on host succeeded, else its line (or
    that there is none), printable and cut: one line per host, "HOST | STATUS => {...}"; a CT's
    answer, JSON on that line, cannot start a line of another (lines end at a newline alone: a U+2028
    that str.splitlines would break at is part of its line)."""
    for line in output.split("\n"):
        if line.startswith(f"{host} | "):
            status = line[len(host) + 3:].split(" ", 1)[0]
            return None if status in ("SUCCESS", "CHANGED") else printable(line[:300])
    return "no answer"
