# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whether the run can write where it writes, as the trainer runs (root in the CT), and what fixes
it when it cannot (Python 3.8 compatible).

In an unprivileged CT (Proxmox's default) the CT's root is an ordinary uid on the node, by the
CT's id map (``lxc.idmap``, by default ``u 0 100000 65536``). A mount point from the node keeps
the node's ownership through that map: a directory the node's root owns shows as ``nobody``
(the kernel's overflow uid) in the CT, and the CT's root cannot write it. The preflight and every
launch ask here before anything is touched, so such a directory is refused by name, with its
owner as the CT sees it and the ``chown`` or id map that fixes it, rather than found by the
trainer's checkpoint or the launch's ``Permission denied`` after the stop.
"""

from __future__ import annotations

import errno
import os
import pwd
import tempfile

OVERFLOW_UID_FILE = "/proc/sys/kernel/overflowuid"
IDENTITY_MAP = [(0, 0, 4294967295)]


def id_map(path="/proc/self/uid_map"):
    """[(inside, outside, count)] of this process's user namespace: the identity in a privileged CT."""
    try:
        with open(path, encoding="utf-8") as handle:
            return [tuple(int(field) for field in line.split()) for line in handle if line.strip()]
    except (OSError, ValueError):
        return IDENTITY_MAP


def mount_of(path, mountinfo="/proc/self/mountinfo"):
    """(mount point, read-only) of the mount that holds path (the longest mount point above it)."""
    best, read_only = "/", False
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                fields = line.split()
                point = fields[4].replace("\\040", " ")
                above = path == point or path.startswith(point.rstrip("/") + "/")
                if above and len(point) >= len(best):
                    best, read_only = point, "ro" in fields[5].split(",")
    except (OSError, IndexError):
        pass
    return best, read_only


def _existing(path):
    """The directory itself, or the nearest one above it that exists (the launch creates the rest)."""
    current = os.path.abspath(path)
    while not os.path.isdir(current) and current != "/":
        current = os.path.dirname(current)
    return current


def _writes(directory, probe):
    """Whether root in the CT can create a file in directory: by creating one (probe), else by access(2)."""
    if not probe:
        return os.access(directory, os.W_OK | os.X_OK)
    try:
        handle, name = tempfile.mkstemp(prefix=".dflash-write-probe-", dir=directory)
    except OSError as err:
        if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return False
        raise
    os.close(handle)
    os.unlink(name)
    return True


def _owner(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _overflow_uid():
    try:
        with open(OVERFLOW_UID_FILE, encoding="utf-8") as handle:
            return int(handle.read())
    except (OSError, ValueError):
        return 65534


def refusal(label, path, probe=True):
    """None when root in the CT can write path (a directory, made with its parents when missing),
    else one line naming label and path, the directory that refuses, its owner as the CT sees it,
    and the fix. probe: try a file there (outside check mode), else ask access(2)."""
    directory = _existing(path)
    try:
        if _writes(directory, probe):
            return None
    except OSError as err:
        return f"{label} {path}: cannot be written: {err}"
    st = os.stat(directory)
    mapped = id_map()
    point, read_only = mount_of(directory)
    where = f"{directory}" + (f" (in {path})" if directory != os.path.abspath(path) else "")
    owner = f"owned by {_owner(st.st_uid)} ({st.st_uid}:{st.st_gid}, mode {st.st_mode & 0o7777:o})"
    if read_only:
        fix = f"it is on {point}, mounted read-only: mount it read-write in the CT's config"
    elif st.st_uid == _overflow_uid() and mapped != IDENTITY_MAP:
        root = next((outside for inside, outside, _count in mapped if inside == 0), None)
        fix = (f"its owner is a node uid outside the CT's id map ({' '.join(str(f) for f in mapped[0])}), on the "
               f"mount point {point}: on the node, chown {root}:{root} its source (the CT's root as the node sees "
               "it), or map its owner into the CT with lxc.idmap")
    else:
        fix = f"in the CT, chown root {directory} or make it writable by its owner"
    return f"{label} {path}: not writable by root in the CT: {where} is {owner}; {fix}"


def refusals(paths, probe=True):
    """The refusal of each {label: path} that root in the CT cannot write, in label order."""
    found = (refusal(label, path, probe) for label, path in sorted(paths.items()) if path)
    return [words for words in found if words]
