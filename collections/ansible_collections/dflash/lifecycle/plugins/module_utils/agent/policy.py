# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The supervisor's policy and its words (Python 3.8 compatible, the standard library only).

Light on purpose: the launch's validation (launch_options.checked), the preflight's report of the
restarts since the last job and `make status` (trainer_state) import only this, never the
supervisor's watch, restart or hang code. The policy is the launch's ``supervise`` option; the
state the supervisor keeps is ``supervisor.json`` in the lifecycle directory
(module_utils/agent/supervision.py writes it).
"""

from __future__ import annotations

import os
import signal
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import change_record, proctable
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct.rundir import read_mapping, write_atomic


# the launch's supervise option (trainer_process's); RULES bound the numbers
POLICY = {"type": "dict", "options": {
    "restart": {"type": "str", "choices": ["never", "on-failure"], "default": "on-failure"},
    "backoff_s": {"type": "float", "default": 10},
    "backoff_max_s": {"type": "float", "default": 360},
    "crash_loop_restarts": {"type": "int", "default": 5},
    "crash_loop_window_s": {"type": "float", "default": 3600},
    "hang_floor_s": {"type": "float", "default": 300},
    "hang_factor": {"type": "float", "default": 5},
    # a Slack-style URL is a secret in itself
    "webhook": {"type": "str", "no_log": True},
    "webhook_timeout_s": {"type": "float", "default": 3},
    # who the events say they are from, and the key they are signed with (agent/webhook.py)
    "webhook_ct": {"type": "str"},
    "webhook_key": {"type": "str", "no_log": True},
}}


RULES = {
    "backoff_s": (0, False, "at least 0"),
    "backoff_max_s": (0, False, "at least 0"),
    "crash_loop_restarts": (1, False, "at least 1"),
    "crash_loop_window_s": (0, True, "above 0"),
    "hang_floor_s": (0, True, "above 0"),
    "hang_factor": (1, False, "at least 1"),
    "webhook_timeout_s": (0, True, "above 0 (and at most 30: it must never hold a restart up)"),
}


def policy_problems(policy, name_of=lambda key: f"supervise.{key}"):
    """The lines naming each value of policy outside its rule (name_of(key): how the caller names
    it, a role variable or the module's option); [] when all hold."""
    problems = []
    for key, (low, strict, words) in RULES.items():
        value = policy.get(key)
        if value is None:
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < low or (strict and value == low):
            problems.append(f"{name_of(key)}: {value!r} must be {words}")
    if isinstance(policy.get("webhook_timeout_s"), (int, float)) and policy["webhook_timeout_s"] > 30:
        problems.append(f"{name_of('webhook_timeout_s')}: {policy['webhook_timeout_s']!r} must be {RULES['webhook_timeout_s'][2]}")
    low, high = policy.get("backoff_s"), policy.get("backoff_max_s")
    if isinstance(low, (int, float)) and isinstance(high, (int, float)) and high < low:
        problems.append(f"{name_of('backoff_max_s')}: {high!r} must be at least {name_of('backoff_s')} ({low!r})")
    hook = policy.get("webhook")
    if hook and not str(hook).startswith(("http://", "https://")):
        problems.append(f"{name_of('webhook')}: {hook!r} must be an http:// or https:// URL")
    return problems


def policy_of(launch):
    """The run's policy, every default filled in; None for a run launched without supervision."""
    given = launch.get("supervise")
    if given is None:
        return None
    return {key: given.get(key) if given.get(key) is not None else spec.get("default")
            for key, spec in POLICY["options"].items()}


def backoff(policy, restarts):
    """The wait before restart number restarts (1: the first), doubling from backoff_s, capped."""
    return min(float(policy["backoff_max_s"]), float(policy["backoff_s"]) * 2 ** max(0, restarts - 1))


def hang_timeout(policy, gaps, startup):
    """Seconds of silence that make a hang: hang_factor times the longest interval the run has
    shown (gaps), at least hang_floor_s; before two beats were seen, startup (the launch's health
    timeout: the run's start-up bound)."""
    if not gaps:
        return max(float(policy["hang_floor_s"]), float(startup))
    return max(float(policy["hang_floor_s"]), float(policy["hang_factor"]) * max(gaps))


def exit_words(status):
    """A waitpid status in words, and the JSON facts of it."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return f"killed by {name}", {"signal": name, "code": None}
    code = os.WEXITSTATUS(status)
    return f"exited with status {code}", {"signal": None, "code": code}


def state_path(directory):
    return os.path.join(directory, "supervisor.json")


def read_state(directory):
    return read_mapping(state_path(directory))


def words(directory, now=None):
    """The supervisor's state in one line for `make status`, with each end it recorded; None
    when the CT keeps no state of one."""
    state = read_state(directory)
    if state is None:
        return None
    now = time.time() if now is None else now
    pid, start = state.get("supervisor"), state.get("supervisor_start")
    alive = bool(pid) and start is not None and proctable.alive((pid, start))
    what = state.get("state") or "?"
    if what == "watching" and alive:
        learned = state.get("learned") or {}
        what = f"watching trainer PID {(state.get('trainer') or {}).get('pid')} (supervisor PID {pid})"
        if learned.get("timeout_s"):
            what += f", a hang after {learned['timeout_s']:.1f} s without progress"
    elif what in ("watching", "relaunched") or what.startswith(("backing off", "relaunching", "stopping")):
        what = f"{what} (PID {pid})" if alive else f"GONE while {what} (PID {pid}): the run is not supervised"
    if state.get("why") and not alive:
        what += f": {state['why']}"
    ends = state.get("ends") or []
    if ends:
        what += f"; {state.get('restarts') or 0} restarts since the launch; ends: " + "; ".join(
            f"{change_record.stamp(e.get('at') or 0)} {e.get('cause')}"
            + (f", checkpoint {e['checkpoint']}" if e.get("checkpoint") else "")
            + (f", {e['steps_lost']} steps lost" if e.get("steps_lost") is not None else "")
            + (f", {e['leftovers']}" if e.get("leftovers") else "")
            + (f", diagnostics {e['diagnostics']}" if e.get("diagnostics") else "")
            + (f" -> {e['relaunch']}" if e.get("relaunch") else "") for e in ends[-5:])
    return what


def restarts_since(directory, mark_path=None, mark=False):
    """The ends the supervisor restarted the run after since the last job that asked (kept in
    mark_path: <directory>/restarts-reported), in words; None when there are none. mark: record
    them as reported."""
    state = read_state(directory)
    mark_path = mark_path or os.path.join(directory, "restarts-reported")
    try:
        with open(mark_path, encoding="utf-8") as handle:
            reported = float(handle.read().strip() or 0)
    except (OSError, ValueError):
        reported = 0.0
    ends = [e for e in (state or {}).get("ends") or [] if (e.get("at") or 0) > reported]
    if not ends:
        return None
    if mark:
        try:
            write_atomic(mark_path, f"{max(e.get('at') or 0 for e in ends)}\n")
        except OSError:
            pass
    return f"the supervisor saw {len(ends)} end(s) of the run since the last job: " + "; ".join(
        f"{change_record.stamp(e.get('at') or 0)} {e.get('cause')}"
        + (f", {e['steps_lost']} steps lost" if e.get("steps_lost") is not None else "")
        + (f" -> {e['relaunch']}" if e.get("relaunch") else "")
        for e in ends) + f"; now: {(state or {}).get('state')}"
