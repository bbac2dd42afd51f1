# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Stop a training process tree in stages, verify it stopped and that it checkpointed.

The logic of the ``dflash.lifecycle.staged_stop`` module, free of Ansible so that
unit tests reach it directly.  Runs on the target: Python 3.8 and later.

Safety rules, each a lesson from the field (see DESIGN.md "Staged stop"):

* Signals go to single PIDs, never to a process group number: inside a CT entered
  with ``pct exec`` the PGID and SID are 0, and ``kill(0, sig)`` would hit the
  caller's own group -- the module and the pct session that runs it.
* A process is named by (pid, starttime) and, where the kernel allows, held by a
  pidfd from the moment the target set is captured, so a reused PID is never hit.
* The module's own process and its ancestors are never targets.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils import checkpoints, proctable

DEFAULT_LADDER = (
    {"signal": "SIGINT", "scope": "main", "wait": 120},
    {"signal": "SIGTERM", "scope": "tree", "wait": 30},
    {"signal": "SIGKILL", "scope": "tree", "wait": 10},
)
SCOPES = ("main", "group", "tree")
FALLBACK_POLL_SECONDS = 0.05


class StopFailed(Exception):
    """The stop did not end as asked; ``result`` says how far it got."""

    def __init__(self, msg, result):
        super().__init__(msg)
        self.result = dict(result, msg=msg)


class InvalidParameter(ValueError):
    """A parameter is wrong; the message names it."""


def signal_number(value, where):
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        number = int(value)
        if number in {s.value for s in signal.Signals}:
            return signal.Signals(number)
    elif isinstance(value, str):
        name = value.upper()
        name = name if name.startswith("SIG") else "SIG" + name
        if name in signal.Signals.__members__:
            return signal.Signals[name]
    raise InvalidParameter(f"{where}: unknown signal {value!r}")


def validate_ladder(ladder):
    """Normalised stages; errors name the offending entry, e.g. ``ladder[1].scope``."""
    if not ladder:
        raise InvalidParameter("ladder: needs at least one stage")
    stages = []
    for index, stage in enumerate(ladder):
        where = f"ladder[{index}]"
        if not isinstance(stage, dict):
            raise InvalidParameter(f"{where}: must be a mapping with signal, scope and wait")
        unknown = set(stage) - {"signal", "scope", "wait"}
        if unknown:
            raise InvalidParameter(f"{where}: unknown keys {sorted(unknown)}")
        if "signal" not in stage:
            raise InvalidParameter(f"{where}.signal: required")
        scope = stage.get("scope", "tree")
        if scope not in SCOPES:
            raise InvalidParameter(f"{where}.scope: {scope!r} is not one of {', '.join(SCOPES)}")
        try:
            wait = float(stage.get("wait", 10))
        except (TypeError, ValueError):
            raise InvalidParameter(f"{where}.wait: {stage.get('wait')!r} is not a number") from None
        if wait < 0:
            raise InvalidParameter(f"{where}.wait: must be >= 0, got {wait}")
        stages.append({"signal": signal_number(stage["signal"], f"{where}.signal"),
                       "scope": scope, "wait": wait})
    return stages


# -- finding the trainer ------------------------------------------------------------------

def read_pidfile(path):
    """(pid, starttime or None, mtime) from a pidfile of the form 'PID [STARTTIME]'."""
    try:
        with open(path) as handle:
            fields = handle.read().split()
        mtime = os.stat(path).st_mtime
    except FileNotFoundError:
        return None
    if not fields or not fields[0].isdigit():
        raise InvalidParameter(f"pidfile: {path} does not start with a PID")
    starttime = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return int(fields[0]), starttime, mtime


def pidfile_process(path, pattern, table, proc_root):
    """The process a pidfile names, and why it was rejected when it was."""
    entry = read_pidfile(path)
    if entry is None:
        return None, "pidfile does not exist"
    pid, starttime, mtime = entry
    proc = table.get(pid)
    if proc is None or proc.gone:
        return None, f"PID {pid} from the pidfile is not running"
    if starttime is not None and proc.starttime != starttime:
        return None, f"PID {pid} was reused: it started at tick {proc.starttime}, not {starttime}"
    if starttime is None and proctable.start_wall_time(proc, proc_root) > mtime + 1:
        return None, f"PID {pid} started after the pidfile was written: the PID was reused"
    if pattern and not re.search(pattern, proc.cmdline):
        return None, f"PID {pid} ({proc.cmdline[:80]!r}) does not match pattern"
    return proc, None


