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


ORPHANED_CALLER = textwrap.dedent("""
    import json, os, sys, time
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import detached
    state, lock_path, marker = sys.argv[1], sys.argv[2], sys.argv[3]
    def work():
        time.sleep(1.5)
        return {"finished": True}
    def orphaned(result):
        open(marker, "w").write(json.dumps(result))
    print(detached.run(work, state, "launch", lease=(lock_path, "job-1", 0.6), on_orphaned=orphaned), flush=True)
""")


def test_a_workers_keeper_renews_its_lease_while_it_works_and_stops_with_it(tmp_path):
    """The lease (0.6 s here) outlives a 1.5 s work only because the worker's keeper renews it,
    naming the worker; once the worker is gone nothing renews it, so it ends one lease later."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import lock

    state, lock_path = str(tmp_path / "state"), str(tmp_path / "state" / "redeploy.lock")
    os.makedirs(state, mode=0o700)
    lock.take(lock_path, "job-1", 0.6)

    def work():  # in the worker: what it saw comes back in its result
        seen = []
        for _ in range(6):
            time.sleep(0.25)
            seen.append(lock.read(lock_path))
        return {"worker": os.getpid(), "seen": seen}

    result, _adopted = detached.run(work, state, "launch", lease=(lock_path, "job-1", 0.6))
    seen = result["seen"]
    renewals = {entry["renewed"] for entry in seen}
    assert len(renewals) >= 3, seen  # every 0.2 s while it worked
    assert all(entry["expires"] > entry["renewed"] and entry["worker"][0] == result["worker"] for entry in seen[1:])
    last = lock.read(lock_path)
    time.sleep(0.7)  # one lease after the worker's end: nobody renewed it, it has ended
    assert lock.read(lock_path)["renewed"] == last["renewed"]
    taken = lock.take(lock_path, "job-2", 60)
    assert taken["taken_over_from"]["holder"] == "job-1" and "expired" in taken["msg"]


def test_a_takeover_of_a_holder_whose_worker_still_works_is_refused_naming_its_last_renewal(tmp_path):
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import lock, proctable

    lock_path = str(tmp_path / "redeploy.lock")
    lock.take(lock_path, "job-1", 60)
    me = proctable.read_process(os.getpid()).identity  # a worker that runs: this process
    assert lock.renew(lock_path, "job-1", 60, me, phase="stop")
    with pytest.raises(lock.LockHeld) as refused:
        lock.take(lock_path, "job-2", 60, takeover=lock.takeover_code(lock.read(lock_path)))
    words = str(refused.value)
    assert f"its worker in the CT (PID {os.getpid()}) is alive and keeps the lease: it is not taken over" in words
    assert "renewed last at" in words and "last phase: stop" in words
    # a renewal never takes a lock back from a job that took it over
    dead = (me[0], me[1] + 1)  # the same PID with another start time: a worker that is gone
    assert lock.renew(lock_path, "job-1", 60, dead)
    assert lock.take(lock_path, "job-2", 60, takeover_holder="job-1")["holder"] == "job-2"
    assert lock.renew(lock_path, "job-1", 60, me) is False and lock.read(lock_path)["holder"] == "job-2"


def test_a_worker_whose_caller_died_gives_the_result_to_on_orphaned(tmp_path):
    """The controller killed while the worker ran: its attached module process ends, and the
    worker itself runs on_orphaned with the result nobody will read."""
    state, marker = str(tmp_path / "state"), str(tmp_path / "marker")
    lock_path = str(tmp_path / "state" / "redeploy.lock")
    env = dict(os.environ, PYTHONPATH=COLLECTIONS)
    caller = subprocess.Popen([sys.executable, "-c", ORPHANED_CALLER, state, lock_path, marker], env=env)
    deadline = time.monotonic() + 10
    while detached.running_worker(state, "launch") is None:
        assert time.monotonic() < deadline and caller.poll() is None
        time.sleep(0.02)
    os.kill(caller.pid, signal.SIGKILL)  # our own child, by PID
    caller.wait()
    deadline = time.monotonic() + 10
    while not os.path.exists(marker):
        assert time.monotonic() < deadline, "on_orphaned never ran"
        time.sleep(0.05)
    time.sleep(0.05)  # written whole: one short write
    assert json.loads(open(marker, encoding="utf-8").read()) == {"finished": True}


def test_the_change_record_says_when_a_change_finished_without_its_controller(tmp_path):
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import change_record

    path = str(tmp_path / "lib" / "last-change.json")
    change_record.begin(path, "root@vm ansible-playbook pid 15973", "redeploy", 4242)
    change_record.update(path, phase="stage model")
    record = change_record.read(path)
    assert change_record.unattended(record, worker_running=True) is False
    assert "is under way in the CT (phase: stage model, worker PID 4242)" in change_record.words(record, True)
    # the worker died in the middle: no outcome, said so
    assert change_record.unattended(record) is True
    assert "ended without a result in phase stage model" in change_record.words(record)
    change_record.end(path, False, "trainer PID 7 healthy")
    assert change_record.unattended(change_record.read(path)) is False  # its controller read it
    change_record.update(path, controller="gone")
    record = change_record.read(path)
    assert change_record.unattended(record) is True
    words = change_record.words(record)
    assert words.startswith("the redeploy started at ") and "by root@vm ansible-playbook pid 15973 finished " \
        "without its controller at " in words and words.endswith(": trainer PID 7 healthy")


UNLOCKING_CALLER = textwrap.dedent("""
    import sys, time
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import detached
    state, lock_path, fails = sys.argv[1], sys.argv[2], sys.argv[3] == "fails"
    def work():
        time.sleep(0.3)
        return {"failed": True} if fails else {"finished": True}
    print(detached.run(work, state, "launch", lease=(lock_path, "job-1", 60), unlock=True), flush=True)
    # and ends without giving the lock back: a module killed with its controller before exit_json
