# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    """The redeploy lease options shared by the modules of action group dflash.lifecycle.redeploy."""

    DOCUMENTATION = r"""
options:
  lock_holder:
    description:
      - Run this task under the per-CT lock of this holder (the lock of
        M(dflash.lifecycle.redeploy_lock)). Before it does anything else the task takes the lock
        or renews its lease and records its phase there; a lock held by another holder whose
        lease has not ended fails the task at once, naming the holder, since when, the phase it
        last reached, and the CT's state (whether the trainer of the pidfile beside the lock runs,
        since when, and the newest checkpoint in its C(--output-dir)); an expired one is taken over.
      - Every playbook of the project sets it for every module of the action group
        C(dflash.lifecycle.redeploy) through C(module_defaults) (C(trainer_run_lock)), so the first
        task of a job in the CT takes the lock, every later one finds out at once if another job
        took it over, and no task of its own is needed to take it.
      - Unset, the lock is neither read nor written.
      - The lock is taken and renewed in check mode too, since a dry run must not overlap a real one.
      - M(dflash.lifecycle.trainer_preflight), the first call of a redeploy, gives back a lock it
        took when it crashes (an error of its own, not a failed check), since its failure names no
        lock, so the job could not give it back and every job would be refused until the lease ends.
    type: str
  lock_ttl:
    description:
      - Lease in seconds from this task on. A detached worker this task starts in the CT (a stop, a
        launch) renews it every third of it while it works, so a long wait for a checkpoint keeps the
        CT, and a holder that dies (a killed controller, a lost connection) frees it within one lease.
    type: float
    default: 60
  lock_path:
    description: Lock file.
    type: path
    default: /run/dflash/redeploy.lock
  lock_unlock:
    description: Give the lock back once this task succeeded (the last task of a job in the CT).
    type: bool
    default: false
    aliases: [lock_release]
  lock_takeover:
    description:
      - Take the lock over even though its lease has not ended, with a warning - the lock's takeover
        code, 12 hex digits that the refusal gives. For a redeploy that is gone before its lease
        ended (its controller lost the connection in the middle of the stop). Any other lock is
        still refused, and so is one whose worker still runs in the CT.
      - A code, never the holder's text - a CT wrote that, and a job must not be given it to template.
      - The playbooks set it from C(redeploy_lock_takeover).
    type: str
"""
