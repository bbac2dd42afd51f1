# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: lock_holder
short_description: The name this run of a playbook holds the per-CT lock under
version_added: 0.2.0
author: DFlash lifecycle maintainers (@dflash-lifecycle)
description:
  - Returns one name for the whole run of a playbook, the same in every task and for every host,
    without a task of its own - C(awx job <id> (<user>)) under AWX / Automation Controller, else
    C(<user>@<controller host> ansible-playbook pid <pid>).
  - The PID is that of the ansible-playbook process, so an operator can tell whether the holder of
    a lock still runs (C(ps -p <pid>) on that controller) before taking the lock over.
  - Every playbook of the project sets it as C(lock_holder) of the action group
    C(dflash.lifecycle.redeploy) through C(module_defaults).
options: {}
"""

EXAMPLES = r"""
- name: Run the stop under the per-CT lock
  module_defaults:
    group/dflash.lifecycle.redeploy:
      lock_holder: "{{ lookup('dflash.lifecycle.lock_holder') }}"
  dflash.lifecycle.staged_stop:
    pattern: train_dflash_pipeline[.]py
"""

RETURN = r"""
_raw:
  description: The holder's name, one element.
  type: list
  elements: str
  sample: ["alice@laptop ansible-playbook pid 4242"]
"""

import getpass
import multiprocessing
import os
import socket

from ansible.plugins.lookup import LookupBase


def holder(variables):
    """awx job <id> (<user>), or <user>@<host> ansible-playbook pid <pid>."""
    job = variables.get("awx_job_id") or variables.get("tower_job_id")
    if job is not None:
        user = variables.get("awx_user_name") or variables.get("tower_user_name") or "?"
        return f"awx job {job} ({user})"
    # tasks run in worker processes forked from ansible-playbook: name the playbook's process
    parent = multiprocessing.parent_process()
    pid = parent.pid if parent is not None else os.getpid()
    return f"{getpass.getuser()}@{socket.gethostname()} ansible-playbook pid {pid}"


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        return [holder(variables or {})]
