# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The run's supervisor inside the CT (Python 3.8 compatible, the standard library only).

The launch's detached worker (module_utils/agent/transaction.py) starts the trainer as its own child
and, once the launch is healthy and its result delivered, becomes the supervisor by an exec of the
agent the launch kept (``python3 <lifecycle dir>/agent.zip supervise``): the same PID, so the
trainer stays its child and its exit status (a code, or the signal that killed it) reaches the
supervisor through waitpid, with no launcher of its own and no change to the trainer. It marks
itself a child subreaper, so a launcher's workers left behind are reaped too. It outlives the
controller like the worker does, and needs neither systemd nor tini: it is a process of the run.

What it does, with the run's spec (module_utils/ct/run_spec.py) and its policy (the launch's
``supervise`` option, agent/policy.py):

- a **crash** - the trainer's main process ends with a non-zero status or by a signal, with no stop
  asked for - is recorded (the status or signal, the traceback from the log, the newest complete
  checkpoint), what the dead run left running is ended at once (its DataLoader workers, a
  launcher's other ranks: module_utils/stop/leftovers.py, by the run's id) and the run is
  relaunched (agent/restart.py): the same release and settings, the model restaged, the GPUs
  waited for, the trainer's own resume loading the newest checkpoint, after a back-off that
  doubles from backoff_s up to backoff_max_s;
- a **hang** - no progress line, and no beat of the stop request's helper (agent/watch.py), for
  longer than the timeout learned from the run's own intervals (hang_factor times the longest seen,
  at least hang_floor_s; a save being written is never a hang) - has its diagnostics kept first,
  then the run is stopped as a hang (agent/hang.py) - SIGINT still first, so a hang a signal
  reaches saves its checkpoint - and a stop that ends it without a new checkpoint is the expected
  end of a hung collective, not a failure: the run is relaunched from its newest complete
  checkpoint, the steps lost stated;
- a **crash loop** - crash_loop_restarts restarts within crash_loop_window_s, and another end -
  leaves the run down, said with every exit's cause in ``make status``;
- a **stop someone asked for** (``make stop``, a redeploy, a rollback, the Proxmox hook) marks the
  stand-down before its first signal (run_spec.stand_down): the supervisor then lets the trainer
  end and exits; the next launch brings a supervisor of its own.

A gang is supervised as one, by its rounds (agent/rounds.py): a member whose run still runs stops it
when another member's ended (its own crash when its launcher's log says a rank of its own was
killed first: that end caused the other's); once every member is down, each relaunches at the
same moment, into one rendezvous, and the crash-loop count is the gang's rounds. Its state is
``supervisor.json`` in the lifecycle directory (``make status``), its log ``supervisor.log``, a
hang's diagnostics ``diagnostics/``.
"""

from __future__ import annotations

import json
import os
import sys
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import metrics_process, policy, restart, rounds, supervision
from ansible_collections.dflash.lifecycle.plugins.module_utils.agent.watch import Watch, newest_checkpoint_entry, save_under_way
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import history, proctable, run_spec


def take_over(directory, pidfile):
    """In the launch's worker, its result delivered: become the supervisor of the trainer it started
    (exec of the agent: same PID, the trainer stays its child). Returns only when there is nothing
    to supervise: no policy, no agent, or the pidfile's trainer is not its child."""
    spec = run_spec.read(directory)
    agent = os.path.join(directory, "agent.zip")
    entry = supervision.read_pidfile(pidfile)
    if not spec or policy.policy_of(spec["launch"]) is None or not os.path.exists(agent) or entry is None:
        return
    if supervision.not_our_child(entry.pid) or supervision.reap(entry.pid) is not None:
        return  # not ours, or it ended already: the launch said how
    os.execv(sys.executable, [sys.executable, agent, "supervise"])


def taking_over(params):
    """What the launch's worker does once its result is delivered, for a launch of params: become
    the supervisor of the trainer it started (the worker stays the trainer's parent); None for a
    run launched without supervision or a lifecycle directory."""
    directory = (params.get("lifecycle") or {}).get("dir")
    if not directory or not params.get("supervise"):
        return None
    return lambda result: take_over(directory, params["pidfile"])


# the metrics process, looked at this often while the run is watched; one that dies again within the
# back-off is started again only after it (a port someone took, a broken agent: no start every tick)
METRICS_EVERY_S = 5.0
METRICS_BACKOFF_S = 60.0


class MetricsKeeper:
    """The run's metrics process kept alive as the run is (docs/monitoring.md): started again when it
    is gone, counted in the supervisor's state (``metrics_restarts``) and said in its log."""

    def __init__(self, sup):
        self.sup = sup
        self.listen = metrics_process.listen_of(sup.spec)
        self.next_at = self.restarted_at = float("-inf")

    def tick(self, now):
        if not self.listen or now < self.next_at:
            return
        self.next_at = now + METRICS_EVERY_S
        if metrics_process.running(self.sup.directory) is not None:
            return
        if now - self.restarted_at < METRICS_BACKOFF_S:  # died again within the back-off: look at its end
            self.next_at = self.restarted_at + METRICS_BACKOFF_S
            return
        problem = metrics_process.ensure(self.sup.directory, wait_s=0)
        self.restarted_at = now
        count = int(self.sup.state.get("metrics_restarts") or 0) + 1
        self.sup.save(metrics_restarts=count)
        self.sup.say(f"the metrics process on {self.listen} was gone: started again ({count} since the launch)"
                     + (f": {problem}" if problem else ""))


