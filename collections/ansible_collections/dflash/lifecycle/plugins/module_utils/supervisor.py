# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The run's supervisor inside the CT (Python 3.8 compatible, the standard library only).

The launch's detached worker (module_utils/launch_call.py) starts the trainer as its own child and,
once the launch is healthy and its result delivered, becomes the supervisor by an exec of the
agent the launch kept (``python3 <lifecycle dir>/agent.zip supervise``): the same PID, so the
trainer stays its child and its exit status (a code, or the signal that killed it) reaches the
supervisor through waitpid, with no launcher of its own and no change to the trainer. It marks
itself a child subreaper, so a launcher's workers left behind are reaped too. It outlives the
controller like the worker does, and needs neither systemd nor tini: it is a process of the run.

What it does, with the run's spec (module_utils/ct/run_spec.py) and its policy (the launch's
``supervise`` option, POLICY):

- a **crash** - the trainer's main process ends with a non-zero status or by a signal, with no stop
  asked for - is recorded (the status or signal, the traceback from the log, the newest complete
  checkpoint), what the dead run left running is ended at once (its DataLoader workers, a
  launcher's other ranks: module_utils/stop/leftovers.py, by the run's id) and the run is
  relaunched: the same release and settings, the model restaged, the GPUs waited for, the
  trainer's own resume loading the newest checkpoint (launch_call: the same launch as a
  redeploy's), after a back-off that doubles from backoff_s up to backoff_max_s;