def pattern_matches(pattern, table, excluded):
    """Processes whose full cmdline matches; of a matching chain only the topmost counts
    (forked workers share the trainer's cmdline)."""
    regex = re.compile(pattern)
    hits = {pid for pid, proc in table.items()
            if pid not in excluded and not proc.gone and regex.search(proc.cmdline)}
    top = []
    for pid in sorted(hits):
        above = proctable.ancestors(table, pid)[1:]
        if not hits.intersection(above):
            top.append(pid)
    resolved = []
    for pid in top:
        # `bash -c "python3 train.py"` style wrappers: the python child is the trainer
        proc = table[pid]
        kids = [k for k in proctable.descendants(table, pid) if k in hits
                and table[k].ppid == pid]
        if proc.comm in proctable.SHELLS and len(kids) == 1:
            resolved.append(kids[0])
        else:
            resolved.append(pid)
    return resolved


def find_trainer(params, table, excluded, proc_root):
    """(main process or None, report). Raises StopFailed on ambiguity."""
    report = {"source": None, "pidfile_stale": False, "pidfile_reason": None}
    if params.get("pidfile"):
        proc, reason = pidfile_process(params["pidfile"], params.get("pattern"), table, proc_root)
        if proc is not None and proc.pid not in excluded:
            report["source"] = "pidfile"
            return proc, report
        report["pidfile_stale"] = reason != "pidfile does not exist"
        report["pidfile_reason"] = reason
    if not params.get("pattern"):
        return None, report
    matches = pattern_matches(params["pattern"], table, excluded)
    if params.get("pid"):
        matches = [pid for pid in matches if pid == params["pid"]]
    if len(matches) > 1:
        select_mode = params.get("select", "only")
        if select_mode == "only":
            listing = [{"pid": pid, "cmdline": table[pid].cmdline} for pid in matches]
            raise StopFailed(
                f"{len(matches)} processes match pattern {params['pattern']!r}: "
                + "; ".join(f"PID {m['pid']}: {m['cmdline'][:200]}" for m in listing)
                + ". Nothing was signalled; set pid, or select: oldest|newest.",
                {"changed": False, "matches": listing, "timeline": [], "targets": []})
        matches.sort(key=lambda pid: table[pid].starttime)
        matches = [matches[0] if select_mode == "oldest" else matches[-1]]
    if not matches:
        return None, report
    report["source"] = "pattern"
    return table[matches[0]], report


# -- the target set ------------------------------------------------------------------------

