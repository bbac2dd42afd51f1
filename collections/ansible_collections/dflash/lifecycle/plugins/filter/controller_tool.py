# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A binary of the controller that the job pushes into the CTs, as the preflight's tools option takes it.

A filter rather than a stat task: it runs in the worker of the task that needs it, so a job pays no
worker, no module payload and no module run on the controller for it (about 0.4 s of CPU a job). It
reads the file once per CT where the stat task ran once per play: py-spy's 7.8 MB hash in about 11 ms."""

from __future__ import annotations

import hashlib
import os
import stat

from ansible.errors import AnsibleFilterError

CHUNK = 1 << 20


def controller_tool(src, dest, missing):
    """{path: dest, sha256, size} of the file src on the controller; missing is the error when src is
    not a regular file there."""
    try:
        info = os.stat(src)
        if not stat.S_ISREG(info.st_mode):  # checked before the open, which a FIFO would hold
            raise AnsibleFilterError(missing)
        digest = hashlib.sha256()
        with open(src, "rb") as handle:
            for chunk in iter(lambda: handle.read(CHUNK), b""):
                digest.update(chunk)
    except OSError:
        raise AnsibleFilterError(missing) from None
    return {"path": dest, "sha256": digest.hexdigest(), "size": info.st_size}


class FilterModule:
    """controller_tool."""

    def filters(self):
        return {"controller_tool": controller_tool}
