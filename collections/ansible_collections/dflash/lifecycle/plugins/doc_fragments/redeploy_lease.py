# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    """The redeploy lease options shared by the modules of action group dflash.lifecycle.redeploy."""

    DOCUMENTATION = r"""
options:
  lock_holder:
    description:
      - Run this task under the per-CT redeploy lock of this holder (the lock of
        M(dflash.lifecycle.redeploy_lock)). Before it does anything else the task takes the lock
        or renews its lease; a lock held by another holder whose lease has not ended fails the
        task at once, naming the holder and since when; an expired one is taken over.
      - C(redeploy.yml) sets it for every module of the action group C(dflash.lifecycle.redeploy)
        through C(module_defaults), so that the first task of a redeploy in the CT takes the lock,
        every later one finds out at once if another redeploy took it over, and no task of its own
        is needed to take it.
      - Unset, the lock is neither read nor written.
      - The lock is taken and renewed in check mode too, since a dry run must not overlap a real one.
    type: str
  lock_ttl:
    description: Lease in seconds from this task on.
    type: float
    default: 1800
  lock_path:
    description: Lock file.
    type: path
    default: /run/dflash/redeploy.lock
  lock_release:
    description: Give the lock back once this task succeeded (the last task of a redeploy).
    type: bool
    default: false
  lock_takeover:
    description:
      - Take the lock over from this holder even though its lease has not ended, with a warning.
        For a redeploy that is gone before its lease ended (its controller lost the connection in
        the middle of the stop); the refusal names the holder to give here. A lock held by anyone
        else is still refused.
      - C(redeploy.yml) sets it from C(dflash_lock_takeover).
    type: str
"""
