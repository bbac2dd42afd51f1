# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A staged stop from start to end: find the trainer, hold its run, climb the ladder, report
what it stopped and what it saved (Python 3.8 compatible).

This file only puts the steps in order; each lives with its concern:
module_utils/stop/trainer_finding.py (which process is the trainer), module_utils/stop/target_set.py
(which processes are its run), module_utils/stop/ladder.py (the signals and waits) and
module_utils/checkpoint/checkpoints.py (what was saved and lost). Runs on the target.
"""

from __future__ import annotations

import os
import resource
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import (
    checkpoint_formats, checkpoint_verdict, checkpoints)
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import history, proctable, progress, run_spec, rundir
from ansible_collections.dflash.lifecycle.plugins.module_utils.launch import launchers
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import (
    detached, ladder, leftovers, next_checkpoint, stop_request, stop_words, target_set, trainer_finding)
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop.stop_options import StopOptions


class StopFailed(Exception):
    """The stop did not end as asked; ``result`` says how far it got."""

    def __init__(self, msg, result):
        super().__init__(msg)
        result["msg"] = msg
        self.result = result  # the caller's own dict: what the stop adds on its way out lands too


def _cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def progress_report(options, directory):
    """The stop's progress for options.progress_file: the stage and its wait (Climb), plus the
    checkpoint bytes written since the stop began and the steps not yet in a checkpoint."""
    base = directory.fingerprint()[1]

    def checkpoint_fields():
        if not directory.path:
            return {}
        return {"checkpoint_bytes": directory.fingerprint()[1] - base,
                "steps_since_checkpoint": directory.loss()["steps_lost"]}

    return rundir.ProgressFile(options.progress_file, checkpoint_fields)


def run(options, proc_root="/proc", check_mode=False):
    """Stop the trainer as options (a StopOptions, or the module's params) say. Returns the
    result; raises StopFailed."""
    started, cpu_at_start, started_at = time.monotonic(), _cpu_seconds(), time.time()
    if not isinstance(options, StopOptions):
        options = StopOptions(options)
    if proc_root == "/proc":
        options.exclude_pids.update(proctable.ancestors(proctable.snapshot(proc_root), os.getpid()))
    result = {"changed": False, "stopped": True, "stopped_by": None, "timeline": [],
              "targets": [], "other_gpu_holders": [], "survivors": [], "diagnostics": None,
              "checkpoint": None, "signal_dispositions": {}, "notes": [], "found": None,
              "run_id": None, "ladder": options.describe_ladder(), "started_at": started_at}
    table = proctable.snapshot(proc_root)
    try:
        main, result["found"] = trainer_finding.find_trainer(options, table, proc_root)
    except trainer_finding.Ambiguous as err:
        result["matches"] = err.matches
        raise StopFailed(str(err), result) from None
    if main is not None:
        result["checkpoint_dir_source"] = _checkpoint_dir_of(main, options, proc_root)
        # the steps lost are read from the log this trainer writes, not from log_file alone
        result["log"] = progress.running_log(main, options.log_file, proc_root, options.step_regex, table)
        options.log_file = result["log"]["path"]
    directory = checkpoints.Directory.of(options)
    try:
        directory.check()
    except checkpoint_formats.InvalidLayout as err:
        raise StopFailed(str(err), result) from None
    before = directory.snapshot()
    if options.signal_at is not None:
        # a gang's CT whose stop starts after the gang's moment: what completed since then was
        # written in answer to the other CTs' signals, so it is this stop's checkpoint too
        before = {name: info for name, info in before.items() if info["mtime"] < options.signal_at}
    targets = target_set.Targets(proc_root)
    progress_file = progress_report(options, directory)
    try:
        scope = None if main is None else target_set.capture(main, table, options, targets, proc_root)
        if scope is None:
            result["msg"] = "no trainer running" + _why_none(main, result["found"]) + _end_leftovers(
                result, table, proc_root, check_mode)
            if directory.path:
                result["checkpoint"] = directory.report(before)
            return result
        holders = target_set.device_holders(options, table, proc_root)
        directory.since = proctable.start_wall_time(main, proc_root)
        result.update(
            changed=True, stopped=False, run_id=scope.run_id, targets=targets.report(),
            other_gpu_holders=target_set.others(holders, targets, table),
            loss_at_start=directory.loss())
        signals, survives, words = directory.saving(options.saves_on)
        result["saves_on"] = {"signals": _names(signals), "save_survives": _names(survives), "words": words}
        launch = launchers.of(main, proc_root)
        if launch is not None:
            result["launcher"] = launch.report()
        # a launcher's workers are the trainer: their signal handling is the one that saves
        trainer = launch.trainer() if launch is not None else main
        result["signal_dispositions"], result["graceful_stage"], result["graceful_reason"] = \
            ladder.assess(trainer, options.stages, signals, words)
        result["graceful_possible"] = result["graceful_stage"] is not None
        climb = ladder.Climb(options, main, targets, scope, directory, result, started, progress_file, launch)
        request = _request(options, main, launch, result)
        if check_mode:
            _signal_note(result, request is not None)
            return _check_report(options, result, directory, before, main)
        if request is not None:
            result["stopped_by"] = climb.by_request(request)
        if result["stopped_by"] is None:
            # the signals' facts warn only when signals are sent: a stop the request ended sent none
            _signal_note(result)
            if not result["graceful_possible"]:
                _no_graceful(options, directory, before, main, result, climb)
            result["stopped_by"] = climb.run()
        return _verify(options, directory, before, targets, result, main, started)
    finally:
        targets.close()
        progress_file.close()
        result["cpu_s"] = round(_cpu_seconds() - cpu_at_start, 3)
        result["duration_s"] = round(time.monotonic() - started, 3)


def run_in_module(options, check_mode=False, lease=None, record_dir=None, cause=None):
    """The stop of a module call (staged_stop's, or the launch's stop_first): detached inside the
    CT when options.detach says so, so that a dropped connection does not stop it, its lease
    (the job's lock: path, holder, ttl) kept alive while it runs. Its figures go to the CT's
    history (ct/history.py) in record_dir, else options.lifecycle_dir, counted under cause (else
    options.cause: a job's). Returns the result; a stop that did not end as asked has failed: True
    in it."""
    def stop():
        asked = options.lifecycle_dir and not check_mode
        notes = []
        if asked:
            # before the first signal: the run's supervisor takes the trainer's end for this stop's
            # (module_utils/agent/supervise.py), never for a crash to restart
            try:
                run_spec.stand_down(options.lifecycle_dir, lease[1] if lease else "a job")
            except OSError as err:
                notes.append(f"lifecycle_dir: {err}; the run's supervisor may take this stop for a crash")
        try:
            result = run(options, check_mode=check_mode)
        except StopFailed as err:
            result = dict(err.result, failed=True)
        if notes:
            result.setdefault("notes", []).extend(notes)
        if not check_mode:
            history.record_stop(record_dir or options.lifecycle_dir, result, cause or options.cause)
        if asked and result.get("failed") and trainer_finding.running(options.pidfile, options.pattern) is not None:
            run_spec.stand_down_cleared(options.lifecycle_dir)  # it still runs: the supervisor watches it again
        if asked and not result.get("failed"):
            # a stop asked for: the run stays down across the CT's restarts (module_utils/agent/hook.py)
            try:
                run_spec.mark(options.lifecycle_dir, "stopped", f"the stop of {lease[1] if lease else 'a job'}")
            except OSError as err:
                result.setdefault("notes", []).append(
                    f"lifecycle_dir: {err}; the CT's next start may relaunch the run this stop ended")
        return result

    if not (options.detach and not check_mode):
        return stop()
    # the detached process is no descendant of ours: keep our ancestors out of reach
    options.exclude_pids.update(proctable.ancestors(proctable.snapshot(), os.getpid()))
    try:
        result, adopted = detached.run(stop, options.detach_dir, "stop", lease=lease)
    except (rundir.UnsafePath, OSError) as err:
        return {"failed": True, "msg": f"detach_dir: {err}"}
    result["adopted"] = adopted
    return result


def _request(options, main, launch, result):
    """Stage 0, the stop request: a Request to write (result["request"] says why), or None when
    the ladder's signals come first. saves_on=auto asks a run that announced it honours requests;
    saves_on=request asks any run, and says so when it never announced it."""
    if options.saves_on not in ("auto", "request"):
        return None
    pids = [main.pid] + [p.pid for p in (launch.workers if launch is not None else [])]
    path, source = stop_request.path_of(pids, options.request_path)
    if path is None:
        if options.saves_on == "request":
            result["request"] = {"taken": False, "why": "no request path: neither the trainer's environment "
                                 f"({stop_request.ENVIRONMENT}) nor request_path names one"}
        return None
    log = result.get("log")
    honoured, words, log_path = stop_request.announced(progress.written_logs(log) if log else [], pids)
    if not honoured and (options.saves_on == "auto" or not log_path):
        if options.saves_on == "request":
            result["request"] = {"path": path, "taken": False, "why": words}
        return None
    result["request"] = {"path": path, "path_from": source, "announced": honoured, "words": words, "taken": None}
    if not honoured:
        result["notes"].append(f"saves_on=request, but {words}: the request is made all the same")
    return stop_request.Request(path, log_path)


def _signal_note(result, request_first=False):
    """The graceful stage's doubt (what the trainer does on a signal, when it is not stage 1) as a
    note, said as the fallback's when a stop request comes first."""
    if result["graceful_stage"] != 0:
        result["notes"].append(("if the stop request is not taken: " if request_first else "")
                               + result["graceful_reason"])


def _names(signals):
    return None if signals is None else sorted(s.name for s in signals)


def _checkpoint_dir_of(main, options, proc_root):
    """Where this trainer writes checkpoints is what its own command line says (the settings may
    have changed since it started); the checkpoint_dir option is the fallback."""
    flag = options.checkpoint_dir_flag
    argv = proctable.read_argv(main.pid, proc_root) or []
    value = None
    for index, arg in enumerate(argv):
        if flag and arg == flag and index + 1 < len(argv):
            value = argv[index + 1]
        elif flag and arg.startswith(flag + "="):
            value = arg[len(flag) + 1:]
    if value is None:
        return "checkpoint_dir" if options.checkpoint_dir else None
    if not os.path.isabs(value):
        cwd = proctable.read_cwd(main.pid, proc_root)
        if cwd is None:
            return "checkpoint_dir" if options.checkpoint_dir else None
        value = os.path.join(cwd, value)
    options.checkpoint_dir = os.path.normpath(value)
    return f"the trainer's {flag}"


def _end_leftovers(result, table, proc_root, check_mode):
    """The dead run's leftovers (trainer_finding) ended, as the run they outlived would have been;
    words for the message ('' when there were none). Survivors fail the stop."""
    found = [table[entry["pid"]] for entry in result["found"]["leftovers"] if entry["pid"] in table]
    if not found:
        return ""
    if check_mode:
        return f"; would end {len(found)} leftover(s) of its dead run (PID {', '.join(str(p.pid) for p in found)})"
    report = leftovers.end(found, proc_root)
    result.update(changed=True, leftovers=report)
    if report["survivors"]:
        raise StopFailed(f"the trainer was not running, and {leftovers.words(report)}", result)
    return f"; {leftovers.words(report)}"


def _why_none(main, found):
    if main is not None:
        return f" (PID {main.pid} ended before it could be held)"
    return f" ({found['pidfile_reason']})" if found["pidfile_reason"] else ""


def _check_report(options, result, directory, before, main):
    result["stopped"] = False
    if directory.path:
        result["checkpoint"] = directory.report(before)
    request = result.get("request") or {}
    result["msg"] = (f"would stop PID {main.pid} and {len(result['targets']) - 1} more "
                     + (f"with the stop request at {request['path']} ({request['words']}), then, if it is not "
                        "taken within request_ack_timeout, " if request.get("taken") is None and request else "with ")
                     + " -> ".join(s["signal"].name for s in options.stages))
    if request.get("taken") is False:
        result["msg"] += f"; no stop request: {request['why']}"
    if result["other_gpu_holders"]:
        result["msg"] += f"; would leave {stop_words.others(result)}"
    if not result["graceful_possible"]:
        result["msg"] += (f"; no graceful checkpoint: {result['graceful_reason']}; "
                          f"{checkpoint_verdict.describe_loss(result['loss_at_start'])}; "
                          f"no_graceful={options.no_graceful}")
    return result


def _no_graceful(options, directory, before, main, result, climb):
    """no_graceful: refuse, wait for the next periodic checkpoint, or go on."""
    if options.no_graceful == "fail":
        raise StopFailed(
            f"{result['graceful_reason']}. Nothing was signalled. "
            f"{checkpoint_verdict.describe_loss(result['loss_at_start'])}. Choose no_graceful="
            "wait_for_checkpoint to stop right after the next periodic checkpoint, or "
            "no_graceful=proceed to stop now.", result)
    if options.no_graceful == "wait_for_checkpoint":
        try:
            next_checkpoint.wait_for_next_checkpoint(options, directory, before, main.identity, result, climb)
        except next_checkpoint.StopRefused as err:
            raise StopFailed(str(err), result) from None


def _verify(options, directory, before, targets, result, main, started):
    """Who survived, what was saved and lost; StopFailed when the stop fell short."""
    proc_root = targets.proc_root
    result["targets"] = targets.report()
    if directory.path:
        result["checkpoint"] = directory.report(before)
    survivors = targets.alive()
    result["survivors"] = [dict(p, threads=proctable.threads_report(p["pid"], proc_root))
                           for p in targets.report(survivors)]
    result["stopped"] = not survivors
    ckpt = result["checkpoint"] or {}
    if ckpt.get("new"):
        ckpt["new_by"], ckpt["new_by_signal"] = _produced_by(result, ckpt["new"], ckpt["new_completed_at"])
    # a checkpoint completed after the first signal, by a trainer that then exited, is its answer
    answered = not survivors and ckpt.get("written") and result.get("signalled_at") is not None
    result["loss"] = directory.loss(answered_at=result["signalled_at"] if answered else None)
    _unexpected_save(options, result)
    result["msg"] = stop_words.summary(result, main.pid, started)
    alive = {ident[0] for ident in survivors}
    for rank in (result.get("launcher") or {}).get("ranks", []):
        if rank["ended_by"] is None:
            rank["ended_by"] = "still running" if rank["pid"] in alive else (
                (result["stopped_by"] or {}).get("signal") or "gone")
    restarted = (result.get("launcher") or {}).get("restarted")
    if restarted:
        raise StopFailed(f"the launcher restarted its workers during the stop (an elastic restart: new "
                         f"PIDs {', '.join(map(str, restarted))}; max restarts "
                         f"{result['launcher']['max_restarts']}): the stop did not end the run as asked. "
                         + result["msg"], result)
    if survivors:
        states = ", ".join(f"PID {p['pid']} state {p['state']}" for p in result["survivors"])
        raise StopFailed(f"{len(survivors)} process(es) survived the last stage: {states}. "
                         + result["msg"], result)
    saved = (result["checkpoint"] or {}).get("written")
    answered_request = bool((result.get("request") or {}).get("taken"))
    expected = (result["graceful_possible"] or answered_request) and options.on_missing_checkpoint == "fail"
    if directory.path and not saved and (options.require_checkpoint or expected):
        raise StopFailed(_no_checkpoint(result, expected), result)
    return result


def _produced_by(result, path, completed_at):
    """(words, signal or None): what made the new checkpoint at path. The stop's own order of
    events first: a checkpoint it saw land before it sent anything is the trainer's own save,
    whatever the file system's coarse clock says. Else the last signal sent before it completed
    (that clock is a few ms coarse), else a save of its own before any signal."""
    timeline = result["timeline"]
    sent = [e for e in timeline if e["event"] in ("signal", "request")]
    landed = [e for e in timeline if e["event"] == "checkpoint_landed" and e["path"] == path]
    if landed and not any(e["t"] <= landed[0]["t"] for e in sent):
        # written again after a signal: a handler that found its step saved wrote it (or its pointer)
        # once more; strictly after, as the coarse clock only ever shows a write as earlier
        again = [e for e in sent if e["event"] == "signal" and e["at"] < completed_at]
        if again:
            return (f"the trainer's own save, which the stop waited for, written again after {again[-1]['signal']}",
                    again[-1]["signal"])
        return "the trainer's own save, which the stop waited for", None
    sent = [e for e in sent if e["at"] <= completed_at + 0.01]
    if sent and sent[-1]["event"] == "request":
        return "completed after the stop request", None
    if sent:
        return f"completed after {sent[-1]['signal']}, stage {sent[-1]['stage'] + 1}", sent[-1]["signal"]
    return "the trainer's own save, completed before any signal", None


def _unexpected_save(options, result):
    """A checkpoint completed after a signal that saves_on=auto said saves nothing: say so, and
    name the setting that makes that signal the graceful stage."""
    ckpt = result["checkpoint"] or {}
    signal_name = ckpt.get("new_by_signal")
    if options.saves_on == "auto" and signal_name and ckpt["written"] and \
            signal_name not in (result["saves_on"]["save_survives"] or []):
        result["notes"].append(
            f"the trainer saved a checkpoint on {signal_name}, which {result['saves_on']['words']} did not "
            f"expect: set trainer_run_saves_on: {signal_name} to make that signal the graceful stage")


def _no_checkpoint(result, expected):
    ckpt, loss = result["checkpoint"], result["loss"]
    why = (f"{ckpt['new']} completed, but " + "; ".join(ckpt["doubts"])) if ckpt["new"] else \
        "none completed during the stop"
    incomplete = [a for a in ckpt["appeared"] if not a["complete"]]
    if incomplete:
        why += "; " + "; ".join(f"{a['name']} is incomplete: {'; '.join(a['problems'])}" for a in incomplete)
    text = (f"the trainer stopped, but no new sound checkpoint in {ckpt['dir']}: {why}. "
            f"{checkpoint_verdict.describe_loss(loss)}. Free space there: "
            f"{loss['free_bytes'] / 1024 ** 3:.2f} GiB.")
    if ckpt["temp_files_left"]:
        text += " Temporary files left (not deleted): " + ", ".join(
            f"{t['name']} ({t['bytes']} bytes)" for t in ckpt["temp_files_left"]) + "."
    if ckpt["format"] is None:
        text += f" ({ckpt['format_reason']}: set checkpoint_format.)"
    text += " No trainer is running."
    if expected:
        why = "the trainer acknowledged the stop request" if (result.get("request") or {}).get("taken") \
            else result["graceful_reason"]
        text += f" ({why}, so a checkpoint was expected; on_missing_checkpoint=proceed accepts the loss.)"
    return text + " " + result["msg"]
