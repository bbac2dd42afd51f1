# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a checkpoint directory holds, and what a stop wrote or lost (Python 3.8 compatible).

The preflight (is there one to resume from?), the staged stop (did it write a new, complete
one? what does a stop lose?) and the launch (free space) read it alike.

A checkpoint is an entry of the directory matching a pattern (``step_*``): a file, or a
directory of files. It counts as written only when nothing says it may be cut short:

* it holds bytes, and no temporary name (``.tmp-*``, ``*.tmp``) inside;
* the directory was not still being written when a signal that ends the trainer without a
  handler was sent (an in-place ``torch.save`` or an HF ``checkpoint-N/`` killed mid-write
  looks complete);
* no save that started after it was left unfinished (a temporary entry newer than it);
* a ``latest`` pointer, when the trainer keeps one, names it (a resume follows the pointer).
"""

from __future__ import annotations

import fnmatch
import os
import re
import time

# names of a checkpoint still being written: the trainer's own temporary names (.tmp-step_N,
# .latest.tmp-PID), torch.save's and common tools'
DEFAULT_TEMP_PATTERNS = (".tmp*", "*.tmp", "*.tmp-*", "*.partial", "*.incomplete")
LATEST_POINTER = "latest"
STEP_IN_NAME = re.compile(r"(\d+)(?!.*\d)")


def is_temp(name, temp_patterns):
    return any(fnmatch.fnmatch(name, pat) for pat in temp_patterns)


def _tree_stats(path, temp_patterns):
    """(bytes, files, newest mtime, holds a temporary name) of a directory tree."""
    size, count, newest, has_temp = 0, 0, os.stat(path).st_mtime, False
    for root, dirs, files in os.walk(path):
        has_temp = has_temp or any(is_temp(item, temp_patterns) for item in dirs + files)
        for item in files:
            try:
                st = os.stat(os.path.join(root, item))
            except OSError:
                continue
            count += 1
            size += st.st_size
            newest = max(newest, st.st_mtime)
    return size, count, newest, has_temp


def entries(directory, pattern, temp_patterns=DEFAULT_TEMP_PATTERNS):
    """{name: {mtime, size, complete}} of candidate checkpoints in directory (mtime: the
    newest change inside it)."""
    found = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return found
    for name in names:
        if name == LATEST_POINTER or is_temp(name, temp_patterns) or not fnmatch.fnmatch(name, pattern):
            continue
        path = os.path.join(directory, name)
        try:
            if os.path.isdir(path):
                size, count, mtime, has_temp = _tree_stats(path, temp_patterns)
                complete = count > 0 and size > 0 and not has_temp
            else:
                st = os.stat(path)
                size, mtime, complete = st.st_size, st.st_mtime, st.st_size > 0
        except OSError:
            continue
        found[name] = {"mtime": mtime, "size": size, "complete": complete}
    return found


def temp_entries(directory, temp_patterns=DEFAULT_TEMP_PATTERNS):
    """Temporary entries left in directory, with their size and mtime: reported, never deleted."""
    left = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return left
    for name in names:
        if not is_temp(name, temp_patterns):
            continue
        path = os.path.join(directory, name)
        try:
            size, _count, mtime, _temp = _tree_stats(path, ()) if os.path.isdir(path) else (
                os.stat(path).st_size, 1, os.stat(path).st_mtime, False)
        except OSError:
            continue
        left.append({"name": name, "bytes": size, "mtime": mtime})
    return left


def latest_pointer(directory):
    """The entry a ``latest`` pointer file names, or None when there is no such file."""
    try:
        with open(os.path.join(directory, LATEST_POINTER), encoding="utf-8") as handle:
            return os.path.basename(handle.read().strip().rstrip("/")) or None
    except (OSError, UnicodeDecodeError):
        return None


def fingerprint(directory):
    """Changes whenever anything under directory is written, created or renamed."""
    total, newest, count = 0, 0, 0
    for root, dirs, files in os.walk(directory):
        for item in dirs + files:
            try:
                st = os.lstat(os.path.join(root, item))
            except OSError:
                continue
            count += 1
            total += st.st_size
            newest = max(newest, st.st_mtime_ns)
    return (count, total, newest)


def free_bytes(path):
    """Free space where path is (or would be created), and the existing path measured."""
    probe = path
    while not os.path.exists(probe):
        probe = os.path.dirname(probe) or "/"
    st = os.statvfs(probe)
    return st.f_bavail * st.f_frsize, probe


def step_of(name):
    match = STEP_IN_NAME.search(name or "")
    return int(match.group(1)) if match else None


def last_logged_step(log_file, step_regex):
    if not log_file:
        return None
    try:
        with open(log_file, "rb") as handle:
            handle.seek(max(0, os.path.getsize(log_file) - 65536))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return None
    steps = re.findall(step_regex, text)
    return int(steps[-1]) if steps else None


class Directory:
    """The checkpoint directory of a stop, read with its options."""

    def __init__(self, options):
        self.path = options.checkpoint_dir
        self.pattern = options.checkpoint_pattern
        self.temp_patterns = options.checkpoint_temp_patterns
        self.stable_window = float(options.checkpoint_stable_window)
        self.log_file = options.log_file
        self.step_regex = options.step_regex

    def entries(self):
        return entries(self.path, self.pattern, self.temp_patterns) if self.path else {}

    def complete(self):
        """Complete entries, oldest first."""
        return sorted(((n, e) for n, e in self.entries().items() if e["complete"]),
                      key=lambda item: item[1]["mtime"])

    def fresh(self, before):
        """Complete entries new or changed since the before snapshot, oldest first."""
        return [(n, e) for n, e in self.complete()
                if n not in before or before[n]["mtime"] != e["mtime"]]

    def doubts(self, name, entry, ended_mid_write=False):
        """Why entry name may be cut short (module docstring); empty when it is sound."""
        found = []
        if ended_mid_write:
            found.append("the directory was still being written when the trainer was ended "
                         "without its handler")
        later = [t["name"] for t in temp_entries(self.path, self.temp_patterns)
                 if t["mtime"] > entry["mtime"]]
        if later:
            found.append(f"a later save was left unfinished ({', '.join(later)})")
        pointer = latest_pointer(self.path)
        if pointer is not None and pointer != name:
            found.append(f"{LATEST_POINTER} names {pointer}, not {name}: a resume would not load it")
        return found

    def report(self, before, ended_mid_write=False):
        """The newest complete checkpoint and its age, the newest one written since before
        (new) and whether it is sound (written), and the temporary files left."""
        done = self.complete()
        fresh = self.fresh(before)
        report = {"dir": self.path, "newest": None, "newest_age_s": None, "new": None,
                  "written": False, "doubts": [],
                  "temp_files_left": temp_entries(self.path, self.temp_patterns)}
        if done:
            name, entry = done[-1]
            report.update(newest=os.path.join(self.path, name),
                          newest_age_s=round(time.time() - entry["mtime"], 3))
        if fresh:
            name, entry = fresh[-1]
            report["new"] = os.path.join(self.path, name)
            report["doubts"] = self.doubts(name, entry, ended_mid_write)
            report["written"] = not report["doubts"]
        for item in report["temp_files_left"]:
            del item["mtime"]
        return report

    def periodic_interval(self):
        """Seconds between the last periodic checkpoints, or None without such a history."""
        done = self.complete()[-3:]
        gaps = [b[1]["mtime"] - a[1]["mtime"] for a, b in zip(done, done[1:])]
        return round(max(gaps), 3) if gaps else None

    def loss(self):
        """What a stop now loses: the newest complete checkpoint against the last step the
        trainer logged."""
        report = {"checkpoint": None, "checkpoint_step": None, "checkpoint_age_s": None,
                  "last_logged_step": last_logged_step(self.log_file, self.step_regex),
                  "steps_lost": None, "checkpoint_interval_s": None, "free_bytes": None}
        if not self.path:
            return report
        done = self.complete()
        report["checkpoint_interval_s"] = self.periodic_interval()
        report["free_bytes"] = free_bytes(self.path)[0]
        if done:
            name, entry = done[-1]
            report.update(checkpoint=os.path.join(self.path, name), checkpoint_step=step_of(name),
                          checkpoint_age_s=round(time.time() - entry["mtime"], 1))
        if report["checkpoint_step"] is not None and report["last_logged_step"] is not None:
            report["steps_lost"] = max(0, report["last_logged_step"] - report["checkpoint_step"])
        elif not done and report["last_logged_step"] is not None:
            report["steps_lost"] = report["last_logged_step"]  # no checkpoint at all: every step
        return report

    def settled(self, before):
        """The newest fresh checkpoint once it is sound and done: the trainer's latest pointer
        names it, or it has not changed for the stable window (a save in place that is still
        growing is not done). None until then."""
        fresh = self.fresh(before)
        if not fresh:
            return None
        name, entry = fresh[-1]
        if self.doubts(name, entry):
            return None
        if latest_pointer(self.path) == name or time.time() - entry["mtime"] >= self.stable_window:
            return name
        return None


def describe_loss(loss):
    if loss["checkpoint"] is None:
        steps = f" ({loss['steps_lost']} steps)" if loss["steps_lost"] is not None else ""
        return f"there is no complete checkpoint: a stop loses the whole run{steps}"
    text = f"newest checkpoint {loss['checkpoint']} is {loss['checkpoint_age_s']}s old"
    if loss["steps_lost"] is not None:
        text += (f" (step {loss['checkpoint_step']}, the log is at step {loss['last_logged_step']}:"
                 f" {loss['steps_lost']} steps not in a checkpoint)")
    return text


class Activity:
    """Whether a directory is being written: its fingerprint, sampled at most every
    SAMPLE_SECONDS (walking a directory a trainer writes a checkpoint into costs CPU)."""

    SAMPLE_SECONDS = 0.5

    def __init__(self, path, window):
        self.path = path
        self.window = float(window)
        self.print = fingerprint(path)
        self.sampled_at = time.monotonic()
        self.changed_at = None

    def sample(self, now, force=False):
        if not force and now - self.sampled_at < self.SAMPLE_SECONDS:
            return
        self.sampled_at = now
        current = fingerprint(self.path)
        if current != self.print:
            self.print, self.changed_at = current, now

    def recent(self, now):
        """Written within the window."""
        return self.changed_at is not None and now - self.changed_at < self.window