class Targets:
    """Processes to stop, each held by identity (and a pidfd where possible)."""

    def __init__(self, proc_root="/proc", use_pidfd=True):
        self.proc_root = proc_root
        self.use_pidfd = use_pidfd and hasattr(os, "pidfd_open") and proc_root == "/proc"
        self.members = {}  # identity -> {"proc": Process, "role": str}
        self.pidfds = {}

    def add(self, proc, role):
        if proc.identity in self.members or proc.gone:
            return
        if self.use_pidfd:
            try:
                fd = os.pidfd_open(proc.pid)
            except OSError:
                return  # already gone
            # opened by PID: valid only if that PID still has the same starttime now
            current = proctable.read_process(proc.pid, self.proc_root)
            if current is None or current.starttime != proc.starttime:
                os.close(fd)
                return
            self.pidfds[proc.identity] = fd
        self.members[proc.identity] = {"proc": proc, "role": role}

    def alive(self):
        return [ident for ident in self.members if proctable.alive(ident, self.proc_root)]

    def send(self, identity, signum):
        """Deliver signum to exactly this process; False when it is already gone."""
        fd = self.pidfds.get(identity)
        try:
            if fd is not None and hasattr(signal, "pidfd_send_signal"):
                signal.pidfd_send_signal(fd, signum)
                return True
            if not proctable.alive(identity, self.proc_root):
                return False
            os.kill(identity[0], signum)
            return True
        except ProcessLookupError:
            return False

    def wait_gone(self, identities, timeout, on_tick=None, tick=0.5):
        """Wait until none of identities runs, at most timeout seconds (a deadline
        the on_tick callback may move: it returns the new remaining time).
        Sleeps in poll() on pidfds; falls back to short sleeps without them."""
        deadline = time.monotonic() + timeout
        pending = set(identities)
        poller = None
        if self.pidfds:
            poller = select.poll()
            for ident in pending:
                if ident in self.pidfds:
                    poller.register(self.pidfds[ident], select.POLLIN)
        while True:
            pending = {i for i in pending if proctable.alive(i, self.proc_root)}
            now = time.monotonic()
            if not pending:
                return pending
            if on_tick is not None and now >= deadline:
                deadline = now + max(0.0, on_tick(now, final=True))
            if now >= deadline:
                return pending
            slice_end = min(deadline, now + tick) if on_tick is not None else deadline
            pollable = poller is not None and all(i in self.pidfds for i in pending)
            if pollable:
                poller.poll(max(0, int((slice_end - now) * 1000)) or 1)
            else:
                time.sleep(min(FALLBACK_POLL_SECONDS, max(0.0, slice_end - now)))
            if on_tick is not None:
                on_tick(time.monotonic(), final=False)

    def close(self):
        for fd in self.pidfds.values():
            os.close(fd)
        self.pidfds.clear()

    def report(self, identities=None):
        chosen = self.members if identities is None else identities
        out = []
        for ident in chosen:
            entry = self.members[ident]
            current = proctable.read_process(ident[0], self.proc_root)
            running = current is not None and current.starttime == ident[1] and not current.gone
            proc = current if running else entry["proc"]
            item = dict(proc.as_dict(), role=entry["role"])
            if running and self.proc_root == "/proc":
                item["uptime_s"] = round(time.time() - proctable.start_wall_time(proc), 1)
            out.append(item)
        return sorted(out, key=lambda p: p["pid"])


def orphans(table, main, device_glob, excluded, proc_root):
    """Reparented processes holding a device (a GPU) that started after the trainer."""
    if not device_glob:
        return []
    found = []
    for pid in proctable.holders_of(device_glob, table, proc_root):
        proc = table[pid]
        parent_gone = proc.ppid not in table or proc.ppid == 1
        if (pid not in excluded and pid != 1 and parent_gone
                and proc.starttime >= main.starttime and not proc.gone):
            found.append(proc)
    return found


def capture(main, table, params, excluded, targets):
    """The target set before the first signal."""
    targets.add(main, "main")
    for pid in proctable.descendants(table, main.pid):
        if pid not in excluded:
            targets.add(table[pid], "descendant")
    # a real group or session (not 0 as under pct exec, not the module's own)
    own = table.get(os.getpid()) if targets.proc_root == "/proc" else None
    for field, role in (("pgid", "group"), ("sid", "session")):
        value = getattr(main, field)
        if value <= 1 or value not in table or (own is not None and getattr(own, field) == value):
            continue
        for proc in table.values():
            if getattr(proc, field) == value and proc.pid not in excluded and proc.pid != 1:
                targets.add(proc, role)
    if params.get("include_wrapper"):
        parent = table.get(main.ppid)
        if parent is not None and parent.pid not in excluded and parent.pid != 1:
            targets.add(parent, "wrapper")
    for proc in orphans(table, main, params.get("device_glob"), excluded, targets.proc_root):
        targets.add(proc, "orphan")


def stage_pids(stage, main_ident, targets, table, excluded):
    """Identities one stage signals, refreshed from a new /proc snapshot."""
    main_proc = targets.members[main_ident]["proc"]
    if stage["scope"] == "main":
        return [main_ident] if proctable.alive(main_ident, targets.proc_root) else []
    # children forked since the capture belong to the tree too
    for ident in list(targets.alive()):
        for pid in proctable.descendants(table, ident[0]):
            if pid not in excluded and pid in table:
                targets.add(table[pid], "descendant")
    if stage["scope"] == "group" and main_proc.pgid > 1 and main_proc.pgid in table:
        return [i for i in targets.alive() if targets.members[i]["proc"].pgid == main_proc.pgid]
    return targets.alive()


