# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a checkpoint directory holds (Python 3.8 compatible): the preflight (is there one to
resume from?) and the staged stop (did the stop write a new, complete one?) read it alike."""

from __future__ import annotations

import fnmatch
import os

# names of a checkpoint still being written (by the trainer or by torch.save's temp files)
DEFAULT_TEMP_PATTERNS = (".tmp*", "*.tmp", "*.partial", "*.incomplete")


def is_temp(name, temp_patterns):
    return any(fnmatch.fnmatch(name, pat) for pat in temp_patterns)


def entries(directory, pattern, temp_patterns):
    """{name: {mtime, complete, size}} of candidate checkpoints in directory."""
    found = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return found
    for name in names:
        if is_temp(name, temp_patterns) or not fnmatch.fnmatch(name, pattern):
            continue
        path = os.path.join(directory, name)
        try:
            st = os.stat(path)
        except OSError:
            continue
        if os.path.isdir(path):
            size, has_temp, count = 0, False, 0
            for root, dirs, files in os.walk(path):
                for item in dirs + files:
                    has_temp = has_temp or is_temp(item, temp_patterns)
                for item in files:
                    count += 1
                    try:
                        size += os.stat(os.path.join(root, item)).st_size
                    except OSError:
                        pass
            complete = count > 0 and size > 0 and not has_temp
        else:
            size, complete = st.st_size, st.st_size > 0
        found[name] = {"mtime": st.st_mtime, "complete": complete, "size": size}
    return found


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
