"""The filter of Prometheus's target list (plugins/filter/monitoring.py): who a CT is comes from the
inventory, a CT without metrics is left out, a bad address names its variable."""

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.dflash.lifecycle.plugins.filter.monitoring import FilterModule

prometheus_target = FilterModule().filters()["prometheus_target"]


def test_a_ct_is_listed_with_the_inventorys_labels():
    assert prometheus_target("ct200", 200, "pve1", "0.0.0.0:9733") == {
        "targets": ["ct200:9733"], "labels": {"ct": "ct200", "vmid": "200", "node": "pve1"}}
    assert prometheus_target("ct400", 400, "pve2", "0.0.0.0:9733", "10.1.2.40:9733", "dflash_big") == {
        "targets": ["10.1.2.40:9733"], "labels": {"ct": "ct400", "vmid": "400", "node": "pve2", "gang": "dflash_big"}}


def test_a_ct_that_serves_no_metrics_is_left_out():
    assert prometheus_target("ct200", 200, "pve1", "") is None


@pytest.mark.parametrize("listen, target, variable", [
    ("9733", "", "trainer_launch_metrics_listen of ct200"), ("0.0.0.0:9733", "ct200", "metrics_target of ct200")])
def test_a_bad_address_names_its_variable(listen, target, variable):
    with pytest.raises(AnsibleFilterError, match=variable):
        prometheus_target("ct200", 200, "pve1", listen, target)
