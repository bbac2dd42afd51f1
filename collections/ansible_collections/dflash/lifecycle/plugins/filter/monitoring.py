# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The filters of the runs' monitoring (docs/monitoring.md): Prometheus's target list
(roles/metrics_targets) and the key each CT signs its webhook events with (roles/trainer_launch).

Its module_utils are imported when it runs (docs/performance.md, "Filters load lazily"): to find any
one of the collection's filters, ansible-core loads every filter file of it in each task's worker,
compiling what they import from source."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError


def prometheus_target(name, vmid, node, listen, target="", gang="", addresses=()):
    """One CT's entry of a file SD list: where Prometheus scrapes it and who it is (ct, vmid, node,
    gang: from the inventory, never from the CT). The address is never a name DNS answers for:
    target (the inventory's metrics_target), else listen's address when it is an IP address other
    than 0.0.0.0 or ::, else the first of addresses (the static ones Proxmox gives the CT's NICs, from its node's
    pct config). None for a CT that serves no metrics (listen empty)."""
    if not listen:
        return None
    import ipaddress

    from ansible_collections.dflash.lifecycle.plugins.module_utils.agent.launch_options import split_listen

    try:
        host, port = split_listen(listen)
    except ValueError as err:
        raise AnsibleFilterError(f"trainer_launch_metrics_listen of {name}: {err}") from None
    if not target:
        try:
            bound = ipaddress.ip_address(host)
        except ValueError:  # a name: what it resolves to in the CT is not Prometheus's to know
            bound = None
        found = [str(bound)] if bound is not None and not bound.is_unspecified else list(addresses)
        if not found:
            raise AnsibleFilterError(
                f"metrics_target of {name}: unset, and no address to scrape the CT at - its metrics listen on "
                f"{listen} and its Proxmox configuration gives its NICs no static address (ip=dhcp); set "
                "metrics_target to the HOST:PORT Prometheus reaches it at")
        address = ipaddress.ip_address(found[0])
        target = f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"
    try:
        split_listen(target)
    except ValueError as err:
        raise AnsibleFilterError(f"metrics_target of {name}: {err}") from None
    labels = {"ct": str(name), "vmid": str(vmid), "node": str(node)}
    if gang:
        labels["gang"] = str(gang)
    return {"targets": [target], "labels": labels}


RUNBOOKS = "https://github.com/dflash-lifecycle/dflash-lifecycle/blob/main/docs/runbooks.md"


def prometheus_target_rules(entries, job="dflash-trainers"):
    """The rule file of a target list (prometheus_target's entries): DflashTargetMissing fires for each
    CT of the list whose target Prometheus does not have - no `up` series for it in the job, from a
    list written by hand, an older one, or one that lost its entry - naming the CT."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.agent.metrics import label_value

    cts = sorted(entry["labels"]["ct"] for entry in entries)
    if not cts:
        return {"groups": []}
    expr = " or ".join(f'absent(up{{job="{label_value(job)}",ct="{label_value(ct)}"}})' for ct in cts)
    return {"groups": [{"name": "dflash-targets", "rules": [{
        "alert": "DflashTargetMissing", "expr": expr, "for": "5m", "labels": {"severity": "critical"},
        "annotations": {
            "summary": "Prometheus does not scrape {{ $labels.ct }}, a trainer CT of the inventory",
            "description": "The target list that make metrics-targets wrote holds {{ $labels.ct }}, and Prometheus has no "
                           "target for it: nothing of its run is watched, and no other alert of it can fire.",
            "runbook_url": f"{RUNBOOKS}#dflashtargetmissing"}}]}]}


def webhook_key(secret, ct):
    """The key CT ct signs its supervisor's webhook events with, derived from the team's secret
    (module_utils/agent/webhook.py): only that CT is given it."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import webhook

    if not isinstance(secret, str) or len(secret) < 16:
        raise AnsibleFilterError("trainer_launch_supervise_webhook_secret: a secret of at least 16 characters "
                                 "(from a vault) signs the CTs' webhook events")
    return webhook.derived_key(secret, str(ct))


class FilterModule:
    """prometheus_target, prometheus_target_rules, webhook_key."""

    def filters(self):
        return {"prometheus_target": prometheus_target, "prometheus_target_rules": prometheus_target_rules,
                "webhook_key": webhook_key}
