# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The launch of the trainer inside a CT (Python 3.8 compatible).

Its own session, SIGINT and SIGTERM at their default dispositions (a background job of a
non-interactive shell would inherit SIGINT ignored, and the graceful stop would be
useless), stdin from /dev/null, output appended to a rotated log, a run identity in its
environment (module_utils/stop/target_set.py: every process of the run inherits it), and a
pidfile ``PID STARTTIME RUN_ID`` naming the Python process itself (the wrapper script
execs it), written without following symlinks.

Healthy means a real progress line (a step number and a throughput figure,
module_utils/ct/progress.py), no Python traceback in the new log, and the process still
alive health_seconds after that line. Then it waits (with a bound) until the run has
logged throughput_lines progress lines after its first throughput_warmup_lines, and
reports their median and the per-stage timings (the throughput canary's "after"); a crash
in that time is no health either. A failed attempt's log is set aside as LOG.failed and the
older logs move back, so failed attempts never rotate the last good run's log away.

One CT of a gang (gang: one torchrun job across CTs) is healthy once every rank its agent starts
runs and the gang's ranks have met. Only the CT that holds global rank 0 (RANK=0 in a worker's
environment) has the progress lines; it is healthy by them as above, and a progress line there is
a step every rank of every CT took part in. Another CT's ranks running prove nothing by
themselves - under a static rendezvous each agent starts its ranks at once, and they wait in
init_process_group for the others - so it is healthy once its ranks still run health_seconds
later and the CT whose ranks log has said its run is healthy (module_utils/launch/gang_health.py), within health_timeout and
throughput_timeout (that CT's own bounds).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid

from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoints
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable, progress
from ansible_collections.dflash.lifecycle.plugins.module_utils.launch import gang_health, launchers
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct.rundir import (
    ProgressFile, check_secure_dir, secure_dir, write_atomic)
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct.proctable import RUN_ID_ENV

HEALTH_POLL_SECONDS = 0.05  # the first progress line is seen within this; the wait is ours


class LaunchError(Exception):
    def __init__(self, msg, **details):
        super().__init__(msg)
        self.details = details


# -- refusals ----------------------------------------------------------------------------------

def free_space_short(path, min_free_gb):
    """Why path lacks min_free_gb GiB of free space, or None when it has it."""
    if not path or not min_free_gb:
        return None
    free, where = checkpoints.free_bytes(path)
    if free >= float(min_free_gb) * 1024 ** 3:
        return None
    return (f"{free / 1024 ** 3:.2f} GiB free at {where}, the run needs {min_free_gb} GiB for "
            "its checkpoints")


# -- run files ---------------------------------------------------------------------------------

def write_pidfile(path, pid, starttime, run_id):
    """'PID STARTTIME RUN_ID' in a root-only directory."""
    secure_dir(os.path.dirname(path))
    write_atomic(path, f"{pid} {starttime} {run_id}\n", 0o644)


def prepare_run(params, check_mode=False):
    """The run directory (root-only, not a symlink), the wrapper script and the secrets env
    file in it, and the directories the run writes to. Returns the paths that changed."""
    changed = []
    run_dir = params.get("run_dir")
    if run_dir:
        if check_mode:
            if os.path.lexists(run_dir):
                check_secure_dir(run_dir)
        else:
            secure_dir(run_dir)
        for name, content, mode in (("trainer.sh", params.get("wrapper_script"), 0o700),
                                    ("secrets.env", params.get("secrets_env"), 0o600)):
            path = os.path.join(run_dir, name)
            if content is None:
                continue
            if check_mode:
                changed.append(path)  # not read: a check run does not compare secrets
            elif write_atomic(path, content, mode):
                changed.append(path)
    for path in params.get("create_dirs") or []:
        if not os.path.isdir(path):
            if not check_mode:
                os.makedirs(path, mode=0o755, exist_ok=True)
            changed.append(path)
    return changed


def rotate_logs(log_file, keep):
    """train.log -> train.log.1 -> ... ; at most keep old logs."""
    if keep < 1 or not os.path.exists(log_file):
        return
    for index in range(keep - 1, 0, -1):
        older = f"{log_file}.{index}"
        if os.path.exists(older):
            os.replace(older, f"{log_file}.{index + 1}")
    os.replace(log_file, f"{log_file}.1")


def set_failed_log_aside(log_file, keep):
    """The failed attempt's log becomes LOG.failed and the older logs move back one place, so
    LOG is the last run's again. Returns where the failed log is."""
    failed = f"{log_file}.failed"
    if os.path.exists(log_file):
        os.replace(log_file, failed)
    for index in range(1, keep + 1):
        older = f"{log_file}.{index}"
        if os.path.exists(older):
            os.replace(older, log_file if index == 1 else f"{log_file}.{index - 1}")
    return failed


# -- launch ------------------------------------------------------------------------------------

def _child_setup():
    """In the child before exec: default dispositions and an empty signal mask."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGPIPE):
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def prepare_resume(params, check_mode=False):
    """What the trainer's resume will load, once an incomplete checkpoint its rule would pick is
    moved aside (incomplete_checkpoint=move_aside) - only when it resumes (resumes, or
    resume_auto); None otherwise. checkpoints.ResumeRefused when it cannot be made safe."""
    if not params.get("checkpoint_dir") or not (params.get("resumes") or params.get("resume_auto")):
        return None
    directory = checkpoints.Directory(params["checkpoint_dir"], params["checkpoint_format"],
                                      params["checkpoint_custom"])
    return directory.prepare_resume(params["incomplete_checkpoint"], check_mode)


def command(params, prepared):
    """The command to run, with the resume arguments when resume_auto finds a complete
    checkpoint the trainer's resume would load (prepared: prepare_resume's)."""
    found = bool(params.get("resume_auto") and prepared and prepared["resume"]["name"])
    return list(params["command"]) + (list(params["resume_args"]) if found else []), found


def start(params, prepared=None):
    """Start the trainer and wait until it is healthy. Returns facts about it; LaunchError
    when it is not healthy (its log set aside)."""
    log_file = params["log_file"]
    argv, resumed = command(params, prepared)
    os.makedirs(os.path.dirname(log_file), mode=0o755, exist_ok=True)
    rotate_logs(log_file, params["log_keep"])
    log_fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o640)
    run_id = uuid.uuid4().hex
    os.write(log_fd, progress.launch_line(params.get("release"), run_id).encode())
    try:
        proc = subprocess.Popen(argv, cwd=params.get("cwd") or "/",
                                env=dict(os.environ, **{RUN_ID_ENV: run_id}),
                                stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd,
                                close_fds=True, start_new_session=True, preexec_fn=_child_setup)
    except OSError as err:  # no such program, not executable, no such cwd
        raise LaunchError(f"cannot start {argv[0]}: {err}", running=False, run_id=run_id,
                          failed_log=set_failed_log_aside(log_file, params["log_keep"])) from err
    finally:
        os.close(log_fd)
    me = proctable.read_process(proc.pid)
    write_pidfile(params["pidfile"], proc.pid, me.starttime if me else 0, run_id)
    try:
        return dict(wait_healthy(proc, params), run_id=run_id, resumed=resumed)
    except LaunchError as err:
        err.details.update(run_id=run_id, failed_log=set_failed_log_aside(log_file, params["log_keep"]))
        raise


def reader_of(params):
    return progress.LogReader(params["step_regex"], params["throughput_patterns"],
                              params["profile_line_regex"], params["profile_stage_regex"])


def wait_healthy(proc, params):
    reader = reader_of(params)
    report = ProgressFile(params.get("progress_file"))
    started = time.monotonic()
    peers = gang_health.GangPeers(params["gang_health"]) if params.get("gang_health") else None
    try:
        facts = _healthy(proc, params, reader, report, started, peers)
    except LaunchError as err:
        if peers is not None and not err.details.get("peer"):
            peers.tell("failed: " + str(err).splitlines()[0])
        raise
    finally:
        report.close()
    if peers is not None:
        peers.tell("healthy")
    return facts


def _healthy(proc, params, reader, report, started, peers):
    """The facts of a healthy run: a CT of a gang whose ranks do not log is healthy by its ranks
    alone; any other by its progress lines and, once healthy, the throughput they show."""
    if params.get("gang"):
        ranks = _wait_all_ranks(proc, params, report, peers)
        if 0 not in [r["rank"] for r in ranks["ranks_env"]]:
            facts = _stay_alive(proc, params, ranks, report, started, peers)
            facts.update(launcher=ranks, throughput=None, logs_progress=False)
            return facts
    facts = _wait_first_progress(proc, params, reader, report, peers)
    if params.get("gang"):
        facts["logs_progress"] = True
    facts["launcher"] = _ranks_running(proc, params)
    facts["throughput"] = _wait_throughput(proc, params, reader, report, peers)
    return facts


def _still_running_failure(proc, what, lines):
    """The LaunchError for a run that still runs but is not healthy: what, then its log's last lines."""
    tail = lines[-progress.TAIL_LINES:]
    return LaunchError(f"{what}; last lines:\n" + "\n".join(tail), pid=proc.pid, running=True, log_tail=tail)


