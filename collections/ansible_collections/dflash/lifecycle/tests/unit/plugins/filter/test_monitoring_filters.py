"""The filter of Prometheus's target list (plugins/filter/monitoring.py): who a CT is comes from the
inventory, where it is scraped from the inventory or the address Proxmox gives it (never a name DNS
answers for), a CT without metrics is left out, a bad address names its variable."""

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.dflash.lifecycle.plugins.filter.monitoring import FilterModule

prometheus_target = FilterModule().filters()["prometheus_target"]


def test_a_ct_is_listed_with_the_inventorys_labels_at_the_address_proxmox_gives_it():
    assert prometheus_target("ct200", 200, "pve1", "0.0.0.0:9733", addresses=["10.1.2.30", "fd00::7"]) == {
        "targets": ["10.1.2.30:9733"], "labels": {"ct": "ct200", "vmid": "200", "node": "pve1"}}
    assert prometheus_target("ct200", 200, "pve1", "[::]:9733", addresses=["fd00::7"])["targets"] == ["[fd00::7]:9733"]
    # the address its metrics listen on, when it is one, before Proxmox's
    assert prometheus_target("ct200", 200, "pve1", "10.1.2.31:9733", addresses=["10.1.2.30"])["targets"] == [
        "10.1.2.31:9733"]


def test_a_ct_with_no_address_of_its_own_is_refused_never_scraped_by_its_name():
    for listen in ("0.0.0.0:9733", "localhost:9733"):
        with pytest.raises(AnsibleFilterError, match=r"^metrics_target of ct200: unset, and no address to scrape"):
            prometheus_target("ct200", 200, "pve1", listen, addresses=[])
    assert prometheus_target("ct400", 400, "pve2", "0.0.0.0:9733", "10.1.2.40:9733", "dflash_big") == {
        "targets": ["10.1.2.40:9733"], "labels": {"ct": "ct400", "vmid": "400", "node": "pve2", "gang": "dflash_big"}}


def test_a_ct_that_serves_no_metrics_is_left_out():
    assert prometheus_target("ct200", 200, "pve1", "") is None


@pytest.mark.parametrize("listen, target, variable", [
    ("9733", "", "trainer_launch_metrics_listen of ct200"), ("0.0.0.0:9733", "ct200", "metrics_target of ct200")])
def test_a_bad_address_names_its_variable(listen, target, variable):
    with pytest.raises(AnsibleFilterError, match=variable):
        prometheus_target("ct200", 200, "pve1", listen, target)


def test_each_ct_gets_a_key_of_its_own_and_a_short_secret_is_refused_by_name():
    import hashlib
    import hmac

    webhook_key = FilterModule().filters()["webhook_key"]
    secret = "team secret from the vault"
    keys = {ct: webhook_key(secret, ct) for ct in ("ct200", "ct201")}
    assert keys["ct200"] != keys["ct201"] and len(keys["ct200"]) == 64
    assert keys["ct200"] == hmac.new(secret.encode(), b"dflash-lifecycle webhook\0ct200", hashlib.sha256).hexdigest()
    with pytest.raises(AnsibleFilterError, match="^trainer_launch_supervise_webhook_secret: a secret of at least 16"):
        webhook_key("short", "ct200")


def test_the_target_lists_rules_name_every_ct_it_holds():
    rules = FilterModule().filters()["prometheus_target_rules"]
    entries = [prometheus_target(ct, vmid, "pve1", "0.0.0.0:9733", addresses=[f"10.1.2.{vmid - 170}"])
               for ct, vmid in (("ct201", 201), ("ct200", 200))]
    (rule,) = rules(entries)["groups"][0]["rules"]
    assert rule["alert"] == "DflashTargetMissing" and rule["labels"] == {"severity": "critical"}
    assert rule["expr"] == 'absent(up{job="dflash-trainers",ct="ct200"}) or absent(up{job="dflash-trainers",ct="ct201"})'
    assert rule["annotations"]["runbook_url"].endswith("docs/runbooks.md#dflashtargetmissing")
    assert rules([]) == {"groups": []}
    odd = dict(entries[0], labels=dict(entries[0]["labels"], ct='a"b\\c'))
    assert 'ct="a\\"b\\\\c"' in rules([odd])["groups"][0]["rules"][0]["expr"]
