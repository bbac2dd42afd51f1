# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""no_graceful=wait_for_checkpoint (Python 3.8 compatible): when no signal can make the trainer
checkpoint (HF Trainer and most frameworks save on none), the stop sends nothing until the
trainer's own next periodic checkpoint has landed, then climbs the ladder right after it
(module_utils/stop/ladder.py), or refuses with what a stop would lose.
"""

from __future__ import annotations

import os
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoint_verdict
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop.ladder import LANDED_POLL


def wait_for_next_checkpoint(options, directory, before, main_ident, result, climb):
    """Send nothing until a checkpoint completed since the stop began has landed (its save over,
    Layout.save_over), then return at once: the signal that ends the trainer follows the
    completion mark within LANDED_POLL. A save under way when the stop began counts once it
    completes. Raise StopRefused when none lands within 1.5x the interval the trainer's own saves
    show (or next_checkpoint_timeout) and no save is under way; a save under way is waited for
    up to graceful_wait_cap, never given up on for a guess from the interval."""
    interval = result["loss_at_start"]["checkpoint_interval_s"]
    under_way = directory.saves_under_way(before)
    if interval is None and not under_way:
        raise StopRefused(
            f"{result['graceful_reason']}; and {options.checkpoint_dir or 'no checkpoint_dir'}"
            " shows no periodic checkpoint history to wait for and no save under way. Nothing was "
            f"signalled. {checkpoint_verdict.describe_loss(result['loss_at_start'])}. To stop anyway: "
            "no_graceful=proceed.")
    bound = min(1.5 * interval, float(options.next_checkpoint_timeout)) if interval is not None else 0.0
    cap = max(bound, float(options.graceful_wait_cap))
    began = time.monotonic()
    while True:
        elapsed = time.monotonic() - began
        if not proctable.alive(main_ident):
            return
        name = directory.landed(before)
        if name is not None:
            climb.landed = name
            climb.event(event="checkpoint_landed", path=os.path.join(directory.path, name),
                        waited=round(elapsed, 3))
            return
        if elapsed >= bound:
            under_way = directory.saves_under_way(before)
            if not under_way or elapsed >= cap:
                break
        climb.progress(stage=0, signal="none (waiting for the trainer's own checkpoint"
                       + (f": {', '.join(under_way)} under way)" if under_way else ")"),
                       elapsed=round(elapsed, 1), bound=round(cap if under_way else bound, 1), running=1)
        time.sleep(LANDED_POLL)
    why = (f"a save still under way ({', '.join(under_way)}) after graceful_wait_cap {cap:.0f}s" if under_way
           else f"no new periodic checkpoint landed within {bound:.0f}s (1.5x the observed interval of {interval}s)"
           if interval is not None else "the save under way ended without a complete checkpoint")
    raise StopRefused(
        f"{result['graceful_reason']}; {why}. Nothing was signalled. "
        f"{checkpoint_verdict.describe_loss(directory.loss())}. To stop anyway: no_graceful=proceed.")


class StopRefused(Exception):
    """The stop refused to signal anything; the message says why and what a stop loses."""
