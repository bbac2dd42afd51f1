# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin of dflash.lifecycle.release_manifest: the manifest is built in the controller's
own process, saving the start of a module (its packaging and a Python) on every redeploy."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct.releases import ReleaseError
from ansible_collections.dflash.lifecycle.plugins.plugin_utils import release_archive

ARGUMENT_SPEC = {
    "src": {"type": "path"},
    "git_repo": {"type": "path"},
    "git_ref": {"type": "str", "default": "HEAD"},
    "include": {"type": "list", "elements": "str", "default": ["*"]},
    "exclude": {"type": "list", "elements": "str", "default": ["__pycache__/*", "*.pyc", ".git/*"]},
    "archive_dir": {"type": "path"},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _spec, params = self.validate_argument_spec(
            argument_spec=ARGUMENT_SPEC, required_one_of=[("src", "git_repo")])
        try:
            result.update(release_archive.build_release(
                params["src"], params["include"], params["exclude"], params["archive_dir"],
                params["git_repo"], params["git_ref"]))
        except (ReleaseError, OSError) as err:
            return dict(result, failed=True, msg=str(err))
        return dict(result, changed=False)
