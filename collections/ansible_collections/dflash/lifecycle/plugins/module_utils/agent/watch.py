# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The run's beats, watched by its supervisor: its progress lines (in the log its trainer writes) and
the stop request helper's heartbeat file, the intervals between them (what the hang timeout is
learned from), its launcher's word on a rank a signal ended, and what the run's checkpoint directory
holds now (Python 3.8 compatible).
"""

from __future__ import annotations

import os
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.agent.supervision import LOG_MAX_BYTES
from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoints
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable
from ansible_collections.dflash.lifecycle.plugins.module_utils.launch import launchers


GAPS_KEPT = 64  # the intervals the hang timeout is learned from: the newest ones
# the end of a log read for a crash's traceback or its launcher's word on a rank
TAIL_BYTES = 65536


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
        self.launcher_log, self.launcher_log_start = self._launcher_log()
        self.find_log()

    def _heartbeat_path(self):
        from ansible_collections.dflash.lifecycle.plugins.module_utils.ct.proctable import read_environ

        env = read_environ(self.main_pid) or {}
        path = env.get("DFLASH_STOP_REQUEST")
        return f"{path}.alive" if path else None

    def _launcher_log(self):
        """Where the run's launcher writes its words (its agent's stderr when that is a file, else the
        launch's log_file), and its length now: what an earlier run wrote there, whose agent may have
        had this PID (a PID the CT reused), is never read as this run's."""
        path, _why = proctable.read_fd(self.main_pid, 2)
        if not (path and os.path.isfile(path)):
            path = self.launch["log_file"]
        try:
            return path, os.path.getsize(path)
        except OSError:
            return path, 0

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

    def own_rank_killed(self):
        """Words naming a rank of this run that a signal ended, as the run's launcher logged it since
        the watch began, or None."""
        return launchers.worker_signalled(
            self.progress.read_lines(self.launcher_log, self.launcher_log_start, max_bytes=TAIL_BYTES), self.main_pid)

    def log_tail(self):
        return self.progress.read_lines(self.log or self.launch["log_file"], max_bytes=TAIL_BYTES)


def newest_checkpoint_entry(launch):
    """(path, step) of the newest complete checkpoint of the run by its layout (the launch's own
    rule), or None; a directory that cannot be read names none rather than ending the supervisor."""
    if not launch.get("checkpoint_dir"):
        return None
    try:
        return checkpoints.newest_complete_entry(launch)
    except (OSError, ValueError):
        return None


def newest_checkpoint(launch):
    """The path of the run's newest complete checkpoint, or None."""
    entry = newest_checkpoint_entry(launch)
    return entry[0] if entry else None


def save_under_way(launch):
    from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoints

    if not launch.get("checkpoint_dir"):
        return []
    try:
        return checkpoints.Directory(launch["checkpoint_dir"], launch["checkpoint_format"],
                                     launch.get("checkpoint_custom")).save_in_progress()
    except (OSError, ValueError):
        return []
