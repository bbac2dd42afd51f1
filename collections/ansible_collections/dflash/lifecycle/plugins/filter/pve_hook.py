# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The filters of what the node says of a CT: the Proxmox hook's policy (module_utils/agent/hook.py
and module_utils/node/installed_hookscript.py hold the rules), and the CT's configuration as
``pct config`` prints it (module_utils/node/ct_config.py). Their module_utils are imported when they
run, as filter/monitoring.py says why."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError


def pve_hook_policy(name, vmid, stop, lifecycle_dir, post_start_s, gang_margin_s, gang_names=(), gang_vmids=(),
                    pre_stop_s=0):
    """The policy the node's hookscript keeps for CT vmid (name): every field from the controller's
    inventory; pre_stop_s 0: derived from the run's stop options. pve_hookscript checks it, as the
    hookscript does, before it writes anything."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import hook
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop.stop_options import InvalidParameter

    if len(gang_names) != len(gang_vmids):
        raise AnsibleFilterError("pve_hook_policy: gang_names and gang_vmids differ in length")
    try:
        return {"name": name, "lifecycle_dir": lifecycle_dir,
                "pre_stop_s": float(pre_stop_s) or round(hook.pre_stop_bound(stop or {}, gang_margin_s), 1),
                "post_start_s": float(post_start_s), "gang_margin_s": float(gang_margin_s),
                "gang": [{"name": member, "vmid": int(member_vmid)} for member, member_vmid in zip(gang_names, gang_vmids)]}
    except (InvalidParameter, TypeError, ValueError) as err:
        raise AnsibleFilterError(f"pve_hook_policy of {name} (CT {vmid}): {err}") from None


def pct_config(config_text):
    """What the project reads of a CT's configuration, as its node's ``pct config`` prints it: the
    node's word, never the CT's."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.node import ct_config

    if not isinstance(config_text, str):
        raise AnsibleFilterError(f"pct_config: the output of pct config, not {type(config_text).__name__}")
    return {"hookscript": ct_config.value(config_text, "hookscript"), "unprivileged": ct_config.unprivileged(config_text),
            "addresses": ct_config.static_addresses(config_text)}


class FilterModule:
    """pve_hook_policy, pct_config."""

    def filters(self):
        return {"pve_hook_policy": pve_hook_policy, "pct_config": pct_config}
