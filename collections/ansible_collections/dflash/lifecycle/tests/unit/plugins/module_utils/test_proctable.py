"""module_utils/ct/proctable.py on a fake /proc: parsing, tree, dispositions, environment, devices."""

import signal

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable


def test_parse_stat_comm_with_spaces_and_parentheses():
    line = "4242 (python3 (worker) 1) S 1 0 0 0 -1 0 0 0 0 0 5 6 0 0 20 0 3 0 98765 0 0\n"
    stat = proctable.parse_stat(line)
    assert stat["comm"] == "python3 (worker) 1"
    assert (stat["state"], stat["ppid"], stat["pgid"], stat["sid"]) == ("S", 1, 0, 0)
    assert stat["threads"] == 3 and stat["starttime"] == 98765


def test_read_process_and_dispositions(fake):
    ign = 1 << (signal.SIGINT - 1) | 1 << (signal.SIGQUIT - 1)
    cgt = 1 << (signal.SIGTERM - 1)
    fake.add(8, "python3 x)", 1, cmdline="python3 -u train.py", sig_ign=ign, sig_cgt=cgt)
    p = proctable.read_process(8, fake.path)
    assert p.comm == "python3 x)" and p.cmdline == "python3 -u train.py"
    assert p.disposition(signal.SIGINT) == "ignored"
    assert p.disposition(signal.SIGTERM) == "caught"
    assert p.disposition(signal.SIGHUP) == "default"
    assert proctable.read_process(9, fake.path) is None


def test_read_argv_keeps_spaces_and_empty_arguments(fake):
    base = fake.add(8, "python3", 1)
    (base / "cmdline").write_bytes(b"python3\0-u\0train.py\0--note\0two words\0\0")
    assert proctable.read_argv(8, fake.path) == ["python3", "-u", "train.py", "--note", "two words", ""]
    (base / "cmdline").write_bytes(b"")  # a zombie, or a kernel thread
    assert proctable.read_argv(8, fake.path) == []
    assert proctable.read_argv(9, fake.path) is None


def test_tree_building_with_pgid_0(fake):
    fake.add(1, "tini", 0, 1, 1)
    fake.add(5, "bash", 0)          # wrapper started by pct exec: parent outside the CT
    fake.add(6, "python3", 5)
    for worker in (7, 8, 9):
        fake.add(worker, "python3", 6)
    fake.add(10, "pt_worker", 9)
    fake.add(11, "sleep", 1)
    table = proctable.snapshot(fake.path)
    assert proctable.descendants(table, 6) == [7, 8, 9, 10]
    assert proctable.descendants(table, 5) == [6, 7, 8, 9, 10]
    assert proctable.ancestors(table, 10) == [10, 9, 6, 5]


def test_zombie_counts_as_gone(fake):
    fake.add(6, "python3", 1, state="Z", start=500)
    assert not proctable.alive((6, 500), fake.path)
    fake.add(7, "python3", 1, state="S", start=500)
    assert proctable.alive((7, 500), fake.path)
    assert not proctable.alive((7, 501), fake.path)  # same PID, another process


def test_environment_and_executable(fake):
    fake.add(6, "python3", 1, environ={"DFLASH_RUN_ID": "abc", "EMPTY": "", "EQ": "a=b"},
             exe="/usr/bin/python3.11")
    assert proctable.read_environ(6, fake.path) == {"DFLASH_RUN_ID": "abc", "EMPTY": "", "EQ": "a=b"}
    assert proctable.read_exe(6, fake.path) == "/usr/bin/python3.11"
    assert proctable.read_environ(9, fake.path) == {} and proctable.read_exe(9, fake.path) is None


def test_device_holders_name_each_device(fake):
    fake.add(6, "python3", 1, fds=["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia0", "/dev/null"])
    fake.add(7, "sleep", 1, fds=["/dev/null"])
    fake.add(8, "smi", 0, fds=["/dev/nvidiactl"])
    table = proctable.snapshot(fake.path)
    assert proctable.device_holders("/dev/nvidia*", table, fake.path) == {
        6: ["/dev/nvidia0", "/dev/nvidia1"], 8: ["/dev/nvidiactl"]}
    assert proctable.device_holders("/dev/nvidia1", table, fake.path) == {6: ["/dev/nvidia1"]}
