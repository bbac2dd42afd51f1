# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The action of every module of this collection that runs in a CT (docs/security.md).

What the CT answers is written by whatever runs there as root, so ansible-core parses only what
the answer check (plugin_utils/untrusted.py ``AnswerCheck``) wrote of it: one checked, cleaned
JSON object, or one line that names the CT. Beside it, two things the controller owns and never
takes from a CT:

- **the takeover code** of a live lock, ``redeploy_lock_takeover``: read as the job gave it, never
  templated (an extra variable is a trusted template in ansible-core 2.19, and ansible-core's role
  argument validation templates what it checks), and refused unless it is 12 hex digits, before
  any module runs. Only then is it the module's ``lock_takeover``.
- **the words of a lock refusal**: the CT answers with the lock's fields (``lock_held``); the
  controller writes the refusal from them, quoting what the CT wrote as its word, and gives the
  command to take the lock over only with a code it checked itself. The fields are not shown
  otherwise: a code the CT wrote is never shown where it could be taken for one to paste.

Each module's AnsiballZ payload is kept from one run to the next (plugin_utils/payload_cache.py).
"""

from __future__ import annotations

import json
import time

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.json import Direction, get_module_decoder
from ansible.plugins.action import ActionBase

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct.lock import TAKEOVER_CODE
from ansible_collections.dflash.lifecycle.plugins.module_utils.node.installed_hookscript import printable
from ansible_collections.dflash.lifecycle.plugins.plugin_utils import payload_cache, untrusted
from ansible_collections.dflash.lifecycle.plugins.plugin_utils.role_variables import TAKEOVER_VARIABLE


def checked_takeover(task_vars):
    """The job's takeover code as the job gave it (never templated), or None when it gives none;
    raises AnsibleActionFail naming the variable when it is not 12 hex digits."""
    given = task_vars.get(TAKEOVER_VARIABLE)
    if given is None or given == "":
        return None
    if not isinstance(given, str) or not TAKEOVER_CODE.fullmatch(given):
        raise AnsibleActionFail(f"{TAKEOVER_VARIABLE}: {printable(ascii(given), 80)} is not a lock's takeover code (12 "
                                "hex digits, as a refusal gives it); it was not templated, and nothing was done")
    return str(given)


def _utc(epoch):
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(epoch)))
    except (TypeError, ValueError, OverflowError, OSError):
        return "an unknown time"


def _quoted(text):
    """What the CT wrote, shown as its word: quoted, ASCII, cleaned."""
    return printable(ascii(str(text)), 400)


def refusal_words(host, held, now=None):
    """The controller's words for a lock another job holds in CT host (held: the CT's lock_held,
    of its checked types). The command to take it over is the controller's own, with the code it
    checked; none when the CT's code is not one or the holder's worker still runs."""
    now = time.time() if now is None else now
    renewed = held.get("renewed") if held.get("renewed") is not None else held.get("since")
    words = (f"{printable(host, 200)}: the CT is being redeployed by {_quoted(held.get('holder'))} (as its lock file "
             f"says) since {_utc(held.get('since'))}, last phase {_quoted(held.get('phase'))}; its lease runs until "
             f"{_utc(held.get('expires'))}")
    if isinstance(renewed, (int, float)):
        words += f", renewed {max(0, round(now - renewed))} s ago"
    worker = held.get("worker_pid")
    code = held.get("takeover_code")
    if worker is not None:
        words += (f". Its worker in the CT (PID {worker}) is alive and keeps the lease: the lock is not taken over; it "
                  "is free within one lease of that worker's end")
    elif isinstance(code, str) and TAKEOVER_CODE.fullmatch(code):
        words += (". It is free once the lease ends, unless renewed. If that job is known to be gone, take the lock "
                  f"over with its takeover code: -e {TAKEOVER_VARIABLE}={code}")
    else:
        words += ". It is free once the lease ends, unless renewed"
    if held.get("ct_state"):
        words += f". Now in this CT, as it says: {_quoted(held['ct_state'])}"
    return words + "."


class CTModuleAction(ActionBase):
    """An action plugin whose module runs in a CT: its answer taken through untrusted.AnswerCheck
    before ansible-core or the project reads or shows any of it, the job's takeover code checked
    before the module runs, a lock refusal said by the controller, the payload kept."""

    _call = None  # (module, host) of the module call under way, whose answer is checked

    def _execute_module(self, module_name=None, module_args=None, tmp=None, task_vars=None, **kwargs):
        name = (module_name or self._task.resolved_action or self._task.action).rpartition(".")[2]
        task_vars = task_vars or {}
        module_args = dict(self._task.args if module_args is None else module_args)
        if module_args.get("lock_holder"):
            code = checked_takeover(task_vars)
            if code is not None:
                module_args["lock_takeover"] = code
        self._call = (name, task_vars.get("inventory_hostname") or self._play_context.remote_addr or "?")
        payload_cache.restore(name)
        try:
            return super()._execute_module(module_name, module_args, tmp, task_vars, **kwargs)
        finally:
            payload_cache.keep(name)

    def _parse_returned_data(self, res, profile, *args, **kwargs):
        # before ansible-core reads it: it shows a module's warnings and failure raw, finds JSON after
        # any text before it, and takes a failure's words for its error as it parses them
        if self._call is not None:
            check = untrusted.AnswerCheck(*self._call, decoder=get_module_decoder(profile, Direction.MODULE_TO_CONTROLLER))
            answer = check.answer(res.get("stdout") or "", res.get("stderr") or "", res.get("rc"))
            if isinstance(answer.get("lock_held"), dict):  # its fields are in the words, a code only once checked
                held = answer.pop("lock_held")
                if answer.get("failed"):  # ansible-core's error says exception's words first: the CT's
                    answer.pop("exception", None)
                    answer["msg"] = refusal_words(check.host, held)
            res = dict(res, stdout=json.dumps(answer, allow_nan=False), stderr="")
        return super()._parse_returned_data(res, profile, *args, **kwargs)
