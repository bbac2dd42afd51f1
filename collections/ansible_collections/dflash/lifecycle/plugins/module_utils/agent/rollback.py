# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a failed launch goes back to: the run as it was - the release of before and the settings of
its last healthy launch, which the CT keeps (run.json) - resuming from the newest checkpoint; and
the launch on a kept launch's settings that the controller's rescues ask for (settings_from)
(Python 3.8 compatible).
"""

from __future__ import annotations

import os

from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import start
from ansible_collections.dflash.lifecycle.plugins.module_utils.agent.launch_options import LaunchFailed
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import run_spec


def run_before(params):
    """(the options to launch, {settings: words} or {}) for settings_from: the job's own, or those of a
    launch the CT keeps (run.json) - its last (a rollback after a launch that failed, which kept nothing)
    or the one before it (after a healthy launch the job rejected: the canary, a gang's failure
    elsewhere) - as a relaunch of that run with this job's lifecycle place and gang health place."""
    wanted = params.get("settings_from") or "job"
    if wanted == "job":
        return params, {}
    directory = (params.get("lifecycle") or {}).get("dir")
    spec = run_spec.read(directory) if directory else None
    if spec is not None and wanted == "launch_before_last":
        spec = spec.get("before")
    if not spec:
        return params, {"settings": "this job's settings (the CT keeps no earlier launch of the run)"}
    again = run_spec.relaunch_params(spec, (params.get("gang_health") or {}).get("dir"))
    # the caller says whether this launch stages the model (a rescue does not: the model at the
    # target is whole, the one of before or the one this job staged)
    again.update(stage_models=params.get("stage_models"))
    again["lifecycle"]["dir"] = directory
    return again, {"settings": run_spec.settings_words(spec, params)}


def relaunch_after_stop(params, judged, spec):
    """After a gang's stop phase failed: the release of before (the push activated nothing) again
    from the checkpoint every CT sees, when every CT's run is gone (judged: the gang's agreement's
    relaunch); else nothing, said."""
    if not judged["relaunch"]:
        return {"after_stop": True, "failed": True, "msg": f"not relaunched: {judged['why']}"}
    try:
        again = relaunch(params, spec)
    except LaunchFailed as err:
        return {"after_stop": True, "failed": True, "msg": err.msg, "relaunch": dict(err.details, failed=True, msg=err.msg)}
    return {"after_stop": True, "relaunch": again,
            "msg": f"the release of before runs again from {judged['checkpoint']}: {again['msg']}"}


def relaunch(params, spec):
    """The launch of the release current points to (the one of before), resuming from the newest
    checkpoint; a gang's in a rendezvous of its own (rollback_launch). spec: the run's spec as this
    job found it (run.json, before its launch): the run goes back on its own last healthy launch's
    settings, not this job's, which may be what failed; the result says which (settings)."""
    other = params["rollback_launch"]
    if spec is not None:
        again = run_spec.relaunch_params(spec, other and other["gang_health_dir"])
        # nothing staged: the model at the target is whole (the one of before, or the one this job
        # staged), and a staging cut short by the failure is this job's, not the rollback's to redo
        again.update(stage_models=None)
        again["lifecycle"]["dir"] = params["lifecycle"]["dir"]
        settings = run_spec.settings_words(spec, params)
    else:
        again = run_spec.relaunch_options(params)
        settings = "this job's settings (the CT keeps none of an earlier launch)"
        if other:
            again["wrapper_script"] = other["wrapper_script"]
            if params["gang_health"] and other["gang_health_dir"]:
                again["gang_health"] = dict(params["gang_health"], dir=other["gang_health_dir"])
    try:
        return dict(start.start(again, False, {}), settings=settings)
    except LaunchFailed as err:
        err.details["settings"] = settings
        raise


def links(params):
    """current and previous of the release base before the launch moves them."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import releases

    base = (params["activate"] or {}).get("base")
    if not base:
        return None
    return {name: releases.link_target(os.path.join(base, name)) for name in ("current", "previous")}


ROLLBACK_LADDER = [{"signal": "SIGTERM", "scope": "tree", "wait": 30}, {"signal": "SIGKILL", "scope": "tree", "wait": 10}]


def rollback(params, failed, before, exclude, spec):
    """After a failed launch: the failed trainer stopped if it still runs (no checkpoint of it is
    wanted), current and previous set back to what they were, and the release of before relaunched,
    resuming from the newest checkpoint (the stop's). Returns what each step did; a step that fails
    ends it with failed and msg."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import releases
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import staged_stop, stop_options

    done = {}
    if failed.details.get("running"):
        try:
            options = stop_options.checked(dict(
                params["stop_first"] or {"pidfile": params["pidfile"], "pattern": params["pattern"]},
                ladder=ROLLBACK_LADDER, no_graceful="proceed", on_missing_checkpoint="proceed", detach=False,
                signal_at=None), "rollback stop")
        except stop_options.InvalidParameter as err:
            return dict(done, failed=True, msg=str(err))
        options.exclude_pids.update(exclude)
        done["stop"] = staged_stop.run_in_module(options)
        if done["stop"].get("failed"):
            return dict(done, failed=True, msg=f"the failed trainer could not be stopped: {done['stop'].get('msg')}")
    if before is not None:
        base = params["activate"]["base"]
        try:
            changed = releases.restore(base, before["current"], before["previous"])
        except (releases.ReleaseError, OSError) as err:
            return dict(done, failed=True, msg=f"restoring current and previous failed: {err}")
        done["restored"] = dict(before, changed=changed)
    try:
        done["relaunch"] = relaunch(params, spec)
    except LaunchFailed as err:
        return dict(done, failed=True, msg=f"{err.msg} (on {err.details['settings']})",
                    relaunch=dict(err.details, failed=True, msg=err.msg))
    done["msg"] = f"rolled back: {done['relaunch']['msg']}, on {done['relaunch']['settings']}"
    return done
