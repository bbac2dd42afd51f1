"""module_utils/stop/staged_stop.py: the steps in order, on a fake /proc and on real processes."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import staged_stop

FAST = [{"signal": "SIGINT", "scope": "main", "wait": 10}, {"signal": "SIGKILL", "scope": "tree", "wait": 5}]


def test_ambiguity_fails_before_any_signal(fake):
    fake.add(6, "python3", 1, cmdline="python3 train.py --a")
    fake.add(9, "python3", 1, cmdline="python3 train.py --b")
    with pytest.raises(staged_stop.StopFailed) as caught:
        staged_stop.run({"pattern": "train[.]py"}, proc_root=fake.path)
    assert [m["pid"] for m in caught.value.result["matches"]] == [6, 9]
    assert caught.value.result["timeline"] == []


def test_check_mode_reports_targets_others_and_ladder(fake):
    fake.add(6, "python3", 1, cmdline="python3 train.py", sig_cgt=1 << 1)
    fake.add(7, "python3", 6, cmdline="python3 train.py")
    fake.add(8, "nvidia-smi", 0, cmdline="nvidia-smi", fds=["/dev/nvidia0"])
    result = staged_stop.run({"pattern": "train[.]py", "saves_on": "SIGINT"}, proc_root=fake.path, check_mode=True)
    assert [(t["pid"], t["role"]) for t in result["targets"]] == [(6, "main"), (7, "descendant")]
    assert result["signal_dispositions"]["SIGINT"] == "caught" and result["graceful_stage"] == 0
    assert [o["pid"] for o in result["other_gpu_holders"]] == [8]
    assert "would leave other GPU holders untouched: PID 8" in result["msg"]
    assert result["timeline"] == [] and result["stopped"] is False


def test_a_trainer_gone_between_snapshot_and_capture_is_no_trainer_running(fake, monkeypatch):
    fake.add(6, "python3", 1, cmdline="python3 train.py", sig_cgt=1 << 1)
    stale = proctable.snapshot(fake.path)
    fake.remove(6)
    monkeypatch.setattr(proctable, "snapshot", lambda proc_root="/proc": stale)
    result = staged_stop.run({"pattern": "train[.]py"}, proc_root=fake.path)
    assert result["msg"] == "no trainer running (PID 6 ended before it could be held)"
    assert result["changed"] is False and result["timeline"] == []


@pytest.mark.parametrize("argv,cwd,expected", [
    ("python3 t.py --output-dir /data/ck --lr 1", None, "/data/ck"),
    ("python3 t.py --output-dir=/data/ck2", None, "/data/ck2"),
    ("python3 t.py --output-dir ck", "/workspace", "/workspace/ck"),
    ("python3 t.py --lr 1", None, "/settings/ck"),
])
def test_the_checkpoint_dir_is_the_one_the_running_trainer_writes(fake, argv, cwd, expected):
    base = fake.add(6, "python3", 1, cmdline=argv, sig_cgt=1 << 1)
    if cwd:
        os.symlink(cwd, base / "cwd")
    result = staged_stop.run({"pattern": "t[.]py", "checkpoint_dir": "/settings/ck"},
                             proc_root=fake.path, check_mode=True)
    assert result["checkpoint"]["dir"] == expected
    assert result["checkpoint_dir_source"] == ("checkpoint_dir" if expected == "/settings/ck"
                                               else "the trainer's --output-dir")


TRAINER = textwrap.dedent("""
    import os, signal, sys, time
    out = sys.argv[1]
    try:
        print("ready", flush=True)
        while True:
            time.sleep(0.05)
    except KeyboardInterrupt:
        if os.environ.get("FULL_DISK") != "1":
            os.makedirs(os.path.join(out, "step_7"))
            open(os.path.join(out, "step_7", "model.bin"), "wb").write(b"x" * 64)
        else:
            open(os.path.join(out, ".tmp-step_7-1"), "wb").write(b"x" * 16)
        sys.exit(130)
""")


def signals_at_default():
    """SIGINT and SIGTERM at their defaults in the trainer, as the launch starts one: a test run
    started as a background job of a non-interactive shell (run-all.sh) passes SIGINT on ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def start_trainer(tmp_path, **env):
    script = tmp_path / "dflash_unit_trainer.py"
    script.write_text(TRAINER)
    (tmp_path / "ck").mkdir(exist_ok=True)
    (tmp_path / "train.log").write_text("step 5 tok/s 1\n")
    child = subprocess.Popen([sys.executable, str(script), str(tmp_path / "ck")], stdout=subprocess.PIPE,
                             env=dict(os.environ, **env), text=True,
                             preexec_fn=signals_at_default)
    assert child.stdout.readline() == "ready\n"
    return child


def stop_params(tmp_path, child, **params):
    return dict({"pid": child.pid, "pattern": "dflash_unit_trainer[.]py", "ladder": FAST,
                 "checkpoint_dir": str(tmp_path / "ck"), "saves_on": "SIGINT",
                 "log_file": str(tmp_path / "train.log"), "device_glob": ""}, **params)


