# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What runs in a CT, read without touching anything (Python 3.8 compatible): the logic of the
dflash.lifecycle.trainer_info module.

The trainer (pidfile, else pattern), its uptime and run identity, the release current points
to and any drift, its recent throughput (the median of its last progress lines) and the
figure recorded at its launch, the newest checkpoint and its age, the per-CT lock with
the phase its holder reached, and the last change a job made to the run as the CT recorded it.
"""

from __future__ import annotations

import os
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import metrics_process, policy
from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoint_verdict, checkpoints
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import (
    change_record, lock, proctable, progress, releases, run_spec, rundir)
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import trainer_finding
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop.stop_options import StopOptions
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct.proctable import RUN_ID_ENV


def throughput(log_file, step_regex, patterns, lines, history=0):
    """The last progress line's step and figure, the median of the last `lines` figures, and
    with history, up to that many points [step, tok/s, time, release, run] spread over this run's log
    and the one before it (LOG.1: the run the last redeploy replaced), oldest first."""
    reader = progress.LogReader(step_regex, patterns)
    points = reader.progress_lines(progress.read_lines(log_file))
    recent = [figure for _step, figure, _line in points[-lines:]]
    report = {"step": points[-1][0] if points else None,
              "last": points[-1][1] if points else None,
              "median": progress.median(recent), "lines": len(recent)}
    if history:
        found = progress.history(reader, progress.read_lines(f"{log_file}.1") + progress.read_lines(log_file))
        picked = found if len(found) <= history else [found[i * len(found) // history] for i in range(history)]
        report["history"] = [list(point) for point in picked]
    return report


def read(params, proc_root="/proc"):
    """The state of the CT's trainer as a dict (module docstring)."""
    table = proctable.snapshot(proc_root)
    options = StopOptions({"pidfile": params["pidfile"], "pattern": params["pattern"], "select": "oldest"},
                          exclude_pids=proctable.ancestors(table, os.getpid()) if proc_root == "/proc" else ())
    main, found = trainer_finding.find_trainer(options, table, proc_root)
    state = {"running": main is not None, "pid": None, "uptime_s": None, "run_id": None,
             "cmdline": None, "found": found}
    if main is not None:
        state.update(pid=main.pid, cmdline=main.cmdline,
                     uptime_s=round(time.time() - proctable.start_wall_time(main, proc_root), 1),
                     run_id=proctable.read_environ(main.pid, proc_root).get(RUN_ID_ENV))
    else:  # why it ended, as its log says
        lines = progress.read_lines(params["log_file"])
        state.update(log_tail=lines[-progress.TAIL_LINES:], traceback=progress.traceback_in(lines) or None)
    if params.get("release_base"):
        installed = releases.status(params["release_base"])
        state["release"] = {key: installed[key] for key in ("current", "previous", "drift", "launch_failures")}
    # a running trainer's figures come from the log its progress goes to, which may not be log_file
    log = progress.running_log(main, params["log_file"], proc_root, params["step_regex"], table) \
        if main is not None else None
    log_file = log["path"] if log else params["log_file"]
    if log is not None:
        # a launcher's agent outlives its failed workers while it tears down: their traceback says
        # so, in whichever file the run writes (a traceback goes to stderr, the progress maybe not)
        failed = next((found for found in (progress.traceback_in(progress.read_lines(path))
                                           for path in progress.written_logs(log)) if found), None)
        if failed:
            state["traceback"] = failed
    state["throughput"] = throughput(log_file, params["step_regex"], params["throughput_patterns"],
                                     params["throughput_lines"], params["throughput_history"])
    state["throughput"]["log_words"] = progress.log_words(log)
    state["throughput"]["at_launch"] = (rundir.read_launch_record(params["pidfile"]) or {}).get("tokens_per_s")
    directory = checkpoints.Directory(params["checkpoint_dir"], params["checkpoint_format"],
                                      params["checkpoint_custom"])
    infos = directory.entries()
    done = directory.complete(infos)
    chosen, reason = directory.resolve()
    state["checkpoint"] = {"dir": params["checkpoint_dir"], "format": chosen.name if chosen else None,
                           "format_reason": reason,
                           "newest": os.path.join(params["checkpoint_dir"], done[-1][0]) if done else None,
                           "newest_step": done[-1][1]["step"] if done else None,
                           "newest_age_s": round(time.time() - done[-1][1]["mtime"], 1) if done else None,
                           "resume": directory.resume(infos)}
    state["checkpoint"]["resume_older"] = checkpoint_verdict.older_resume_words(state["checkpoint"]) or None
    held = lock.read(params["lock_path"]) if params.get("lock_path") else None
    state["lock"] = held if held and held.get("expires", 0) > time.time() else None
    state["last_change"] = last_change(params.get("change_record"), os.path.dirname(params["pidfile"]))
    state["lifecycle"] = run_spec.summary(params["lifecycle_dir"]) if params.get("lifecycle_dir") else None
    state["supervisor"] = policy.words(params["lifecycle_dir"]) if params.get("lifecycle_dir") else None
    state["metrics"] = metrics_process.words(params["lifecycle_dir"], int(
        (policy.read_state(params["lifecycle_dir"]) or {}).get("metrics_restarts") or 0)) \
        if params.get("lifecycle_dir") else None
    return state


def last_change(path, run_dir):
    """The CT's record of the last change to the run (module_utils/ct/change_record.py), with its
    words, or None; whether its worker still runs is read from the run directory."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import detached

    return change_record.last(path, lambda: detached.running_worker(run_dir, "launch") is not None)
