"""module_utils/launch/launch.py: health is a real progress line, failed attempts keep the good log."""

import functools
import subprocess
import sys
import time

import pytest

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import progress
from ansible_collections.dflash.lifecycle.plugins.module_utils.launch import gang_health, launch


def params(tmp_path, **extra):
    return dict({"log_file": str(tmp_path / "train.log"), "health_timeout": 10, "health_seconds": 0.3,
                 "step_regex": progress.STEP_REGEX, "throughput_patterns": list(progress.THROUGHPUT_PATTERNS),
                 "profile_line_regex": progress.PROFILE_LINE_REGEX,
                 "profile_stage_regex": progress.PROFILE_STAGE_REGEX, "throughput_lines": 0,
                 "throughput_warmup_lines": 0, "throughput_timeout": 5, "log_keep": 3}, **extra)


def run_trainer(tmp_path, script):
    log = open(tmp_path / "train.log", "ab")
    return subprocess.Popen([sys.executable, "-u", "-c", script], stdout=log, stderr=log)


def test_a_progress_line_then_alive_is_healthy(tmp_path):
    proc = run_trainer(tmp_path, "import time\nprint('banner: reports tok/s')\nprint('step 5 loss 2 | 123.5 tok/s')\n"
                                 "time.sleep(30)")
    try:
        facts = launch.wait_healthy(proc, params(tmp_path))
        assert (facts["step"], facts["tokens_per_s"]) == (5, 123.5) and facts["healthy_after_s"] >= 0.3
    finally:
        proc.kill()
        proc.wait()


def test_the_throughput_window_waits_for_its_lines_after_the_warm_up(tmp_path):
    script = ("import time\n"
              "for step, figure, ms in ((10, 50.0, 9.0), (20, 100.0, 4.0), (30, 110.0, 3.0), (40, 90.0, 5.0)):\n"
              "    print(f'step {step} loss 1 tok/s {figure}', flush=True)\n"
              "    print(f'[ProfileStats step {step}] drafter avg {ms}ms max {ms + 1}ms', flush=True)\n"
              "    time.sleep(0.3)\n"
              "time.sleep(30)\n")
    proc = run_trainer(tmp_path, script)
    try:
        facts = launch.wait_healthy(proc, params(tmp_path, health_seconds=0, throughput_lines=3,
                                                 throughput_warmup_lines=1, progress_file=str(tmp_path / "p.json")))
    finally:
        proc.kill()
        proc.wait()
    window = facts["throughput"]
    assert (window["tokens_per_s"], window["lines"], window["complete"]) == (100.0, 3, True)
    assert (window["first_step"], window["last_step"]) == (20, 40)  # the warm-up line left out
    assert window["stages"] == {"drafter": {"avg_ms": 4.0, "max_ms": 6.0}}
    assert window["waited_s"] >= 0.5 and not (tmp_path / "p.json").exists()


def test_a_traceback_with_tok_s_in_its_source_line_is_no_health(tmp_path):
    script = ("import time\nx = 0\ntry:\n    print(f'step 1 tok/s {1 / x}')\nexcept Exception:\n"
              "    import traceback; traceback.print_exc()\n    time.sleep(30)\n")
    proc = run_trainer(tmp_path, script)
    try:
        with pytest.raises(launch.LaunchError) as caught:
            launch.wait_healthy(proc, params(tmp_path))
        assert "printed a Python traceback" in str(caught.value) and caught.value.details["running"] is True
        assert "ZeroDivisionError" in str(caught.value)
    finally:
        proc.kill()
        proc.wait()


def test_a_crash_right_after_the_first_progress_line_is_no_health(tmp_path):
    proc = run_trainer(tmp_path, "import sys\nprint('step 1 tok/s 10')\nsys.exit(3)")
    with pytest.raises(launch.LaunchError) as caught:
        launch.wait_healthy(proc, params(tmp_path, health_seconds=2))
    assert caught.value.details["exit_status"] == 3 and caught.value.details["running"] is False