def _launcher_run(proc):
    """(the launcher's run the started process is, module_utils/launch/launchers.py, and the ranks its
    command line asks for, None when it does not say); (None, None) for a plain trainer, or a
    wrapper shell that has not exec'd the agent yet."""
    main = proctable.read_process(proc.pid)
    run = launchers.of(main) if main is not None else None
    return run, (run.launcher.ranks_of(proctable.read_argv(proc.pid) or []) if run else None)


def _ranks_running(proc, params):
    """A launcher's run (module_utils/launch/launchers.py) is healthy when every rank its agent's command
    line asks for runs: the agent, its workers and the deadline it would keep; None for a plain
    trainer."""
    run, asked = _launcher_run(proc)
    if run is None:
        return None
    facts = run.report()
    facts["ranks"] = asked
    if facts["ranks"] and len(run.workers) < facts["ranks"]:
        raise _still_running_failure(
            proc, f"the {run.launcher.title} agent (PID {proc.pid}) runs {len(run.workers)} of its {facts['ranks']} "
            "ranks", progress.read_lines(params["log_file"]))
    return facts


def _wait_all_ranks(proc, params, report, peers=None):
    """Until every rank the agent's command line asks for runs (the rendezvous is complete), up to
    health_timeout: the launcher's facts with each worker's global rank (ranks_env)."""
    began = time.monotonic()
    while True:
        lines = _log_while_healthy(proc, params, began, peers)
        run, asked = _launcher_run(proc)
        wanted = (asked or 1) if run else None
        if run is not None and len(run.workers) >= wanted:
            facts = run.report()
            facts["ranks_env"], facts["ranks"] = facts.pop("ranks"), wanted
            return facts
        elapsed = time.monotonic() - began
        if elapsed > float(params["health_timeout"]):
            what = (f"the {run.launcher.title} agent (PID {proc.pid}) runs {len(run.workers)} of its {wanted} ranks"
                    if run else f"PID {proc.pid} is no launcher's agent (a CT of a gang runs torchrun)")
            raise _still_running_failure(
                proc, f"{what} after {elapsed:.0f}s: the rendezvous did not complete (the gang's other CTs)", lines)
        report(phase="rendezvous", ranks=len(run.workers) if run else 0, of=wanted, elapsed=round(elapsed, 1),
               bound=params["health_timeout"])
        time.sleep(HEALTH_POLL_SECONDS)


