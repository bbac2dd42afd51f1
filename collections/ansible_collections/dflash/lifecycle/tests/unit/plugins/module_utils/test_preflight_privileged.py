"""module_utils/preflight.py: whether the CT is privileged, by its user namespace's map (its root is
the node's root when uid 0 maps to the node's uid 0), as a check that passes with a warning or,
with trainer_preflight_privileged=refuse, fails before anything is touched."""

import pytest

from ansible_collections.dflash.lifecycle.plugins.module_utils import preflight


@pytest.mark.parametrize("uid_map, root", [
    ("         0          0 4294967295\n", 0),  # the node's own map: a privileged CT shares it
    ("         0     100000      65536\n", 100000),  # Proxmox's default unprivileged CT
    ("      1000       1000          1\n         0     200000       1000\n", 200000),  # a custom map
    ("", None), ("garbage\n", None),
])
def test_the_nodes_uid_of_the_cts_root_is_read_from_its_map(tmp_path, uid_map, root):
    (tmp_path / "uid_map").write_text(uid_map)
    assert preflight.node_uid_of_root(str(tmp_path / "uid_map")) == root
    assert preflight.node_uid_of_root(str(tmp_path / "missing")) is None


@pytest.mark.parametrize("root, refuse, ok, privileged", [
    (0, False, True, True), (0, True, False, True), (100000, True, True, False), (None, True, True, False)])
def test_a_privileged_ct_is_said_and_refused_only_when_asked(monkeypatch, root, refuse, ok, privileged):
    monkeypatch.setattr(preflight, "node_uid_of_root", lambda: root)
    checks = []
    assert preflight.privileged_check(refuse, lambda *check: checks.append(check)) is privileged
    (name, passed, found, hint), = checks
    assert (name, passed) == ("unprivileged", ok)
    if privileged:
        assert found == "a privileged CT: its root is the node's root"
        assert hint.startswith("trainer_preflight_privileged=refuse")
    elif root is not None:
        assert found == f"unprivileged: its root is uid {root} on the node"
