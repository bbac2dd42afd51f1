# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ladder: which stage can make the trainer checkpoint, and climbing it (Python 3.8
compatible).

A stage sends one signal to a scope of the target set (module_utils/stop/target_set.py) and
waits. The graceful stage is the first whose signal the trainer saves on (the saves_on
setting, or what its checkpoint layout is known to do) and that its main process catches
(SigCgt): a caught signal alone proves nothing, since Python's own KeyboardInterrupt
handler shows as caught. The graceful stage's wait grows while the checkpoint directory is
being written, up to a cap. The stages before it are skipped (their signals would end the
trainer without a checkpoint), as is a stage of a signal the main process ignores. The
first signal is never sent while a save is being written, unless the trainer finishes a
save on it. Before escalating past the first stage the main process's threads (state,
wchan) and a py-spy dump are recorded.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoint_verdict
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import stop_request, target_set

NEVER_CAUGHT = (signal.SIGKILL, signal.SIGSTOP)
# where py-spy is looked for when the py_spy option is unset: where the project installs it
# (roles/trainer_preflight, trainer_preflight_py_spy), then where pip and Debian put it (pct exec runs
# commands with PATH=/sbin:/bin:/usr/sbin:/usr/bin)
PY_SPY_PATH = "/var/lib/dflash/bin:/usr/local/bin:/usr/bin:/bin:/root/.local/bin"
# how long a stage that signals only the main process waits for the rest of the set once the
# main process is gone: its workers notice within DataLoader's 5 s status check; a leftover
# it was not signalled (a setsid helper) would otherwise hold the stage for its whole wait
AFTER_MAIN_GRACE = 10.0
# how often the wait for the trainer's own checkpoint looks for its completion: the signal that
# ends the trainer follows the completion mark within this, plus one read of the directory
LANDED_POLL = 0.2


def assess(main, stages, saves_on, saves_words):
    """How the ladder's signals meet the main process: their dispositions, the graceful stage
    (index, or None) and the reason in plain words. saves_on: the signals the trainer saves
    on (None: not known)."""
    dispositions = {s["signal"].name: main.disposition(s["signal"]) for s in stages}
    words, graceful = [], None
    if saves_on is None:
        words.append(f"what the trainer does on a signal is not known ({saves_words}); set saves_on")
    for index, stage in enumerate(stages):
        sig = stage["signal"]
        state = "default" if sig in NEVER_CAUGHT else dispositions[sig.name]
        saving = saves_on is not None and sig in saves_on
        if saving and state == "caught":
            graceful = index
            words.append(f"{sig.name} is caught by PID {main.pid} and the trainer saves on it ({saves_words})")
            break
        if state == "ignored":
            words.append(f"{sig.name} is ignored by PID {main.pid}"
                         + (", as after a background launch (nohup/&)" if sig == signal.SIGINT else ""))
        elif saving:
            words.append(f"the trainer saves on {sig.name} ({saves_words}), but PID {main.pid} does not "
                         "catch it: it ends it without a checkpoint")
        elif state == "caught":
            words.append(f"{sig.name} is caught by PID {main.pid}, but no checkpoint is expected to follow it"
                         + (f" ({saves_words})" if saves_on is not None else "")
                         + " (Python's own KeyboardInterrupt handler shows as caught too)"
                         * (sig == signal.SIGINT))
        else:
            words.append(f"{sig.name} is not caught by PID {main.pid}: it ends it without a checkpoint")
    return dispositions, graceful, "; ".join(words)


def diagnostics(main_ident, options, proc_root, native=False):
    """Threads (state, wchan) and a py-spy dump of the main process (native: with the C frames of a
    thread blocked in a C call, NCCL's or CUDA's, beside its Python ones)."""
    pid = main_ident[0]
    threads = proctable.threads_report(pid, proc_root)
    report = {"pid": pid, "threads": threads, "py_spy": None}
    py_spy = options.py_spy or shutil.which("py-spy", path=PY_SPY_PATH)
    if not py_spy:
        report["py_spy"] = f"py-spy not found (py_spy option unset, not in {PY_SPY_PATH})"
        return report
    if any(t["state"] == "D" for t in threads):
        # ptrace on an uninterruptible task would hang py-spy itself
        report["py_spy"] = "skipped: a thread is in D state"
        return report
    try:
        out = subprocess.run([py_spy, "dump", "--pid", str(pid)] + ["--native"] * native, capture_output=True,
                             text=True, timeout=options.py_spy_timeout, check=False)
        report["py_spy"] = (out.stdout + out.stderr).strip()[-8000:]
    except subprocess.TimeoutExpired:
        report["py_spy"] = "py-spy dump timed out"
    except OSError as err:
        report["py_spy"] = f"py-spy failed: {err}"
    return report