- a **hang** - no progress line, and no beat of the stop request's helper, for longer than the
  timeout learned from the run's own intervals (hang_factor times the longest seen, at least
  hang_floor_s; a save being written is never a hang) - has its diagnostics kept first (each
  process's threads, state and wchan, its Python stacks with native frames by py-spy, nvidia-smi),
  then the run is stopped as a hang: the run's own stop, each stage before the last waiting no
  longer than the run's longest interval (HANG_GRACE_FLOOR_S at least) - SIGINT still first, so a
  hang a signal reaches saves its checkpoint, and the wait grows while one is written - and a stop
  that ends it without a new checkpoint is the expected end of a hung collective, not a failure:
  the run is relaunched from its newest complete checkpoint, the steps lost stated;
- a **crash loop** - crash_loop_restarts restarts within crash_loop_window_s, and another end -
  leaves the run down, said with every exit's cause in ``make status``;
- a **stop someone asked for** (``make stop``, a redeploy, a rollback, the Proxmox hook) marks the
  stand-down before its first signal (run_spec.stand_down): the supervisor then lets the trainer
  end and exits; the next launch brings a supervisor of its own.

A gang is supervised as one: each member's supervisor writes its member's end into the gang's
rounds (in the checkpoint directory they share); a member whose run still runs stops it when
another member's ended; once every member is down, each relaunches at the same moment (one
back-off from the round's first end), into one rendezvous, and the crash-loop count is the
gang's rounds. Its state is ``supervisor.json`` in the lifecycle directory (``make status``), its
log ``supervisor.log``, a hang's diagnostics ``diagnostics/``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import change_record, proctable, run_spec
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct.rundir import read_json, write_atomic

HOLDER = "dflash supervisor"
LEASE_SECONDS = 60
POLL_SECONDS = 1.0  # a tick: a waitpid, a read of the log's new bytes, two stats
GAPS_KEPT = 64  # the intervals the hang timeout is learned from: the newest ones
HISTORY_KEPT = 20  # ends kept in the state
DIAGNOSTICS_KEPT = 10
# a hang's stop: the wait of each stage before the last, at least this, else the run's longest interval
HANG_GRACE_FLOOR_S = 3.0
HANG_GRACE_UNKNOWN_S = 30.0  # a run that showed no interval yet
LOG_MAX_BYTES = 1 << 20
PR_SET_CHILD_SUBREAPER = 36

# the launch's supervise option (trainer_process's); RULES bound the numbers
POLICY = {"type": "dict", "options": {
    "restart": {"type": "str", "choices": ["never", "on-failure"], "default": "on-failure"},
    "backoff_s": {"type": "float", "default": 10},
    "backoff_max_s": {"type": "float", "default": 360},
    "crash_loop_restarts": {"type": "int", "default": 5},
    "crash_loop_window_s": {"type": "float", "default": 3600},
    "hang_floor_s": {"type": "float", "default": 300},
    "hang_factor": {"type": "float", "default": 5},
    "webhook": {"type": "str"},
    "webhook_timeout_s": {"type": "float", "default": 3},
}}
RULES = {
    "backoff_s": (0, False, "at least 0"),
    "backoff_max_s": (0, False, "at least 0"),
    "crash_loop_restarts": (1, False, "at least 1"),
    "crash_loop_window_s": (0, True, "above 0"),
    "hang_floor_s": (0, True, "above 0"),
    "hang_factor": (1, False, "at least 1"),
    "webhook_timeout_s": (0, True, "above 0 (and at most 30: it must never hold a restart up)"),
}


def policy_problems(policy, name_of=lambda key: f"supervise.{key}"):
    """The lines naming each value of policy outside its rule (name_of(key): how the caller names
    it, a role variable or the module's option); [] when all hold."""
    problems = []
    for key, (low, strict, words) in RULES.items():
        value = policy.get(key)
        if value is None:
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < low or (strict and value == low):
            problems.append(f"{name_of(key)}: {value!r} must be {words}")
    if isinstance(policy.get("webhook_timeout_s"), (int, float)) and policy["webhook_timeout_s"] > 30:
        problems.append(f"{name_of('webhook_timeout_s')}: {policy['webhook_timeout_s']!r} must be {RULES['webhook_timeout_s'][2]}")
    low, high = policy.get("backoff_s"), policy.get("backoff_max_s")
    if isinstance(low, (int, float)) and isinstance(high, (int, float)) and high < low:
        problems.append(f"{name_of('backoff_max_s')}: {high!r} must be at least {name_of('backoff_s')} ({low!r})")
    hook = policy.get("webhook")
    if hook and not str(hook).startswith(("http://", "https://")):
        problems.append(f"{name_of('webhook')}: {hook!r} must be an http:// or https:// URL")
    return problems


def policy_of(launch):
    """The run's policy, every default filled in; None for a run launched without supervision."""
    given = launch.get("supervise")
    if given is None:
        return None
    return {key: given.get(key) if given.get(key) is not None else spec.get("default")
            for key, spec in POLICY["options"].items()}


def backoff(policy, restarts):
    """The wait before restart number restarts (1: the first), doubling from backoff_s, capped."""
    return min(float(policy["backoff_max_s"]), float(policy["backoff_s"]) * 2 ** max(0, restarts - 1))


def hang_timeout(policy, gaps, startup):
    """Seconds of silence that make a hang: hang_factor times the longest interval the run has
    shown (gaps), at least hang_floor_s; before two beats were seen, startup (the launch's health
    timeout: the run's start-up bound)."""
    if not gaps:
        return max(float(policy["hang_floor_s"]), float(startup))
    return max(float(policy["hang_floor_s"]), float(policy["hang_factor"]) * max(gaps))


def exit_words(status):
    """A waitpid status in words, and the JSON facts of it."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return f"killed by {name}", {"signal": name, "code": None}
    code = os.WEXITSTATUS(status)
    return f"exited with status {code}", {"signal": None, "code": code}


# -- the files: state, log, rounds --------------------------------------------------------------

def state_path(directory):
    return os.path.join(directory, "supervisor.json")


def read_state(directory):
    try:
        state = read_json(state_path(directory))
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


class Supervisor:
    """One supervisor process: the run's spec, its policy, its state and its log."""

    def __init__(self, directory, agent):
        self.directory, self.agent = directory, agent
        self.spec = run_spec.read(directory)
        self.launch = self.spec["launch"]
        self.policy = policy_of(self.launch)
        self.state = read_state(directory) or {}
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
            write_atomic(state_path(self.directory), json.dumps(self.state))
        except OSError as err:
            self.say(f"cannot write its state: {err}")

    def remember(self, end):
        """An end of the run (crash, hang, a failed relaunch, a peer's end) in the state's history."""
        history = (self.state.get("ends") or [])[-(HISTORY_KEPT - 1):] + [end]
        self.save(ends=history, last_end=end)

    # -- the gang's rounds (one member alone is a gang of one, in the lifecycle directory)

    def _round_dir(self, number):
        return os.path.join(self.rounds_dir, str(number))

    def tell_down(self, facts):
        folder = os.path.join(self._round_dir(self.round), "down")
        try:
            os.makedirs(folder, mode=0o755, exist_ok=True)
            write_atomic(os.path.join(folder, f"{self.me}.json"), json.dumps(dict(facts, at=time.time())), mode=0o644)
        except OSError as err:
            self.say(f"cannot tell the gang this member is down: {err}")

    def downs(self, number=None):
        """{member: its end} of the round (this one by default) for the members that said it."""
        folder = os.path.join(self._round_dir(self.round if number is None else number), "down")
        try:
            names = os.listdir(folder)
        except OSError:
            return {}
        found = {}
        for name in names:
            if name.endswith(".json") and name[:-5] in self.members:
                try:
                    found[name[:-5]] = read_json(os.path.join(folder, name)) or {}
                except (OSError, ValueError):
                    continue
        return found

    def restarts_in_window(self, now):
        """The rounds that ended within the crash-loop window, this one included, and when this
        round's first end was (the gang's one clock for its back-off)."""
        window = float(self.policy["crash_loop_window_s"])
        counted, first = 0, None
        for number in range(self.round + 1):
            ends = [word.get("at", 0) for word in self.downs(number).values()]
            if not ends:
                continue
            began = min(ends)
            if number == self.round:
                first = began
            if now - began <= window:
                counted += 1
        return counted, first if first is not None else now


def _subreaper():
    """Descendants left behind (a launcher's workers) are reparented to us and reaped."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _exit_waiter(pid):
    """A tick's wait that ends at once when the trainer exits (asleep in poll() on its pidfd where
    the kernel and Python have them: a crash is seen within milliseconds, not a tick)."""
    import select

    try:
        poller = select.poll()
        poller.register(os.pidfd_open(pid), select.POLLIN)
    except (AttributeError, OSError):
        return lambda: time.sleep(POLL_SECONDS)
    return lambda: poller.poll(POLL_SECONDS * 1000)


def _read_pidfile(path):
    """The launch's pidfile (rundir.Pidfile) when it names a process by its start time, else None.
    rundir's reader, not trainer_finding's: a watching supervisor never imports the stop's options."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import rundir

    try:
        entry = rundir.read_pidfile(path)
    except (OSError, ValueError):
        return None
    return entry if entry is not None and entry.starttime is not None else None