def supervise(directory, agent):
    """The supervisor's loop, from the exec to its end. Returns the exit status."""
    sup = supervision.Supervisor(directory, agent)
    if sup.policy is None:
        return 0
    supervision.subreaper()
    entry = supervision.read_pidfile(sup.launch["pidfile"])
    if entry is None:
        sup.say("no pidfile: nothing to supervise")
        return 0
    pid, run_id = entry.pid, entry.run_id
    sup.run_id = run_id
    since = sup.spec.get("launched_at") or time.time()
    watch = Watch(sup.launch, pid, since, (sup.state.get("learned") or {}).get("gaps"))
    sup.save(state="watching", why=None, trainer={"pid": pid, "run_id": run_id, "since": since},
             learned={"gaps": watch.gaps, "timeout_s": None})
    sup.say(f"watching trainer PID {pid} (run {run_id}), policy {json.dumps(sup.policy, sort_keys=True)}")
    startup = float(sup.launch.get("health_timeout") or 300)
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import rundir

    # a gang's member whose ranks log nothing (no global rank 0) has no beat to miss: rank 0's CT
    # finds the gang's hang, and its end stops this one
    armed = (rundir.read_launch_record(sup.launch["pidfile"]) or {}).get("first_progress_s") is not None
    lost = supervision.not_our_child(pid)
    if lost:
        sup.say(f"lost its trainer: {lost}")
        sup.save(state="stood down", why=f"lost the trainer: {lost}")
        return 1
    saved_timeout = None
    nap = supervision.exit_waiter(pid)
    metrics = MetricsKeeper(sup)
    while True:
        status = supervision.reap(pid)
        now = time.time()
        if status is not None:
            return ended(sup, watch, policy.exit_words(status), since)
        metrics.tick(now)
        asked = run_spec.stood_down(directory, since)
        if watch.beat(now) and watch.gaps and policy.hang_timeout(sup.policy, watch.gaps, startup) != saved_timeout:
            saved_timeout = policy.hang_timeout(sup.policy, watch.gaps, startup)  # kept when it changes: rarely
            sup.save(learned={"gaps": watch.gaps, "timeout_s": saved_timeout})
        if asked is None:
            peers = {m: w for m, w in rounds.downs(sup).items() if m != sup.me} if len(sup.members) > 1 else {}
            if peers:
                member, word = next(iter(peers.items()))
                killed = watch.own_rank_killed()
                if killed:  # this member's own rank died first; the peer's end followed from it
                    return restart.stop_and_restart(sup, watch, f"crash: the trainer's launcher: {killed}", since,
                                                    kind="crash")
                return restart.stop_and_restart(sup, watch, f"{member} of the gang went down ({word.get('cause')})", since)
            silent = now - watch.last_beat
            timeout = policy.hang_timeout(sup.policy, watch.gaps, startup)
            if watch.log is None and now - since > startup:
                watch.find_log()
            if silent > timeout and (armed or watch.heartbeat_at) and not save_under_way(sup.launch):
                # the figures exact beside the words: a silence just past its timeout reads alike in both
                silence = {"silent_s": silent, "timeout_s": timeout, "interval_s": max(watch.gaps) if watch.gaps else None}
                cause = (f"hung: no progress line{' or heartbeat' if watch.heartbeat_at else ''} for {silent:.2f} s "
                         f"(the longest interval it showed: {silence['interval_s'] or 'none yet'} s; "
                         f"timeout {timeout:.2f} s)")
                return restart.hung(sup, watch, cause, pid, since, silence)
        nap()


def ended(sup, watch, how, since):
    """The trainer ended on its own: a stop asked for, a finished run, or a crash."""
    words, facts = how
    deliberate = supervision.deliberate(sup, since)
    if deliberate:
        sup.say(f"the trainer {words}: {deliberate}; standing down")
        sup.save(state="stood down", why=deliberate)
        return 0
    if facts["code"] == 0:
        sup.say("the trainer finished (status 0): nothing to restart")
        sup.save(state="finished", why="the trainer exited with status 0")
        return 0
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import progress

    # a SIGKILLed process writes nothing: a traceback after it is a leftover's (a DataLoader worker's
    # ConnectionResetError when its parent vanished), never the crash's cause
    traceback = [] if facts["signal"] == "SIGKILL" else progress.traceback_in(watch.log_tail()) or []
    cause = f"crash: the trainer {words}" + (f" ({traceback[-1].strip()})" if traceback else "")
    checkpoint = newest_checkpoint_entry(sup.launch)
    # the steps of its last progress line past its newest checkpoint (none when the checkpoint is
    # newer than the line): the steps it ran after that line are in no log
    lost = max(0, watch.last_step - checkpoint[1]) \
        if checkpoint and checkpoint[1] is not None and watch.last_step is not None else None
    end = {"cause": cause, "exit": facts, "traceback": traceback[-12:], "step": watch.last_step,
           "checkpoint": checkpoint[0] if checkpoint else None, "steps_lost": lost, "at": time.time(), "kind": "crash"}
    history.record_crash(sup.directory, lost, end["at"])
    left = end_leftovers(sup)
    if left:
        end["leftovers"] = left
    return restart.restart(sup, end)


def end_leftovers(sup):
    """What the dead run left running (its DataLoader workers, a launcher's other ranks: the
    processes that carry its run id, reparented to this subreaper) ended before the back-off, so
    that they hold no GPU and no relaunch or `make restart` takes them for a trainer. Words of
    it, or None when nothing was left."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import leftovers

    table = proctable.snapshot()
    found = proctable.carrying(sup.run_id, table, proctable.ancestors(table, os.getpid()))
    if not found:
        return None
    report = leftovers.end(found)
    supervision.reap()
    said = leftovers.words(report)
    sup.say(said)
    return said
