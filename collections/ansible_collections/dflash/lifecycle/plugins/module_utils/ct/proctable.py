# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading processes from /proc: identity, tree, signal dispositions, open devices.

Pure functions over a ``proc_root`` (``/proc`` by default, a fake tree in unit
tests).  Runs on the target, so it keeps to Python 3.8.
"""

from __future__ import annotations

import fnmatch
import os

SHELLS = ("sh", "bash", "dash", "zsh", "ksh")
# the variable the launch marks a run with: every process the run starts inherits it
RUN_ID_ENV = "DFLASH_RUN_ID"


class Process:
    """One process as /proc showed it at one moment."""

    __slots__ = ("pid", "comm", "state", "ppid", "pgid", "sid", "starttime", "cmdline",
                 "sig_ign", "sig_cgt", "threads")

    def __init__(self, pid, comm, state, ppid, pgid, sid, starttime, cmdline="",
                 sig_ign=0, sig_cgt=0, threads=1):
        self.pid = pid
        self.comm = comm
        self.state = state
        self.ppid = ppid
        self.pgid = pgid
        self.sid = sid
        self.starttime = starttime
        self.cmdline = cmdline
        self.sig_ign = sig_ign
        self.sig_cgt = sig_cgt
        self.threads = threads

    @property
    def identity(self):
        """(pid, starttime): a PID that was reused has another starttime."""
        return (self.pid, self.starttime)

    @property
    def gone(self):
        """Exited: a zombie has finished running, only its parent's wait is missing."""
        return self.state in ("Z", "X")

    def disposition(self, signum):
        bit = 1 << (signum - 1)
        if self.sig_ign & bit:
            return "ignored"
        if self.sig_cgt & bit:
            return "caught"
        return "default"

    def as_dict(self):
        return {"pid": self.pid, "ppid": self.ppid, "pgid": self.pgid, "sid": self.sid,
                "state": self.state, "comm": self.comm, "cmdline": self.cmdline}


def parse_stat(text):
    """Fields of /proc/PID/stat. comm may hold spaces and parentheses: it ends at the
    last ')' of the line."""
    open_paren = text.index("(")
    close_paren = text.rindex(")")
    pid = int(text[:open_paren].strip())
    comm = text[open_paren + 1:close_paren]
    rest = text[close_paren + 2:].split()
    # rest[0] is field 3 (state); starttime is field 22
    return {"pid": pid, "comm": comm, "state": rest[0], "ppid": int(rest[1]),
            "pgid": int(rest[2]), "sid": int(rest[3]), "threads": int(rest[17]),
            "starttime": int(rest[19])}


def parse_status_masks(text):
    masks = {"SigIgn": 0, "SigCgt": 0}
    for line in text.splitlines():
        key, _sep, value = line.partition(":")
        if key in masks:
            masks[key] = int(value.strip(), 16)
    return masks["SigIgn"], masks["SigCgt"]


def _read(path, mode="r"):
    with open(path, mode) as handle:
        return handle.read()


def read_argv(pid, proc_root="/proc"):
    """The argv the process runs with (its NUL-separated cmdline; empty arguments kept), or None
    when it no longer exists."""
    try:
        raw = _read(os.path.join(proc_root, str(pid), "cmdline"), "rb")
    except OSError:
        return None
    if not raw:
        return []
    return [arg.decode("utf-8", "replace") for arg in (raw[:-1] if raw.endswith(b"\0") else raw).split(b"\0")]


def read_process(pid, proc_root="/proc"):
    """The process, or None when it no longer exists."""
    base = os.path.join(proc_root, str(pid))
    try:
        stat = parse_stat(_read(os.path.join(base, "stat")))
        cmdline = _read(os.path.join(base, "cmdline"), "rb")
        sig_ign, sig_cgt = parse_status_masks(_read(os.path.join(base, "status")))
    except (OSError, ValueError, IndexError):
        return None
    args = cmdline.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")
    return Process(stat["pid"], stat["comm"], stat["state"], stat["ppid"], stat["pgid"],
                   stat["sid"], stat["starttime"], args, sig_ign, sig_cgt, stat["threads"])


def snapshot(proc_root="/proc"):
    """Every process visible in proc_root, by PID."""
    table = {}
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return table
    for entry in entries:
        if entry.isdigit():
            proc = read_process(int(entry), proc_root)
            if proc is not None:
                table[proc.pid] = proc
    return table


def children_map(table):
    kids = {}
    for proc in table.values():
        kids.setdefault(proc.ppid, []).append(proc.pid)
    return kids


def descendants(table, pid):
    """PIDs below pid in the tree (by PPid; PGID and SID play no part)."""
    kids = children_map(table)
    found, frontier = [], [pid]
    while frontier:
        for child in sorted(kids.get(frontier.pop(), [])):
            if child not in found and child != pid:
                found.append(child)
                frontier.append(child)
    return found


def ancestors(table, pid):
    """pid and the PIDs above it, up to the namespace's top."""
    chain, current = [], pid
    while current in table and current not in chain:
        chain.append(current)
        current = table[current].ppid
    return chain


def alive(identity, proc_root="/proc"):
    """True while the process with this (pid, starttime) still runs (not a zombie)."""
    proc = read_process(identity[0], proc_root)
    return proc is not None and proc.starttime == identity[1] and not proc.gone


