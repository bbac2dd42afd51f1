"""module_utils/stop/leftovers.py and proctable.carrying, with real processes of the test's own:
what a dead run left is found by its run id, never by its command line, and ended (SIGTERM, a
grace, SIGKILL)."""

import os
import signal
import subprocess
import sys
import uuid

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import leftovers

SLEEPER = "import time\nwhile True: time.sleep(0.1)\n"
DEAF = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: time.sleep(0.1)\n"


def started(code, run_id):
    return subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, DFLASH_RUN_ID=run_id))


def test_the_leftovers_of_a_dead_run_are_found_by_its_id_and_ended(tmp_path):
    run_id, other = uuid.uuid4().hex[:16], uuid.uuid4().hex[:16]
    procs = [started(SLEEPER, run_id), started(DEAF, run_id), started(SLEEPER, other)]
    try:
        # the dead trainer: a PID that ran (this test's own, ended) with the run's id
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        pidfile = tmp_path / "trainer.pid"
        pidfile.write_text(f"{dead.pid} 1 {run_id}\n")
        subprocess.run([sys.executable, "-c", "import time; time.sleep(0.3)"], check=True)  # the children's exec
        table = proctable.snapshot()
        assert leftovers.dead_run_id(str(pidfile), table) == run_id
        found = proctable.carrying(run_id, table)
        assert sorted(p.pid for p in found) == sorted([procs[0].pid, procs[1].pid])
        report = leftovers.end(found, grace=0.5)
        assert report == {"ended": sorted([procs[0].pid, procs[1].pid]), "killed": [procs[1].pid], "survivors": []}
        assert procs[0].wait(5) == -signal.SIGTERM and procs[1].wait(5) == -signal.SIGKILL
        assert procs[2].poll() is None, "another run's process is never touched"
        assert leftovers.words(report).startswith("2 leftover(s) of the dead run ended (PID ")
        pidfile.write_text(f"{procs[2].pid} {proctable.read_process(procs[2].pid).starttime} {other}\n")
        assert leftovers.dead_run_id(str(pidfile), proctable.snapshot()) is None, "a live trainer leaves none"
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
