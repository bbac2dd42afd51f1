#!/usr/bin/python
# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: pct_push
short_description: Copy a file from the controller into a Proxmox CT through its node with C(pct push)
version_added: 0.2.0
author: DFlash lifecycle maintainers (@dflash-lifecycle)
description:
  - Run against the CT's node (C(delegate_to) the node). Transfers O(src) into a private
    temporary directory on the node (mode C(0700)), runs C(pct push) into the CT and removes the
    temporary copy in the same SSH session, whatever C(pct push) said.
  - C(pct push) ends within O(timeout) seconds, whatever the CT holds at the target.
  - Three SSH sessions on the node and no Python there; C(ansible.builtin.copy) followed by a
    C(pct push) command and a clean-up task would start three modules.
  - C(pct push) can exit 0 without writing the file (pve-container's CLI has no upid exit handler
    for it; docs/architecture.md of this project); verify the file in the CT
    afterwards, for example with M(dflash.lifecycle.trainer_release) O(dflash.lifecycle.trainer_release#module:archive_sha256).
options:
  src:
    description: File on the controller.
    type: path
    required: true
  vmid:
    description: The CT.
    type: int
    required: true
  dest:
    description: Path inside the CT.
    type: str
    required: true
  perms:
    description: File mode in the CT (C(pct push --perms)).
    type: str
    default: "0600"
  timeout:
    description:
      - Seconds the node gives C(pct push) (coreutils C(timeout), then C(KILL) 5 s later); past them the task
        fails saying so. The CT owns the target's path - a FIFO planted there would hold C(pct push) for ever.
    type: int
    default: 300
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
attributes:
  action:
    support: full
    details: An action plugin; the node only runs a shell command.
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
    details: Reports what it would push; transfers nothing.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Push the release archive into ct200
  dflash.lifecycle.pct_push:
    src: /root/.cache/dflash-lifecycle/releases/0388a82fa6a8d99c.tar.gz
    vmid: 200
    dest: /tmp/dflash-0388a82fa6a8d99c.tar.gz
  delegate_to: pve1
"""

RETURN = r"""
cmd:
  description: The C(pct push) command run on the node (with the temporary source path).
  returned: unless in check mode
  type: str
rc:
  description: Exit status of C(pct push).
  returned: unless in check mode
  type: int
stderr:
  description: What C(pct push) printed on stderr.
  returned: unless in check mode
  type: str
"""

# The work is done by the action plugin of the same name (plugins/action/pct_push.py); this
# file holds its documentation.
