#!/usr/bin/python
# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: model_stage
short_description: Stage a model into shared memory from its persistent copy, verified, if it fits
version_added: 0.4.0
author: DFlash lifecycle maintainers (@dflash-lifecycle)
description:
  - Runs inside the CT. For each O(models) entry, the path the trainer loads (in C(/dev/shm) or
    another tmpfs, which a CT restart wipes) is compared with its persistent copy by file names,
    sizes and modification times (a copy keeps its source's, so a shard rewritten at its old size
    differs). A target that is missing or differs is staged; one that matches is left alone.
  - The copy goes into C(.<name>.staging) beside the target, several files at once, and is renamed
    into place once every file is complete and verified. A cut copy never stands at the target, and
    a rerun removes what one left and copies again.
  - Verified by the copy's names and sizes, the shards that C(model.safetensors.index.json) names,
    and the SHA-256 sums of any C(*.sha256) file (in C(sha256sum) format) of the persistent copy,
    computed over the bytes written. Each of RV(models) says which.
  - "It must fit: a tmpfs is charged to the CT's memory cgroup. Before a byte is copied, the model's
    size plus O(reserve_gb) is compared with what the cgroup can still take (cgroup v2
    C(memory.max) - C(memory.current), v1 C(memory.limit_in_bytes) - C(memory.usage_in_bytes), both
    plus the page cache the kernel can reclaim, over the CT's cgroup and those above it) and with the
    tmpfs's free space. A model that does not fit is refused, naming the three figures."
  - A target is never replaced while the trainer runs (O(trainer)) or while any process maps it
    or holds it open.
extends_documentation_fragment:
  - dflash.lifecycle.redeploy_lease
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
options:
  models:
    description:
      - The path the trainer loads, mapped to its persistent copy (a directory with a
        C(config.json) that the CT can read, on its own disk or a mount point).
    type: dict
    required: true
  reserve_gb:
    description: Memory (GB, 10^9 bytes) kept free beside the model for the trainer's own host memory.
    type: float
    default: 32
  workers:
    description: Files copied at once.
    type: int
    default: 4
  trainer:
    description:
      - How to find the trainer (as M(dflash.lifecycle.trainer_preflight) takes it). While it runs,
        no model is staged, whether or not it holds the model's files open now.
    type: dict
    suboptions:
      pidfile:
        description: The trainer's pidfile.
        type: path
      pattern:
        description: A regular expression over the trainer's command line.
        type: str
  progress_file:
    description: Where the copy's progress (bytes, rate, ETA) is written about once a second for the
      controller to show (the action plugin); removed at the end.
    type: path
    default: /run/dflash/stage.progress.json
attributes:
  action:
    support: full
    details: The action plugin shows the copy's progress on the controller while it runs.
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
    details: Says for each model whether it would be staged, how many bytes, and whether it fits.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Put the target model back into /dev/shm after a CT restart
  dflash.lifecycle.model_stage:
    models:
      /dev/shm/Qwen3.6-27B: /workspace/models/Qwen3.6-27B
    reserve_gb: 64
"""

RETURN = r"""
lock:
  description: The redeploy lock this task ran under.
  returned: when O(lock_holder) is set
  type: dict
models:
  description: >-
    Per model - C(target), C(source), C(state) (V(matches), V(missing), V(differs), or V(staged)),
    C(differences) (the first ten), C(bytes), C(files), C(verified_by), C(fits), C(can_take) (bytes
    the CT can still take), C(reserve), C(shm_free), C(memory) (the tightest memory cgroup: C(cgroup),
    C(path), C(limit), C(usage), C(reclaimable), C(free); null without a limit), C(leftover) (bytes of
    a cut copy removed first) and, once staged, C(seconds), C(rate) (bytes per second) and C(workers).
  returned: always
  type: list
  elements: dict
  sample:
    - {target: /dev/shm/Qwen3.6-27B, source: /workspace/models/Qwen3.6-27B, state: staged, bytes: 53794812672,
       files: 14, seconds: 61.2, rate: 878999553, workers: 4, fits: true,
       verified_by: "the 11 shards of model.safetensors.index.json, names and sizes"}
msg:
  description: One line per model.
  returned: always
  type: str
"""

from ansible_collections.dflash.lifecycle.plugins.module_utils import leased
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import model_stage
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import trainer_finding


def main():
    module = leased.LeasedModule(
        phase="stage model",
        argument_spec={
            "models": {"type": "dict", "required": True},
            "reserve_gb": {"type": "float", "default": 32},
            "workers": {"type": "int", "default": 4},
            "progress_file": {"type": "path", "default": "/run/dflash/stage.progress.json"},
            "trainer": {"type": "dict", "options": {"pidfile": {"type": "path"}, "pattern": {"type": "str"}}},
        },
        supports_check_mode=True,
    )
    params = module.params
    trainer = params["trainer"]
    try:
        changed, done, msg = model_stage.stage_all(
            params["models"], params["reserve_gb"], params["workers"], params["progress_file"],
            lambda: trainer_finding.running(trainer["pidfile"], trainer["pattern"]) if trainer else None,
            module.check_mode)
    except model_stage.StageRefused as err:
        module.fail_json(msg=str(err), models=err.models)
    module.exit_json(changed=changed, models=done, msg=msg)


if __name__ == "__main__":
    main()
