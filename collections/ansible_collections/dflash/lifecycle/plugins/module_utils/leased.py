# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An AnsibleModule that runs under the per-CT lock given by its lock_* options.

Doc fragment dflash.lifecycle.redeploy_lease documents the options. Taking and giving back
the lock inside the modules a job runs anyway spares it two round trips into the CT (a lock
task and an unlock task, about 0.7 s of a 4 s overhead on the testbed), and every phase
checks that its job still holds the CT, and records its phase in the lock. A refusal says
who holds the lock, how far that job got, and the CT's state: whether a trainer runs, since
when, and the newest checkpoint it wrote.
"""

from __future__ import annotations

import contextlib
import os
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import lock, rundir

ARGUMENT_SPEC = {
    "lock_holder": {"type": "str"},
    "lock_ttl": {"type": "float", "default": 60},
    "lock_path": {"type": "path", "default": "/run/dflash/redeploy.lock"},
    "lock_unlock": {"type": "bool", "default": False, "aliases": ["lock_release"],
                    "deprecated_aliases": [{"name": "lock_release", "version": "0.3.0",
                                            "collection_name": "dflash.lifecycle"}]},
    "lock_takeover": {"type": "str"},
}


def ct_state(lock_path):
    """The CT in words: the trainer named by the pidfile beside the lock (running since when,
    or not), and the newest checkpoint in the directory its own --output-dir names."""
    # only a refusal needs these: every module start would pay for importing them
    from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoints
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import trainer_finding
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop.stop_options import InvalidParameter

    pidfile = os.path.join(os.path.dirname(lock_path), "trainer.pid")
    try:
        entry = trainer_finding.read_pidfile(pidfile)
    except (OSError, InvalidParameter):
        entry = None
    proc = proctable.read_process(entry.pid) if entry else None
    if proc is None or proc.gone or (entry.starttime is not None and proc.starttime != entry.starttime):
        return "no trainer is running (by its pidfile)"
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(proctable.start_wall_time(proc)))
    words = f"the trainer PID {proc.pid} runs since {started}"
    argv = proctable.read_argv(proc.pid) or []
    if "--output-dir" in argv[:-1]:
        directory = argv[argv.index("--output-dir") + 1]
        done = checkpoints.Directory(directory).complete()  # its layout, as auto recognises it
        words += (f", newest checkpoint {os.path.join(directory, done[-1][0])}" if done
                  else f", no complete checkpoint in {directory}")
    return words


class LeasedModule(AnsibleModule):
    """Takes or renews the lock before the module's own work; every result carries ``lock``."""

    def __init__(self, argument_spec, phase=None, **kwargs):
        """phase: what this module does in a job, recorded in the lock (a string, or a function
        of the module's params)."""
        self.lease = None  # set before AnsibleModule can exit on a bad argument
        self.took_lock = False
        super().__init__(argument_spec={**argument_spec, **ARGUMENT_SPEC}, **kwargs)
        if self.params["lock_holder"]:
            self.lease = self._take(phase(self.params) if callable(phase) else phase)
            self.took_lock = self.lease.pop("changed")  # the module's own work decides changed
            self.lease["released"] = False
            if self.lease["taken_over_from"]:
                self.warn(self.lease["msg"])

    def _take(self, phase):
        """Take or renew the lock for this call's job, recording its phase; a lock another job
        holds fails the call, saying what runs in the CT."""
        code = self.params["lock_takeover"]
        if code and not lock.TAKEOVER_CODE.fullmatch(code):
            self.fail_json(msg=f"lock_takeover: {code!r} is not a lock's takeover code (12 hex digits, as the refusal "
                               "gives it; redeploy_lock_takeover in the playbooks)")
        try:
            return lock.take(self.params["lock_path"], self.params["lock_holder"], self.params["lock_ttl"],
                             code, phase)
        except lock.LockHeld as err:
            state = ct_state(self.params["lock_path"])
            self.fail_json(msg=f"{err} Now in this CT: {state}.", lock_held=dict(err.held, ct_state=state))
        except rundir.UnsafePath as err:
            self.fail_json(msg=f"lock_path: {err}")

    def worker_lease(self):
        """The job's lock as a detached worker keeps it alive while it works, (path, holder, ttl);
        None when this call runs under no lock."""
        if self.lease is None:
            return None
        return self.params["lock_path"], self.params["lock_holder"], self.params["lock_ttl"]

    def enter_phase(self, phase):
        """Record in the lock (renewed) that this call went on to another phase of its job: the
        preflight's call that launches too is in the launch, as a refusal and `make status` say."""
        if self.lease is not None:
            renewed = self._take(phase)
            self.lease.update({key: renewed[key] for key in ("since", "expires", "phase")})

    @contextlib.contextmanager
    def lock_given_back_on_a_crash(self):
        """Around the work of a call that takes the lock for its job (the preflight): a crash ends
        the call with no result naming the lock, so the job's unlock does not run, and the lease
        would keep every job out of the CT until it ends. A lock this call took is given back;
        one it renewed stays with its job, which holds it by an earlier result."""
        try:
            yield
        except Exception:
            if self.took_lock:
                with contextlib.suppress(OSError, rundir.UnsafePath):
                    lock.release(self.params["lock_path"], self.params["lock_holder"])
            raise

    def exit_json(self, **kwargs):
        if self.lease is not None:
            if self.params["lock_unlock"]:
                try:
                    self.lease["released"] = lock.release(self.params["lock_path"], self.params["lock_holder"])
                except rundir.UnsafePath as err:
                    self.fail_json(msg=f"lock_path: {err}")
            kwargs["lock"] = self.lease
        super().exit_json(**kwargs)

    def fail_json(self, msg, **kwargs):
        if self.lease is not None:
            kwargs["lock"] = self.lease
        super().fail_json(msg=msg, **kwargs)