def _stay_alive(proc, params, ranks, report, started, peers=None):
    """A CT of a gang without global rank 0 (no progress lines): healthy when its agent and every
    rank still run health_seconds after they all started, and the gang's ranks have met (the CT
    whose ranks log said healthy: gang_health.GangPeers.met) within health_timeout and throughput_timeout."""
    began = time.monotonic()
    pids = [r["pid"] for r in ranks["ranks_env"]]
    # the CT whose ranks log says healthy after its first progress line and its throughput's
    bound = float(params["health_timeout"]) + float(params["throughput_timeout"])
    if peers is not None:
        peers.tell("ranks running")
    while True:
        elapsed = time.monotonic() - began
        met = peers is None or peers.met()
        if elapsed >= float(params["health_seconds"]) and met:
            break
        lines = _log_while_healthy(proc, params, began, peers)
        gone = [pid for pid in pids if proctable.read_process(pid) is None]
        if gone:
            raise _still_running_failure(
                proc, f"rank processes {', '.join(map(str, gone))} of the agent (PID {proc.pid}) ended "
                f"{elapsed:.1f}s after the rendezvous", lines)
        if elapsed > bound:
            raise _still_running_failure(
                proc, f"the gang's ranks did not meet within {elapsed:.0f}s: its ranks run, but no CT whose ranks "
                "log said its run is healthy", lines)
        report(phase="health" if met else "gang", elapsed=round(elapsed, 1),
               bound=params["health_seconds"] if met else bound)
        time.sleep(HEALTH_POLL_SECONDS)
    return {"pid": proc.pid, "argv": proctable.read_argv(proc.pid), "healthy_after_s": round(time.monotonic() - started, 2),
            "first_progress_s": None, "progress_line": None, "step": None, "tokens_per_s": None}


