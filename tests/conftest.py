"""The session's testbed fixture (helpers in testlib.py). make test spreads the test files over
pytest-xdist workers (--dist loadfile: each file whole on one worker, so its module-scoped
fixtures and its tests' order hold), each worker with a testbed of its own (testlib: gw0 the
default one, gwN a copy on other loopback addresses), so integration modules run side by side."""

import os

import pytest

from testlib import LiveTestbed, TESTBED_INVENTORY, testbed_mod


@pytest.fixture(scope="session")
def testbed():
    bed = testbed_mod.Testbed(TESTBED_INVENTORY)
    was_up = os.path.isdir(bed.state_dir) and all(
        bed.sshd_pid(name) for name in bed.nodes)
    bed.up()
    try:
        yield LiveTestbed(bed)
    finally:
        if not was_up:  # a testbed someone else brought up (make demo) stays up
            bed.down()
