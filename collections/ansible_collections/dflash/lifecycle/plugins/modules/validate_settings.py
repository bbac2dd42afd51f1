#!/usr/bin/python
# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: validate_settings
short_description: Check every setting a job will apply, on the controller, before anything is touched
version_added: 0.2.0
author: DFlash lifecycle maintainers (@dflash-lifecycle)
description:
  - Runs on the controller, in the Ansible process itself (an action plugin), and touches nothing.
  - Every C(dflash_*) variable must be one of the run's settings - a trainer flag, the passthrough
    list C(dflash_extra_args), the environment C(dflash_env) and C(dflash_secret_env), or the
    resume choice C(dflash_resume). A misspelt key fails, naming the nearest known one
    (C(dflash_warmup_ratoi - did you mean dflash_warmup_ratio?)); the values are checked by the
    rules of P(dflash.lifecycle.dflash_argv#filter).
  - Every variable in a role's namespace (C(trainer_<role>_*)) or a job setting (C(redeploy_*))
    that no role of the project knows fails the same way; a renamed one names its new name.
  - The variables of the roles in O(roles) are checked against their argument specs.
  - Each failure is one line that names the variable, the value and the rule; all of them are in
    RV(errors).
options:
  roles:
    description:
      - Roles whose variables the job applies, C(role) (its main entry point) or C(role.entry_point).
    type: list
    elements: str
    required: true
  roles_dir:
    description: The project's roles directory; found beside the playbook (or one level up) when unset.
    type: path
  settings:
    description: Also check the C(dflash_*) settings.
    type: bool
    default: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
attributes:
  action:
    support: full
    details: Runs in the controller's Ansible process.
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
    details: Only reads variables.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Check every setting the redeploy applies
  dflash.lifecycle.validate_settings:
    roles: [trainer_run.validate, trainer_preflight, trainer_code, trainer_stop, trainer_launch]
"""

RETURN = r"""
gpus_needed:
  description: GPUs the run needs (its highest GPU id + 1).
  returned: when settings is true and they are valid
  type: int
errors:
  description: Every failure, one line each.
  returned: failure
  type: list
  elements: str
"""

# The work is done by the action plugin of the same name (plugins/action/validate_settings.py);
# this file holds its documentation.