def _reap(pid=None):
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


def _not_our_child(pid):
    """Why pid is not a child of ours (an ended one not reaped yet is), or None: only a parent learns
    its exit status, and a child stays ours until we reap it, so this is asked once."""
    proc = proctable.read_process(pid)
    if proc is None:
        return f"PID {pid} is gone"
    if proc.ppid != os.getpid():
        return f"PID {pid} is not a child of the supervisor (its parent is {proc.ppid})"
    return None


# -- watching ---------------------------------------------------------------------------------

class Watch:
    """The run's beats: its progress lines (in the log its trainer writes) and the stop request
    helper's heartbeat file; the intervals between them."""

    def __init__(self, launch, main_pid, since, gaps):
        from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import progress

        self.progress = progress
        self.reader = progress.LogReader(launch["step_regex"], launch["throughput_patterns"],
                                         launch["profile_line_regex"], launch["profile_stage_regex"])
        self.launch, self.main_pid, self.since = launch, main_pid, since
        self.gaps = list(gaps or [])[-GAPS_KEPT:]
        self.log = None
        self.offset = 0
        self.partial = b""
        self.last_beat = time.time()
        self.beats = 0  # a gap is learned from the second beat the supervisor saw on
        self.last_step = None
        self.heartbeat = self._heartbeat_path()
        self.heartbeat_at = 0.0
        self.find_log()

    def _heartbeat_path(self):
        from ansible_collections.dflash.lifecycle.plugins.module_utils.ct.proctable import read_environ

        env = read_environ(self.main_pid) or {}
        path = env.get("DFLASH_STOP_REQUEST")
        return f"{path}.alive" if path else None

    def find_log(self):
        main = proctable.read_process(self.main_pid)
        if main is None:
            return
        found = self.progress.running_log(main, self.launch["log_file"], step_regex=self.launch["step_regex"])
        if found["path"] and found["path"] != self.log:
            self.log = found["path"]
            try:
                self.offset = os.path.getsize(self.log)
            except OSError:
                self.offset = 0
            self.partial = b""

    def _new_lines(self):
        if not self.log:
            return []
        try:
            with open(self.log, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                if size < self.offset:  # truncated or replaced: read it from its start
                    self.offset, self.partial = 0, b""
                if size == self.offset:
                    return []
                handle.seek(self.offset)
                data = handle.read(min(size - self.offset, LOG_MAX_BYTES))
        except OSError:
            return []
        self.offset += len(data)
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()
        return [line.decode("utf-8", "replace") for line in lines]

    def beat(self, now):
        """Whether the run gave a sign of progress since the last tick (a gap is learned then)."""
        fresh = False
        for line in self._new_lines():
            point = self.reader.progress(line)
            if point is not None:
                fresh, self.last_step = True, point[0]
        if self.heartbeat:
            try:
                mtime = os.stat(self.heartbeat).st_mtime
            except OSError:
                mtime = 0.0
            if mtime > self.heartbeat_at and mtime >= self.since:
                fresh, self.heartbeat_at = True, mtime
        if fresh:
            if self.beats:
                self.gaps = (self.gaps + [round(now - self.last_beat, 3)])[-GAPS_KEPT:]
            self.beats += 1
            self.last_beat = now
        return fresh

    def log_tail(self):
        return self.progress.read_lines(self.log or self.launch["log_file"], max_bytes=65536)


def newest_checkpoint(launch):
    """The newest complete checkpoint of the run by its layout (the launch's own rule), or None; a
    directory that cannot be read names none rather than ending the supervisor."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils import launch_call

    if not launch.get("checkpoint_dir"):
        return None
    try:
        return launch_call.newest_complete(launch)
    except (OSError, ValueError):
        return None


def save_under_way(launch):
    from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoints

    if not launch.get("checkpoint_dir"):
        return []
    try:
        return checkpoints.Directory(launch["checkpoint_dir"], launch["checkpoint_format"],
                                     launch.get("checkpoint_custom")).save_in_progress()
    except (OSError, ValueError):
        return []


def diagnostics(directory, launch, stop, main_pid):
    """A hung run's threads (state, wchan) and Python stacks with native frames (py-spy dump
    --native) for each of its processes, and nvidia-smi, kept in <directory>/diagnostics/ (the
    newest DIAGNOSTICS_KEPT). Returns the path."""
    import subprocess

    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import ladder, stop_options

    options = stop_options.StopOptions(stop)
    main = proctable.read_process(main_pid)
    processes = proctable.run_processes(main, proctable.snapshot()) if main else []
    found = [dict(ladder.diagnostics(p.identity, options, "/proc", native=True), cmdline=p.cmdline[:300])
             for p in processes]
    report = {"at": time.time(), "processes": found}
    smi = launch.get("nvidia_smi") or "/usr/bin/nvidia-smi"
    try:
        ran = subprocess.run([smi], capture_output=True, text=True, timeout=10, check=False)
        report["nvidia_smi"] = (ran.stdout + ran.stderr)[-8000:]
    except (OSError, subprocess.TimeoutExpired) as err:
        report["nvidia_smi"] = f"{smi}: {err}"
    folder = os.path.join(directory, "diagnostics")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    path = os.path.join(folder, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-hang.json")
    write_atomic(path, json.dumps(report, indent=1))
    for old in sorted(os.listdir(folder))[:-DIAGNOSTICS_KEPT]:
        os.unlink(os.path.join(folder, old))
    return path


def post_event(policy, event):
    """The webhook's POST of event (JSON), in a child of its own: it never holds the restart up."""
    url = policy.get("webhook")
    if not url:
        return
    if os.fork() != 0:
        return  # the watch loop reaps it
    status = 0
    try:
        from ansible.module_utils.urls import open_url

        open_url(url, data=json.dumps(event), method="POST", headers={"Content-Type": "application/json"},
                 timeout=float(policy["webhook_timeout_s"])).close()
    except BaseException:  # noqa: BLE001  (a forked child must never return into the supervisor)
        status = 1
    finally:
        os._exit(status)


