"""Run-directory files written without following symlinks, and the detached worker of the stop."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from testlib import REPO
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import rundir
from ansible_collections.dflash.lifecycle.plugins.module_utils.launch import launch
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import detached

COLLECTIONS = os.path.join(REPO, "collections")


def test_write_atomic_sets_the_mode_and_reports_change(tmp_path):
    path = str(tmp_path / "trainer.sh")
    assert rundir.write_atomic(path, "echo 1\n", 0o700) is True
    assert oct(os.stat(path).st_mode & 0o777) == "0o700"
    assert rundir.write_atomic(path, "echo 1\n", 0o700) is False  # same content and mode
    assert rundir.write_atomic(path, "echo 1\n", 0o600) is True  # mode differs
    assert rundir.write_atomic(path, "echo 2\n", 0o600) is True
    assert open(path, encoding="utf-8").read() == "echo 2\n"
    assert [p.name for p in tmp_path.iterdir()] == ["trainer.sh"]  # no temporary left


def test_write_atomic_replaces_a_planted_symlink_without_following_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    planted = tmp_path / "secrets.env"
    planted.symlink_to(victim)
    assert rundir.write_atomic(str(planted), "TOKEN=x\n", 0o600) is True
    assert victim.read_text() == "untouched\n"
    assert not planted.is_symlink() and planted.read_text() == "TOKEN=x\n"


@pytest.mark.parametrize("check_mode", [False, True])
def test_prepare_run_refuses_a_symlinked_run_dir_and_writes_nothing(tmp_path, check_mode):
    evil = tmp_path / "evil"
    evil.mkdir(mode=0o777)
    os.chmod(evil, 0o1777)
    run_dir = tmp_path / "run"
    run_dir.symlink_to(evil)
    with pytest.raises(rundir.UnsafePath, match="not a symlink"):
        launch.prepare_run({"run_dir": str(run_dir), "wrapper_script": "x", "secrets_env": "y"},
                           check_mode=check_mode)
    assert list(evil.iterdir()) == []


def test_prepare_run_refuses_a_group_writable_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.chmod(run_dir, 0o770)
    with pytest.raises(rundir.UnsafePath, match="not writable by group or others"):
        launch.prepare_run({"run_dir": str(run_dir), "wrapper_script": "x"})
    assert list(run_dir.iterdir()) == []


def test_prepare_run_writes_modes_creates_dirs_and_check_mode_writes_nothing(tmp_path):
    params = {"run_dir": str(tmp_path / "run"), "wrapper_script": "exec true\n",
              "secrets_env": "TOKEN='s'\n", "create_dirs": [str(tmp_path / "logs"), str(tmp_path / "ck")]}
    planned = launch.prepare_run(params, check_mode=True)
    assert sorted(os.listdir(tmp_path)) == []
    assert len(planned) == 4
    written = launch.prepare_run(params)
    assert sorted(written) == sorted(planned)
    modes = {name: oct(os.stat(tmp_path / "run" / name).st_mode & 0o777)
             for name in ("trainer.sh", "secrets.env")}
    assert modes == {"trainer.sh": "0o700", "secrets.env": "0o600"}
    assert oct(os.stat(tmp_path / "run").st_mode & 0o777) == "0o700"
    assert launch.prepare_run(params) == []  # idempotent


def test_detached_work_runs_in_its_own_session_and_returns_its_result(tmp_path):
    state = str(tmp_path / "state")
    result, adopted = detached.run(lambda: {"sid": os.getsid(0), "pid": os.getpid()}, state, "stop")
    assert adopted is False
    # a session of its own, not its leader (the double fork: it can never get a terminal)
    assert result["sid"] not in (os.getsid(0), result["pid"])
    assert not os.path.exists(os.path.join(state, "stop.worker"))
    assert detached.run(lambda: 1 / 0, state, "stop")[0]["failed"] is True  # errors come back


CALLER = textwrap.dedent("""
    import os, sys, time
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import detached
    state, marker = sys.argv[1], sys.argv[2]
    def work():
        time.sleep(1.5)
        open(marker, "w").write("done")
        return {"finished": True}
    print(detached.run(work, state, "stop"), flush=True)
""")


def test_detached_work_outlives_its_caller_and_a_later_call_adopts_it(tmp_path):
    state, marker = str(tmp_path / "state"), str(tmp_path / "marker")
    env = dict(os.environ, PYTHONPATH=COLLECTIONS)
    caller = subprocess.Popen([sys.executable, "-c", CALLER, state, marker], env=env)
    deadline = time.monotonic() + 10
    while detached.running_worker(state, "stop") is None:
        assert time.monotonic() < deadline and caller.poll() is None
        time.sleep(0.02)
    os.kill(caller.pid, signal.SIGKILL)  # the dropped connection: our own child, by PID
    caller.wait()
    assert not os.path.exists(marker)
    # the first worker's result, not a second run of the work
    result, adopted = detached.run(lambda: {"second": True}, state, "stop")
    assert adopted is True and result == {"finished": True}
    assert open(marker, encoding="utf-8").read() == "done"
    with open(os.path.join(state, "stop.result.json"), encoding="utf-8") as handle:
        assert json.load(handle)["result"] == {"finished": True}
