#!/usr/bin/python
# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: pve_hook_mark
short_description: Mark in a CT whether the project's Proxmox hookscript was set on it
version_added: 0.2.0
author: DFlash lifecycle maintainers (@dflash-lifecycle)
description:
  - Runs inside the CT. Writes C(pve-hook.json) in the CT's lifecycle directory, which the run's
    metrics read to tell a CT that started without the hook (C(dflash_pve_hook_present) in
    docs/monitoring.md) - whether C(make pve-hooks) set the hookscript or took it off, and when. The
    marker's modification time is the node's clock, as the CT's start time is.
  - A CT whose run no launch of this project started yet has no lifecycle directory; it is made as
    a launch makes it, its parents with the defaults and itself root's only. A directory that is a
    symlink, not root's or writable by others is refused, never followed.
  - The marker is rewritten at every call (its time is what the metrics read), so the task decides
    what changed (the playbook - whether the hookscript setting changed).
  - Its answer is checked on the controller as every answer from a CT is (docs/security.md).
options:
  lifecycle_dir:
    description: The CT's lifecycle directory, where the node's hookscript runs the hook.
    type: path
    required: true
  installed:
    description: Whether the hookscript is now set on the CT.
    type: bool
    required: true
  set_at:
    description: When the controller set it or took it off (epoch seconds, for people).
    type: float
    required: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
attributes:
  action:
    support: full
    details: The action plugin checks the CT's answer before ansible-core reads it.
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
    details: Says what it would write, and writes nothing.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Mark in the CT that its hookscript was set
  dflash.lifecycle.pve_hook_mark:
    lifecycle_dir: /var/lib/dflash/lifecycle
    installed: true
    set_at: "{{ now(utc=true).timestamp() }}"
"""

RETURN = r"""
path:
  description: The marker's path in the CT.
  returned: always
  type: str
  sample: /var/lib/dflash/lifecycle/pve-hook.json
installed:
  description: What the marker says.
  returned: always
  type: bool
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import history, rundir


def main():
    module = AnsibleModule(
        argument_spec={
            "lifecycle_dir": {"type": "path", "required": True},
            "installed": {"type": "bool", "required": True},
            "set_at": {"type": "float", "required": True},
        },
        supports_check_mode=True,
    )
    params = module.params
    path = os.path.join(params["lifecycle_dir"], history.HOOK_MARKER)
    if not module.check_mode:
        try:
            history.mark_hook(params["lifecycle_dir"], params["installed"], params["set_at"])
        except (OSError, rundir.UnsafePath) as err:
            module.fail_json(msg=f"lifecycle_dir: {err}", path=path, installed=params["installed"])
    module.exit_json(changed=True, path=path, installed=params["installed"])


if __name__ == "__main__":
    main()
