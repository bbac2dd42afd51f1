#!/usr/bin/python
# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: trainer_release
short_description: Install, activate and roll back content-addressed trainer releases in a CT
version_added: 0.1.0
author: DFlash lifecycle maintainers (@dflash-lifecycle)
description:
  - Layout under O(base) inside the container. C(releases/<id>/) holds one release, C(current) and
    C(previous) are symlinks into C(releases/).
  - V(status) reports what is installed in one round trip, every release that matters (current,
    previous, O(release)) verified file by file against its manifest by sha256. A release whose
    files changed, appeared or disappeared in place (an edit through the legacy link
    C(/root/train_dflash_pipeline.py)) has drifted - RV(drift) lists its files, and it does not
    count as RV(present).
  - V(install) unpacks an archive already pushed into the CT under a temporary name, checks the
    archive and every file against the controller's checksums (C(pct push) exits 0 even when the
    copy failed), compiles every .py with the CT's own python (a syntax error fails, naming the
    file, the line and the message, and changes nothing), renames the release into place and prunes old
    releases. A drifted copy of the release is set aside as C(releases/.drifted-<id>-<time>/) (the
    edit is kept) and the release is unpacked afresh. It never touches C(current). No owner, link
    or device from the archive is ever applied.
  - V(activate) points C(current) at the release (the former one becomes C(previous)), with atomic
    symlink renames, and links legacy paths such as C(/root/train_dflash_pipeline.py) into it.
  - V(rollback) swaps C(current) and C(previous); it refuses a previous release that failed to
    launch or has drifted.
  - V(restore) points C(current) and C(previous) at exactly O(current) and O(previous) (the rescue
    of a failed launch returns to what ran before the redeploy).
options:
  base:
    description: Directory of the releases inside the CT.
    type: path
    required: true
  state:
    description: What to do.
    type: str
    choices: [status, install, activate, rollback, restore]
    default: status
  release:
    description: Release id (from M(dflash.lifecycle.release_manifest)).
    type: str
  archive:
    description: The pushed archive inside the CT (V(install)); removed afterwards.
    type: path
  archive_sha256:
    description: sha256 of the archive as the controller computed it (V(install)).
    type: str
  files:
    description:
      - The manifest from M(dflash.lifecycle.release_manifest). Required for V(install); with
        V(status) the result lists the changes from the current release (and a diff).
    type: dict
  keep:
    description: Releases to keep after V(install); the current and previous ones always stay.
    type: int
    default: 5
  legacy_links:
    description: With V(activate), paths to turn into symlinks to a file of the current release.
    type: list
    elements: dict
    default: []
  current:
    description: With V(restore), the release C(current) points to afterwards.
    type: str
  previous:
    description: With V(restore), the release C(previous) points to afterwards (none when empty).
    type: str
extends_documentation_fragment:
  - dflash.lifecycle.redeploy_lease
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
    support: full
    details: V(status) runs; the other states report what they would do.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Activate the release
  dflash.lifecycle.trainer_release:
    base: /opt/dflash
    state: activate
    release: "{{ trainer_manifest.release }}"
    legacy_links:
      - {path: /root/train_dflash_pipeline.py, target: train_dflash_pipeline.py}
"""

RETURN = r"""
lock:
  description: >-
    The redeploy lock this task ran under (holder, since and expires as epoch seconds,
    taken_over_from, msg, released), also when it failed after taking it.
  returned: when O(lock_holder) is set
  type: dict
current:
  description: Release C(current) points to after the task.
  returned: always
  type: str
previous:
  description: Release C(previous) points to after the task.
  returned: always
  type: str
present:
  description: Whether O(release) is installed and matches its manifest.
  returned: always
  type: bool
drift:
  description: >-
    Releases (current, previous, O(release)) whose files no longer match their manifest, each with
    the files C(modified), C(added) and C(removed).
  returned: always
  type: dict
  sample: {3f2a9c0d1e2b4a5f: {modified: [train_dflash_pipeline.py], added: [], removed: []}}
launch_failures:
  description: Releases that failed to launch, with the error; never a rollback target.
  returned: always
  type: dict
rolled_back_to:
  description: With V(rollback), the release now current.
  returned: when state is rollback
  type: str
repaired_drift:
  description: With V(install), the files of the release that had drifted and were reinstalled.
  returned: when a drifted release was reinstalled
  type: dict
drifted_copy:
  description: With V(install), where the drifted copy of the release was set aside.
  returned: when a drifted release was reinstalled
  type: str
releases:
  description: Installed releases with their install time.
  returned: always
  type: list
  elements: dict
current_files:
  description: Files of the current release.
  returned: always
  type: list
  elements: str
changes:
  description: With V(status) and O(files), files added, removed and modified against current.
  returned: when state is status and files is given
  type: dict
pruned:
  description: Releases removed by V(install).
  returned: when state is install
  type: list
  elements: str
"""

from ansible_collections.dflash.lifecycle.plugins.module_utils import leased
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import releases


def main():
    module = leased.LeasedModule(
        phase=lambda params: f"release {params['state']}",
        argument_spec={
            "base": {"type": "path", "required": True},
            "state": {"type": "str", "default": "status",
                      "choices": ["status", "install", "activate", "rollback", "restore"]},
            "release": {"type": "str"},
            "archive": {"type": "path"},
            "archive_sha256": {"type": "str"},
            "files": {"type": "dict"},
            "keep": {"type": "int", "default": 5},
            "legacy_links": {"type": "list", "elements": "dict", "default": []},
            "current": {"type": "str"},
            "previous": {"type": "str"},
        },
        required_if=[("state", "install", ("release", "archive", "archive_sha256", "files")),
                     ("state", "activate", ("release",)),
                     ("state", "restore", ("current",))],
        supports_check_mode=True,
    )
    params = module.params
    base, state = params["base"], params["state"]
    if state == "status":  # one read of what is installed
        installed = (releases.status(base, params["release"]) if params["files"] is None
                     else releases.compared(base, params["release"], params["files"]))
        module.exit_json(changed=False, **installed)
    result = {"changed": False}
    try:
        if state == "install":
            result["changed"] = not releases.status(base, params["release"])["present"]
            if result["changed"] and not module.check_mode:
                result["changed"], details = releases.install(
                    base, params["release"], params["archive"], params["archive_sha256"],
                    params["files"], params["keep"])
                result.update(details)
        elif state == "activate":
            result["changed"] = releases.switch(base, params["release"], params["legacy_links"],
                                                module.check_mode)["changed"]
        elif state == "rollback":
            result["rolled_back_to"] = releases.rollback(base, module.check_mode)
            result["changed"] = True
        elif state == "restore":
            result["changed"] = releases.restore(base, params["current"], params["previous"],
                                                 module.check_mode)
    except releases.ReleaseError as err:
        module.fail_json(msg=str(err), **releases.status(base, params["release"]))
    after = releases.status(base, params["release"])
    del after["current_manifest"]  # only status needs it (for diffs); keep results small
    module.exit_json(**result, **after)


if __name__ == "__main__":
    main()
