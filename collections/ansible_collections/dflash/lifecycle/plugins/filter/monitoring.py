# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The filter of Prometheus's target list (roles/metrics_targets, docs/monitoring.md).

Its module_utils are imported when it runs (docs/performance.md, "Filters load lazily"): to find any
one of the collection's filters, ansible-core loads every filter file of it in each task's worker,
compiling what they import from source."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError


def prometheus_target(name, vmid, node, listen, target="", gang=""):
    """One CT's entry of a file SD list: where Prometheus scrapes it (target, else the CT's name on
    the port of listen) and who it is (ct, vmid, node, gang: from the inventory, never from the
    CT). None for a CT that serves no metrics (listen empty)."""
    if not listen:
        return None
    from ansible_collections.dflash.lifecycle.plugins.module_utils.agent.launch_options import split_listen

    try:
        _host, port = split_listen(listen)
    except ValueError as err:
        raise AnsibleFilterError(f"trainer_launch_metrics_listen of {name}: {err}") from None
    address = target or f"{name}:{port}"
    try:
        split_listen(address)
    except ValueError as err:
        raise AnsibleFilterError(f"metrics_target of {name}: {err}") from None
    labels = {"ct": str(name), "vmid": str(vmid), "node": str(node)}
    if gang:
        labels["gang"] = str(gang)
    return {"targets": [address], "labels": labels}


class FilterModule:
    """prometheus_target."""

    def filters(self):
        return {"prometheus_target": prometheus_target}
