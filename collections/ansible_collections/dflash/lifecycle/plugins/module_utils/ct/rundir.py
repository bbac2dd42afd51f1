# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Files in root-only run directories (/run/dflash): the lock, the pidfile, the wrapper, the
secrets and the detached stop's records (Python 3.8 compatible).

A directory is used only when it is a real directory of ours that nobody else can write to;
a file is read and written with O_NOFOLLOW and lands by rename, so a symlink planted in its
place is refused or replaced, never followed. Kept apart from launch.py so that the lock,
which every CT-side module of a redeploy takes, imports nothing else.
"""

from __future__ import annotations

import collections
import fcntl
import json
import os
import stat
import time


class UnsafePath(Exception):
    """A run directory that is a symlink, not ours, or writable by others."""


def check_secure_dir(path):
    """path must be a real directory owned by us, not writable by group or others."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePath(f"{path} must be a real directory owned by uid {os.geteuid()}, not a "
                         f"symlink (to {os.readlink(path)})")
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise UnsafePath(f"{path} must be a directory owned by uid {os.geteuid()} and not "
                         f"writable by group or others (found mode {stat.S_IMODE(st.st_mode):o}, "
                         f"uid {st.st_uid})")


def secure_dir(path):
    """A root-owned, non-group/world-writable real directory (created 0700 when missing)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    check_secure_dir(path)


def guarded(path, action):
    """action() under an exclusive flock of <path>.guard, in path's directory (secured first):
    what a read, change and rename of path does there is never interleaved with another's."""
    secure_dir(os.path.dirname(path))
    fd = os.open(f"{path}.guard", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return action()
    finally:
        os.close(fd)


def write_atomic(path, text, mode=0o600):
    """Replace path with text: a new file opened O_EXCL|O_NOFOLLOW (a planted symlink is
    refused, not followed), then renamed over path. Returns whether the content changed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as handle:
            unchanged = handle.read() == text.encode() and stat.S_IMODE(os.fstat(fd).st_mode) == mode
    except OSError:  # missing, or a symlink (ELOOP): replaced below
        unchanged = False
    if unchanged:
        return False
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        os.fchmod(handle.fileno(), mode)  # whatever the umask
    os.rename(tmp, path)
    return True


LAUNCH_RECORD = "launch.json"

Pidfile = collections.namedtuple("Pidfile", "pid starttime mtime run_id")


def read_pidfile(path):
    """The Pidfile at path (``PID STARTTIME [RUN_ID]``, the launch's), or None when there is none;
    ValueError when it does not start with a PID."""
    try:
        with open(path) as handle:
            fields = handle.read().split()
        mtime = os.stat(path).st_mtime
    except FileNotFoundError:
        return None
    if not fields or not fields[0].isdigit():
        raise ValueError(f"{path} does not start with a PID")
    starttime = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return Pidfile(int(fields[0]), starttime, mtime, fields[2] if len(fields) > 2 else None)


class ProgressFile:
    """A long wait's progress, written about once a second (by rename, in a root-only
    directory) for the controller to show while the module runs; removed when it ends."""

    EVERY_SECONDS = 1.0

    def __init__(self, path, extra=None):
        self.path = path
        self.extra = extra or (lambda: {})
        self.written_at = None

    def __call__(self, **fields):
        now = time.monotonic()
        if not self.path or (self.written_at is not None and now - self.written_at < self.EVERY_SECONDS):
            return
        self.written_at = now
        fields.update(self.extra())
        try:
            write_atomic(self.path, json.dumps(fields), 0o600)
        except OSError:
            self.path = None  # showing progress must never break the wait it reports on

    def close(self):
        if self.path and os.path.lexists(self.path):
            os.unlink(self.path)


def write_launch_record(pidfile, facts):
    """What a healthy launch saw (its figures, its release), beside the pidfile: status reads it."""
    write_atomic(os.path.join(os.path.dirname(pidfile), LAUNCH_RECORD), json.dumps(facts), 0o644)


def read_launch_record(pidfile):
    try:
        return read_json(os.path.join(os.path.dirname(pidfile), LAUNCH_RECORD))
    except (OSError, ValueError):
        return None


def read_json(path):
    """The JSON in path, None when it is missing; a symlink is refused (ELOOP), not followed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    with os.fdopen(fd) as handle:
        return json.load(handle)


def read_mapping(path):
    """The JSON mapping in path, or None when it is missing, unreadable, not JSON or not a mapping:
    a record the CT keeps, which a reader takes as absent rather than fail on."""
    try:
        found = read_json(path)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None
