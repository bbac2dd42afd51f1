"""module_utils/stop/trainer_finding.py: pidfile first, pattern next, never a guess."""

import pytest

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import trainer_finding
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop.stop_options import InvalidParameter, StopOptions


def test_pattern_picks_topmost_and_sees_through_a_shell(fake):
    fake.add(5, "bash", 0, cmdline="bash -c python3 train_dflash_pipeline.py")
    fake.add(6, "python3", 5, cmdline="python3 train_dflash_pipeline.py")
    fake.add(7, "python3", 6, cmdline="python3 train_dflash_pipeline.py")  # forked worker
    table = proctable.snapshot(fake.path)
    assert trainer_finding.pattern_matches(r"train_dflash_pipeline[.]py", table, set()) == [6]


def test_pidfile_with_a_reused_pid_is_rejected(fake, tmp_path):
    fake.add(6, "python3", 1, start=2000, cmdline="python3 train.py")
    table = proctable.snapshot(fake.path)
    pidfile = tmp_path / "t.pid"
    pidfile.write_text("6 1999\n")
    found, reason = trainer_finding.pidfile_process(str(pidfile), None, table, fake.path)
    assert found is None and "was reused" in reason
    pidfile.write_text("6 2000 0123abcd\n")
    found, reason = trainer_finding.pidfile_process(str(pidfile), None, table, fake.path)
    assert found.pid == 6 and reason is None
    found, reason = trainer_finding.pidfile_process(str(pidfile), "other[.]py", table, fake.path)
    assert found is None and "does not match pattern" in reason


def test_pidfile_fields(tmp_path):
    path = tmp_path / "t.pid"
    path.write_text("42 777 5d41402abc4b2a76\n")
    entry = trainer_finding.read_pidfile(str(path))
    assert (entry.pid, entry.starttime, entry.run_id) == (42, 777, "5d41402abc4b2a76")
    path.write_text("42\n")
    assert trainer_finding.read_pidfile(str(path))[:2] == (42, None)
    assert trainer_finding.read_pidfile(str(tmp_path / "none")) is None
    path.write_text("nope\n")
    with pytest.raises(InvalidParameter):
        trainer_finding.read_pidfile(str(path))


def test_ambiguity_is_refused_and_select_picks(fake):
    fake.add(6, "python3", 1, start=10, cmdline="python3 train.py --a")
    fake.add(9, "python3", 1, start=20, cmdline="python3 train.py --b")
    table = proctable.snapshot(fake.path)
    with pytest.raises(trainer_finding.Ambiguous) as caught:
        trainer_finding.find_trainer(StopOptions({"pattern": "train[.]py"}), table, fake.path)
    assert [m["pid"] for m in caught.value.matches] == [6, 9]
    assert "Nothing was signalled" in str(caught.value)
    newest, _found = trainer_finding.find_trainer(
        StopOptions({"pattern": "train[.]py", "select": "newest"}), table, fake.path)
    assert newest.pid == 9
    chosen, found = trainer_finding.find_trainer(
        StopOptions({"pattern": "train[.]py", "pid": 6}), table, fake.path)
    assert chosen.pid == 6 and found["source"] == "pattern"


def test_a_dead_runs_workers_are_its_leftovers_not_a_trainer(fake, tmp_path):
    """The main process SIGKILLed: its two DataLoader workers, reparented, still match the pattern;
    they carry the pidfile's run id, so the stop finds no trainer and names them as leftovers."""
    fake.add(7, "python3", 1, start=1010, cmdline="python3 train.py", environ={"DFLASH_RUN_ID": "5d41402abc4b2a76"})
    fake.add(8, "python3", 1, start=1011, cmdline="python3 train.py", environ={"DFLASH_RUN_ID": "5d41402abc4b2a76"})
    fake.add(9, "python3", 1, start=1500, cmdline="python3 train.py", environ={"DFLASH_RUN_ID": "other"})
    pidfile = tmp_path / "t.pid"
    pidfile.write_text("6 1000 5d41402abc4b2a76\n")
    table = proctable.snapshot(fake.path)
    main, found = trainer_finding.find_trainer(StopOptions({"pidfile": str(pidfile), "pattern": "train[.]py"}),
                                               table, fake.path)
    assert main.pid == 9 and found["source"] == "pattern", "a process of another run is still a trainer"
    assert [entry["pid"] for entry in found["leftovers"]] == [7, 8]
    (fake.root / "9").rename(fake.root / "gone-9")
    main, found = trainer_finding.find_trainer(StopOptions({"pidfile": str(pidfile), "pattern": "train[.]py"}),
                                               proctable.snapshot(fake.path), fake.path)
    assert main is None and found["pidfile_stale"] and len(found["leftovers"]) == 2
    pidfile.write_text("7 1010 5d41402abc4b2a76\n")  # a live trainer: its workers are its run, not leftovers
    main, found = trainer_finding.find_trainer(StopOptions({"pidfile": str(pidfile), "pattern": "train[.]py"}),
                                               proctable.snapshot(fake.path), fake.path)
    assert main.pid == 7 and found["leftovers"] == []
