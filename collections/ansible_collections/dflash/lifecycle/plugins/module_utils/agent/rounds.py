# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gang's rounds (Python 3.8 compatible, the standard library only): each member's supervisor
writes its member's end into the round (in the checkpoint directory the gang's members share;
one member alone is a gang of one, in its lifecycle directory), waits until every member is down,
and counts the crash loop and times the back-off by the gang's rounds.
"""

from __future__ import annotations

import json
import os
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import supervision
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct.rundir import read_json, write_atomic


def round_dir(sup, number):
    return os.path.join(sup.rounds_dir, str(number))


def tell_down(sup, facts):
    folder = os.path.join(round_dir(sup, sup.round), "down")
    try:
        os.makedirs(folder, mode=0o755, exist_ok=True)
        write_atomic(os.path.join(folder, f"{sup.me}.json"), json.dumps(dict(facts, at=time.time())), mode=0o644)
    except OSError as err:
        sup.say(f"cannot tell the gang this member is down: {err}")


def downs(sup, number=None):
    """{member: its end} of the round (this one by default) for the members that said it."""
    folder = os.path.join(round_dir(sup, sup.round if number is None else number), "down")
    try:
        names = os.listdir(folder)
    except OSError:
        return {}
    found = {}
    for name in names:
        if name.endswith(".json") and name[:-5] in sup.members:
            try:
                found[name[:-5]] = read_json(os.path.join(folder, name)) or {}
            except (OSError, ValueError):
                continue
    return found


def restarts_in_window(sup, now):
    """The rounds that ended within the crash-loop window, this one included, and when this
    round's first end was (the gang's one clock for its back-off)."""
    window = float(sup.policy["crash_loop_window_s"])
    counted, first = 0, None
    for number in range(sup.round + 1):
        ends = [word.get("at", 0) for word in downs(sup, number).values()]
        if not ends:
            continue
        began = min(ends)
        if number == sup.round:
            first = began
        if now - began <= window:
            counted += 1
    return counted, first if first is not None else now


def gone_down(sup, end):
    """This member's end in its round (the count and the back-off's clock are read there); for a
    gang, once every member is down: words of the members that never went down, else None."""
    tell_down(sup, {"cause": end["cause"]})
    return gang_down(sup) if len(sup.members) > 1 else None


def gang_down(sup):
    """Wait until every member of the gang said it is down in this round; words of the missing
    ones after the bound (the longest stop, and a minute), else None."""
    bound = float(sup.spec["stop"].get("graceful_wait_cap") or 900) + 60
    deadline = time.monotonic() + bound
    while True:
        missing = [m for m in sup.members if m not in downs(sup)]
        if not missing:
            return None
        if time.monotonic() >= deadline:
            return f"{', '.join(missing)} of the gang did not go down within {bound:.0f} s: the gang is not restarted"
        supervision.reap()
        time.sleep(supervision.POLL_SECONDS)
