# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Finding the trainer: its pidfile first, else a command-line pattern (Python 3.8 compatible).

A pidfile reads ``PID STARTTIME [RUN_ID]``: the start time (clock ticks, field 22 of
/proc/PID/stat) makes a reused PID harmless, the run identity names every process of the
launch (module_utils/stop/target_set.py). Several processes matching the pattern are an error
unless the caller says which one: a stop never guesses. Processes that carry the run id of the
pidfile's dead trainer are that run's leftovers (module_utils/stop/leftovers.py), never a trainer.
"""

from __future__ import annotations

import os
import re

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable, rundir
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import leftovers
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop.stop_options import InvalidParameter, StopOptions


class Ambiguous(Exception):
    """Several processes match and the caller did not say which one; nothing was signalled."""

    def __init__(self, msg, matches):
        super().__init__(msg)
        self.matches = matches


def read_pidfile(path):
    """The rundir.Pidfile at path, or None when there is none."""
    try:
        return rundir.read_pidfile(path)
    except ValueError as err:
        raise InvalidParameter(f"pidfile: {err}") from None


def pidfile_process(path, pattern, table, proc_root):
    """The process a pidfile names, and why it was rejected when it was."""
    entry = read_pidfile(path)
    if entry is None:
        return None, "pidfile does not exist"
    proc = table.get(entry.pid)
    if proc is None or proc.gone:
        return None, f"PID {entry.pid} from the pidfile is not running"
    if entry.starttime is not None and proc.starttime != entry.starttime:
        return None, (f"PID {entry.pid} was reused: it started at tick {proc.starttime}, "
                      f"not {entry.starttime}")
    if entry.starttime is None and proctable.start_wall_time(proc, proc_root) > entry.mtime + 1:
        return None, f"PID {entry.pid} started after the pidfile was written: the PID was reused"
    if pattern and not re.search(pattern, proc.cmdline):
        return None, f"PID {entry.pid} ({proc.cmdline[:80]!r}) does not match pattern"
    return proc, None


def pattern_matches(pattern, table, excluded):
    """Processes whose full cmdline matches; of a matching chain only the topmost counts
    (forked workers share the trainer's cmdline)."""
    regex = re.compile(pattern)
    hits = {pid for pid, proc in table.items()
            if pid not in excluded and not proc.gone and regex.search(proc.cmdline)}
    resolved = []
    for pid in sorted(hits):
        if hits.intersection(proctable.ancestors(table, pid)[1:]):
            continue
        # `bash -c "python3 train.py"` style wrappers: the python child is the trainer
        kids = [k for k in hits if table[k].ppid == pid]
        resolved.append(kids[0] if table[pid].comm in proctable.SHELLS and len(kids) == 1 else pid)
    return resolved


def find_trainer(options, table, proc_root):
    """(main process or None, how it was found: found["leftovers"] holds the processes of the
    pidfile's dead run, which no pattern match counts). Raises Ambiguous."""
    found = {"source": None, "pidfile_stale": False, "pidfile_reason": None, "leftovers": []}
    excluded = options.exclude_pids
    if options.pidfile:
        proc, reason = pidfile_process(options.pidfile, options.pattern, table, proc_root)
        if proc is not None and proc.pid not in excluded:
            found["source"] = "pidfile"
            return proc, found
        found["pidfile_stale"] = reason != "pidfile does not exist"
        found["pidfile_reason"] = reason
        left = proctable.carrying(leftovers.dead_run_id(options.pidfile, table), table, excluded, proc_root)
        found["leftovers"] = [{"pid": proc.pid, "cmdline": proc.cmdline[:200]} for proc in left]
        excluded = set(excluded).union(proc.pid for proc in left)
    if not options.pattern:
        return None, found
    matches = pattern_matches(options.pattern, table, excluded)
    if options.pid:
        matches = [pid for pid in matches if pid == options.pid]
    if len(matches) > 1:
        if options.select == "only":
            listing = [{"pid": pid, "cmdline": table[pid].cmdline} for pid in matches]
            raise Ambiguous(
                f"{len(matches)} processes match pattern {options.pattern!r}: "
                + "; ".join(f"PID {m['pid']}: {m['cmdline'][:200]}" for m in listing)
                + ". Nothing was signalled; set pid, or select: oldest|newest.", listing)
        matches.sort(key=lambda pid: table[pid].starttime)
        matches = [matches[0] if options.select == "oldest" else matches[-1]]
    if not matches:
        return None, found
    found["source"] = "pattern"
    return table[matches[0]], found


def running(pidfile, pattern, proc_root="/proc"):
    """The trainer already running (by pidfile, else the oldest pattern match), or None."""
    table = proctable.snapshot(proc_root)
    options = StopOptions({"pidfile": pidfile, "pattern": pattern, "select": "oldest"},
                          exclude_pids=proctable.ancestors(table, os.getpid()))
    main, _found = find_trainer(options, table, proc_root)
    return main