# -- the supervisor's life --------------------------------------------------------------------

def take_over(directory, pidfile):
    """In the launch's worker, its result delivered: become the supervisor of the trainer it started
    (exec of the agent: same PID, the trainer stays its child). Returns only when there is nothing
    to supervise: no policy, no agent, or the pidfile's trainer is not its child."""
    spec = run_spec.read(directory)
    agent = os.path.join(directory, "agent.zip")
    entry = _read_pidfile(pidfile)
    if not spec or policy_of(spec["launch"]) is None or not os.path.exists(agent) or entry is None:
        return
    if _not_our_child(entry.pid) or _reap(entry.pid) is not None:
        return  # not ours, or it ended already: the launch said how
    os.execv(sys.executable, [sys.executable, agent, "supervise"])


def supervise(directory, agent):
    """The supervisor's loop, from the exec to its end. Returns the exit status."""
    sup = Supervisor(directory, agent)
    if sup.policy is None:
        return 0
    _subreaper()
    entry = _read_pidfile(sup.launch["pidfile"])
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
    lost = _not_our_child(pid)
    if lost:
        sup.say(f"lost its trainer: {lost}")
        sup.save(state="stood down", why=f"lost the trainer: {lost}")
        return 1
    saved_timeout = None
    nap = _exit_waiter(pid)
    while True:
        status = _reap(pid)
        now = time.time()
        if status is not None:
            return ended(sup, watch, exit_words(status), since)
        asked = run_spec.stood_down(directory, since)
        if watch.beat(now) and watch.gaps and hang_timeout(sup.policy, watch.gaps, startup) != saved_timeout:
            saved_timeout = hang_timeout(sup.policy, watch.gaps, startup)  # kept when it changes: rarely
            sup.save(learned={"gaps": watch.gaps, "timeout_s": saved_timeout})
        if asked is None:
            peers = {m: w for m, w in sup.downs().items() if m != sup.me} if len(sup.members) > 1 else {}
            if peers:
                member, word = next(iter(peers.items()))
                return stop_and_restart(sup, watch, f"{member} of the gang went down ({word.get('cause')})", since)
            silent = now - watch.last_beat
            timeout = hang_timeout(sup.policy, watch.gaps, startup)
            if watch.log is None and now - since > startup:
                watch.find_log()
            if silent > timeout and (armed or watch.heartbeat_at) and not save_under_way(sup.launch):
                # the figures exact beside the words: a silence just past its timeout reads alike in both
                silence = {"silent_s": silent, "timeout_s": timeout, "interval_s": max(watch.gaps) if watch.gaps else None}
                cause = (f"hung: no progress line{' or heartbeat' if watch.heartbeat_at else ''} for {silent:.2f} s "
                         f"(the longest interval it showed: {silence['interval_s'] or 'none yet'} s; "
                         f"timeout {timeout:.2f} s)")
                return hung(sup, watch, cause, pid, since, silence)
        nap()