def _wait_throughput(proc, params, reader, report, peers=None):
    """The window of throughput_lines progress lines after the warm-up, once they are in (or
    what is there when throughput_timeout ends: complete is false then)."""
    count, warmup = int(params["throughput_lines"]), int(params["throughput_warmup_lines"])
    began = time.monotonic()
    while True:
        lines = _log_while_healthy(proc, params, began, peers)
        window = reader.window(lines, count, warmup)
        elapsed = time.monotonic() - began
        if window["lines"] >= count or elapsed >= float(params["throughput_timeout"]):
            window["complete"] = window["lines"] >= count
            window["waited_s"] = round(elapsed, 2)
            return window
        report(phase="throughput", lines=window["lines"], of=count, tokens_per_s=window["tokens_per_s"],
               elapsed=round(elapsed, 1), bound=params["throughput_timeout"])
        time.sleep(0.2)


def _wait_first_progress(proc, params, reader, report, peers=None):
    began = time.monotonic()
    deadline = began + float(params["health_timeout"])
    settle = float(params["health_seconds"])
    seen = seen_at = None
    while True:
        lines = _log_while_healthy(proc, params, began, peers)
        if seen is None:
            points = reader.progress_lines(lines)
            if points:
                seen, seen_at = points[0], time.monotonic()
        now = time.monotonic()
        if seen is not None and now - seen_at >= settle:
            # what runs, for the caller's report: the wrapper's exec made it the trainer's own argv
            return {"pid": proc.pid, "argv": proctable.read_argv(proc.pid),
                    "healthy_after_s": round(now - began, 2),
                    "first_progress_s": round(seen_at - began, 2), "progress_line": seen[2],
                    "step": seen[0], "tokens_per_s": seen[1]}
        if now > deadline:
            raise _still_running_failure(
                proc, f"the trainer (PID {proc.pid}) was not healthy within {params['health_timeout']}s "
                "(no progress line with a step number and a throughput figure, followed by "
                f"{settle}s alive); it is still running", lines)
        report(phase="health", elapsed=round(now - began, 1), bound=params["health_timeout"],
               progress_line=seen is not None)
        time.sleep(HEALTH_POLL_SECONDS)


def _log_while_healthy(proc, params, began, peers=None):
    """The new log's lines; LaunchError when the trainer exited or printed a traceback, or another
    CT of its gang said its own launch failed (the rendezvous will not complete)."""
    code = proc.poll()  # before the read: what an exited trainer printed last is in the lines
    lines = progress.read_lines(params["log_file"])
    failure = _unhealthy(proc, code, lines, began, params)
    if failure:
        raise failure
    peer = peers.failed() if peers is not None else None
    if peer:
        raise LaunchError(f"{peer[0]} of the gang failed its launch ({peer[1]}); this CT stopped waiting after "
                          f"{time.monotonic() - began:.1f}s; last lines:\n" + "\n".join(lines[-progress.TAIL_LINES:]),
                          pid=proc.pid, running=proc.poll() is None, peer=peer[0], log_tail=lines[-progress.TAIL_LINES:])
    return lines


def _unhealthy(proc, code, lines, began, params):
    """The LaunchError for a trainer that exited or printed a traceback, else None."""
    if code is not None:
        return LaunchError(
            f"the trainer (PID {proc.pid}) exited with status {code} after "
            f"{time.monotonic() - began:.1f}s; last lines of {params['log_file']}:\n"
            + "\n".join(lines[-progress.TAIL_LINES:]),
            pid=proc.pid, exit_status=code, running=False, log_tail=lines[-progress.TAIL_LINES:])
    traceback = progress.traceback_in(lines)
    if traceback:
        try:
            code = proc.wait(timeout=1)  # most trainers exit right after: say so when they do
        except subprocess.TimeoutExpired:
            code = None
        if code is not None:
            return LaunchError(
                f"the trainer (PID {proc.pid}) printed a Python traceback and exited with status "
                f"{code} after {time.monotonic() - began:.1f}s:\n" + "\n".join(traceback[-progress.TAIL_LINES:]),
                pid=proc.pid, exit_status=code, running=False, traceback=traceback,
                log_tail=lines[-progress.TAIL_LINES:])
        return LaunchError(
            f"the trainer (PID {proc.pid}) printed a Python traceback after "
            f"{time.monotonic() - began:.1f}s; it is still running (tearing down):\n"
            + "\n".join(traceback[-progress.TAIL_LINES:]),
            pid=proc.pid, running=True, traceback=traceback, log_tail=lines[-progress.TAIL_LINES:])
    return None
