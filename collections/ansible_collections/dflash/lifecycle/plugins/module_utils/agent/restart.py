# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The supervisor's restart and its back-off (Python 3.8 compatible): after the run's end - a crash,
a hang (its diagnostics kept, its stop a hang's), a gang member's end - the back-off that doubles
from backoff_s, then the relaunch (transaction.py: the redeploy's launch, resuming from the newest
checkpoint) by this process, so the new trainer is its child, and a fresh supervisor by an exec; a
crash loop, a stop that failed or a gang that did not go down leave the run down, said.
"""

from __future__ import annotations

import os
import sys
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import hang, policy, rounds, supervision
from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import watch as watch_mod
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import change_record, proctable, run_spec


def hung(sup, watch, cause, pid, since, silence):
    path = None
    try:
        path = hang.diagnostics(sup.directory, sup.launch, sup.spec["stop"], pid)
        sup.say(f"{cause}; diagnostics kept in {path}")
    except (OSError, ValueError) as err:
        sup.say(f"{cause}; its diagnostics could not be kept: {err}")
    supervision.post_event(sup.policy, {"event": "hang", "ct": sup.me, "cause": cause, "diagnostics": path})
    if sup.policy["restart"] == "never":
        sup.remember(dict(silence, cause=cause, at=time.time(), kind="hang", diagnostics=path))
        sup.save(state="hung, left running (restart: never)")
        while supervision.reap(pid) is None and run_spec.stood_down(sup.directory, since) is None:
            time.sleep(supervision.POLL_SECONDS)
        return 0
    return stop_and_restart(sup, watch, cause, since, diagnostics_path=path, kind="hang", facts=silence)


def stop_and_restart(sup, watch, cause, since, diagnostics_path=None, kind="peer", facts=None):
    """The run stopped as a hang (a hung member, or a member whose gang went down: its ranks wait in
    collectives that will not return), by the run's own stop options with the grace of its cadence
    and no checkpoint required, then restarted from the newest complete checkpoint."""
    sup.save(state=f"stopping ({kind})")
    result = stop(sup, hang.hang_grace(watch.gaps), cause=kind)
    deliberate = supervision.deliberate(sup, since)
    if deliberate:
        sup.save(state="stood down", why=deliberate)
        return 0
    stopped = f"stopped: {(result.get('msg') or '').split('; ')[0]}; {hang.loss_words(result)}" \
        if not result.get("failed") else f"ITS STOP FAILED: {result.get('msg')}"
    sup.say(f"{cause}; {stopped}")
    end = {"cause": cause, "at": time.time(), "kind": kind, "stop": stopped, "step": watch.last_step,
           "steps_lost": (result.get("loss") or {}).get("steps_lost"),
           "checkpoint": watch_mod.newest_checkpoint(sup.launch), "diagnostics": diagnostics_path, **(facts or {})}
    if result.get("failed"):
        sup.remember(end)
        return down(sup, f"{cause}, and its stop failed: {result.get('msg')}")
    return restart(sup, end)


def stop(sup, grace=None, cause="crash"):
    """The staged stop of a `make stop`, under the CT's lock, not marking the run stopped; with
    grace (a hang's), every stage but the last and the stop request's acknowledgement wait at most
    grace, and a stop with no new checkpoint, or no graceful stage, goes on: the run resumes from its
    newest complete checkpoint. cause: what the CT's history counts it under (a hang, a gang
    member's end; a relaunch that failed and still runs: a crash)."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import staged_stop, stop_options

    try:
        options = stop_options.checked(sup.spec["stop"], "the run's stop options")
    except stop_options.InvalidParameter as err:
        return {"failed": True, "msg": str(err)}
    options.lifecycle_dir, options.detach, options.signal_at = None, False, None
    if grace is not None:
        hang.as_hang(options, grace)
    lease = supervision.take_lock(sup)
    if isinstance(lease, str):
        return {"failed": True, "msg": f"not stopped: {lease} holds the CT"}
    try:
        return staged_stop.run_in_module(options, lease=lease, record_dir=sup.directory, cause=cause)
    finally:
        supervision.give_lock(sup)


def down(sup, words):
    """The run stays down: said in the state, the CT's change record and the webhook."""
    sup.say(f"THE RUN STAYS DOWN: {words}")
    sup.save(state="DOWN", why=words)
    record = sup.launch.get("change_record") or change_record.DEFAULT_PATH
    try:
        change_record.begin(record, supervision.HOLDER, "restart after the run ended", os.getpid())
        change_record.end(record, True, f"THE RUN STAYS DOWN: {words}")
    except OSError:
        pass
    supervision.post_event(sup.policy, {"event": "down", "ct": sup.me, "why": words})
    return 1


def ask_again(sup, since):
    """Why the supervisor no longer restarts: a stop asked for since, or a trainer someone else
    started; None to go on. A trainer this supervisor started is its child until reaped, and one
    that ended may take a while to exit (a launcher's agent past its ranks, its command line gone
    already): the pidfile naming it is no one else's trainer."""
    deliberate = supervision.deliberate(sup, since)
    if deliberate:
        return deliberate
    entry = supervision.read_pidfile(sup.launch["pidfile"])
    if entry is not None and proctable.alive((entry.pid, entry.starttime)) and supervision.not_our_child(entry.pid):
        return f"a trainer runs again (PID {entry.pid}), started by someone else"
    return None


def restart(sup, end):
    """After the run's end (end: its facts): the back-off, then the relaunch; a crash loop, a
    gang member that never went down or restart never leave it down."""
    since = time.time()
    sup.remember(end)
    supervision.post_event(sup.policy, {"event": end["kind"], "ct": sup.me, "cause": end["cause"],
                                        "checkpoint": end.get("checkpoint"), "steps_lost": end.get("steps_lost"),
                                        "leftovers": end.get("leftovers")})
    if sup.policy["restart"] == "never":
        return down(sup, f"{end['cause']} (restart: never)")
    missing = rounds.gone_down(sup, end)
    if missing:
        return down(sup, f"{end['cause']}; {missing}")
    cause = end["kind"]  # what the restarts of this end are counted under, a failed relaunch's retries too
    while True:
        now = time.time()
        count, first = rounds.restarts_in_window(sup, now)
        if count > int(sup.policy["crash_loop_restarts"]):
            causes = "; ".join(e["cause"] for e in (sup.state.get("ends") or [])[-count:])
            supervision.post_event(sup.policy, {"event": "crash-loop", "ct": sup.me, "restarts": count - 1})
            return down(sup, f"crash loop: {count - 1} restarts within {sup.policy['crash_loop_window_s']:.0f} s, "
                             f"and it ended again: {causes}")
        wait = policy.backoff(sup.policy, count)
        due = first + wait
        sup.save(state=f"backing off {wait:.0f} s (restart {count} within the window)", restart_due=due,
                 backoff_s=wait)
        sup.say(f"{end['cause']}; restart {count} in {max(0.0, due - now):.1f} s")
        while time.time() < due:
            why = ask_again(sup, since)
            if why:
                sup.save(state="stood down", why=why)
                return 0
            supervision.reap()
            time.sleep(min(supervision.POLL_SECONDS, max(0.0, due - time.time())))
        outcome = relaunch(sup, since, cause)
        if outcome is None:
            return 0  # stood down, or exec'd into the new run's supervisor
        end = dict(outcome, at=time.time())
        sup.remember(end)
        sup.round += 1
        missing = rounds.gone_down(sup, end)
        if missing:
            return down(sup, f"{end['cause']}; {missing}")


def relaunch(sup, since, cause):
    """The run launched again (transaction.py: the redeploy's launch, resuming from the newest
    checkpoint), by this process, so the new trainer is its child; then a fresh supervisor (an
    exec). cause: the kind of end it restarts after, for the metrics' count. Returns the facts of a
    relaunch that failed, or None once it stood down."""
    # only a relaunch compiles the launch: a supervisor that watches holds none of it
    from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import transaction
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import detached

    lease = supervision.take_lock(sup)
    if isinstance(lease, str):
        sup.say(f"not relaunched yet: {lease} holds the CT")
        return {"cause": f"relaunch refused: {lease} holds the CT", "kind": "relaunch"}
    try:
        why = ask_again(sup, since)
        if why:
            sup.save(state="stood down", why=why)
            return None
        sup.save(state=f"relaunching (round {sup.round + 1})")
        health = os.path.join(rounds.round_dir(sup, sup.round + 1), "health") if len(sup.members) > 1 else None
        params = run_spec.relaunch_params(sup.spec, health)
        params["lifecycle"].update(dir=sup.directory, rounds_dir=sup.rounds_dir, round=sup.round + 1)
        keeper = detached.start_keeper(lease, proctable.read_process(os.getpid()))
        try:
            result = transaction.run_here(params, lease)
        finally:
            detached.end_keeper(keeper)
    finally:
        supervision.give_lock(sup)
    if not result.get("failed"):
        resumed = (result.get("resume") or {}).get("path")
        sup.say(f"the run is back: {result.get('msg')}, "
                + (f"resuming from {resumed}" if resumed else "with no checkpoint to resume from"))
        ends = sup.state.get("ends") or []
        if ends:
            ends[-1]["relaunch"] = f"{result.get('msg')}, resumed from {resumed}" if resumed else result.get("msg")
        sup.save(state="relaunched", ends=ends, restarts=(sup.state.get("restarts") or 0) + 1,
                 restarts_by_cause=supervision.counted(sup.state.get("restarts_by_cause"), cause))
        os.execv(sys.executable, [sys.executable, sup.agent, "supervise"])
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import progress

    first = (result.get("msg") or "").splitlines()[0].split("; last lines")[0]
    traceback = result.get("traceback") or progress.traceback_in(result.get("log_tail") or []) or []
    sup.say(f"THE RELAUNCH FAILED: {result.get('msg')}")
    if result.get("trainer_running"):
        stop(sup)
    return {"cause": f"the relaunch failed: {first}" + (f" ({traceback[-1].strip()})" if traceback else ""),
            "kind": "relaunch", "traceback": traceback[-12:]}