def _deliberate(sup, since):
    """Words of the stop someone asked for that ended the run, or None."""
    asked = run_spec.stood_down(sup.directory, since)
    spec = run_spec.read(sup.directory) or {}
    if asked is not None:
        return f"the stop of {asked.get('by')} at {change_record.stamp(asked['at'])}"
    if spec.get("wanted") != "running":
        return f"{spec.get('wanted_by')}: the run is wanted stopped"
    return None


def ended(sup, watch, how, since):
    """The trainer ended on its own: a stop asked for, a finished run, or a crash."""
    words, facts = how
    deliberate = _deliberate(sup, since)
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
    end = {"cause": cause, "exit": facts, "traceback": traceback[-12:], "step": watch.last_step,
           "checkpoint": newest_checkpoint(sup.launch), "at": time.time(), "kind": "crash"}
    left = end_leftovers(sup)
    if left:
        end["leftovers"] = left
    return restart(sup, end)


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
    _reap()
    said = leftovers.words(report)
    sup.say(said)
    return said


def hung(sup, watch, cause, pid, since, silence):
    path = None
    try:
        path = diagnostics(sup.directory, sup.launch, sup.spec["stop"], pid)
        sup.say(f"{cause}; diagnostics kept in {path}")
    except (OSError, ValueError) as err:
        sup.say(f"{cause}; its diagnostics could not be kept: {err}")
    post_event(sup.policy, {"event": "hang", "ct": sup.me, "cause": cause, "diagnostics": path})
    if sup.policy["restart"] == "never":
        sup.remember(dict(silence, cause=cause, at=time.time(), kind="hang", diagnostics=path))
        sup.save(state="hung, left running (restart: never)")
        while _reap(pid) is None and run_spec.stood_down(sup.directory, since) is None:
            time.sleep(POLL_SECONDS)
        return 0
    return stop_and_restart(sup, watch, cause, since, diagnostics_path=path, kind="hang", facts=silence)


def hang_grace(gaps):
    """How long each stage but the last of a hang's stop waits: the run's longest interval (a
    signal that still reaches the trainer has started its save by then), HANG_GRACE_FLOOR_S at
    least; HANG_GRACE_UNKNOWN_S for a run that showed none."""
    return max(HANG_GRACE_FLOOR_S, *gaps) if gaps else HANG_GRACE_UNKNOWN_S


