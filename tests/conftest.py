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


# The longest test files (several minutes each on a 2-core machine), handed out first: loadfile
# gives the workers files in collection order (run-all.sh passes --no-loadscope-reorder, or xdist
# would sort them by their count of tests), and one started last would run alone at the end
# while the other workers sit idle.
LONGEST_FIRST = ("test_layout_redeploys.py", "test_gang.py", "test_faults.py", "test_launchers.py",
                 "test_redeploy.py", "test_staged_stop.py", "test_trainer_code.py", "test_canary.py")


def pytest_collection_modifyitems(items):
    def rank(item):
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)
    items.sort(key=rank)  # stable: within a file, the tests keep their order
