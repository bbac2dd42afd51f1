# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The staged stop's result in one line (Python 3.8 compatible): who stopped at which stage, or by the
stop request; the checkpoint's verdict; the steps lost, or why they are not known; the log; what
the trainer's resume would load; the other GPU holders left alone; a launcher's agent and workers.
"""

from __future__ import annotations

import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoint_verdict
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import progress


def request_words(result):
    """The request's id, its acknowledgement's step, and its time to the exit."""
    request = result["request"]
    ack = request.get("acknowledged")
    words = f"request {request['body']['id']}"
    words += (f", acknowledged at step {ack['step']}" if ack else ", exited without an acknowledgement")
    if request.get("saved"):
        words += f", saved {request['saved']['checkpoint']}"
    return words + f", exited {request['exit_after_s']}s after the request"


def others(result):
    return "other GPU holders untouched: " + "; ".join(
        f"PID {o['pid']} ({o['cmdline'][:60]}) on {', '.join(o['devices'])}, {o['why']}"
        for o in result["other_gpu_holders"])


def checkpoint_words(ckpt):
    """The checkpoint part of the stop's message: the same verdict as written, new and doubts."""
    if ckpt["written"]:
        words = f"; new checkpoint {ckpt['new']} ({ckpt.get('new_by') or 'completed during the stop'})"
    elif ckpt["new"]:
        words = f"; NO sound new checkpoint: {ckpt['new']} completed, but {'; '.join(ckpt['doubts'])}"
    else:
        newest = f" (newest complete: {ckpt['newest']}, from before the stop)" if ckpt["newest"] else ""
        words = "; NO new checkpoint" + newest
    if ckpt.get("unfinished"):
        words += f"; a later save was left unfinished ({', '.join(ckpt['unfinished'])})"
    return words


def request_signals(result):
    """The signals of a stop by its request: none, or those of the launcher's agent left alone in its
    exit barrier once its workers had exited (SIGTERM, then SIGKILL: ladder.Climb._exit_after_request)."""
    ended = (result.get("request") or {}).get("agent_ended")
    if ended:
        return ("no signal sent to its workers (its agent, left waiting in its exit barrier once they had exited, "
                f"got {', then '.join(ended['signals'])})")
    return "no signal sent"


def summary(result, main_pid, started):
    took = round(time.monotonic() - started, 1)
    launch = result.get("launcher")
    if launch:
        plan = launch.get("plan") or {}
        head_words = (f"{launch['launcher']} agent PID {main_pid} ({len(launch['workers'])} workers, deadline "
                      f"{launch['deadline']}"
                      + (f"; the graceful signal went to the {plan['to']}" if plan else "") + ")")
    else:
        head_words = None
    if result["survivors"]:
        head = f"PID {main_pid} NOT stopped after {took}s"
    elif result["stopped_by"] and result["stopped_by"]["scope"] == "request":
        head = f"stopped PID {main_pid} by the stop request in {took}s, {request_signals(result)} ({request_words(result)})"
    elif result["stopped_by"]:
        by = result["stopped_by"]
        head = f"stopped PID {main_pid} at stage {by['stage'] + 1} ({by['signal']}) in {took}s"
    else:
        head = f"PID {main_pid} stopped in {took}s"
    ckpt = result.get("checkpoint")
    if ckpt is not None:
        head += checkpoint_words(ckpt)
    loss = result["loss"]
    request = result.get("request") or {}
    if request.get("taken") is False:
        head += f"; the stop request was not taken: {request['why']}" + (
            ", and the signal ladder followed" if result["stopped_by"] else "")
    if loss["saved_on_stop"]:
        by = "the stop request" if request.get("taken") else ckpt.get("new_by_signal") or "its own"
        head += f"; 0 steps lost (the trainer saved on {by} and exited)"
    elif loss["ahead_of_log"] is not None:
        head += (f"; the checkpoint's step {loss['checkpoint_step']} is {loss['ahead_of_log']} steps ahead "
                 f"of the log (step {loss['last_logged_step']}): steps lost not known")
    elif loss["steps_lost"] is not None:
        lost = checkpoint_verdict.lost_words(loss)
        head += (f"; {lost} steps after the newest checkpoint lost" if loss["checkpoint"]
                 else f"; no checkpoint at all: all {lost} steps of the run lost")
    elif loss["checkpoint"] and loss["checkpoint_step"] is None:
        head += "; steps lost not known (the checkpoint's step is not known)"
    elif loss["last_logged_step"] is None:
        head += "; steps lost not known (no step in the trainer's log)"
    log = progress.log_words(result.get("log"))
    # no log with a step is said where the loss hangs on it, not where the trainer saved on the stop
    # (a gang's CT whose ranks do not log: rank 0 logs on another CT)
    if log and not (loss["saved_on_stop"] and (result.get("log") or {}).get("path") is None):
        head += f"; log: {log}"
    resume = (ckpt or {}).get("resume") or {}
    if resume.get("name") and not resume["complete"]:
        head += (f"; the trainer's resume would load the incomplete {resume['name']} "
                 f"({'; '.join(resume['problems'])})")
    older = checkpoint_verdict.older_resume_words(ckpt or {})
    if older:
        head += f"; {older}"
    if result["other_gpu_holders"]:
        head += f"; {others(result)}"
    return head + (f"; {head_words}" if head_words else "")
