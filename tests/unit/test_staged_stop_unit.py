"""module_utils of staged_stop on a fake /proc: parsing, tree, ladder, identity."""

import ast
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO
from ansible_collections.dflash.lifecycle.plugins.module_utils import checkpoints, proctable, staged_stop

COLLECTION = os.path.join(REPO, "collections", "ansible_collections", "dflash", "lifecycle")


def fake_proc(root, pid, comm, ppid, pgid=0, sid=0, state="S", start=1000, cmdline=None,
              sig_ign=0, sig_cgt=0):
    base = root / str(pid)
    base.mkdir(parents=True)
    # stat fields 3.. : state ppid pgrp session ... num_threads (20) ... starttime (22)
    fields = [state, ppid, pgid, sid] + [0] * 13 + [1, 0, start] + [0] * 30
    (base / "stat").write_text(f"{pid} ({comm}) " + " ".join(str(f) for f in fields) + "\n")
    (base / "cmdline").write_bytes(((cmdline or comm).replace(" ", "\0") + "\0").encode())
    (base / "status").write_text(f"Name:\t{comm}\nSigIgn:\t{sig_ign:016x}\nSigCgt:\t{sig_cgt:016x}\n")
    return base


@pytest.fixture
def proc(tmp_path):
    root = tmp_path / "proc"
    root.mkdir()
    (root / "stat").write_text("cpu 0 0\nbtime 1700000000\n")
    return root


def test_parse_stat_comm_with_spaces_and_parentheses():
    line = "4242 (python3 (worker) 1) S 1 0 0 0 -1 0 0 0 0 0 5 6 0 0 20 0 3 0 98765 0 0\n"
    stat = proctable.parse_stat(line)
    assert stat["comm"] == "python3 (worker) 1"
    assert (stat["state"], stat["ppid"], stat["pgid"], stat["sid"]) == ("S", 1, 0, 0)
    assert stat["threads"] == 3 and stat["starttime"] == 98765


def test_read_process_and_dispositions(proc):
    ign = 1 << (signal.SIGINT - 1) | 1 << (signal.SIGQUIT - 1)
    cgt = 1 << (signal.SIGTERM - 1)
    fake_proc(proc, 8, "python3 x)", 1, cmdline="python3 -u train.py", sig_ign=ign, sig_cgt=cgt)
    p = proctable.read_process(8, str(proc))
    assert p.comm == "python3 x)" and p.cmdline == "python3 -u train.py"
    assert p.disposition(signal.SIGINT) == "ignored"
    assert p.disposition(signal.SIGTERM) == "caught"
    assert p.disposition(signal.SIGHUP) == "default"
    assert proctable.read_process(9, str(proc)) is None


def test_read_argv_keeps_spaces_and_empty_arguments(proc):
    fake_proc(proc, 8, "python3", 1)
    (proc / "8" / "cmdline").write_bytes(b"python3\0-u\0train.py\0--note\0two words\0\0")
    assert proctable.read_argv(8, str(proc)) == ["python3", "-u", "train.py", "--note", "two words", ""]
    (proc / "8" / "cmdline").write_bytes(b"")  # a zombie, or a kernel thread
    assert proctable.read_argv(8, str(proc)) == []
    assert proctable.read_argv(9, str(proc)) is None


def test_tree_building_with_pgid_0(proc):
    fake_proc(proc, 1, "tini", 0, 1, 1)
    fake_proc(proc, 5, "bash", 0)          # wrapper started by pct exec: parent outside the CT
    fake_proc(proc, 6, "python3", 5)
    for worker in (7, 8, 9):
        fake_proc(proc, worker, "python3", 6)
    fake_proc(proc, 10, "pt_worker", 9)
    fake_proc(proc, 11, "sleep", 1)
    table = proctable.snapshot(str(proc))
    assert proctable.descendants(table, 6) == [7, 8, 9, 10]
    assert proctable.descendants(table, 5) == [6, 7, 8, 9, 10]
    assert proctable.ancestors(table, 10) == [10, 9, 6, 5]


def test_zombie_counts_as_gone(proc):
    fake_proc(proc, 6, "python3", 1, state="Z", start=500)
    assert not proctable.alive((6, 500), str(proc))
    fake_proc(proc, 7, "python3", 1, state="S", start=500)
    assert proctable.alive((7, 500), str(proc))
    assert not proctable.alive((7, 501), str(proc))  # same PID, another process


@pytest.mark.parametrize("ladder,error", [
    ([], "ladder: needs at least one stage"),
    ([{"signal": "SIGFOO"}], "ladder[0].signal: unknown signal 'SIGFOO'"),
    ([{"signal": "SIGINT", "scope": "all"}], "ladder[0].scope: 'all' is not one of main, group, tree"),
    ([{"signal": "INT", "wait": -1}], "ladder[0].wait: must be >= 0"),
    ([{"signal": 2}, {"signal": "TERM", "wait": "soon"}], "ladder[1].wait: 'soon' is not a number"),
    ([{"scope": "main"}], "ladder[0].signal: required"),
    ([{"signal": "INT", "timeout": 3}], "ladder[0]: unknown keys ['timeout']"),
])
def test_ladder_validation_errors(ladder, error):
    with pytest.raises(staged_stop.InvalidParameter) as caught:
        staged_stop.validate_ladder(ladder)
    assert str(caught.value).startswith(error)


