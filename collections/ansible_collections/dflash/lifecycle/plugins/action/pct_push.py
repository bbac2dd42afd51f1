# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin of dflash.lifecycle.pct_push: controller file -> node -> CT in three SSH
sessions on the node (private temporary directory, transfer, pct push + clean-up) and no
Python on the node, where ansible.builtin.copy + command + file would start three modules. The push
is bounded in time on the node: the CT owns the path it writes."""

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
    "timeout": {"type": "int", "default": 300},
}
# what coreutils' timeout leaves after its signal, and after the KILL that follows it
TIMED_OUT = (124, 137)
KILL_AFTER_S = 5


class ActionModule(ActionBase):
    # it transfers a file, but into a directory that run makes and removes itself: with True,
    # ActionBase.run would make another first (one SSH session more) and leave it on the node
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _spec, params = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        if params["timeout"] < 1:
            return dict(result, failed=True, msg=f"timeout: {params['timeout']} must be at least 1 (seconds)")
        if not os.path.isfile(params["src"]):
            return dict(result, failed=True, msg=f"src: {params['src']} is not a file on the controller")
        argv = ["pct", "push", str(params["vmid"]), None, params["dest"], "--perms", params["perms"]]
        result.update(changed=True, src=params["src"], dest=params["dest"], vmid=params["vmid"])
        if self._task.check_mode:
            return dict(result, msg=f"would push {params['src']} to CT {params['vmid']}:{params['dest']}")
        tmpdir = self._make_tmp_path()  # 0700, under the node user's remote_tmp
        argv[3] = self._connection._shell.join_path(tmpdir, os.path.basename(params["src"]))
        self._transfer_file(params["src"], argv[3])
        # one session: push, bounded (the CT owns the target: a FIFO there would hold pct), then remove
        # the transit copy whatever pct said
        bounded = ["timeout", "-k", str(KILL_AFTER_S), str(params["timeout"]), *argv]
        command = f"{shlex.join(bounded)}; rc=$?; rm -rf {shlex.quote(tmpdir)}; exit $rc"
        res = self._low_level_execute_command(command, sudoable=False)
        self._connection._shell.tmpdir = None  # removed above: no clean-up session after the task
        # what pct said of the CT's side (a path's error) is shown as a CT's words are
        result.update(rc=res["rc"], stdout=printable(res["stdout"], 2000, lines=True),
                      stderr=printable(res["stderr"], 2000, lines=True), cmd=shlex.join(argv))
        if res["rc"] in TIMED_OUT:
            result.update(failed=True, msg=f"pct push to CT {params['vmid']}:{params['dest']} did not end within "
                                           f"{params['timeout']} s: the node ended it (what the CT holds at the target "
                                           "may hold a write: a FIFO, a stalled mount)")
        elif res["rc"] != 0:
            result.update(failed=True, msg=f"pct push to CT {params['vmid']} failed (rc {res['rc']}): "
                                           f"{printable(res['stderr'].strip() or res['stdout'].strip(), 2000)}")
        else:
            result["msg"] = f"pushed {params['src']} to CT {params['vmid']}:{params['dest']}"
        return result
