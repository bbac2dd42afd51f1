"""The session's testbed fixture (helpers in testlib.py). make test spreads the tests over
pytest-xdist workers (--dist loadgroup), each worker with a testbed of its own (testlib: gw0 the
default one, gwN a copy on other loopback addresses), so integration modules run side by side.
An integration file goes whole to one worker (its group: its module-scoped fixtures and its tests'
order hold), the longest first (tests/run-all.sh passes --no-loadscope-reorder): a worker takes
the next file when it is done with one, so a long file started last would keep the run waiting on
one worker while the others idle. The unit tests come last, each on its own: they fill the
workers that end first (a file of them whole on one worker would be the run's last 200 s)."""

import pytest

from testlib import LiveTestbed, TESTBED_INVENTORY, testbed_mod

# the integration files that take longest in make test, roughly longest first (seconds of one
# worker, measured on 2 cores with 4 workers on 2026-12-04: 413, 393, 307, 310, 167, 145, 85, 52,
# 58, 60, 77, 51, 28, 17, 22, 16); the rest follow, then the unit tests one by one.
LONGEST_FIRST = ("test_layout_redeploys.py", "test_faults.py", "test_gang_as_run.py", "test_gang.py",
                 "test_staged_stop.py", "test_redeploy.py", "test_launchers.py",
                 "test_model_in_shm.py", "test_trainer_code.py", "test_canary.py", "test_settings.py",
                 "test_launch.py", "test_connection_plugin.py", "test_moved_ct.py", "test_seeded_trainer.py",
                 "test_security.py")


def pytest_collection_modifyitems(items):
    def spread(item):
        return "integration" not in item.path.parts

    def rank(item):
        name = item.path.name
        return (spread(item), LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST))

    for item in items:
        if not spread(item):
            item.add_marker(pytest.mark.xdist_group(name=item.path.name))
    items.sort(key=rank)  # a stable sort: each file's own order holds


@pytest.fixture(scope="session")
def testbed():
    bed = testbed_mod.Testbed(TESTBED_INVENTORY)
    was_up = bed.running()
    bed.up_fresh(keep_running=True)  # what a killed run left, nothing of it running, is not reused
    try:
        yield LiveTestbed(bed)
    finally:
        if not was_up:  # a testbed someone else brought up (make demo) stays up
            bed.down()