class Climb:
    """One climb of the ladder for one run; events go to result["timeline"]."""

    def __init__(self, options, main, targets, scope, directory, result, started, progress=None, launch=None):
        self.options = options
        self.main = main
        self.launch = launch  # a launcher's run (module_utils/launch/launchers.py), or None
        self.targets = targets
        self.scope = scope
        self.directory = directory
        self.result = result
        self.started = started
        self.progress = progress or (lambda **fields: None)
        self.landed = None  # the checkpoint the wait for the trainer's own save saw land

    def event(self, when=None, **fields):
        """Append an event, timed now or at when (clock()'s pair: a signal is timed before it is
        sent, so that a save it triggers never seems to predate it)."""
        now, wall = when or self.clock()
        fields.update(t=round(now, 6), elapsed=round(now - self.started, 3), at=round(wall, 6))
        self.result["timeline"].append(fields)

    @staticmethod
    def clock():
        return time.monotonic(), time.time()

    def members(self, stage):
        """Identities one stage signals."""
        ident = self.main.identity
        if stage["scope"] == "main":
            return [ident] if proctable.alive(ident, self.targets.proc_root) else []
        alive = self.targets.alive()
        if stage["scope"] == "group" and self.main.pgid > 1:
            return [i for i in alive if self.targets.members[i]["proc"].pgid == self.main.pgid]
        return alive

    def refresh(self):
        """New members of the run since the last look: forked children, carriers of the
        identity, leftovers. Returns the snapshot's device holders."""
        table = proctable.snapshot(self.targets.proc_root)
        holders = target_set.device_holders(self.options, table, self.targets.proc_root)
        self.scope.collect(self.targets, table, holders)
        return table, holders

    def saves(self, index):
        """Whether stage index's signal makes the trainer save (the graceful stage)."""
        return index == self.result["graceful_stage"]

    def skip_reason(self, index, stage):
        """Why stage index is not sent, or None."""
        name = stage["signal"].name
        graceful = self.result["graceful_stage"]
        if graceful is not None and index < graceful:
            return (f"{name} would end PID {self.main.pid} without a checkpoint: the trainer saves on "
                    f"{self.options.stages[graceful]['signal'].name}")
        if self.result["signal_dispositions"].get(name) == "ignored":
            # once the trainer's own checkpoint has landed, an ignored signal is never waited out
            if self.landed is not None:
                return f"{name} is ignored by PID {self.main.pid}, and the checkpoint {self.landed} has landed"
            if stage["scope"] == "main" and self.options.skip_ignored_stage:
                return f"{name} is ignored by PID {self.main.pid}"
        return None

    def run(self):
        """Climb until the set is gone. Returns stopped_by, or None."""
        proc_root = self.targets.proc_root
        first = True
        for index, stage in enumerate(self.options.stages):
            name = stage["signal"].name
            reason = self.skip_reason(index, stage)
            if reason:
                self.event(event="skipped", stage=index, signal=name, reason=reason)
                continue
            if first:
                self.wait_for_save(stage)
            main_alive = proctable.alive(self.main.identity, proc_root)
            if index > 0 and self.result["diagnostics"] is None and main_alive:
                self.result["diagnostics"] = diagnostics(self.main.identity, self.options, proc_root)
            # a stage that signals the main process alone signals before the look at /proc (it
            # can take a tenth of a second under load, and a landed checkpoint's next save goes on)
            through_launcher = self.launch is not None and self.saves(index)
            if stage["scope"] != "main" or through_launcher:
                self.refresh()
            if first:
                if "signalled_at" not in self.result:  # a request before took the moment
                    self.wait_for_moment(name)
                first = False
            if through_launcher:
                stopped = self.through_launcher(stage, index)
                if stopped:
                    return stopped
                continue
            chosen = self.members(stage)
            sending = self.clock()
            sent = [ident[0] for ident in chosen if self.targets.send(ident, stage["signal"])]
            if stage["signal"] != signal.SIGKILL:
                for ident in chosen:  # a stopped (T) process must run to act on the signal
                    self.targets.send(ident, signal.SIGCONT)
            self.event(sending, event="signal", stage=index, signal=name, scope=stage["scope"], pids=sorted(sent))
            if stage["scope"] == "main":
                self.refresh()
            if not self.wait(stage, index, self.saves(index)):
                self.refresh()  # children or leftovers that surfaced meanwhile keep us going
                if not self.targets.alive():
                    self.event(event="stopped", stage=index, signal=name)
                    return {"stage": index, "signal": name, "scope": stage["scope"]}
        return None

    def through_launcher(self, stage, index):
        """The graceful stage of a launcher's run, by the launcher's rules (launchers.Run.plan):
        the agent alone when it forwards the signal and its deadline covers the graceful cap
        (never a worker too: a second SIGINT cuts a save), else every worker's group at once
        while the agent is held (SIGSTOP): neither its deadline nor the first rank's exit can
        then end the others in their save. Once the workers are gone the agent gets SIGTERM and
        SIGCONT: it exits without an elastic restart. Returns stopped_by, or None."""
        sig, name = stage["signal"], stage["signal"].name
        how, why = self.launch.plan(sig, float(self.options.graceful_wait_cap))
        self.result["launcher"]["plan"] = {"stage": index, "to": how, "why": why}
        alive = self.targets.alive()
        if how == "agent":
            sending = self.clock()
            sent = [self.main.pid] if self.targets.send(self.main.identity, sig) else []
            self.targets.send(self.main.identity, signal.SIGCONT)
            self.event(sending, event="signal", stage=index, signal=name, scope="agent", pids=sent)
            remaining = self._wait(alive, stage, index, True)
        else:
            holders = [p.identity for p in self.launch.holders if p.identity in alive]
            for ident in holders:
                self.targets.send(ident, signal.SIGSTOP)
            self.event(event="held", stage=index, pids=[i[0] for i in holders], signal="SIGSTOP")
            groups = {p.pid for p in self.launch.workers}
            chosen = [i for i in alive if i not in holders and (
                i[0] in groups or self.targets.members[i]["proc"].pgid in groups)]
            sending = self.clock()
            sent = [i[0] for i in chosen if self.targets.send(i, sig)]
            self.event(sending, event="signal", stage=index, signal=name, scope="workers", pids=sorted(sent))
            workers = [p.identity for p in self.launch.workers if p.identity in alive]
            self._wait(workers, stage, index, True)
            for ident in holders:  # pending until it runs again: no restart, no SIGKILL
                self.targets.send(ident, signal.SIGTERM)
                self.targets.send(ident, signal.SIGCONT)
            self.event(event="released", stage=index, pids=[i[0] for i in holders], signal="SIGTERM")
            self.refresh()
            remaining = self.targets.wait_gone(self.targets.alive(), min(AFTER_MAIN_GRACE, stage["wait"]))
        for rank in self.result["launcher"]["ranks"]:
            gone = not any(i[0] == rank["pid"] for i in self.targets.alive())
            rank["ended_by"] = rank["ended_by"] or (f"{name} ({how})" if gone else None)
        restarted = self.launch.restarted()
        if restarted:
            self.result["launcher"]["restarted"] = restarted
            self.event(event="elastic_restart", stage=index, pids=restarted)
        if not remaining:
            self.refresh()
            if not self.targets.alive():
                self.event(event="stopped", stage=index, signal=name)
                return {"stage": index, "signal": name, "scope": "agent" if how == "agent" else "workers"}
        return None

    def by_request(self, request):
        """Stage 0, the stop request (module_utils/stop/stop_request.py): written at the gang's
        moment, its acknowledgement awaited up to request_ack_timeout, then the run's exit up to
        graceful_wait_cap (its save, then its exit 0). Returns stopped_by once the run is gone,
        else None: a request not taken is withdrawn, and the ladder follows."""
        record = self.result["request"]
        self.wait_for_moment("the stop request")
        bound = float(self.options.request_ack_timeout)
        sending = self.clock()
        try:
            record["body"] = request.write(deadline=round(sending[1] + bound, 3))
        except OSError as err:
            record.update(taken=False, why=f"it could not be written to {request.path} ({err.strerror})")
            self.event(event="request_failed", path=request.path, error=err.strerror)
            return None
        self.event(sending, event="request", id=request.id, path=request.path)
        began = time.monotonic()
        while request.acknowledged is None and time.monotonic() - began < bound and \
                proctable.alive(self.main.identity, self.targets.proc_root):
            self.progress(stage=0, signal="none (a stop request, waiting for its acknowledgement)",
                          elapsed=round(time.monotonic() - began, 1), bound=bound, running=len(self.targets.alive()))
            time.sleep(stop_request.POLL)
            request.poll()
        request.poll()
        if request.acknowledged is None and self.targets.alive():
            request.withdraw()
            record.update(taken=False, why=f"no acknowledgement in {request.log_path} within {bound:g}s "
                                           "(request_ack_timeout)")
            self.event(event="request_not_taken", id=request.id, waited=round(time.monotonic() - began, 3))
            return None
        if request.acknowledged is not None:
            record["acknowledged"] = request.acknowledged
            self.event(event="request_acknowledged",
                       id=request.acknowledged["id"], step=request.acknowledged["step"])
        cap = float(self.options.graceful_wait_cap)

        def on_tick(now, final):
            request.poll()
            self.progress(stage=0, signal="none (the stop request was acknowledged: the save, then the exit)",
                          elapsed=round(now - began, 1), bound=cap, running=len(self.targets.alive()))
            return 0.0

        self.refresh()
        remaining = self._exit_after_request(cap, on_tick)
        request.poll()
        record.update(taken=request.acknowledged is not None, saved=request.saved)
        if request.saved is not None:
            self.event(event="request_saved",
                       checkpoint=request.saved["checkpoint"], step=request.saved["step"])
        if remaining:
            record["why"] = f"the run still ran {cap:g}s (graceful_wait_cap) after the request"
            self.event(event="request_outlived", waited=round(time.monotonic() - began, 3))
            return None
        self.refresh()
        if self.targets.alive():
            return None
        record["exit_after_s"] = round(time.time() - record["body"]["requested_at"], 3)
        self.event(event="stopped", stage=-1, signal=None)
        return {"stage": -1, "signal": None, "scope": "request"}

    def _exit_after_request(self, cap, on_tick):
        """The run's own save and exit after its request was taken, up to cap seconds; what still
        runs then. A launcher's agent whose workers have all exited waits in torchrun's exit
        barrier (up to 300 s) for the agents of the gang's other CTs - for all of it when one of
        them failed instead (a rank that aborted on its way out). Nothing is left to save when
        the agents are all that is left of the run: after AFTER_MAIN_GRACE they get SIGTERM, and
        SIGKILL after AFTER_MAIN_GRACE more (the barrier waits in a C++ call, where no Python
        handler runs), and the request's record says so."""
        began = time.monotonic()

        def rest():
            return max(0.0, cap - (time.monotonic() - began))

        if self.launch is None or not self.launch.workers:
            return self.targets.wait_gone(self.targets.alive(), cap, on_tick=on_tick)
        if self.targets.wait_gone([p.identity for p in self.launch.workers], cap, on_tick=on_tick):
            return set(self.targets.alive())
        self.refresh()
        left = self.targets.wait_gone(self.targets.alive(), min(AFTER_MAIN_GRACE, rest()), on_tick=on_tick)
        agents = {p.identity for p in self.launch.holders} & left
        if not agents or left - agents:
            return self.targets.wait_gone(left, rest(), on_tick=on_tick)
        ended = self.result["request"]["agent_ended"] = {
            "pids": sorted(ident[0] for ident in agents), "signals": [],
            "after_workers_s": round(time.monotonic() - began, 3)}
        for sig in (signal.SIGTERM, signal.SIGKILL):
            sending = self.clock()
            sent = sorted(ident[0] for ident in agents if self.targets.send(ident, sig))
            ended["signals"].append(sig.name)
            self.event(sending, event="agent_ended", signal=sig.name, pids=sent)
            agents = self.targets.wait_gone(agents, AFTER_MAIN_GRACE, on_tick=on_tick)
            if not agents:
                break
        return self.targets.wait_gone(self.targets.alive(), rest(), on_tick=on_tick)

    def wait_for_moment(self, what):
        """Hold the first signal until signal_at (the wall clock's seconds since the epoch), the
        moment every CT of a gang signals its ranks, so they enter their save together; a moment
        already past sends it now, and how late is recorded. signal_spare_s is how long before the
        moment the stop was ready to signal (negative: after it), against which the gang's margin
        is judged; signalled_at is when it went."""
        wanted = self.options.signal_at
        if wanted is not None:
            self.result["signal_spare_s"] = round(wanted - time.time(), 3)
            while time.time() < wanted and proctable.alive(self.main.identity, self.targets.proc_root):
                self.progress(stage=0, signal=f"{what} at the gang's moment",
                              elapsed=round(time.monotonic() - self.started, 1),
                              bound=round(wanted - time.time(), 1), running=len(self.targets.alive()))
                time.sleep(min(0.2, max(0.0, wanted - time.time())))
            self.result["signal_late_s"] = round(max(0.0, time.time() - wanted), 4)
        self.result["signalled_at"] = time.time()

    def wait_for_save(self, stage):
        """Hold the first signal while a save is being written, unless the trainer finishes a
        save on it (its layout's rule, or the saves_on setting), or the stop waited for the
        trainer's own checkpoint and it has landed (the next save, if one began, is cut and
        reported unfinished): up to graceful_wait_cap."""
        survives = self.result["saves_on"]["save_survives"]
        if not self.directory.path or (survives is not None and stage["signal"].name in survives):
            return
        if self.landed is not None:  # the stop follows the landed checkpoint: a later save is cut
            return
        began = time.monotonic()
        bound = float(self.options.graceful_wait_cap)
        writing = self.directory.save_in_progress()
        if not writing:
            return
        while writing and time.monotonic() - began < bound:
            if not proctable.alive(self.main.identity, self.targets.proc_root):
                break
            self.progress(stage=0, signal=f"none yet (a save is being written: {', '.join(writing)})",
                          elapsed=round(time.monotonic() - began, 1), bound=bound, running=len(self.targets.alive()))
            time.sleep(0.2)
            writing = self.directory.save_in_progress()
        self.event(event="waited_for_save", signal=stage["signal"].name,
                   waited=round(time.monotonic() - began, 3),
                   still_writing=", ".join(writing) or None)

    def wait(self, stage, index, graceful):
        """Wait for the set to go (for the main process, when the stage signals only it, then
        AFTER_MAIN_GRACE for the rest); the graceful stage waits longer while the checkpoint
        directory is being written, up to graceful_wait_cap. Returns who still runs."""
        if stage["scope"] != "main":
            return self._wait(self.targets.alive(), stage, index, graceful)
        if self._wait([self.main.identity], stage, index, graceful):
            return self.targets.alive()
        self.refresh()
        return self.targets.wait_gone(self.targets.alive(), min(AFTER_MAIN_GRACE, stage["wait"]))

    def _wait(self, identities, stage, index, graceful):
        base = stage["wait"]
        if not graceful or not self.directory.path:
            return self.targets.wait_gone(identities, base, on_tick=self.tick_reporter(index, base))
        began = time.monotonic()
        cap_at = began + max(base, float(self.options.graceful_wait_cap))
        activity = checkpoint_verdict.Activity(self.directory.fingerprint, self.options.checkpoint_activity_window)
        extended = [0.0]
        report = self.tick_reporter(index, base)

        def on_tick(now, final):
            activity.sample(now, force=final)
            report(now, final)
            if not final or not activity.recent(now) or now >= cap_at:
                return 0.0
            extra = min(activity.window, cap_at - now)
            extended[0] += extra
            return extra

        remaining = self.targets.wait_gone(identities, base, on_tick=on_tick)
        if extended[0]:
            self.event(event="wait_extended", stage=index, by=round(extended[0], 3),
                       reason=f"{self.directory.path} was still being written")
        return remaining

    def tick_reporter(self, index, bound):
        stage = self.options.stages[index]
        began = time.monotonic()

        def report(now, final):
            self.progress(stage=index + 1, signal=stage["signal"].name, elapsed=round(now - began, 1),
                          bound=bound, running=len(self.targets.alive()))
            return 0.0

        return report
