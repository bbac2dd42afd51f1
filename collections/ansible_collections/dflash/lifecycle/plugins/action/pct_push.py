# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin of dflash.lifecycle.pct_push: controller file -> node -> CT in three SSH
sessions on the node (private temporary directory, transfer, pct push + clean-up) and no
Python on the node, where ansible.builtin.copy + command + file would start three modules."""

from __future__ import annotations

import os
import shlex

from ansible.plugins.action import ActionBase

from ansible_collections.dflash.lifecycle.plugins.module_utils.node.installed_hookscript import printable

ARGUMENT_SPEC = {
    "src": {"type": "path", "required": True},
    "vmid": {"type": "int", "required": True},
    "dest": {"type": "str", "required": True},
    "perms": {"type": "str", "default": "0600"},
}


class ActionModule(ActionBase):
    # it transfers a file, but into a directory that run makes and removes itself: with True,
    # ActionBase.run would make another first (one SSH session more) and leave it on the node
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _spec, params = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        if not os.path.isfile(params["src"]):
            return dict(result, failed=True, msg=f"src: {params['src']} is not a file on the controller")
        argv = ["pct", "push", str(params["vmid"]), None, params["dest"], "--perms", params["perms"]]
        result.update(changed=True, src=params["src"], dest=params["dest"], vmid=params["vmid"])
        if self._task.check_mode:
            return dict(result, msg=f"would push {params['src']} to CT {params['vmid']}:{params['dest']}")
        tmpdir = self._make_tmp_path()  # 0700, under the node user's remote_tmp
        argv[3] = self._connection._shell.join_path(tmpdir, os.path.basename(params["src"]))
        self._transfer_file(params["src"], argv[3])
        # one session: push, then remove the transit copy whatever pct said
        command = f"{shlex.join(argv)}; rc=$?; rm -rf {shlex.quote(tmpdir)}; exit $rc"
        res = self._low_level_execute_command(command, sudoable=False)
        self._connection._shell.tmpdir = None  # removed above: no clean-up session after the task
        result.update(rc=res["rc"], stdout=res["stdout"], stderr=res["stderr"], cmd=shlex.join(argv))
        if res["rc"] != 0:
            result.update(failed=True, msg=f"pct push to CT {params['vmid']} failed (rc {res['rc']}): "
                                           f"{printable(res['stderr'].strip() or res['stdout'].strip(), 2000)}")
        else:
            result["msg"] = f"pushed {params['src']} to CT {params['vmid']}:{params['dest']}"
        return result
