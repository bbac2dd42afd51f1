# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The launch of the trainer inside a CT (Python 3.8 compatible).

The launch follows DESIGN.md "Launch contract": its own session, SIGINT and SIGTERM at
their default dispositions (a background job of a non-interactive shell would inherit
SIGINT ignored, and the graceful stop would be useless), stdin from /dev/null, output
appended to a rotated log, and a pidfile naming the Python process itself (the wrapper
script execs it), written without following symlinks.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils import proctable, staged_stop
from ansible_collections.dflash.lifecycle.plugins.module_utils.rundir import check_secure_dir, secure_dir, write_atomic

TAIL_LINES = 20
HEALTH_POLL_SECONDS = 0.05  # the first progress line is seen within this; the wait is ours


class LaunchError(Exception):
    def __init__(self, msg, **details):
        super().__init__(msg)
        self.details = details


# -- running trainer / busy GPUs -----------------------------------------------------------

def running_trainer(pidfile, pattern, proc_root="/proc"):
    """The trainer already running (by pidfile or pattern), or None."""
    table = proctable.snapshot(proc_root)
    excluded = set(proctable.ancestors(table, os.getpid()))
    main, _found = staged_stop.find_trainer({"pidfile": pidfile, "pattern": pattern,
                                             "select": "oldest"}, table, excluded, proc_root)
    return main


def gpu_holders(device_paths, proc_root="/proc"):
    table = proctable.snapshot(proc_root)
    busy = {}
    for path in device_paths:
        for pid in proctable.holders_of(path, table, proc_root):
            busy.setdefault(path, []).append({"pid": pid, "cmdline": table[pid].cmdline[:200]})
    return busy


# -- run files ---------------------------------------------------------------------------------

def write_pidfile(path, pid, starttime):
    """'PID STARTTIME' in a root-only directory."""
    secure_dir(os.path.dirname(path))
    write_atomic(path, f"{pid} {starttime}\n", 0o644)


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


def log_tail(log_file, offset=0, lines=TAIL_LINES):
    try:
        with open(log_file, "rb") as handle:
            handle.seek(offset)
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]


# -- launch ------------------------------------------------------------------------------------

def _child_setup():
    """In the child before exec: default dispositions and an empty signal mask."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGPIPE):
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def start(params):
    """Start the trainer and wait until it is healthy. Returns facts about it."""
    log_file = params["log_file"]
    os.makedirs(os.path.dirname(log_file), mode=0o755, exist_ok=True)
    rotate_logs(log_file, params.get("log_keep", 5))
    log_fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o640)
    offset = os.fstat(log_fd).st_size
    try:
        proc = subprocess.Popen(params["command"], cwd=params.get("cwd") or "/",
                                stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd,
                                close_fds=True, start_new_session=True, preexec_fn=_child_setup)
    finally:
        os.close(log_fd)
    me = proctable.read_process(proc.pid)
    write_pidfile(params["pidfile"], proc.pid, me.starttime if me else 0)
    return wait_healthy(proc, params, offset)


def wait_healthy(proc, params, offset):
    regex = re.compile(params.get("health_regex") or r"tok/s")
    began = time.monotonic()
    deadline = began + float(params.get("health_timeout", 300))
    min_alive = float(params.get("health_seconds") or 0)
    seen = None
    while True:
        code = proc.poll()
        if code is not None:
            raise LaunchError(
                f"the trainer (PID {proc.pid}) exited with status {code} after "
                f"{time.monotonic() - began:.1f}s; last lines of {params['log_file']}:\n"
                + "\n".join(log_tail(params["log_file"], offset)),
                pid=proc.pid, exit_status=code,
                log_tail=log_tail(params["log_file"], offset))
        if seen is None:
            for line in log_tail(params["log_file"], offset, lines=200):
                if regex.search(line):
                    seen, seen_after = line, time.monotonic() - began
                    break
        alive_for = time.monotonic() - began
        if seen is not None and alive_for >= min_alive:
            figure = re.search(r"tok/s\s+([0-9.]+)", seen)
            # what runs, for the caller's report: the wrapper's exec made it the trainer's own argv
            return {"pid": proc.pid, "argv": proctable.read_argv(proc.pid),
                    "healthy_after_s": round(alive_for, 2),
                    "first_progress_s": round(seen_after, 2), "progress_line": seen,
                    "tokens_per_s": float(figure.group(1)) if figure else None}
        if time.monotonic() > deadline:
            raise LaunchError(
                f"the trainer (PID {proc.pid}) printed no line matching {regex.pattern!r} in "
                f"{params.get('health_timeout', 300)}s; it is left running. Last lines:\n"
                + "\n".join(log_tail(params["log_file"], offset)),
                pid=proc.pid, log_tail=log_tail(params["log_file"], offset))
        time.sleep(HEALTH_POLL_SECONDS)
