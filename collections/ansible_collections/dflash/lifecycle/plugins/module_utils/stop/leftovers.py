# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a dead run left behind, found by the run's identity and ended (Python 3.8 compatible).

A trainer's main process killed by the OOM killer or a CUDA error leaves its DataLoader workers
(and a launcher's other ranks) running for a few seconds with the same command line: a worker
notices its parent's death only at its next status check (DataLoader's is every 5 s). They are
not a trainer: they carry the dead run's identity (the launch's DFLASH_RUN_ID, in the pidfile
beside the dead trainer's PID), and they belong to the run they outlived. The supervisor ends
them before its relaunch, and a stop that finds them instead of a trainer ends them too: a
crash is one end, never a refused relaunch or an ambiguous stop.
"""

from __future__ import annotations

import signal

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import rundir
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import target_set

# SIGTERM, then this long for those that exit by themselves (a worker's own cleanup), then SIGKILL
GRACE_S = 3.0
KILL_WAIT_S = 5.0


def dead_run_id(pidfile, table):
    """The run id of the pidfile's trainer when that trainer is dead, else None (a live trainer,
    no pidfile, or a pidfile without a run id: nothing says which processes were its run)."""
    try:
        entry = rundir.read_pidfile(pidfile) if pidfile else None
    except (OSError, ValueError):
        return None
    if entry is None or not entry.run_id:
        return None
    main = table.get(entry.pid)
    if main is not None and not main.gone and (entry.starttime is None or main.starttime == entry.starttime):
        return None
    return entry.run_id


def end(procs, proc_root="/proc", grace=GRACE_S):
    """SIGTERM to each, grace seconds, SIGKILL to those left, then up to KILL_WAIT_S. Returns
    {"ended": [pid, ...], "killed": [pid, ...], "survivors": [pid, ...]}."""
    targets = target_set.Targets(proc_root)
    try:
        held = [proc.identity for proc in procs if targets.add(proc, "leftover of a dead run")]
        for identity in held:
            targets.send(identity, signal.SIGTERM)
        left = targets.wait_gone(held, grace)
        for identity in left:
            targets.send(identity, signal.SIGKILL)
        survivors = targets.wait_gone(left, KILL_WAIT_S) if left else set()
    finally:
        targets.close()
    return {"ended": sorted(ident[0] for ident in held), "killed": sorted(ident[0] for ident in left),
            "survivors": sorted(ident[0] for ident in survivors)}


def words(report):
    """The report in a few words; '' when nothing was left."""
    if not report["ended"]:
        return ""
    text = (f"{len(report['ended'])} leftover(s) of the dead run ended (PID "
            f"{', '.join(map(str, report['ended']))}"
            + (f"; {len(report['killed'])} needed SIGKILL" if report["killed"] else "") + ")")
    if report["survivors"]:
        text += f"; STILL RUNNING: PID {', '.join(map(str, report['survivors']))}"
    return text
