# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A gang's CTs judge their stop together, with no controller in the loop (Python 3.8 compatible).

In a redeploy each CT's detached worker runs its member's stop and launch as one transaction
(module_utils/agent/transaction.py). Between the two, the gang must agree: every member stopped, and
the gang's one checkpoint - the newest a member's stop saw written - complete as every member
sees it once all have stopped (where rank 0 saves alone, the other CTs' ranks leave at once and
their own stop ends before that save is complete). The members tell each other through small
files in the checkpoint directory they share, ``<dir>/.dflash-gang/<rendezvous id>/stop/``, as
the launch's health does (launch/gang_health.py's GangPeers), in two rounds: each member's stop, then what each
sees of the directory once every member has stopped. Every member reads the same files and
applies the same rules - those of the controller's barrier after a stop (checkpoint_problems,
gang_checkpoint, relaunchable; plugin_utils/gang.py uses them) - so every member decides alike:
launch, relaunch the release of before from the checkpoint every CT sees, or stay down, said.
A member that does not report within ``wait`` (its worker, its CT or its job gone) fails the
agreement; one that reports a failed stop ends the wait of the others at once.
"""

from __future__ import annotations

import json
import os
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct.rundir import write_atomic

POLL_SECONDS = 0.2
STOP_FIELDS = ("failed", "msg", "stopped", "changed", "graceful_possible")


def _ok(result):
    return isinstance(result, dict) and not result.get("failed") and not result.get("unreachable")


def _why(host, result, what):
    if result is None:
        return f"{host} did not {what} (unreachable, or it failed before)"
    return f"{host}: {' '.join(str(result.get('msg') or 'failed').split())}"


def checkpoint_problems(results, on_missing_checkpoint, after=None):
    """The gang's checkpoint: the newest that a member's stop saw written; every member must see
    it complete once every member has stopped (after: what each read then; a CT whose ranks left
    before rank 0's save was complete ended its own stop too early to tell). None written where
    a signal could save: the loss, unless on_missing_checkpoint is proceed."""
    newest = gang_checkpoint(results)
    if newest is None:
        stopped = [h for h, r in results.items() if r.get("changed")]
        possible = [h for h, r in results.items() if r.get("graceful_possible")]
        if stopped and possible and on_missing_checkpoint == "fail":
            return [f"no CT of the gang saw a new sound checkpoint after its stop ({'; '.join(_why(h, r, 'stop') for h, r in results.items())}); "
                    "trainer_stop_on_missing_checkpoint=proceed accepts the loss"]
        return []
    found = []
    for host, result in results.items():
        read = (after or {}).get(host)
        seen = ((read if _ok(read) and not read.get("skipped") else result).get("checkpoint") or {}).get("newest")
        if seen != newest:
            found.append(f"{host} does not see the gang's new checkpoint {newest} complete (its newest: {seen}): the CTs "
                         "of a gang resume from one checkpoint directory (a mount point on shared storage)")
    return found


def gang_checkpoint(results):
    """The gang's one checkpoint: the newest, by step, that a member's stop saw written (a CT whose
    ranks left at once may have seen an older save of rank 0 complete during its stop). results:
    {member: its stop result}; None when no stop saw one written."""
    stops = {h: r for h, r in results.items() if isinstance(r, dict)}  # a CT that never stopped has none
    written = [r["checkpoint"]["new"] for r in stops.values() if (r.get("checkpoint") or {}).get("written")]
    return max(written, key=lambda n: _step_of(stops, n)) if written else None


def relaunchable(stops, after):
    """After a gang's stop phase failed: whether every CT's run is gone and a complete checkpoint
    is there to relaunch the release of before from, as after a failed launch. stops: {member:
    its stop result}; after: {member: what it read once every CT had stopped}. Returns
    {relaunch, checkpoint, why}."""
    running = [h for h, r in stops.items() if not isinstance(r, dict) or not r.get("stopped")]
    seen = {((r or {}).get("checkpoint") or {}).get("newest") for r in after.values() if _ok(r) and not r.get("skipped")}
    seen.discard(None)
    if running:
        return {"relaunch": False, "checkpoint": None,
                "why": f"the run may still run on {', '.join(running)} (its stop did not end it)"}
    if len(seen) != 1:
        return {"relaunch": False, "checkpoint": None,
                "why": "no complete checkpoint every CT sees" if not seen else
                f"the CTs see different newest checkpoints ({', '.join(sorted(seen))})"}
    return {"relaunch": True, "checkpoint": seen.pop(), "why": "every CT's run is gone"}


def _step_of(results, name):
    for result in results.values():
        ckpt = result.get("checkpoint") or {}
        if ckpt.get("new") == name and ckpt.get("new_step") is not None:
            return ckpt["new_step"]
    return -1


def stop_summary(result):
    """What the other members need of a member's stop result (None: no stop ran)."""
    result = result or {}
    checkpoint = result.get("checkpoint") or {}
    return dict({key: result.get(key) for key in STOP_FIELDS},
                checkpoint={key: checkpoint.get(key) for key in ("new", "new_step", "written", "newest")})


def tell_stopped(spec, stop_result):
    """This member's stop, for the others (its failure ends their wait at once)."""
    _tell(spec, "stopped", stop_summary(stop_result))


def _tell(spec, round_name, data):
    os.makedirs(spec["dir"], mode=0o755, exist_ok=True)
    write_atomic(os.path.join(spec["dir"], f"{spec['me']}.{round_name}.json"), json.dumps(data), 0o644)


def _gather(spec, round_name):
    """{member: what it told in this round} once every member told, or a member's stop failed,
    or spec's wait ran out; and the members missing."""
    deadline = time.monotonic() + spec["wait"]
    while True:
        told = {}
        for member in spec["members"]:
            try:
                with open(os.path.join(spec["dir"], f"{member}.{round_name}.json"), encoding="utf-8") as handle:
                    told[member] = json.load(handle)
            except (OSError, ValueError):  # not there yet, or being renamed into place
                continue
        missing = [m for m in spec["members"] if m not in told]
        if not missing or any(not _ok(r) for r in told.values()) or time.monotonic() >= deadline:
            return told, missing
        time.sleep(POLL_SECONDS)


def agree(spec, stop_result, read_newest):
    """The gang's judgement of its stop, as this member (spec: dir, me, members, wait,
    on_missing_checkpoint) sees it: {stops, after, checkpoint, problems, relaunch}; problems empty:
    launch. stop_result: this member's stop; read_newest(): the newest complete checkpoint this CT
    sees in the shared directory now."""
    tell_stopped(spec, stop_result)
    stops, missing = _gather(spec, "stopped")
    results = {m: stops.get(m) for m in spec["members"]}
    problems = [_why(h, r, "stop") for h, r in results.items() if r is not None and not _ok(r)]
    problems += [f"{m} did not report its stop within {spec['wait']:.0f}s (its worker, its CT or its job is gone)"
                 for m in missing]
    after = {}
    if not problems:
        _tell(spec, "seen", {"checkpoint": {"newest": read_newest()}})
        seen, missing = _gather(spec, "seen")
        after = {m: seen.get(m) for m in spec["members"]}
        problems = [f"{m} did not say what it sees of the checkpoint directory within {spec['wait']:.0f}s"
                    for m in missing] or checkpoint_problems(results, spec["on_missing_checkpoint"], after)
    return {"stops": results, "after": after, "checkpoint": gang_checkpoint(results), "problems": problems,
            "relaunch": relaunchable(results, after) if problems else None}