""")


@pytest.mark.parametrize("outcome", ["healthy", "fails"])
def test_a_worker_gives_the_jobs_lock_back_once_its_caller_ended_without_doing_so(tmp_path, outcome):
    """The job's last step (unlock): a caller that ended without giving the lock back leaves it to the
    worker, at once, not at the end of a 60 s lease; a launch that failed keeps it for the job's
    rescue."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import lock

    state, lock_path = str(tmp_path / "state"), str(tmp_path / "state" / "redeploy.lock")
    os.makedirs(state, mode=0o700)
    lock.take(lock_path, "job-1", 60)
    env = dict(os.environ, PYTHONPATH=COLLECTIONS)
    subprocess.run([sys.executable, "-c", UNLOCKING_CALLER, state, lock_path, outcome], env=env, check=True, timeout=30)
    deadline = time.monotonic() + 3
    while lock.read(lock_path) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (lock.read(lock_path) is None) == (outcome == "healthy"), lock.read(lock_path)


def test_a_cancelled_job_marks_only_its_own_change_and_no_update_loses_the_mark(tmp_path):
    """mark_unseen (the lock_on_cancel callback's `state=cancelled`) marks the record of the change
    the job's holder made, never another job's; and the CT's worker, which reads, changes and writes
    the record at each phase, cannot write back a copy it read before the mark: both go under the
    record's guard."""
    import threading

    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import change_record

    path = str(tmp_path / "lib" / "last-change.json")
    assert change_record.mark_unseen(path, "job 1") is False  # no record yet: nothing to mark
    change_record.begin(path, "job 1", "redeploy", 4242)
    assert change_record.mark_unseen(path, "job 2") is False
    assert change_record.read(path)["controller"] == "attached"
    # the worker's update of its phase holds the guard when the mark comes: the mark waits for it
    inside, release = threading.Event(), threading.Event()
    real_read = change_record.read

    def slow_read(where):
        record = real_read(where)
        if threading.current_thread() is worker:
            inside.set()
            release.wait(5)
        return record

    change_record.read = slow_read
    try:
        worker = threading.Thread(target=change_record.update, args=(path,), kwargs={"phase": "launch"})
        worker.start()
        assert inside.wait(5)
        marked = []
        marker = threading.Thread(target=lambda: marked.append(change_record.mark_unseen(path, "job 1")))
        marker.start()
        marker.join(0.3)
        assert marker.is_alive(), "the mark did not wait for the worker's update under way"
        release.set()
        worker.join(5)
        marker.join(5)
    finally:
        change_record.read = real_read
    record = change_record.read(path)
    assert marked == [True] and record["phase"] == "launch" and record["controller"] == "gone"
    change_record.end(path, False, "trainer PID 7 healthy")  # the worker's end keeps the mark
    assert change_record.unattended(change_record.read(path)) is True
    assert change_record.mark_unseen(path, "job 1") is False  # marked already
    assert os.path.exists(path + ".guard") and rundir.read_json(path)["outcome"] == "trainer PID 7 healthy"
