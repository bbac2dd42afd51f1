# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One supervisor process of a run: its spec, its policy, its state (``supervisor.json``) and its log
(``supervisor.log``), the process helpers it watches its trainer with, its webhook, and the CT's
lock it stops and relaunches under (Python 3.8 compatible, the standard library only).

What the supervisor does is told in module_utils/agent/supervise.py; this is what its rooms share.
"""

from __future__ import annotations

import json
import os
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import policy, webhook
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import change_record, lock, proctable, run_spec
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct.rundir import write_atomic


HOLDER = "dflash supervisor"


LEASE_SECONDS = 60


POLL_SECONDS = 1.0  # a tick: a waitpid, a read of the log's new bytes, two stats


HISTORY_KEPT = 20  # ends kept in the state


LOG_MAX_BYTES = 1 << 20


PR_SET_CHILD_SUBREAPER = 36


class Supervisor:
    """One supervisor process: the run's spec, its policy, its state and its log."""

    def __init__(self, directory, agent):
        self.directory, self.agent = directory, agent
        self.spec = run_spec.read(directory)
        self.launch = self.spec["launch"]
        self.policy = policy.policy_of(self.launch)
        self.state = policy.read_state(directory) or {}
        if self.state.get("launched_at") != self.spec.get("launched_at") and not self.spec.get("round"):
            self.state = {}  # a job's launch: a new run, a new count
        self.log_path = os.path.join(directory, "supervisor.log")
        health = self.launch.get("gang_health")
        self.me = health["me"] if health else "this CT"
        self.members = health["members"] if health else [self.me]
        self.rounds_dir = self.spec.get("rounds_dir") or os.path.join(directory, "rounds")
        self.round = int(self.spec.get("round") or 0)
        self.start = proctable.read_process(os.getpid()).starttime  # with the PID, what status checks alive
        self.run_id = None  # the watched run's identity (its pidfile's), what its leftovers carry

    # -- bookkeeping

    def say(self, text):
        line = f"{change_record.stamp(time.time())} dflash supervisor (PID {os.getpid()}): {text}\n"
        try:
            if os.path.getsize(self.log_path) > LOG_MAX_BYTES:
                os.replace(self.log_path, self.log_path + ".1")
        except OSError:
            pass
        try:
            fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        except OSError:
            pass

    def save(self, **fields):
        self.state.update(fields, supervisor=os.getpid(), supervisor_start=self.start,
                          launched_at=self.spec.get("launched_at"), round=self.round, updated_at=time.time())
        try:
            write_atomic(policy.state_path(self.directory), json.dumps(self.state))
        except OSError as err:
            self.say(f"cannot write its state: {err}")

    def remember(self, end):
        """An end of the run (crash, hang, a failed relaunch, a peer's end) in the state's history."""
        history = (self.state.get("ends") or [])[-(HISTORY_KEPT - 1):] + [end]
        self.save(ends=history, last_end=end, ends_by_kind=counted(self.state.get("ends_by_kind"), end["kind"]))


def counted(counts, key):
    """counts (a {key: n} of the state, or None) with key's one more: the metrics' counters, which
    the history's trimmed list of ends cannot give."""
    return dict(counts or {}, **{key: int((counts or {}).get(key) or 0) + 1})


def subreaper():
    """Descendants left behind (a launcher's workers) are reparented to us and reaped."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def exit_waiter(pid):
    """A tick's wait that ends at once when the trainer exits (asleep in poll() on its pidfd where
    the kernel and Python have them: a crash is seen within milliseconds, not a tick)."""
    import select

    try:
        poller = select.poll()
        poller.register(os.pidfd_open(pid), select.POLLIN)
    except (AttributeError, OSError):
        return lambda: time.sleep(POLL_SECONDS)
    return lambda: poller.poll(POLL_SECONDS * 1000)


def read_pidfile(path):
    """The launch's pidfile (rundir.Pidfile) when it names a process by its start time, else None.
    rundir's reader, not trainer_finding's: a watching supervisor never imports the stop's options."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import rundir

    try:
        entry = rundir.read_pidfile(path)
    except (OSError, ValueError):
        return None
    return entry if entry is not None and entry.starttime is not None else None


def reap(pid=None):
    """Reap every child that ended (a webhook's, a launcher's worker reparented to us); the waitpid
    status of pid when it was among them, else None."""
    found = None
    while True:
        try:
            ended, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return found
        if ended == 0:
            return found
        if ended == pid:
            found = status


def not_our_child(pid):
    """Why pid is not a child of ours (an ended one not reaped yet is), or None: only a parent learns
    its exit status, and a child stays ours until we reap it, so this is asked once."""
    proc = proctable.read_process(pid)
    if proc is None:
        return f"PID {pid} is gone"
    if proc.ppid != os.getpid():
        return f"PID {pid} is not a child of the supervisor (its parent is {proc.ppid})"
    return None


def post_event(rules, event):
    """The webhook's POST of event (JSON) by the run's policy (rules), in a child of its own: it never
    holds the restart up. The event names the CT as the inventory does; with the CT's key, it is
    signed (agent/webhook.py)."""
    url = rules.get("webhook")
    if not url:
        return
    if os.fork() != 0:
        return  # the watch loop reaps it
    status = 0
    try:
        from ansible.module_utils.urls import open_url

        ct = rules.get("webhook_ct") or event.get("ct")
        body = json.dumps(dict(event, ct=ct)).encode()
        headers = {"Content-Type": "application/json"}
        if rules.get("webhook_key"):
            headers.update(webhook.signed_headers(ct, rules["webhook_key"], body, time.time()))
        open_url(url, data=body, method="POST", headers=headers, timeout=float(rules["webhook_timeout_s"])).close()
    except BaseException:  # noqa: BLE001  (a forked child must never return into the supervisor)
        status = 1
    finally:
        os._exit(status)


def deliberate(sup, since):
    """Words of the stop someone asked for that ended the run, or None."""
    asked = run_spec.stood_down(sup.directory, since)
    spec = run_spec.read(sup.directory) or {}
    if asked is not None:
        return f"the stop of {asked.get('by')} at {change_record.stamp(asked['at'])}"
    if spec.get("wanted") != "running":
        return f"{spec.get('wanted_by')}: the run is wanted stopped"
    return None


def take_lock(sup):
    """The CT's redeploy lock for the supervisor (a job holding it is waited for up to a lease);
    the lease, or the words of the holder."""
    path = run_spec.lock_path(sup.spec)
    went_on = lock.wait_for(path, HOLDER, LEASE_SECONDS, LEASE_SECONDS, takeover_holder=HOLDER)
    return went_on or (path, HOLDER, LEASE_SECONDS)


def give_lock(sup):
    try:
        lock.release(run_spec.lock_path(sup.spec), HOLDER)
    except OSError:
        pass