# -- checkpoints -----------------------------------------------------------------------------

def _temp_patterns(params):
    return params.get("checkpoint_temp_patterns") or checkpoints.DEFAULT_TEMP_PATTERNS


def module_checkpoints(params):
    """checkpoints.entries() of checkpoint_dir with the module's pattern parameters."""
    return checkpoints.entries(params["checkpoint_dir"], params.get("checkpoint_pattern") or "*",
                              _temp_patterns(params))


def temp_files_left(params):
    """Temporary names in checkpoint_dir: a checkpoint still being written."""
    try:
        names = os.listdir(params["checkpoint_dir"])
    except OSError:
        return []
    return sorted(n for n in names if checkpoints.is_temp(n, _temp_patterns(params)))


def checkpoint_report(params, before):
    directory = params["checkpoint_dir"]
    after = module_checkpoints(params)
    complete = {n: e for n, e in after.items() if e["complete"]}
    newest = max(complete, key=lambda n: complete[n]["mtime"]) if complete else None
    new = sorted((n for n, e in complete.items()
                  if n not in before or before[n]["mtime"] != e["mtime"]),
                 key=lambda n: complete[n]["mtime"])
    return {
        "dir": directory,
        "newest": os.path.join(directory, newest) if newest else None,
        "newest_age_s": round(time.time() - complete[newest]["mtime"], 3) if newest else None,
        "new": os.path.join(directory, new[-1]) if new else None,
        "written": bool(new),
        "temp_files_left": temp_files_left(params),
    }


# -- when no signal can make the trainer checkpoint ---------------------------------------------

NO_GRACEFUL = ("wait_for_checkpoint", "fail", "proceed")
STEP_IN_NAME = re.compile(r"(\d+)(?!.*\d)")


def graceful_assessment(main, stages):
    """(possible, reason): can the first stage's signal make the trainer checkpoint?"""
    first = stages[0]["signal"]
    state = main.disposition(first)
    others = []
    for stage in stages[1:]:
        sig = stage["signal"]
        if sig not in (signal.SIGKILL, signal.SIGSTOP) and sig.name not in " ".join(others):
            others.append(f"{sig.name} is {'caught' if main.disposition(sig) == 'caught' else 'not caught'}")
    tail = (", " + ", ".join(others)) if others else ""
    if state == "caught":
        return True, f"{first.name} is caught by PID {main.pid}: its handler can checkpoint{tail}"
    if state == "ignored":
        return False, (f"{first.name} is ignored by PID {main.pid}, as after a background launch "
                       f"(nohup/&){tail}")
    return False, f"{first.name} is not caught by PID {main.pid}: it ends it without a checkpoint{tail}"


def _complete_checkpoints(params):
    entries = module_checkpoints(params)
    return sorted(((n, e) for n, e in entries.items() if e["complete"]), key=lambda i: i[1]["mtime"])


def periodic_interval(params):
    """Seconds between the last periodic checkpoints, or None without such a history."""
    done = _complete_checkpoints(params)[-3:]
    gaps = [b[1]["mtime"] - a[1]["mtime"] for a, b in zip(done, done[1:])]
    return round(max(gaps), 3) if gaps else None


def last_logged_step(params):
    path, regex = params.get("log_file"), params.get("step_regex") or r"\bstep (\d+)\b"
    if not path:
        return None
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.path.getsize(path) - 65536))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return None
    steps = re.findall(regex, text)
    return int(steps[-1]) if steps else None