def loss_words(result):
    """What a stop of the supervisor's kept or lost, from its result's loss (staged_stop's)."""
    loss = result.get("loss") or {}
    if loss.get("saved_on_stop"):
        return "it saved a checkpoint on its stop: 0 steps lost"
    if loss.get("steps_lost") is not None:
        since = f"since {os.path.basename(loss['checkpoint'])}" if loss.get("checkpoint") else "of the run (no checkpoint)"
        return f"no checkpoint from its stop: {loss['steps_lost']} steps {since} lost"
    return "no checkpoint from its stop; the steps lost are not known"


def stop_and_restart(sup, watch, cause, since, diagnostics_path=None, kind="peer", facts=None):
    """The run stopped as a hang (a hung member, or a member whose gang went down: its ranks wait in
    collectives that will not return), by the run's own stop options with the grace of its cadence
    and no checkpoint required, then restarted from the newest complete checkpoint."""
    sup.save(state=f"stopping ({kind})")
    result = _stop(sup, hang_grace(watch.gaps))
    deliberate = _deliberate(sup, since)
    if deliberate:
        sup.save(state="stood down", why=deliberate)
        return 0
    stopped = f"stopped: {(result.get('msg') or '').split('; ')[0]}; {loss_words(result)}" \
        if not result.get("failed") else f"ITS STOP FAILED: {result.get('msg')}"
    sup.say(f"{cause}; {stopped}")
    end = {"cause": cause, "at": time.time(), "kind": kind, "stop": stopped, "step": watch.last_step,
           "steps_lost": (result.get("loss") or {}).get("steps_lost"),
           "checkpoint": newest_checkpoint(sup.launch), "diagnostics": diagnostics_path, **(facts or {})}
    if result.get("failed"):
        sup.remember(end)
        return down(sup, f"{cause}, and its stop failed: {result.get('msg')}")
    return restart(sup, end)


def _stop(sup, grace=None):
    """The staged stop of a `make stop`, under the CT's lock, not marking the run stopped; with
    grace (a hang's), every stage but the last and the stop request's acknowledgement wait at most
    grace, and a stop with no new checkpoint, or no graceful stage, goes on: the run resumes from its
    newest complete checkpoint."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import staged_stop, stop_options

    try:
        options = stop_options.checked(sup.spec["stop"], "the run's stop options")
    except stop_options.InvalidParameter as err:
        return {"failed": True, "msg": str(err)}
    options.lifecycle_dir, options.detach, options.signal_at = None, False, None
    if grace is not None:
        as_hang(options, grace)
    lease = _lock(sup)
    if isinstance(lease, str):
        return {"failed": True, "msg": f"not stopped: {lease} holds the CT"}
    try:
        return staged_stop.run_in_module(options, lease=lease)
    finally:
        _unlock(sup)


def as_hang(options, grace):
    """The run's stop options (StopOptions) made a hang's: every stage but the last, and the stop
    request's acknowledgement, wait at most grace (the graceful stage still grows while a
    checkpoint is written); no checkpoint is required of it, and a run with no graceful stage is
    stopped at once rather than at its next periodic checkpoint."""
    options.on_missing_checkpoint, options.no_graceful, options.require_checkpoint = "proceed", "proceed", False
    options.request_ack_timeout = min(float(options.request_ack_timeout), grace)
    options.stages = [dict(stage, wait=min(stage["wait"], grace)) for stage in options.stages[:-1]] + options.stages[-1:]
    return options


def _lock(sup):
    """The CT's redeploy lock for the supervisor (a job holding it is waited for up to a lease);
    the lease, or the words of the holder."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils import pve_hook

    path = pve_hook.lock_path(sup.spec)
    went_on = pve_hook.wait_for_lock(path, HOLDER, LEASE_SECONDS, takeover_holder=HOLDER)
    return went_on or (path, HOLDER, LEASE_SECONDS)


def _unlock(sup):
    from ansible_collections.dflash.lifecycle.plugins.module_utils import pve_hook
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import lock

    try:
        lock.release(pve_hook.lock_path(sup.spec), HOLDER)
    except OSError:
        pass


def down(sup, words):
    """The run stays down: said in the state, the CT's change record and the webhook."""
    sup.say(f"THE RUN STAYS DOWN: {words}")
    sup.save(state="DOWN", why=words)
    record = sup.launch.get("change_record") or change_record.DEFAULT_PATH
    try:
        change_record.begin(record, HOLDER, "restart after the run ended", os.getpid())
        change_record.end(record, True, f"THE RUN STAYS DOWN: {words}")
    except OSError:
        pass
    post_event(sup.policy, {"event": "down", "ct": sup.me, "why": words})
    return 1


