"""The session's testbed fixture (helpers in testlib.py)."""

import os

import pytest

from testlib import LiveTestbed, testbed_mod


@pytest.fixture(scope="session")
def testbed():
    bed = testbed_mod.Testbed()
    was_up = os.path.isdir(bed.state_dir) and all(
        bed.sshd_pid(name) for name in bed.nodes)
    bed.up()
    try:
        yield LiveTestbed(bed)
    finally:
        if not was_up:  # a testbed someone else brought up (make demo) stays up
            bed.down()