def loss_report(params):
    """What a stop now loses: the newest checkpoint against the last step the trainer logged."""
    report = {"checkpoint": None, "checkpoint_step": None, "checkpoint_age_s": None,
              "last_logged_step": last_logged_step(params), "steps_lost": None,
              "checkpoint_interval_s": None}
    if not params.get("checkpoint_dir"):
        return report
    done = _complete_checkpoints(params)
    report["checkpoint_interval_s"] = periodic_interval(params)
    if done:
        name, entry = done[-1]
        step = STEP_IN_NAME.search(name)
        report.update(checkpoint=os.path.join(params["checkpoint_dir"], name),
                      checkpoint_step=int(step.group(1)) if step else None,
                      checkpoint_age_s=round(time.time() - entry["mtime"], 1))
    if report["checkpoint_step"] is not None and report["last_logged_step"] is not None:
        report["steps_lost"] = max(0, report["last_logged_step"] - report["checkpoint_step"])
    return report


def describe_loss(loss):
    if loss["checkpoint"] is None:
        return "there is no complete checkpoint: a stop loses the whole run"
    text = f"newest checkpoint {loss['checkpoint']} is {loss['checkpoint_age_s']}s old"
    if loss["steps_lost"] is not None:
        text += (f" (step {loss['checkpoint_step']}, the log is at step {loss['last_logged_step']}:"
                 f" a stop now loses {loss['steps_lost']} steps)")
    return text


def wait_for_checkpoint(params, before, main_ident, result, started):
    """Sleep until a new complete periodic checkpoint lands; StopFailed (nothing signalled)
    when none lands within 1.5x the observed interval (or checkpoint_wait_max)."""
    interval = result["loss_at_start"]["checkpoint_interval_s"]
    if interval is None:
        raise StopFailed(
            f"{result['graceful_reason']}; and {params.get('checkpoint_dir') or 'no checkpoint_dir'}"
            " shows no periodic checkpoint history to wait for. Nothing was signalled. "
            f"{describe_loss(result['loss_at_start'])}. To stop anyway: no_graceful=proceed.",
            result)
    bound = min(1.5 * interval, float(params.get("checkpoint_wait_max") or 1800))
    began = time.monotonic()
    while time.monotonic() - began < bound:
        if not proctable.alive(main_ident):
            return
        fresh = [(n, e) for n, e in _complete_checkpoints(params)
                 if n not in before or before[n]["mtime"] != e["mtime"]]
        if fresh and not temp_files_left(params):
            _event(result, started, event="checkpoint_landed",
                   path=os.path.join(params["checkpoint_dir"], fresh[-1][0]),
                   waited=round(time.monotonic() - began, 3))
            return
        time.sleep(0.1)
    raise StopFailed(
        f"{result['graceful_reason']}; no new periodic checkpoint landed within {bound:.0f}s "
        f"(1.5x the observed interval of {interval}s). Nothing was signalled. "
        f"{describe_loss(loss_report(params))}. To stop anyway: no_graceful=proceed.", result)


# -- diagnostics ------------------------------------------------------------------------------

def diagnostics(main_ident, params, proc_root):
    pid = main_ident[0]
    threads = proctable.threads_report(pid, proc_root)
    report = {"pid": pid, "threads": threads, "py_spy": None}
    py_spy = params.get("py_spy") or shutil.which("py-spy")
    if not py_spy or params.get("py_spy") is False:
        report["py_spy"] = "py-spy not found"
        return report
    if any(t["state"] == "D" for t in threads):
        # ptrace on an uninterruptible task would hang py-spy itself
        report["py_spy"] = "skipped: a thread is in D state"
        return report
    try:
        out = subprocess.run([py_spy, "dump", "--pid", str(pid)], capture_output=True,
                             text=True, timeout=params.get("py_spy_timeout", 10), check=False)
        report["py_spy"] = (out.stdout + out.stderr).strip()[-8000:]
    except subprocess.TimeoutExpired:
        report["py_spy"] = "py-spy dump timed out"
    except OSError as err:
        report["py_spy"] = f"py-spy failed: {err}"
    return report


# -- the stop ---------------------------------------------------------------------------------

def _disposition_notes(main, stages):
    notes, dispositions = [], {}
    for stage in stages:
        name = stage["signal"].name
        dispositions[name] = main.disposition(stage["signal"])
    first = stages[0]["signal"]
    state = dispositions[first.name]
    if state == "ignored":
        notes.append(f"{first.name} is ignored by PID {main.pid} (SigIgn): "
                     "its handler cannot run, so it cannot checkpoint on this signal")
    elif state == "default" and first not in (signal.SIGKILL, signal.SIGSTOP):
        notes.append(f"{first.name} is not caught by PID {main.pid} (SigCgt): "
                     "it will end the process without a checkpoint")
    return dispositions, notes