def _ask_again(sup, since):
    """Why the supervisor no longer restarts: a stop asked for since, or a trainer someone else
    started; None to go on."""
    deliberate = _deliberate(sup, since)
    if deliberate:
        return deliberate
    entry = _read_pidfile(sup.launch["pidfile"])
    if entry is not None and proctable.alive((entry.pid, entry.starttime)):
        return f"a trainer runs again (PID {entry.pid}), started by someone else"
    return None


def restart(sup, end):
    """After the run's end (end: its facts): the back-off, then the relaunch; a crash loop, a
    gang member that never went down or restart never leave it down."""
    since = time.time()
    sup.remember(end)
    post_event(sup.policy, {"event": end["kind"], "ct": sup.me, "cause": end["cause"], "checkpoint": end.get("checkpoint"),
                            "steps_lost": end.get("steps_lost"), "leftovers": end.get("leftovers")})
    if sup.policy["restart"] == "never":
        return down(sup, f"{end['cause']} (restart: never)")
    missing = _gone_down(sup, end)
    if missing:
        return down(sup, f"{end['cause']}; {missing}")
    while True:
        now = time.time()
        count, first = sup.restarts_in_window(now)
        if count > int(sup.policy["crash_loop_restarts"]):
            causes = "; ".join(e["cause"] for e in (sup.state.get("ends") or [])[-count:])
            post_event(sup.policy, {"event": "crash-loop", "ct": sup.me, "restarts": count - 1})
            return down(sup, f"crash loop: {count - 1} restarts within {sup.policy['crash_loop_window_s']:.0f} s, "
                             f"and it ended again: {causes}")
        wait = backoff(sup.policy, count)
        due = first + wait
        sup.save(state=f"backing off {wait:.0f} s (restart {count} within the window)", restart_due=due,
                 backoff_s=wait)
        sup.say(f"{end['cause']}; restart {count} in {max(0.0, due - now):.1f} s")
        while time.time() < due:
            why = _ask_again(sup, since)
            if why:
                sup.save(state="stood down", why=why)
                return 0
            _reap()
            time.sleep(min(POLL_SECONDS, max(0.0, due - time.time())))
        outcome = relaunch(sup, since)
        if outcome is None:
            return 0  # stood down, or exec'd into the new run's supervisor
        end = dict(outcome, at=time.time())
        sup.remember(end)
        sup.round += 1
        missing = _gone_down(sup, end)
        if missing:
            return down(sup, f"{end['cause']}; {missing}")


def _gone_down(sup, end):
    """This member's end in its round (the count and the back-off's clock are read there); for a
    gang, once every member is down: words of the members that never went down, else None."""
    sup.tell_down({"cause": end["cause"]})
    return _gang_down(sup) if len(sup.members) > 1 else None


def _gang_down(sup):
    """Wait until every member of the gang said it is down in this round; words of the missing
    ones after the bound (the longest stop, and a minute), else None."""
    bound = float(sup.spec["stop"].get("graceful_wait_cap") or 900) + 60
    deadline = time.monotonic() + bound
    while True:
        missing = [m for m in sup.members if m not in sup.downs()]
        if not missing:
            return None
        if time.monotonic() >= deadline:
            return f"{', '.join(missing)} of the gang did not go down within {bound:.0f} s: the gang is not restarted"
        _reap()
        time.sleep(POLL_SECONDS)


