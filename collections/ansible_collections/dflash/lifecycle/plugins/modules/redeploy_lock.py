#!/usr/bin/python
# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: redeploy_lock
short_description: Per-CT lock so that two redeploys never work on one CT at once
version_added: 0.1.0
author: DFlash lifecycle maintainers (@dflash-lifecycle)
description:
  - Runs inside the CT. V(acquired) takes the lock for O(holder) or renews its lease; a lock
    held by someone else whose lease has not ended fails the task at once, naming the holder and
    since when. A lock whose lease ended (its redeploy was killed or lost its connection) is
    taken over, and the result says from whom.
  - V(released) drops the lock if O(holder) has it.
  - V(cancelled) says that the job of O(holder) was cancelled after its launch call began in the
    CT (the C(dflash.lifecycle.lock_on_cancel) callback sends it before the job ends). The CT's
    record of the change that job made (O(change_record)) then says that its controller did not see
    it end, and C(make status) and the next redeploy report how it ended. The lock stays, and the CT's
    worker finishes the change and gives it back.
  - The lock lives in a root-only directory; files are written with O_NOFOLLOW and renamed into
    place under flock, so symlinks planted there are never followed.
options:
  path:
    description: Lock file.
    type: path
    default: /run/dflash/redeploy.lock
  holder:
    description: Who holds it, for example C(awx job 42 (admin)) or C(alice@laptop pid 4242).
    type: str
    required: true
  ttl:
    description: Lease in seconds; each acquire by the same holder renews it.
    type: float
    default: 60
  controller_gone:
    description:
      - With O(state=released), the job that holds the lock is gone (its controller died while its call
        ran in the CT) - the CT's record of the change it made (O(change_record)) says so, for
        C(make status) and the next redeploy. The launch's action plugin sends it when its
        C(ansible-playbook) died while the module ran.
    type: bool
    default: false
  change_record:
    description: The CT's record of the last change to the run.
    type: path
    default: /var/lib/dflash/last-change.json
  state:
    description: Take or drop the lock, or record that its job was cancelled.
    type: str
    choices: [acquired, released, cancelled]
    default: acquired
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
attributes:
  action:
    support: none
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: none
    details: Skipped in check mode unless the task sets C(check_mode=false), as the playbooks do so
      that a dry run never overlaps a real one.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Lock the CT for this redeploy
  dflash.lifecycle.redeploy_lock:
    holder: "{{ awx_user_name | default(lookup('env', 'USER')) }}"
"""

RETURN = r"""
lock:
  description: The lock now in place (holder, since, expires as epoch seconds).
  returned: when state is acquired
  type: dict
taken_over_from:
  description: The expired lock that was replaced, if any.
  returned: when state is acquired
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import change_record, lock, rundir


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "default": "/run/dflash/redeploy.lock"},
            "holder": {"type": "str", "required": True},
            "ttl": {"type": "float", "default": 60},
            "state": {"type": "str", "choices": ["acquired", "released", "cancelled"], "default": "acquired"},
            "controller_gone": {"type": "bool", "default": False},
            "change_record": {"type": "path", "default": change_record.DEFAULT_PATH},
        },
        supports_check_mode=False,
    )
    params = module.params
    try:
        if params["state"] == "released" and params["controller_gone"]:
            held = (lock.read(params["path"]) or {}).get("holder") == params["holder"]
            change_record.without_controller(params["change_record"], (params["path"], params["holder"], 0))
            module.exit_json(changed=held)
        if params["state"] == "released":
            module.exit_json(changed=lock.release(params["path"], params["holder"]))
        if params["state"] == "cancelled":
            try:
                module.exit_json(changed=change_record.mark_unseen(params["change_record"], params["holder"]))
            except OSError as err:
                module.fail_json(msg=f"change_record: {err}")
        taken = lock.take(params["path"], params["holder"], params["ttl"])
    except lock.LockHeld as err:
        module.fail_json(msg=str(err), lock_held=err.held)
    except rundir.UnsafePath as err:
        module.fail_json(msg=str(err))
    module.exit_json(changed=taken.pop("changed"), msg=taken.pop("msg"),
                     taken_over_from=taken.pop("taken_over_from"), lock=taken)


if __name__ == "__main__":
    main()
