"""The session's testbed fixture (helpers in testlib.py). make test spreads the test files over
pytest-xdist workers (--dist loadfile: each file whole on one worker, so its module-scoped
fixtures and its tests' order hold), each worker with a testbed of its own (testlib: gw0 the
default one, gwN a copy on other loopback addresses), so integration modules run side by side.
The longest files go first (tests/run-all.sh passes --no-loadscope-reorder): a worker takes the
next file when it is done with one, so a long file started last would keep the run waiting on
one worker while the others idle."""

import pytest

from testlib import LiveTestbed, TESTBED_INVENTORY, testbed_mod

# the files that take longest in make test, roughly longest first (seconds of one worker in this
# order, measured on 2 cores with 4 workers on 2026-12-04: 413, 393, 307, 310, 167, 145, 149, 85,
# 52, 58, 60, 77, 51, 28, 30, 17, 25, 22, 16; test_controller_death.py, added 2026-12-05, placed
# by an estimate of about 250, test_hostile_ct.py, added 2026-12-06, by the 49 s it took alone,
# and test_supervise_real_trainer.py, added 2026-12-06, by the 82 s it took alone); the rest follow. In this order the four workers end
# within a second of each other in a simulation on those figures (614 s each), as three did on the
# figures of 2026-12-03, where a file left out (147 s) made one worker end 80 s after the others.
# With five workers (the default of tests/run-all.sh since 2026-12-06; the files' durations of one run: 4110 s) the simulation
# ends them within 7 s of each other (819 to 826 s), 4 s after the best order it finds.
LONGEST_FIRST = ("test_layout_redeploys.py", "test_faults.py", "test_gang_as_run.py", "test_gang.py",
                 "test_controller_death.py", "test_monitoring.py", "test_staged_stop.py", "test_redeploy.py", "test_own_checkpoint_stop.py", "test_launchers.py",
                 "test_model_in_shm.py", "test_supervise.py", "test_supervise_real_trainer.py", "test_pve_hooks.py", "test_hostile_ct.py", "test_trainer_code.py", "test_canary.py", "test_settings.py",
                 "test_launch.py", "test_connection_plugin.py", "test_checkpoint_layouts.py", "test_moved_ct.py",
                 "test_stop_request.py", "test_seeded_trainer.py", "test_security.py", "test_unprivileged_ct.py")


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