def test_ladder_accepts_names_and_numbers():
    stages = staged_stop.validate_ladder([{"signal": "int", "scope": "main", "wait": 1},
                                          {"signal": 9}])
    assert [s["signal"] for s in stages] == [signal.SIGINT, signal.SIGKILL]
    assert stages[1]["scope"] == "tree"


def test_pattern_picks_topmost_and_sees_through_a_shell(proc):
    fake_proc(proc, 5, "bash", 0, cmdline="bash -c python3 train_dflash_pipeline.py")
    fake_proc(proc, 6, "python3", 5, cmdline="python3 train_dflash_pipeline.py")
    fake_proc(proc, 7, "python3", 6, cmdline="python3 train_dflash_pipeline.py")  # forked worker
    table = proctable.snapshot(str(proc))
    assert staged_stop.pattern_matches(r"train_dflash_pipeline[.]py", table, set()) == [6]


def test_pidfile_with_a_reused_pid_is_rejected(proc, tmp_path):
    fake_proc(proc, 6, "python3", 1, start=2000, cmdline="python3 train.py")
    table = proctable.snapshot(str(proc))
    pidfile = tmp_path / "t.pid"
    pidfile.write_text("6 1999\n")
    found, reason = staged_stop.pidfile_process(str(pidfile), None, table, str(proc))
    assert found is None and "was reused" in reason
    pidfile.write_text("6 2000\n")
    found, reason = staged_stop.pidfile_process(str(pidfile), None, table, str(proc))
    assert found.pid == 6 and reason is None
    found, reason = staged_stop.pidfile_process(str(pidfile), "other[.]py", table, str(proc))
    assert found is None and "does not match pattern" in reason


def test_ambiguity_fails_before_any_signal(proc):
    fake_proc(proc, 6, "python3", 1, cmdline="python3 train.py --a")
    fake_proc(proc, 9, "python3", 1, cmdline="python3 train.py --b")
    with pytest.raises(staged_stop.StopFailed) as caught:
        staged_stop.run({"pattern": "train[.]py"}, proc_root=str(proc))
    assert [m["pid"] for m in caught.value.result["matches"]] == [6, 9]
    assert caught.value.result["timeline"] == []


def test_check_mode_on_fake_proc_reports_targets_and_ladder(proc):
    fake_proc(proc, 6, "python3", 1, cmdline="python3 train.py", sig_cgt=1 << 1)
    fake_proc(proc, 7, "python3", 6, cmdline="python3 train.py")
    result = staged_stop.run({"pattern": "train[.]py"}, proc_root=str(proc), check_mode=True)
    assert [(t["pid"], t["role"]) for t in result["targets"]] == [(6, "main"), (7, "descendant")]
    assert result["signal_dispositions"]["SIGINT"] == "caught"
    assert result["timeline"] == [] and result["stopped"] is False


def test_real_identity_check_never_signals_a_reused_pid(tmp_path):
    # a real process, signalled through Targets with a wrong starttime: untouched
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        me = proctable.read_process(child.pid)
        targets = staged_stop.Targets(use_pidfd=False)
        assert targets.send((child.pid, me.starttime + 1), signal.SIGTERM) is False
        assert child.poll() is None
        assert targets.send(me.identity, signal.SIGTERM) is True
        assert child.wait(timeout=10) == -signal.SIGTERM
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("use_pidfd", [True, False])
def test_wait_gone_wakes_on_exit(use_pidfd):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    targets = staged_stop.Targets(use_pidfd=use_pidfd)
    try:
        targets.add(proctable.read_process(child.pid), "main")
        began = time.monotonic()
        pending = targets.wait_gone(list(targets.members), timeout=20)
        assert pending == set()
        assert time.monotonic() - began < 15  # woke on the exit, not at the timeout
    finally:
        targets.close()
        child.wait()


def test_checkpoint_report_new_complete_and_temp(tmp_path):
    ckpt = tmp_path / "ck"
    (ckpt / "step_10").mkdir(parents=True)
    (ckpt / "step_10" / "model.json").write_text("{}")
    before = checkpoints.entries(str(ckpt), "step_*", checkpoints.DEFAULT_TEMP_PATTERNS)
    (ckpt / ".tmp-step_20-5").mkdir()
    (ckpt / ".tmp-step_20-5" / "model.json").write_text("{}")
    params = {"checkpoint_dir": str(ckpt), "checkpoint_pattern": "step_*"}
    report = staged_stop.checkpoint_report(params, before)
    assert report["written"] is False and report["temp_files_left"] == [".tmp-step_20-5"]
    os.rename(ckpt / ".tmp-step_20-5", ckpt / "step_20")
    report = staged_stop.checkpoint_report(params, before)
    assert report["written"] is True and report["new"].endswith("step_20")
    (ckpt / "step_30").mkdir()  # empty: not complete
    assert staged_stop.checkpoint_report(params, before)["newest"].endswith("step_20")


def test_target_code_parses_as_python_3_8():
    for rel in ("plugins/modules/staged_stop.py", "plugins/module_utils/staged_stop.py",
                "plugins/module_utils/proctable.py"):
        with open(os.path.join(COLLECTION, rel), encoding="utf-8") as handle:
            ast.parse(handle.read(), filename=rel, feature_version=(3, 8))
