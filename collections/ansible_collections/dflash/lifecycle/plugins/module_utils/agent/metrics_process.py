# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The metrics process's life (Python 3.8 compatible, the standard library only; docs/monitoring.md):
whether it serves, and starting or replacing it. Apart from what it serves (agent/metrics.py) so
that the run's supervisor, which keeps it alive as it keeps the run, imports none of that.
"""

from __future__ import annotations

import os
import signal
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable, run_spec

PIDFILE = "metrics.pid"
LOG = "metrics.log"


def listen_of(spec):
    """The address the run's spec asks the metrics to be served on, or None."""
    return ((spec or {}).get("launch", {}).get("metrics") or {}).get("listen") or None


def agent_stamp(directory):
    """agent.zip's identity: an exporter that runs older code is replaced."""
    try:
        st = os.stat(os.path.join(directory, "agent.zip"))
    except OSError:
        return "-"
    return f"{st.st_ino}-{st.st_mtime_ns}"


def running(directory):
    """(pid, starttime, listen, agent stamp) of the exporter that serves, or None."""
    try:
        with open(os.path.join(directory, PIDFILE), encoding="utf-8") as handle:
            fields = handle.read().split()
        pid, start = int(fields[0]), int(fields[1])
    except (OSError, ValueError, IndexError):
        return None
    if len(fields) < 4 or not proctable.alive((pid, start)):
        return None
    return pid, start, fields[2], fields[3]


def ensure(directory, wait_s=3.0):
    """Make sure an exporter serves the address the run's spec names, with the code of its agent.zip:
    start one (waiting up to wait_s for it to listen), or replace one that serves another address or
    older code; end one no address is asked of. Returns what stands in the way, in words, or None.
    Never raises OSError."""
    try:
        listen = listen_of(run_spec.read(directory))
    except (OSError, ValueError, run_spec.UnsafePath) as err:
        return f"the metrics: the run's spec cannot be read: {err}"
    found = running(directory)
    if found is not None and found[2] == listen and found[3] == agent_stamp(directory):
        return None
    if found is not None:
        try:
            os.kill(found[0], signal.SIGTERM)
        except OSError:
            pass
        deadline = time.monotonic() + 5
        while proctable.alive(found[:2]) and time.monotonic() < deadline:
            time.sleep(0.05)
    if listen and os.path.exists(os.path.join(directory, "agent.zip")):
        try:
            from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import payload

            # no inherited environment: it never carries the run's id, so no stop takes it for the run's
            payload.run_detached(directory, "metrics", LOG, {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"})
        except OSError as err:
            return f"the metrics on {listen} could not be started: {err}"
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if running(directory) is not None:
                return None
            time.sleep(0.05)
        if wait_s:
            return f"the metrics on {listen} are not served: {_last_line(os.path.join(directory, LOG))}"
    return None


def _last_line(path):
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.path.getsize(path) - 4096))
            lines = handle.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        lines = []
    return lines[-1] if lines else f"no word from it in {path}"


def words(directory, restarts=0):
    """The metrics process in one line for `make status`, or None for a run that serves none."""
    try:
        listen = listen_of(run_spec.read(directory))
    except (OSError, ValueError, run_spec.UnsafePath):
        return None
    if not listen:
        return None
    again = f"; the supervisor started it again {restarts} time(s) since the launch" if restarts else ""
    found = running(directory)
    if found is None:
        return (f"NOT SERVED on {listen}: its process is gone (the run's supervisor starts it again within "
                f"seconds; a stopped run's comes back with its next launch or CT start){again}")
    return f"served on {found[2]} by PID {found[0]}{again}"