def test_a_real_trainer_stops_at_sigint_with_its_checkpoint(tmp_path):
    child = start_trainer(tmp_path)
    try:
        result = staged_stop.run(stop_params(tmp_path, child))
        child.wait(timeout=10)
    finally:
        child.kill()
    assert result["stopped_by"] == {"stage": 0, "signal": "SIGINT", "scope": "main"}
    assert result["checkpoint"]["written"] and result["checkpoint"]["new"].endswith("step_7")
    assert result["cpu_s"] < 1.0


def test_a_graceful_stop_that_wrote_nothing_fails_with_the_loss(tmp_path):
    child = start_trainer(tmp_path, FULL_DISK="1")
    try:
        with pytest.raises(staged_stop.StopFailed) as caught:
            staged_stop.run(stop_params(tmp_path, child))
        child.wait(timeout=10)
    finally:
        child.kill()
    msg = caught.value.result["msg"]
    assert caught.value.result["stopped"] is True
    assert "no new sound checkpoint" in msg and "No trainer is running" in msg
    assert ".tmp-step_7-1 (16 bytes)" in msg and "GiB" in msg
    assert (tmp_path / "ck" / ".tmp-step_7-1").exists()  # reported, never deleted
    child = start_trainer(tmp_path, FULL_DISK="1")
    try:
        result = staged_stop.run(stop_params(tmp_path, child, on_missing_checkpoint="proceed"))
    finally:
        child.kill()
    assert result["checkpoint"]["written"] is False and result["stopped"] is True


PERIODIC = textwrap.dedent("""
    import json, os, signal, sys, time
    out = sys.argv[1]
    mode = os.environ.get("MODE", "")
    if mode == "sigterm_saves":
        def save_and_exit(signum, frame):
            os.makedirs(os.path.join(out, "checkpoint-9"))
            json.dump({"global_step": 9}, open(os.path.join(out, "checkpoint-9", "trainer_state.json"), "w"))
            sys.exit(0)
        signal.signal(signal.SIGTERM, save_and_exit)
    print("ready", flush=True)
    if mode == "saving":  # an in-place save (HF's order), slow, when the stop comes
        os.makedirs(os.path.join(out, "checkpoint-8"))
        for index in range(12):  # 3 s: the stop's start outlasts a shorter one on a loaded machine
            open(os.path.join(out, "checkpoint-8", f"part{index}.txt"), "w").write("x")
            time.sleep(0.25)
        json.dump({"global_step": 8}, open(os.path.join(out, "checkpoint-8", "trainer_state.json"), "w"))
    while True:
        time.sleep(0.05)
""")


def start_periodic(tmp_path, **env):
    script = tmp_path / "dflash_unit_trainer.py"
    script.write_text(PERIODIC)
    out = tmp_path / "ck"
    out.mkdir(exist_ok=True)
    (out / "checkpoint-5").mkdir(exist_ok=True)
    (out / "checkpoint-5" / "trainer_state.json").write_text('{"global_step": 5}')
    child = subprocess.Popen([sys.executable, str(script), str(out)], stdout=subprocess.PIPE,
                             env=dict(os.environ, **env), text=True,
                             preexec_fn=signals_at_default)
    assert child.stdout.readline() == "ready\n"
    return child


def test_a_caught_sigint_of_a_trainer_that_saves_nothing_is_no_graceful_stop(tmp_path):
    """Python's default SIGINT handler shows as caught; an HF Trainer saves nothing on it."""
    child = start_periodic(tmp_path)
    try:
        result = staged_stop.run(stop_params(tmp_path, child, saves_on="auto"), check_mode=True)
    finally:
        child.kill()
    assert result["checkpoint"]["format"] == "hf_trainer"
    assert result["signal_dispositions"]["SIGINT"] == "caught" and result["graceful_possible"] is False
    assert "can checkpoint" not in result["graceful_reason"]
    assert "no graceful checkpoint" in result["msg"] and "saves nothing on a signal" in result["msg"]


def test_the_stages_before_the_one_the_trainer_saves_on_are_skipped(tmp_path):
    child = start_periodic(tmp_path, MODE="sigterm_saves")
    ladder = [{"signal": "SIGINT", "scope": "main", "wait": 5}, {"signal": "SIGTERM", "scope": "tree", "wait": 10},
              {"signal": "SIGKILL", "scope": "tree", "wait": 5}]
    try:
        result = staged_stop.run(stop_params(tmp_path, child, saves_on="SIGTERM", ladder=ladder))
        child.wait(timeout=10)
    finally:
        child.kill()
    assert result["graceful_stage"] == 1
    assert result["timeline"][0]["event"] == "skipped" and "would end PID" in result["timeline"][0]["reason"]
    assert result["stopped_by"]["signal"] == "SIGTERM"
    assert result["checkpoint"]["written"] and result["checkpoint"]["new_step"] == 9


