"""The session's testbed fixture (helpers in testlib.py). make test spreads the test files over
pytest-xdist workers (--dist loadfile: each file whole on one worker, so its module-scoped
fixtures and its tests' order hold), each worker with a testbed of its own (testlib: gw0 the
default one, gwN a copy on other loopback addresses), so integration modules run side by side.
The longest files go first (tests/run-all.sh passes --no-loadscope-reorder): a worker takes the
next file when it is done with one, so a long file started last would keep the run waiting on
one worker while the others idle."""

import pytest

from testlib import LiveTestbed, TESTBED_INVENTORY, testbed_mod

# the files that take longest in make test, longest first: each file's seconds of its worker in a
# fresh-clone run of 2026-12-07 (5 workers, 2 cores), test_layout_redeploys.py and test_faults.py
# estimated from their smaller shapes since (about half, and 110 s less): 562, 450, 411, 344, 283,
# 260, 211, 202, 171, 150, 129, 128, 124, 121, 111, 109, 106, 103, 85; the rest follow. In this
# order a simulation on those figures ends the five workers within 15 s of each other (872 to 887 s).
LONGEST_FIRST = ("test_gang.py", "test_faults.py", "test_gang_as_run.py", "test_controller_death.py", "test_redeploy.py",
                 "test_layout_redeploys.py", "test_staged_stop.py", "test_own_checkpoint_stop.py", "test_pve_hooks.py",
                 "test_monitoring.py", "test_hostile_ct.py", "test_launchers.py", "test_settings.py", "test_supervise.py",
                 "test_canary.py", "test_model_in_shm.py", "test_trainer_code.py", "test_supervise_real_trainer.py",
                 "test_launch.py", "test_connection_plugin.py", "test_checkpoint_layouts.py", "test_stop_request.py",
                 "test_unprivileged_ct.py", "test_seeded_trainer.py", "test_moved_ct.py", "test_security.py")


def pytest_collection_modifyitems(items):
    def rank(item):
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

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
