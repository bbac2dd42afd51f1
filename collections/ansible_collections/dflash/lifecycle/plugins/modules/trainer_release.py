#!/usr/bin/python
# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: trainer_release
short_description: Install, activate and roll back content-addressed trainer releases in a CT
version_added: 0.1.0
author: dflash-lifecycle contributors
description:
  - Layout under O(base) inside the container. C(releases/<id>/) holds one release, C(current) and
    C(previous) are symlinks into C(releases/).
  - V(status) reports what is installed in one round trip.
  - V(install) unpacks an archive already pushed into the CT under a temporary name, checks the
    archive and every file against the controller's checksums (C(pct push) exits 0 even when the
    copy failed), compiles every .py with the CT's own python (a syntax error fails, naming the
    file, the line and the message, and changes nothing), renames the release into place and prunes old
    releases. It never touches C(current).
  - V(activate) points C(current) at the release (the former one becomes C(previous)), with atomic
    symlink renames, and links legacy paths such as C(/root/train_dflash_pipeline.py) into it.
  - V(rollback) swaps C(current) and C(previous).
options:
  base:
    description: Directory of the releases inside the CT.
    type: path
    required: true
  state:
    description: What to do.
    type: str
    choices: [status, install, activate, rollback]
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
extends_documentation_fragment:
  - dflash.lifecycle.redeploy_lease
attributes:
  check_mode:
    support: full
    details: V(status) runs; the other states report what they would do.
  diff_mode:
    support: none
  platform:
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
  description: With V(status), whether O(release) is installed and complete.
  returned: always
  type: bool
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

from ansible_collections.dflash.lifecycle.plugins.module_utils import leased, releases


def main():
    module = leased.LeasedModule(
        argument_spec={
            "base": {"type": "path", "required": True},
            "state": {"type": "str", "default": "status",
                      "choices": ["status", "install", "activate", "rollback"]},
            "release": {"type": "str"},
            "archive": {"type": "path"},
            "archive_sha256": {"type": "str"},
            "files": {"type": "dict"},
            "keep": {"type": "int", "default": 5},
            "legacy_links": {"type": "list", "elements": "dict", "default": []},
        },
        required_if=[("state", "install", ("release", "archive", "archive_sha256", "files")),
                     ("state", "activate", ("release",))],
        supports_check_mode=True,
    )
    params = module.params
    base, state = params["base"], params["state"]
    if state == "status":  # one read of what is installed
        installed = (releases.status(base, params["release"]) if params["files"] is None
                     else releases.compared(base, params["release"], params["files"]))
        module.exit_json(changed=False, **installed)
    before = releases.status(base, params["release"])
    result = {"changed": False}
    try:
        if state == "install":
            result["changed"] = not before["present"]
            if result["changed"] and not module.check_mode:
                result["changed"], details = releases.install(
                    base, params["release"], params["archive"], params["archive_sha256"],
                    params["files"], params["keep"])
                result.update(details)
        elif state == "activate":
            result["changed"] = releases.switch(base, params["release"], params["legacy_links"],
                                                module.check_mode)["changed"]
        elif state == "rollback":
            result["changed"] = True
            if not before["previous"]:
                raise releases.ReleaseError(f"no previous release to roll back to in {base}")
            if not module.check_mode:
                releases.rollback(base)
    except releases.ReleaseError as err:
        module.fail_json(msg=str(err), **before)
    after = releases.status(base, params["release"])
    del after["current_manifest"]  # only status needs it (for diffs); keep results small
    module.exit_json(**result, **after)


if __name__ == "__main__":
    main()