def run(params, proc_root="/proc", check_mode=False):
    """Stop the trainer as params say. Returns the result; raises StopFailed."""
    started = time.monotonic()
    stages = validate_ladder(params.get("ladder") or DEFAULT_LADDER)
    table = proctable.snapshot(proc_root)
    excluded = set(proctable.ancestors(table, os.getpid())) if proc_root == "/proc" else set()
    excluded.update(params.get("exclude_pids") or [])
    main, found = find_trainer(params, table, excluded, proc_root)
    result = {"changed": False, "stopped": True, "stopped_by": None, "timeline": [],
              "targets": [], "survivors": [], "diagnostics": None, "checkpoint": None,
              "signal_dispositions": {}, "notes": [], "found": found,
              "ladder": [dict(s, signal=s["signal"].name) for s in stages]}
    before = {}
    if params.get("checkpoint_dir"):
        before = module_checkpoints(params)
    if main is None:
        result["msg"] = "no trainer running" + (
            f" ({found['pidfile_reason']})" if found["pidfile_reason"] else "")
        if params.get("checkpoint_dir"):
            result["checkpoint"] = checkpoint_report(params, before)
        return result

    targets = Targets(proc_root, use_pidfd=params.get("use_pidfd", True))
    try:
        capture(main, table, params, excluded, targets)
        main_ident = main.identity
        result["targets"] = targets.report()
        result["signal_dispositions"], result["notes"] = _disposition_notes(main, stages)
        result["graceful_possible"], result["graceful_reason"] = graceful_assessment(main, stages)
        result["loss_at_start"] = loss_report(params)
        result["changed"] = True
        policy = params.get("no_graceful") or "wait_for_checkpoint"
        if policy not in NO_GRACEFUL:
            raise InvalidParameter(f"no_graceful: {policy!r} is not one of {', '.join(NO_GRACEFUL)}")
        if check_mode:
            result["stopped"] = False
            if params.get("checkpoint_dir"):
                result["checkpoint"] = checkpoint_report(params, before)
            result["msg"] = (f"would stop PID {main.pid} and {len(result['targets']) - 1} more "
                             f"with {' -> '.join(s['signal'].name for s in stages)}")
            if not result["graceful_possible"]:
                result["msg"] += (f"; no graceful checkpoint: {result['graceful_reason']}; "
                                  f"{describe_loss(result['loss_at_start'])}; "
                                  f"no_graceful={policy}")
            return result
        if not result["graceful_possible"]:
            if policy == "fail":
                raise StopFailed(
                    f"{result['graceful_reason']}. Nothing was signalled. "
                    f"{describe_loss(result['loss_at_start'])}. Choose no_graceful="
                    "wait_for_checkpoint to stop right after the next periodic checkpoint, or "
                    "no_graceful=proceed to stop now.", result)
            if policy == "wait_for_checkpoint":
                wait_for_checkpoint(params, before, main_ident, result, started)
        return _run_ladder(params, stages, main_ident, targets, excluded, before, result, started)
    finally:
        targets.close()


def _event(result, started, **fields):
    now = time.monotonic()
    fields.update(t=round(now, 6), elapsed=round(now - started, 3))
    result["timeline"].append(fields)