def relaunch(sup, since):
    """The run launched again (launch_call: the redeploy's launch, resuming from the newest
    checkpoint), by this process, so the new trainer is its child; then a fresh supervisor (an
    exec). Returns the facts of a relaunch that failed, or None once it stood down."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils import launch_call
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import detached

    lease = _lock(sup)
    if isinstance(lease, str):
        sup.say(f"not relaunched yet: {lease} holds the CT")
        return {"cause": f"relaunch refused: {lease} holds the CT", "kind": "relaunch"}
    try:
        why = _ask_again(sup, since)
        if why:
            sup.save(state="stood down", why=why)
            return None
        sup.save(state=f"relaunching (round {sup.round + 1})")
        health = os.path.join(sup._round_dir(sup.round + 1), "health") if len(sup.members) > 1 else None
        params = run_spec.relaunch_params(sup.spec, health)
        params["lifecycle"].update(dir=sup.directory, rounds_dir=sup.rounds_dir, round=sup.round + 1)
        keeper = detached.start_keeper(lease, proctable.read_process(os.getpid()))
        try:
            result = launch_call.run_here(params, lease)
        finally:
            detached.end_keeper(keeper)
    finally:
        _unlock(sup)
    if not result.get("failed"):
        resumed = (result.get("resume") or {}).get("path")
        sup.say(f"the run is back: {result.get('msg')}, "
                + (f"resuming from {resumed}" if resumed else "with no checkpoint to resume from"))
        ends = sup.state.get("ends") or []
        if ends:
            ends[-1]["relaunch"] = f"{result.get('msg')}, resumed from {resumed}" if resumed else result.get("msg")
        sup.save(state="relaunched", ends=ends, restarts=(sup.state.get("restarts") or 0) + 1)
        os.execv(sys.executable, [sys.executable, sup.agent, "supervise"])
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import progress

    first = (result.get("msg") or "").splitlines()[0].split("; last lines")[0]
    traceback = result.get("traceback") or progress.traceback_in(result.get("log_tail") or []) or []
    sup.say(f"THE RELAUNCH FAILED: {result.get('msg')}")
    if result.get("trainer_running"):
        _stop(sup)
    return {"cause": f"the relaunch failed: {first}" + (f" ({traceback[-1].strip()})" if traceback else ""),
            "kind": "relaunch", "traceback": traceback[-12:]}


def words(directory, now=None):
    """The supervisor's state in one line for `make status`, with each end it recorded; None
    when the CT keeps no state of one."""
    state = read_state(directory)
    if state is None:
        return None
    now = time.time() if now is None else now
    pid, start = state.get("supervisor"), state.get("supervisor_start")
    alive = bool(pid) and start is not None and proctable.alive((pid, start))
    what = state.get("state") or "?"
    if what == "watching" and alive:
        learned = state.get("learned") or {}
        what = f"watching trainer PID {(state.get('trainer') or {}).get('pid')} (supervisor PID {pid})"
        if learned.get("timeout_s"):
            what += f", a hang after {learned['timeout_s']:.1f} s without progress"
    elif what in ("watching", "relaunched") or what.startswith(("backing off", "relaunching", "stopping")):
        what = f"{what} (PID {pid})" if alive else f"GONE while {what} (PID {pid}): the run is not supervised"
    if state.get("why") and not alive:
        what += f": {state['why']}"
    ends = state.get("ends") or []
    if ends:
        what += f"; {state.get('restarts') or 0} restarts since the launch; ends: " + "; ".join(
            f"{change_record.stamp(e.get('at') or 0)} {e.get('cause')}"
            + (f", checkpoint {e['checkpoint']}" if e.get("checkpoint") else "")
            + (f", {e['steps_lost']} steps lost" if e.get("steps_lost") is not None else "")
            + (f", {e['leftovers']}" if e.get("leftovers") else "")
            + (f", diagnostics {e['diagnostics']}" if e.get("diagnostics") else "")
            + (f" -> {e['relaunch']}" if e.get("relaunch") else "") for e in ends[-5:])
    return what


def restarts_since(directory, mark_path=None, mark=False):
    """The ends the supervisor restarted the run after since the last job that asked (kept in
    mark_path: <directory>/restarts-reported), in words; None when there are none. mark: record
    them as reported."""
    state = read_state(directory)
    mark_path = mark_path or os.path.join(directory, "restarts-reported")
    try:
        with open(mark_path, encoding="utf-8") as handle:
            reported = float(handle.read().strip() or 0)
    except (OSError, ValueError):
        reported = 0.0
    ends = [e for e in (state or {}).get("ends") or [] if (e.get("at") or 0) > reported]
    if not ends:
        return None
    if mark:
        try:
            write_atomic(mark_path, f"{max(e.get('at') or 0 for e in ends)}\n")
        except OSError:
            pass
    return f"the supervisor saw {len(ends)} end(s) of the run since the last job: " + "; ".join(
        f"{change_record.stamp(e.get('at') or 0)} {e.get('cause')}"
        + (f", {e['steps_lost']} steps lost" if e.get("steps_lost") is not None else "")
        + (f" -> {e['relaunch']}" if e.get("relaunch") else "")
        for e in ends) + f"; now: {(state or {}).get('state')}"
