"""The filter that reads a controller binary for the preflight's tools (plugins/filter/controller_tool.py):
its digest and size as the CT's check compares them, and the caller's error when it is not a file."""

import hashlib
import os

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.dflash.lifecycle.plugins.filter.controller_tool import FilterModule

controller_tool = FilterModule().filters()["controller_tool"]
MISSING = "trainer_preflight_py_spy_src: /x not found"


def test_a_binary_is_named_by_its_digest_and_size_at_its_path_in_the_ct(tmp_path):
    data = os.urandom(3 << 20) + b"tail"  # more than one read
    (tmp_path / "py-spy").write_bytes(data)
    assert controller_tool(str(tmp_path / "py-spy"), "/var/lib/dflash/bin/py-spy", MISSING) == {
        "path": "/var/lib/dflash/bin/py-spy", "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


@pytest.mark.parametrize("name", ["absent", "a-directory", ""])
def test_what_is_not_a_file_fails_with_the_callers_message_alone(tmp_path, name):
    (tmp_path / "a-directory").mkdir()
    with pytest.raises(AnsibleFilterError) as raised:
        controller_tool(str(tmp_path / name) if name else "", "/var/lib/dflash/bin/py-spy", MISSING)
    assert str(raised.value) == MISSING