def test_the_first_signal_waits_for_a_save_in_progress(tmp_path):
    """no_graceful=proceed still never cuts a save short: SIGINT goes once checkpoint-8 is done."""
    child = start_periodic(tmp_path, MODE="saving")
    try:
        time.sleep(0.25)  # the save is under way
        result = staged_stop.run(stop_params(tmp_path, child, saves_on="none", no_graceful="proceed"))
        child.wait(timeout=10)
    finally:
        child.kill()
    waited = [e for e in result["timeline"] if e["event"] == "waited_for_save"]
    assert waited and waited[0]["still_writing"] is None and waited[0]["waited"] > 0.3
    assert result["checkpoint"]["newest_step"] == 8 and result["checkpoint"]["written"]
    assert result["loss"]["checkpoint_step"] == 8


def stopped_at_moment(tmp_path, child, moment):
    """The stop of a gang's CT whose moment is signal_at (the trainer saves on no signal)."""
    try:
        result = staged_stop.run(stop_params(tmp_path, child, saves_on="none", no_graceful="proceed",
                                             signal_at=moment))
        child.wait(timeout=10)
    finally:
        child.kill()
    return result


def test_a_gang_ct_stopped_after_the_moment_counts_the_checkpoint_written_since(tmp_path):
    """A CT of a gang whose stop starts late: rank 0 on another CT already saved in answer to that
    CT's signal at the gang's moment. That checkpoint is this stop's new one, not one from before."""
    child = start_periodic(tmp_path)
    moment = time.time() - 2.0
    os.utime(tmp_path / "ck" / "checkpoint-5", (moment - 60, moment - 60))
    (tmp_path / "ck" / "checkpoint-6").mkdir()
    (tmp_path / "ck" / "checkpoint-6" / "trainer_state.json").write_text('{"global_step": 6}')
    result = stopped_at_moment(tmp_path, child, moment)
    ckpt = result["checkpoint"]
    assert ckpt["written"] and ckpt["new"].endswith("checkpoint-6") and ckpt["new_step"] == 6, ckpt
    assert result["signal_late_s"] >= 2.0 and result["signal_spare_s"] <= -2.0
    assert "NO new checkpoint" not in result["msg"], result["msg"]


def test_a_gang_ct_ready_before_the_moment_holds_its_signal_and_says_how_early_it_was_ready(tmp_path):
    """The margin a gang's moment leaves is judged by how long before it each CT's stop was ready."""
    child = start_periodic(tmp_path)
    moment = time.time() + 3.0  # the stop is ready long before, even on a loaded machine
    result = stopped_at_moment(tmp_path, child, moment)
    assert 0 < result["signal_spare_s"] < 3.0 and result["signal_late_s"] < 0.2
    assert result["signalled_at"] >= moment


def test_a_checkpoint_seen_landing_before_the_signal_is_the_trainers_own_save_on_a_coarse_clock():
    """The file system stamps a save's last write with a clock a few ms coarse: a SIGINT sent
    5 ms after the stop saw the save land may carry a wall time at or before that stamp + 10 ms.
    The stop's own order of events decides, never that stamp (seen in CI under load)."""
    path = "/ckpt/step_50"
    timeline = [{"event": "checkpoint_landed", "path": path, "t": 10.000, "at": 1000.000},
                {"event": "signal", "signal": "SIGINT", "stage": 0, "t": 10.005, "at": 1000.005}]
    assert staged_stop._produced_by({"timeline": timeline}, path, 1000.001) == (
        "the trainer's own save, which the stop waited for", None)
    # a checkpoint that completed after the signal, although another landed before it, is the signal's
    assert staged_stop._produced_by({"timeline": timeline}, "/ckpt/step_51", 1000.300) == (
        "completed after SIGINT, stage 1", "SIGINT")
    # the one seen landing, written again after the signal (a handler that found its step saved)
    assert staged_stop._produced_by({"timeline": timeline}, path, 1000.300) == (
        "the trainer's own save, which the stop waited for, written again after SIGINT", "SIGINT")


def test_a_dead_runs_leftovers_are_ended_not_taken_for_two_trainers(tmp_path):
    """The trainer SIGKILLed, its two workers (real processes of this test, with its command line and
    its run id) still running: the stop finds no trainer, ends them and says so; check mode only
    names them."""
    import uuid

    run_id = uuid.uuid4().hex[:16]
    marker = f"dflash-leftover-{run_id}"
    workers = [subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.1)", marker],
                                env=dict(os.environ, DFLASH_RUN_ID=run_id)) for _worker in range(2)]
    try:
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        pidfile = tmp_path / "trainer.pid"
        pidfile.write_text(f"{dead.pid} 1 {run_id}\n")
        time.sleep(0.3)  # their exec
        options = {"pidfile": str(pidfile), "pattern": marker, "ladder": FAST}
        planned = staged_stop.run(options, check_mode=True)
        assert "would end 2 leftover(s) of its dead run" in planned["msg"] and all(w.poll() is None for w in workers)
        result = staged_stop.run(options)
        assert result["msg"].startswith(f"no trainer running (PID {dead.pid} from the pidfile is not running); "
                                        "2 leftover(s) of the dead run ended"), result["msg"]
        assert result["changed"] and result["leftovers"]["survivors"] == []
        assert [w.wait(5) for w in workers] == [-signal.SIGTERM] * 2
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