def test_a_failed_attempt_is_set_aside_and_the_good_log_comes_back(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("the good run\n")
    launch.rotate_logs(str(log), 3)  # the failed attempt's start
    log.write_text("the failed attempt\n")
    assert launch.set_failed_log_aside(str(log), 3) == f"{log}.failed"
    assert log.read_text() == "the good run\n" and (tmp_path / "train.log.failed").read_text() == "the failed attempt\n"
    assert not (tmp_path / "train.log.1").exists()


def test_a_command_that_cannot_start_fails_with_its_cause_and_nothing_written(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("the good run\n")
    missing = str(tmp_path / "no-such-trainer")
    with pytest.raises(launch.LaunchError) as caught:
        launch.start(params(tmp_path, command=[missing], pidfile=str(tmp_path / "trainer.pid"), cwd=str(tmp_path)))
    assert str(caught.value).startswith(f"cannot start {missing}: [Errno 2]")
    assert caught.value.details["running"] is False
    assert log.read_text() == "the good run\n" and not (tmp_path / "trainer.pid").exists()


def test_resume_auto_adds_the_resume_arguments_only_with_a_complete_checkpoint(tmp_path):
    base = {"command": ["/bin/sh", "t.sh"], "resume_auto": True, "checkpoint_dir": str(tmp_path / "ck"),
            "checkpoint_format": "auto", "checkpoint_custom": None, "incomplete_checkpoint": "move_aside",
            "resume_args": ["--resume"]}

    def command(params):
        return launch.command(params, launch.prepare_resume(params))

    assert command(base) == (["/bin/sh", "t.sh"], False)
    (tmp_path / "ck" / "step_5").mkdir(parents=True)
    (tmp_path / "ck" / "step_5" / "model.bin").write_bytes(b"x")
    assert command(base) == (["/bin/sh", "t.sh", "--resume"], True)
    assert command(dict(base, resume_auto=False)) == (["/bin/sh", "t.sh"], False)
    assert command(dict(base, checkpoint_dir=None)) == (["/bin/sh", "t.sh"], False)
    (tmp_path / "ck" / "step_5" / "model.bin").unlink()  # incomplete: its resume would not load it
    assert command(base) == (["/bin/sh", "t.sh"], False)


def test_a_gang_ct_stops_waiting_when_another_ct_says_its_launch_failed(tmp_path):
    """ct400 waits for a progress line its rendezvous will never give; ct401's launch failed and
    said so in the directory they share: ct400 stops waiting within a second, naming ct401."""
    shared = tmp_path / "ckpt" / ".dflash-gang" / "big-abc-1"
    health = {"dir": str(shared), "me": "ct400", "members": ["ct400", "ct401"]}
    proc = run_trainer(tmp_path, "import time\nprint('waiting for the rendezvous')\ntime.sleep(30)")
    try:
        other = gang_health.GangPeers(dict(health, me="ct401"))
        other.tell("failed: the trainer (PID 9) exited with status 1 after 0.4s")
        with pytest.raises(launch.LaunchError) as caught:
            launch.wait_healthy(proc, params(tmp_path, gang_health=health))
        assert str(caught.value).startswith("ct401 of the gang failed its launch (the trainer (PID 9) exited with "
                                            "status 1 after 0.4s); this CT stopped waiting after ")
        assert caught.value.details["peer"] == "ct401" and caught.value.details["running"] is True
        assert (shared / "ct400").read_text() == "starting\n"  # a peer's failure is not this CT's to tell
    finally:
        proc.kill()
        proc.wait()


def test_a_gang_ct_whose_launch_fails_tells_the_others(tmp_path):
    shared = tmp_path / "ckpt" / ".dflash-gang" / "big-abc-1"
    health = {"dir": str(shared), "me": "ct401", "members": ["ct400", "ct401"]}
    proc = run_trainer(tmp_path, "raise SystemExit(3)")
    with pytest.raises(launch.LaunchError):
        launch.wait_healthy(proc, params(tmp_path, gang_health=health))
    assert (shared / "ct401").read_text().startswith("failed: the trainer (PID ")
    assert gang_health.GangPeers(dict(health, me="ct400")).failed()[0] == "ct401"


@pytest.mark.parametrize("rank0_says", ["healthy", None])
def test_a_gang_ct_without_rank_0_is_healthy_only_once_the_gangs_ranks_have_met(tmp_path, rank0_says):
    """ct401's ranks run from the start (a static rendezvous starts them at once; they wait in
    init_process_group): healthy only once ct400, whose ranks log, says its run is healthy; a CT that
    says only that its ranks run proves nothing; silence past health_timeout fails, naming it."""
    import threading

    shared = tmp_path / "ckpt" / ".dflash-gang" / "big-abc-1"
    health = {"dir": str(shared), "me": "ct401", "members": ["ct400", "ct401"]}
    proc = run_trainer(tmp_path, "import time\ntime.sleep(30)")
    rank0 = gang_health.GangPeers(dict(health, me="ct400"))
    try:
        peers = gang_health.GangPeers(health)
        rank0.tell("ranks running")
        assert not peers.met() and not rank0.met(), "ranks running is no meeting"
        if rank0_says:
            threading.Timer(0.6, rank0.tell, (rank0_says,)).start()
        ranks = {"ranks_env": [{"pid": proc.pid, "rank": 1}]}
        began = time.monotonic()
        wait = functools.partial(launch._stay_alive, proc, params(tmp_path, health_timeout=1.5, throughput_timeout=0.5), ranks,
                                 lambda **fields: None, began, peers)
        if rank0_says:
            assert wait()["pid"] == proc.pid and time.monotonic() - began >= 0.6
            assert (shared / "ct401").read_text() == "ranks running\n"  # wait_healthy says healthy after
        else:
            with pytest.raises(launch.LaunchError) as caught:
                wait()
            assert "the gang's ranks did not meet within 2s: its ranks run, but no CT whose ranks log said" in str(caught.value)
    finally:
        proc.kill()
        proc.wait()