def _run_ladder(params, stages, main_ident, targets, excluded, before, result, started):
    proc_root = targets.proc_root
    main_pid = main_ident[0]
    stopped_by = None
    for index, stage in enumerate(stages):
        name = stage["signal"].name
        if (stage["scope"] == "main" and params.get("skip_ignored_stage", True)
                and result["signal_dispositions"].get(name) == "ignored"):
            _event(result, started, event="skipped", stage=index, signal=name,
                   reason=f"{name} is ignored by PID {main_pid}")
            continue
        if index > 0 and result["diagnostics"] is None and proctable.alive(main_ident, proc_root):
            result["diagnostics"] = diagnostics(main_ident, params, proc_root)
        table = proctable.snapshot(proc_root)
        main_proc = targets.members[main_ident]["proc"]
        for proc in orphans(table, main_proc, params.get("device_glob"), excluded, proc_root):
            targets.add(proc, "orphan")
        chosen = stage_pids(stage, main_ident, targets, table, excluded)
        sent = [ident[0] for ident in chosen if targets.send(ident, stage["signal"])]
        if stage["signal"] != signal.SIGKILL:
            for ident in chosen:  # a stopped (T) process must run to act on the signal
                targets.send(ident, signal.SIGCONT)
        _event(result, started, event="signal", stage=index, signal=name,
               scope=stage["scope"], pids=sorted(sent))
        remaining = _wait_stage(params, stage, index, targets, result, started)
        if not remaining:
            # nothing of the set runs; orphans that surfaced meanwhile keep us going
            late = orphans(proctable.snapshot(proc_root), main_proc, params.get("device_glob"),
                           excluded, proc_root)
            for proc in late:
                targets.add(proc, "orphan")
            if not targets.alive():
                stopped_by = {"stage": index, "signal": name, "scope": stage["scope"]}
                _event(result, started, event="stopped", stage=index, signal=name)
                break
    result["targets"] = targets.report()
    result["stopped_by"] = stopped_by
    if params.get("checkpoint_dir"):
        result["checkpoint"] = checkpoint_report(params, before)
    survivors = targets.alive()
    result["survivors"] = [dict(p, threads=proctable.threads_report(p["pid"], proc_root))
                           for p in targets.report(survivors)]
    result["stopped"] = not survivors
    result["loss"] = loss_report(params)
    result["msg"] = _summary(result, main_pid, started)
    if survivors:
        states = ", ".join(f"PID {p['pid']} state {p['state']}" for p in result["survivors"])
        raise StopFailed(f"{len(survivors)} process(es) survived the last stage: {states}. "
                         + result["msg"], result)
    if params.get("require_checkpoint") and not (result["checkpoint"] or {}).get("written"):
        raise StopFailed("stopped, but no new complete checkpoint appeared in "
                         f"{params.get('checkpoint_dir')}. " + result["msg"], result)
    return result


def _wait_stage(params, stage, index, targets, result, started):
    """Wait for the set to go; the first stage waits longer while a checkpoint is written."""
    base = stage["wait"]
    directory = params.get("checkpoint_dir") if index == 0 else None
    if not directory:
        return targets.wait_gone(targets.alive(), base)
    window = float(params.get("checkpoint_activity_window", 5))
    cap_at = time.monotonic() + max(base, float(params.get("checkpoint_max_wait", 900)))
    state = {"print": checkpoints.fingerprint(directory), "changed_at": None, "extended": 0.0}

    def on_tick(now, final):
        current = checkpoints.fingerprint(directory)
        if current != state["print"]:
            state["print"], state["changed_at"] = current, now
        if not final:
            return 0.0
        recent = state["changed_at"] is not None and now - state["changed_at"] < window
        if not recent or now >= cap_at:
            return 0.0
        extra = min(window, cap_at - now)
        state["extended"] += extra
        return extra

    remaining = targets.wait_gone(targets.alive(), base, on_tick=on_tick)
    if state["extended"]:
        _event(result, started, event="wait_extended", stage=index,
               by=round(state["extended"], 3),
               reason=f"{directory} was still being written")
    return remaining


def _summary(result, main_pid, started):
    took = round(time.monotonic() - started, 1)
    if result["survivors"]:
        head = f"PID {main_pid} NOT stopped after {took}s"
    elif result["stopped_by"]:
        by = result["stopped_by"]
        head = f"stopped PID {main_pid} at stage {by['stage'] + 1} ({by['signal']}) in {took}s"
    else:
        head = f"PID {main_pid} stopped in {took}s"
    ckpt = result.get("checkpoint")
    if ckpt is not None:
        head += ("; new checkpoint " + ckpt["new"]) if ckpt["written"] else "; NO new checkpoint"
    if result["loss"]["steps_lost"] is not None:
        head += f"; {result['loss']['steps_lost']} steps since it lost"
    return head
