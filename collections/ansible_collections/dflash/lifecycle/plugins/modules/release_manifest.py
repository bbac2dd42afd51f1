#!/usr/bin/python
# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: release_manifest
short_description: Content hash, file manifest and archive of the trainer code, on the controller
version_added: 0.1.0
author: DFlash lifecycle maintainers (@dflash-lifecycle)
description:
  - Selects the trainer files from a local directory (or a git ref of a local repository), computes
    the sha256 of each and the release id (a hash of paths, modes and contents), and writes one tar
    archive of them for the push.
  - Runs on the controller, in the Ansible process itself (an action plugin, no module to ship
    and start), whatever host the task targets; it changes nothing it manages, so it also runs
    in check mode. Use it with C(run_once).
options:
  src:
    description: Directory holding the trainer code. Ignored when O(git_repo) is set.
    type: path
  git_repo:
    description: A local git repository to take the code from, at O(git_ref).
    type: path
  git_ref:
    description: Commit, branch or tag of O(git_repo).
    type: str
    default: HEAD
  include:
    description: Globs of files to ship, matched against the relative path and the file name.
    type: list
    elements: str
    default: ["*"]
  exclude:
    description: Globs of files to leave out.
    type: list
    elements: str
    default: ["__pycache__/*", "*.pyc", ".git/*"]
  archive_dir:
    description:
      - Where to write the archive C(<release>.tar.gz). Must be private to the user running
        Ansible - created C(0700) when missing; a symlink, or a directory owned by someone else
        or open to others, is refused. The archive is created with O_EXCL and hashed through the
        descriptor that wrote it.
      - Default C($XDG_CACHE_HOME/dflash-lifecycle/releases), else
        C(~/.cache/dflash-lifecycle/releases).
    type: path
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
    details: Works the same in check mode; the archive is a controller-side file.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Manifest of the trainer checkout
  dflash.lifecycle.release_manifest:
    src: ~/src/dflash
    include: ["*.py", "configs/*.yaml"]
  run_once: true
  register: trainer_manifest
"""

RETURN = r"""
release:
  description: Release id, the content hash.
  returned: always
  type: str
  sample: 3f9c0d6a41b2e7c5
files:
  description: The manifest, relative path to sha256 and mode.
  returned: always
  type: dict
archive:
  description: Path of the archive on the controller.
  returned: always
  type: str
archive_sha256:
  description: sha256 of the archive, checked inside the CT after the push.
  returned: always
  type: str
archive_bytes:
  description: Size of the archive.
  returned: always
  type: int
"""

# The work is done by the action plugin of the same name (plugins/action/release_manifest.py);
# this file holds its documentation.
