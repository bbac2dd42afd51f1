# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The stop request, the stop's side (Python 3.8 compatible): stage 0 of the staged stop when
the trainer takes part (docs/stop.md, "The stop request"; the trainer's side is the one-file helper
tests/testbed/example_trainer/dflash_stop_request.py).

The launch gives the run the request's path in DFLASH_STOP_REQUEST. A trainer that honours it
says so once at start-up in its log:

    dflash-stop-request: honoured path=/run/dflash/stop-request pid=4242

The stop writes one JSON object there (a temporary file renamed into place, so no half request
is ever read): {"id", "requested_at", "deadline"}. At its next step boundary the trainer logs

    dflash-stop-request: acknowledged id=<id> step=<step>
    dflash-stop-request: saved id=<id> step=<step> checkpoint=<path>

around its save, and exits 0. No acknowledgement by the deadline: the request is withdrawn and
the signal ladder follows. The path the stop writes is the one in the running trainer's own
environment (the settings may have changed since it started), else the configured one.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable

ENVIRONMENT = "DFLASH_STOP_REQUEST"
HONOURED = re.compile(r"dflash-stop-request: honoured path=(?P<path>\S+) pid=(?P<pid>\d+)")
ACKNOWLEDGED = re.compile(r"dflash-stop-request: acknowledged id=(?P<id>\S+) step=(?P<step>\d+)")
SAVED = re.compile(r"dflash-stop-request: saved id=(?P<id>\S+) step=(?P<step>\d+) checkpoint=(?P<checkpoint>\S+)")
# where the announcement is looked for: a run's log starts with it (the launch starts a new log),
# and a log a hand-started run appends to has it in its latest part
HEAD_BYTES = 4 << 20
TAIL_BYTES = 1 << 20
POLL = 0.1


def path_of(pids, configured, proc_root="/proc"):
    """(the request path the running trainer watches, where that was read): DFLASH_STOP_REQUEST
    in the environment of the first of pids that has it, else the configured path."""
    for pid in pids:
        value = proctable.read_environ(pid, proc_root).get(ENVIRONMENT)
        if value:
            return value, f"PID {pid}'s {ENVIRONMENT}"
    return (configured, "request_path") if configured else (None, None)


def _read_span(path, start, size):
    with open(path, "rb") as handle:
        handle.seek(start)
        return handle.read(size).decode("utf-8", "replace")


def announced(log_paths, pids):
    """Whether a process of this run (pids) announced in one of its logs (log_paths: the log its
    progress goes to first, then the other files it writes; a helper may print to stdout while
    the progress goes to a log file) that it honours requests: (True/False, words, the log it
    announced in or the first one). Lines of other runs (other PIDs) do not count."""
    paths = [path for path in log_paths if path]
    if not paths:
        return (False, "no log of this run is known, so neither its announcement nor an acknowledgement can be read",
                None)
    wanted, unreadable = {str(p) for p in pids}, []
    for log_path in paths:
        try:
            size = os.path.getsize(log_path)
            text = _read_span(log_path, 0, HEAD_BYTES)
            if size > HEAD_BYTES:
                text += "\n" + _read_span(log_path, max(HEAD_BYTES, size - TAIL_BYTES), TAIL_BYTES)
        except OSError as err:
            unreadable.append(f"its log {log_path} cannot be read ({err.strerror})")
            continue
        for found in HONOURED.finditer(text):
            if found.group("pid") in wanted:
                return True, f"PID {found.group('pid')} announced in {log_path} that it honours stop requests", log_path
    words = f"no process of this run announced in {' or '.join(paths)} that it honours stop requests"
    return False, "; ".join([words] + unreadable), paths[0]


class Request:
    """One request: written, then watched for in the log from where the log stood when the stop
    began (the ranks of a gang may acknowledge another CT's request before this one is written)."""

    def __init__(self, path, log_path):
        self.path = path
        self.log_path = log_path
        self.id = uuid.uuid4().hex[:12]
        self.written_at = None
        try:
            self.offset = os.path.getsize(log_path)
        except OSError:
            self.offset = 0
        self.acknowledged = None  # {id, step} of the first acknowledgement
        self.saved = None  # {id, step, checkpoint}

    def write(self, deadline):
        """Put the request in place at once (a rename); OSError when it cannot be written."""
        self.written_at = time.time()
        body = {"id": self.id, "requested_at": self.written_at, "deadline": deadline}
        tmp = f"{self.path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, json.dumps(body).encode())
        finally:
            os.close(fd)
        os.rename(tmp, self.path)
        return body

    def poll(self):
        """Read what the trainer logged since the last poll."""
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except OSError:
            return
        complete = chunk.rfind(b"\n") + 1  # a line still being written is read next time
        self.offset += complete
        for line in chunk[:complete].decode("utf-8", "replace").splitlines():
            ack = ACKNOWLEDGED.search(line)
            if ack and self.acknowledged is None:
                self.acknowledged = {"id": ack.group("id"), "step": int(ack.group("step"))}
            saved = SAVED.search(line)
            if saved and self.saved is None:
                self.saved = {"id": saved.group("id"), "step": int(saved.group("step")),
                              "checkpoint": saved.group("checkpoint")}

    def withdraw(self):
        """Remove the request if it is still ours (a later trainer must not take it)."""
        try:
            with open(self.path, encoding="utf-8") as handle:
                ours = json.load(handle).get("id") == self.id
        except (OSError, ValueError, AttributeError):
            return
        if ours:
            try:
                os.unlink(self.path)
            except OSError:
                pass
