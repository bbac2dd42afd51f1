# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The summary of one CT's redeploy, built from the results its phases registered, and the
report line it prints (controller side; the redeploy_summary and redeploy_report filters).

The summary never says more than the results show: a phase that did not run is "not
stopped" / "not launched", a failed one carries its error, and whether a trainer runs after
the job is said in plain words, above all when none does.
"""

from __future__ import annotations

import shlex
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoint_verdict
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import model_stage
from ansible_collections.dflash.lifecycle.plugins.plugin_utils import canary as throughput_canary


def _ok(result):
    return isinstance(result, dict) and not result.get("failed") and not result.get("skipped")


def _failed(result):
    return isinstance(result, dict) and bool(result.get("failed"))


def _checks_of(preflight):
    """The preflight's own outcome. A preflight that also launched (its launch option) fails by
    that launch only once every check passed: the failure is the launch's, reported as the launch's
    (the caller passes it as the launch)."""
    if _failed(preflight) and _failed(preflight.get("launch")):
        return {key: value for key, value in preflight.items() if key not in ("failed", "msg", "launch")}
    return preflight


def _msg(result):
    return " ".join(str((result or {}).get("msg") or "unknown error").split())


def _release_words(release, status, install):
    if not release:
        return "no release built", None
    if status is None:
        return f"release {release}", None
    changes = status.get("changes")
    drift = status.get("drift") or {}
    if release in drift:
        files = drift[release]
        words = (f"release {release} (drifted in place: {len(files['modified'])} modified, "
                 f"{len(files['added'])} added, {len(files['removed'])} removed"
                 + (", reinstalled)" if _ok(install) and install.get("changed") else ")"))
        return words, changes
    if status.get("present"):
        return f"release {release} (installed already)", None
    return (f"release {release} (new: {len(changes['modified'])} modified, {len(changes['added'])} "
            f"added, {len(changes['removed'])} removed)"), changes


def summary(host, checked=None, manifest=None, preflight=None, install=None, stop=None, launch=None,
            failed_launch=None, restored=None, rescue_error=None, argv=None, canary=None, gang_failure=None,
            relaunched_after_stop=False, staged=None):
    """The summary dict of one CT (module docstring). launch is the last launch (the rescue's
    relaunch when there was one), failed_launch the launch that failed before it; gang_failure
    what stopped the CT's gang after a phase (its barrier's message); relaunched_after_stop: the
    gang's stop phase failed and the release of before runs again from its checkpoint."""
    preflight = _checks_of(preflight)
    status = (preflight or {}).get("release_status") if _ok(preflight) else None
    release = (manifest or {}).get("release")
    release_words, changes = _release_words(release, status, install)
    first_launch = failed_launch if failed_launch is not None else launch
    errors = []
    for phase, result in (("settings", checked), ("release", manifest), ("preflight", preflight),
                          ("push", install), ("stop", stop), ("model staging", staged), ("launch", first_launch)):
        if _failed(result):
            errors.append(f"{phase} failed: {_msg(result)}")
    if gang_failure:
        errors.append(" ".join(str(gang_failure).split()))
    if (canary or {}).get("action"):
        errors.append(f"throughput regression: {throughput_canary.words(canary)}")
    if rescue_error:
        errors.append(f"rollback failed: {' '.join(str(rescue_error).split())}")
    running = _ok(launch) and launch.get("pid") is not None and not launch.get("check_mode")
    stopped = _ok(stop) and stop.get("stopped_by") is not None
    checkpoint = (stop or {}).get("checkpoint") or {}
    data = {
        "host": host,
        "release": release,
        "changes": changes,
        "drift": (status or {}).get("drift") or {},
        "running_before": (status or {}).get("current"),
        "rolled_back_to": (restored or {}).get("current") if _ok(restored) else None,
        "stopped_by": (stop or {}).get("stopped_by") if _ok(stop) else None,
        "request": (stop or {}).get("request") if _ok(stop) else None,
        "stop_seconds": ((stop or {}).get("timeline") or [{}])[-1].get("elapsed") if stopped else None,
        "checkpoint": checkpoint.get("new") if checkpoint.get("written") else None,
        "checkpoint_format": checkpoint.get("format"),
        "newest_checkpoint": checkpoint.get("newest"),
        # the trainer's resume loads an older checkpoint than the newest complete one
        "resume_older": checkpoint_verdict.older_resume_words(checkpoint) or None,
        "steps_lost": ((stop or {}).get("loss") or {}).get("steps_lost") if stopped else None,
        "steps_lost_up_to": ((stop or {}).get("loss") or {}).get("steps_lost_up_to") if stopped else None,
        "ahead_of_log": ((stop or {}).get("loss") or {}).get("ahead_of_log") if stopped else None,
        # what the new run resumed from, and the incomplete checkpoints moved aside before it
        "resumed_from": ((launch or {}).get("resume") or {}).get("path") if running else None,
        "moved_aside": (launch or {}).get("moved_aside") or [] if _ok(launch) else [],
        "other_gpu_holders": len((stop or {}).get("other_gpu_holders") or []),
        "pid": launch.get("pid") if running else None,
        "ranks": ((launch or {}).get("launcher") or {}).get("ranks") if running else None,
        "run_id": launch.get("run_id") if running else None,
        # the driver still freeing the old run's GPU memory when the launch began
        "gpu_wait_seconds": ((launch or {}).get("gpu_wait") or {}).get("waited_s")
        if running and ((launch or {}).get("gpu_wait") or {}).get("held_at_start") else None,
        "startup_seconds": launch.get("first_progress_s") if running else None,
        "healthy_seconds": launch.get("healthy_after_s") if running else None,
        "tokens_per_s": launch.get("tokens_per_s") if running else None,
        "canary": canary,
        # what runs, read from the process; else what the settings render (check mode, a failure)
        "command_line": " ".join(shlex.quote(a) for a in (running and (launch or {}).get("argv")) or argv or []),
        "command_line_from": "process" if running and (launch or {}).get("argv") else "settings",
        "errors": errors,
        "trainer_running": _trainer_running(running, preflight, stop, launch),
        "running_before_job": (preflight or {}).get("trainer_running") if isinstance(preflight, dict) else None,
        "relaunched_after_stop": bool(relaunched_after_stop) and running,
        # when this job stopped the run (the stop's first signal, the node's wall clock)
        "stopped_at": (stop or {}).get("signalled_at") if isinstance(stop, dict) else None,
        # a change to the run before this job that no controller saw end (the CT's worker finished it)
        "unattended_change": (preflight or {}).get("unattended_change") if isinstance(preflight, dict) else None,
        # the crashes and hangs the CT's supervisor restarted since the last job
        "supervisor_restarts": (preflight or {}).get("supervisor_restarts") if isinstance(preflight, dict) else None,
        # the gang this CT runs in (its own report says what the gang's state is)
        "gang": ((checked or {}).get("gang") or {}).get("name") if isinstance(checked, dict) else None,
    }
    # the models staged, or (check mode, nothing to stage) what the preflight found
    data["models"] = (staged.get("models") if _ok(staged) else None) or (
        (preflight or {}).get("model_stage") if isinstance(preflight, dict) else None) or []
    data["model_words"] = [model_stage.words(m) for m in data["models"] if m.get("needed") or m.get("state") == "staged"]
    data["release_words"] = release_words
    data["stop_words"] = _stop_words(stop, data)
    data["launch_words"] = _launch_words(launch, failed_launch, data)
    return data