def device_holders(device_glob, table, proc_root="/proc"):
    """{pid: [device, ...]}: the processes with an open file descriptor on a path matching
    device_glob, and which ones they hold."""
    holders = {}
    for pid in table:
        fd_dir = os.path.join(proc_root, str(pid), "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if fnmatch.fnmatch(target, device_glob) and target not in holders.get(pid, []):
                holders.setdefault(pid, []).append(target)
    return {pid: sorted(devices) for pid, devices in holders.items()}


def read_environ(pid, proc_root="/proc"):
    """The environment the process was started with (/proc/PID/environ); {} when it is gone
    or unreadable. Children inherit it through fork and exec, so a variable set at a launch
    marks every process of that launch."""
    try:
        raw = _read(os.path.join(proc_root, str(pid), "environ"), "rb")
    except OSError:
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {key.decode("utf-8", "replace"): value.decode("utf-8", "replace")
            for key, _sep, value in pairs}


def run_processes(main, table, proc_root="/proc"):
    """The processes of main's run as a snapshot (table) shows them, main first, for reading what
    they write (the stop's target set, module_utils/stop/target_set.py, decides what is signalled): its
    descendants and, for a run this project launched, every process carrying its RUN_ID_ENV."""
    found = [main] + [table[pid] for pid in descendants(table, main.pid) if pid in table]
    return found + carrying(read_environ(main.pid, proc_root).get(RUN_ID_ENV), table,
                            {proc.pid for proc in found}, proc_root)


def carrying(run_id, table, excluded=(), proc_root="/proc"):
    """The processes of a snapshot (table) still running that carry run_id in their RUN_ID_ENV, by
    PID, those in excluded left out; [] for no run_id."""
    if not run_id:
        return []
    return [proc for pid, proc in sorted(table.items()) if pid not in excluded and not proc.gone
            and read_environ(pid, proc_root).get(RUN_ID_ENV) == run_id]


def read_cwd(pid, proc_root="/proc"):
    """The working directory of the process (/proc/PID/cwd), or None."""
    try:
        return os.readlink(os.path.join(proc_root, str(pid), "cwd"))
    except OSError:
        return None


def read_fd(pid, fd, proc_root="/proc"):
    """(what file descriptor fd of the process names, None) or (None, why it cannot be read)."""
    try:
        return os.readlink(os.path.join(proc_root, str(pid), "fd", str(fd))), None
    except OSError as err:
        return None, err.strerror or str(err)


# a file descriptor's access mode (O_ACCMODE of the octal flags in /proc/PID/fdinfo/FD): written
# when opened O_WRONLY (1) or O_RDWR (2)
ACCESS_MODE_MASK = 0o3
WRITE_MODES = (1, 2)


def _opened_for_writing(pid, fd, proc_root):
    """Whether fd of the process was opened for writing, by its flags; None when fdinfo cannot be
    read."""
    try:
        text = _read(os.path.join(proc_root, str(pid), "fdinfo", str(fd)))
    except OSError:
        return None
    for line in text.splitlines():
        key, _sep, value = line.partition(":")
        if key == "flags":
            return (int(value.strip(), 8) & ACCESS_MODE_MASK) in WRITE_MODES
    return None


def written_files(pid, proc_root="/proc"):
    """([(fd, path)] of the regular files the process holds open for writing, in fd order; None when
    its fds cannot be read, why). A stdout or stderr whose flags cannot be read counts as written:
    those are the streams a process writes."""
    fd_dir = os.path.join(proc_root, str(pid), "fd")
    try:
        fds = sorted(int(fd) for fd in os.listdir(fd_dir) if fd.isdigit())
    except OSError as err:
        return None, err.strerror or str(err)
    found = []
    for fd in fds:
        target, _error = read_fd(pid, fd, proc_root)
        if not target or not target.startswith("/") or target.endswith(" (deleted)") or not os.path.isfile(target):
            continue
        writing = _opened_for_writing(pid, fd, proc_root)
        if writing or (writing is None and fd in (1, 2)):
            found.append((fd, target))
    return found, None


def read_exe(pid, proc_root="/proc"):
    """The executable the process runs (/proc/PID/exe), or None."""
    try:
        return os.readlink(os.path.join(proc_root, str(pid), "exe"))
    except OSError:
        return None


def threads_report(pid, proc_root="/proc"):
    """Per-thread state and wchan: where each thread of pid sleeps."""
    report = []
    task_dir = os.path.join(proc_root, str(pid), "task")
    try:
        tids = sorted(int(t) for t in os.listdir(task_dir) if t.isdigit())
    except OSError:
        return report
    for tid in tids:
        try:
            stat = parse_stat(_read(os.path.join(task_dir, str(tid), "stat")))
        except (OSError, ValueError, IndexError):
            continue
        try:
            wchan = _read(os.path.join(task_dir, str(tid), "wchan")).strip() or "0"
        except OSError:
            wchan = "?"
        report.append({"tid": tid, "comm": stat["comm"], "state": stat["state"],
                       "wchan": wchan})
    return report


def boot_time(proc_root="/proc"):
    for line in _read(os.path.join(proc_root, "stat")).splitlines():
        if line.startswith("btime "):
            return int(line.split()[1])
    raise ValueError("no btime in /proc/stat")


def start_wall_time(proc, proc_root="/proc"):
    """When the process started, in seconds since the epoch."""
    return boot_time(proc_root) + proc.starttime / os.sysconf("SC_CLK_TCK")
