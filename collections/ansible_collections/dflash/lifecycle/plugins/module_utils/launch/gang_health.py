# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How the CTs of a gang tell each other how their launch went (Python 3.8 compatible): each writes
its state (ranks running, healthy, failed) into the gang's health directory, in the checkpoint
directory they share, and reads the others' - a CT whose ranks do not log is healthy once the CT
whose ranks log said healthy, and a CT whose own launch was healthy fails with its gang when another
CT's failed (module_utils/agent/transaction.py).
"""

from __future__ import annotations

import os
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct.rundir import write_atomic


def gang_states(spec):
    """{member: the first line of its file ('' when it wrote none)} of the gang's health directory."""
    states = {}
    for member in spec["members"]:
        try:
            with open(os.path.join(spec["dir"], member), encoding="utf-8") as handle:
                states[member] = handle.readline().strip()
        except OSError:
            states[member] = ""
    return states


def _failed_peer(states, me):
    """(member, why) of the first CT other than me whose launch failed, or None."""
    return next(((member, state[len("failed: "):]) for member, state in states.items()
                 if member != me and state.startswith("failed: ")), None)


class GangPeers:
    """The CTs of a gang tell each other how their launch goes, through one small file each in
    the checkpoint directory they share (gang_health: dir, me, members): a CT whose agent exited
    or printed a traceback writes why; the others, waiting for a rendezvous that will never
    complete, stop waiting within PEER_POLL_SECONDS instead of the whole health timeout."""

    PEER_POLL_SECONDS = 0.5

    def __init__(self, spec):
        self.spec, self.dir, self.me = spec, spec["dir"], spec["me"]
        self.read_at = 0.0
        os.makedirs(self.dir, mode=0o755, exist_ok=True)
        self.tell("starting")

    def tell(self, state):
        write_atomic(os.path.join(self.dir, self.me), f"{state}\n", mode=0o644)

    def met(self):
        """Whether another CT said its run is healthy: the first to say it is the CT whose ranks log
        (the others say it only after it), so the gang's ranks have taken a step together."""
        return any(state == "healthy" for member, state in gang_states(self.spec).items() if member != self.me)

    def failed(self):
        """(member, why) of another CT whose launch failed, or None (read every PEER_POLL_SECONDS)."""
        now = time.monotonic()
        if now - self.read_at < self.PEER_POLL_SECONDS:
            return None
        self.read_at = now
        return _failed_peer(gang_states(self.spec), self.me)


def gang_outcome(spec, timeout):
    """After this CT's own healthy launch: (member, why) of the first other CT of the gang whose
    launch failed, once every CT said healthy or failed; None when none failed, or when one says
    nothing within timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        states = gang_states(spec)
        failed = _failed_peer(states, spec["me"])
        if failed:
            return failed
        if all(state == "healthy" for state in states.values()) or time.monotonic() >= deadline:
            return None
        time.sleep(GangPeers.PEER_POLL_SECONDS)