def _trainer_running(launched, preflight, stop, launch=None):
    """Whether a trainer runs in the CT after the job: True, False, or None when unknown."""
    if launched:
        return True
    if _failed(launch) and "trainer_running" in launch:  # read in the CT when the launch's call failed
        return launch["trainer_running"]
    if isinstance(stop, dict) and not stop.get("skipped") and not (
            _failed(stop) and stop.get("signalled_at") is None and not stop.get("stopped_by")):
        return bool(stop.get("changed")) and not stop.get("stopped", False)
    # no stop, or one that failed before it sent anything (two trainers matched, a refusal): the
    # run is as the preflight found it
    return (preflight or {}).get("trainer_running")


def _stop_words(stop, data):
    if stop is None or stop.get("skipped"):
        return "not stopped"
    if _failed(stop):
        return "stop failed"
    if data["stopped_by"]:
        request = data["request"] or {}
        if data["stopped_by"]["scope"] == "request":
            ack = request.get("acknowledged")
            ended = request.get("agent_ended")
            sent = (f"no signal sent to the workers, {', then '.join(ended['signals'])} to the agent left in its "
                    "exit barrier" if ended else "no signal sent")
            by = "the stop request" + (f" (taken at step {ack['step']}, {sent})" if ack else f" ({sent})")
        else:
            by = data["stopped_by"]["signal"] + (
                f" (the stop request was not taken: {request['why']})" if request.get("taken") is False else "")
        words = f"stopped by {by} in {data['stop_seconds']}s, "
        words += f"checkpoint {data['checkpoint']}" if data["checkpoint"] else "NO new checkpoint"
        if data["checkpoint_format"]:
            words += f" ({data['checkpoint_format']})"
        if not data["checkpoint"] and data["newest_checkpoint"]:
            words += f", newest complete {data['newest_checkpoint']}"
        if data["steps_lost"] is not None:
            words += f" ({checkpoint_verdict.lost_words(data)} steps lost)"
        elif data["ahead_of_log"]:
            words += f" (the checkpoint is {data['ahead_of_log']} steps ahead of the log: steps lost not known)"
        else:
            words += " (steps lost not known)"
        if data["resume_older"]:
            words += f" ({data['resume_older']})"
        return words
    return _msg(stop)


