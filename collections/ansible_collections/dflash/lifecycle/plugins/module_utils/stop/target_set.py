# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which processes a stop may touch, held by identity (Python 3.8 compatible).

The rules, each a lesson from a CT (docs/architecture.md, "Touch only the run"):

* A run launched by this project carries proctable.RUN_ID_ENV in its environment; every process it
  starts inherits it (DataLoader workers, torch.multiprocessing spawn children, a helper
  double-forked with ``setsid -f``). The run is its main process, its descendants and
  every process carrying its identity.
* A trainer started by hand (``nohup bash run.sh &``) carries none. Its run is its own tree
  and a wrapper that does nothing but run it (``bash run.sh``). Never an interactive shell,
  never the rest of its session or process group (a trainer started from a login shell or
  tmux shares them with the operator's shell, editor and tensorboard).
* A process with PPID 0 inside a CT was attached from outside (``pct exec`` runs
  ``lxc-attach``, whose process lives outside the CT's PID namespace): an operator's
  ``nvidia-smi``, a probe. It is never an orphan of the trainer.
* A GPU holder outside the run (reparented to PID 1, started after the trainer) is the run's
  leftover only when it runs the trainer's own program (a forked worker that outlived it)
  or the caller names it (leftover_pids, leftover_pattern). Every other GPU holder is
  reported, never signalled.
* Signals go to single processes through pidfds: a reused PID is never hit, and a process
  group number is never used (it is 0 under ``pct exec``, and ``kill(0)`` hits the caller).
"""

from __future__ import annotations

import os
import re
import select
import signal
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable

FALLBACK_POLL_SECONDS = 0.05
WAIT_TICK_SECONDS = 0.5  # the longest a wait sleeps between calls of its on_tick
INTERACTIVE_FLAGS = ("-i", "-l", "--login", "--interactive")


class Targets:
    """Processes to stop, each held by identity (and a pidfd where possible)."""

    def __init__(self, proc_root="/proc", use_pidfd=True):
        """use_pidfd=False measures the fallback (bench/stop_latency.py)."""
        self.proc_root = proc_root
        self.use_pidfd = use_pidfd and hasattr(os, "pidfd_open") and proc_root == "/proc"
        self.members = {}  # identity -> {"proc": Process, "role": str}
        self.pidfds = {}

    def add(self, proc, role):
        """Hold proc as a target; False when it is gone (or its PID now names another)."""
        if proc.identity in self.members:
            return True
        fd = None
        if self.use_pidfd:
            try:
                fd = os.pidfd_open(proc.pid)
            except OSError:
                return False
        # opened by PID: valid only if that PID still is the process the snapshot saw
        current = proctable.read_process(proc.pid, self.proc_root)
        if current is None or current.starttime != proc.starttime or current.gone:
            if fd is not None:
                os.close(fd)
            return False
        if fd is not None:
            self.pidfds[proc.identity] = fd
        self.members[proc.identity] = {"proc": proc, "role": role}
        return True

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

    def wait_gone(self, identities, timeout, on_tick=None):
        """Wait until none of identities runs, at most timeout seconds (a deadline the
        on_tick callback may move: called at least every WAIT_TICK_SECONDS, it returns the
        new remaining time when final). Sleeps in poll() on the pidfds of the processes
        still running; an exited one is unregistered, so its readable pidfd cannot wake
        the wait again. Falls back to short sleeps without pidfds."""
        deadline = time.monotonic() + timeout
        pending = set(identities)
        poller = select.poll() if self.pidfds else None
        registered = set()
        while True:
            pending = {i for i in pending if proctable.alive(i, self.proc_root)}
            for ident in registered - pending:
                poller.unregister(self.pidfds[ident])
                registered.discard(ident)
            now = time.monotonic()
            if not pending:
                return pending
            if on_tick is not None and now >= deadline:
                deadline = now + max(0.0, on_tick(now, final=True))
            if now >= deadline:
                return pending
            for ident in pending - registered:
                if ident in self.pidfds:
                    poller.register(self.pidfds[ident], select.POLLIN)
                    registered.add(ident)
            slice_end = min(deadline, now + WAIT_TICK_SECONDS) if on_tick is not None else deadline
            if registered == pending:
                poller.poll(max(1, int((slice_end - now) * 1000)))
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


class RunScope:
    """The rules that say which processes belong to the run of one main process."""

    def __init__(self, main, options, proc_root):
        self.main = main
        self.options = options
        self.proc_root = proc_root
        self.run_id = proctable.read_environ(main.pid, proc_root).get(proctable.RUN_ID_ENV) or None
        self.program = program_of(main, proc_root)

    def never(self, proc):
        """Processes no rule may add: the caller's own chain, init, attached from outside."""
        return (proc.pid in self.options.exclude_pids or proc.pid == 1 or proc.gone
                or (proc.ppid == 0 and proc.pid != self.main.pid))

    def carries_identity(self, proc):
        return (self.run_id is not None
                and proctable.read_environ(proc.pid, self.proc_root).get(proctable.RUN_ID_ENV) == self.run_id)

    def leftover(self, proc, table):
        """A reparented process started after the trainer that is recognisably the run's."""
        reparented = proc.ppid == 1 or proc.ppid not in table
        if not reparented or proc.starttime < self.main.starttime:
            return False
        if proc.pid in (self.options.leftover_pids or ()):
            return True
        if self.options.leftover_pattern and re.search(self.options.leftover_pattern, proc.cmdline):
            return True
        return self.program is not None and program_of(proc, self.proc_root) == self.program

    def wrapper(self, table):
        """The main process's parent when it is a non-interactive shell that runs nothing but
        the trainer (``bash run.sh``), else None."""
        parent = table.get(self.main.ppid)
        if parent is None or self.never(parent) or parent.comm not in proctable.SHELLS:
            return None
        children = [p for p in table.values() if p.ppid == parent.pid and not p.gone]
        if [p.pid for p in children] != [self.main.pid]:
            return None
        argv = proctable.read_argv(parent.pid, self.proc_root) or []
        if not argv or argv[0].startswith("-") or any(a in INTERACTIVE_FLAGS for a in argv[1:]):
            return None  # a login or interactive shell
        # a script or a -c command: without one, a shell reads its commands from a terminal
        runs_something = "-c" in argv[1:] or any(not a.startswith("-") for a in argv[1:])
        return parent if runs_something else None

    def collect(self, targets, table, device_holders):
        """Add to targets what belongs to the run in this snapshot: the descendants of every
        target still running, the identity's carriers and the leftovers holding a device."""
        for ident in targets.alive():
            for pid in proctable.descendants(table, ident[0]):
                if pid in table and not self.never(table[pid]):
                    targets.add(table[pid], "descendant")
        if self.run_id is not None:
            for proc in table.values():
                if not self.never(proc) and proc.identity not in targets.members \
                        and self.carries_identity(proc):
                    targets.add(proc, "run identity")
        for pid in device_holders:
            proc = table.get(pid)
            if proc is not None and proc.identity not in targets.members \
                    and not self.never(proc) and self.leftover(proc, table):
                targets.add(proc, "leftover")


def program_of(proc, proc_root="/proc"):
    """(executable, script): what a process runs, e.g. (/usr/bin/python3.11,
    /root/train_dflash_pipeline.py); a forked worker runs the same as its trainer."""
    argv = proctable.read_argv(proc.pid, proc_root) or []
    script = next((a for a in argv[1:] if not a.startswith("-")), None)
    exe = proctable.read_exe(proc.pid, proc_root)
    return (exe, script) if exe and script else None


def capture(main, table, options, targets, proc_root):
    """The run's target set before the first signal, and its RunScope (None when the main
    process ended before it could be held)."""
    scope = RunScope(main, options, proc_root)
    if not targets.add(main, "main"):
        return None
    if options.include_wrapper and scope.run_id is None:
        wrapper = scope.wrapper(table)
        if wrapper is not None:
            targets.add(wrapper, "wrapper")
    scope.collect(targets, table, device_holders(options, table, proc_root))
    return scope


def device_holders(options, table, proc_root):
    if not options.device_glob:
        return {}
    return proctable.device_holders(options.device_glob, table, proc_root)


def others(holders, targets, table):
    """GPU holders that are not targets: reported, never signalled."""
    report = []
    for pid, devices in sorted(holders.items()):
        proc = table.get(pid)
        if proc is None or proc.identity in targets.members or proc.gone:
            continue
        why = ("attached from outside the CT (PPID 0: a pct exec session)" if proc.ppid == 0
               else "not of this run")
        report.append({"pid": pid, "ppid": proc.ppid, "cmdline": proc.cmdline[:300],
                       "devices": devices, "why": why})
    return report