def _launch_words(launch, failed_launch, data):
    if failed_launch is not None and data["pid"] and not data["relaunched_after_stop"]:
        why = "launch failed" if _failed(failed_launch) else (
            "throughput regression" if (data["canary"] or {}).get("action") == "rollback"
            else "the gang's launch failed")
        health = (f"its {data['ranks']} ranks healthy after {data['healthy_seconds']}s"
                  if launch.get("logs_progress") is False
                  else f"first progress after {data['startup_seconds']}s, {data['tokens_per_s']} tok/s")
        back = f"rolled back to {data['rolled_back_to']}" if data["rolled_back_to"] else "the run of before relaunched"
        settings = f" (on {launch['settings']})" if launch.get("settings") else ""
        return f"{why}, {back}: PID {data['pid']} running again{settings}, {health}"
    if data["relaunched_after_stop"]:
        return (f"the gang's stop phase failed: the release of before runs again, PID {data['pid']}, "
                f"resumed from {data['resumed_from']}")
    if launch is None or launch.get("skipped"):
        return "not launched"
    if _failed(launch):
        return "launch failed"
    if data["pid"]:
        waited = f"waited {data['gpu_wait_seconds']}s for the GPUs, " if data["gpu_wait_seconds"] else ""
        moved = "".join(f"moved the incomplete {m['name']} aside to {m['to']}, " for m in data["moved_aside"])
        resumed = f"resumed from {data['resumed_from']}, " if data["resumed_from"] else ""
        if launch.get("logs_progress") is False:  # a CT of a gang whose ranks do not log
            return (f"{moved}PID {data['pid']}, {resumed}{waited}its {data['ranks']} ranks healthy after "
                    f"{data['healthy_seconds']}s (the gang's rank 0 logs on another CT)")
        return (f"{moved}PID {data['pid']}, {resumed}{waited}first progress after {data['startup_seconds']}s, "
                f"healthy after {data['healthy_seconds']}s, {data['tokens_per_s']} tok/s")
    return _msg(launch)


def _down_since(data):
    if data["stopped_at"]:
        return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(data['stopped_at']))} UTC, when this job stopped it"
    if data["running_before_job"] is False:
        return "before this job (its preflight found no trainer running)"
    return "this job (it found a trainer running and leaves none)"


def report(data):
    """The lines a person reads: what happened to the CT, then the command line (or why none)."""
    head = f"{data['host']}: " + ", ".join((data["release_words"], data["stop_words"], data["launch_words"]))
    if data["trainer_running"] is False and not data["gang"] and (data["stopped_at"] or data["errors"]):
        # a CT that runs alone left with no trainer by a job that stopped it or failed: said first,
        # with since when and the way back (a gang's report says it of the gang)
        head = (f"{data['host']} is DOWN since {_down_since(data)}: `make start HOST={data['host']}` starts it "
                "again. " + head)
    lines = [head]
    if data.get("unattended_change"):
        lines.append(f"before this job, {data['unattended_change']}")
    if data.get("supervisor_restarts"):
        lines.append(f"before this job, {data['supervisor_restarts']}")
    lines.extend(data["model_words"])
    if data["errors"]:
        lines.append("; ".join(data["errors"]))
    if data["canary"] and not data["canary"]["action"]:  # an acted-on regression is among the errors
        lines.append("canary: " + throughput_canary.words(data["canary"]))
    if data["trainer_running"] is False:
        lines.append("NO TRAINER IS RUNNING in this CT" + (
            f"; newest checkpoint {data['checkpoint']}" if data["checkpoint"] else ""))
    if not data["command_line"]:
        lines.append("no command line: not launched")
    elif data["command_line_from"] == "settings" and data["trainer_running"] is False:
        lines.append("not running; the settings render: " + data["command_line"])
    else:
        lines.append(data["command_line"])
    return lines
