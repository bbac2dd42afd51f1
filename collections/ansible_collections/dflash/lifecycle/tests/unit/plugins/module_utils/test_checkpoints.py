"""module_utils/checkpoints.py: a checkpoint counts as written only when nothing says it may
be cut short."""

import os
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils import checkpoints
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop_options import StopOptions


def directory(path, **params):
    return checkpoints.Directory(StopOptions(dict({"pattern": "x", "checkpoint_dir": str(path),
                                                   "checkpoint_pattern": "step_*"}, **params)))


def save(path, name, text="{}", age=0.0):
    (path / name).mkdir(parents=True, exist_ok=True)
    (path / name / "model.json").write_text(text)
    if age:
        stamp = time.time() - age
        os.utime(path / name / "model.json", (stamp, stamp))
        os.utime(path / name, (stamp, stamp))


def test_new_complete_and_temp(tmp_path):
    save(tmp_path, "step_10", age=60)
    ck = directory(tmp_path)
    before = ck.entries()
    (tmp_path / ".tmp-step_20-5").mkdir()
    (tmp_path / ".tmp-step_20-5" / "model.json").write_text("{}")
    report = ck.report(before)
    assert report["written"] is False and report["new"] is None
    assert [t["name"] for t in report["temp_files_left"]] == [".tmp-step_20-5"]
    assert report["temp_files_left"][0]["bytes"] == 2
    os.rename(tmp_path / ".tmp-step_20-5", tmp_path / "step_20")
    report = ck.report(before)
    assert report["written"] is True and report["new"].endswith("step_20")
    assert report["temp_files_left"] == []
    (tmp_path / "step_30").mkdir()  # empty: not complete
    assert ck.report(before)["newest"].endswith("step_20")


def test_the_pointer_temp_file_is_a_temporary_name():
    assert checkpoints.is_temp(".latest.tmp-4242", checkpoints.DEFAULT_TEMP_PATTERNS)


def test_a_checkpoint_written_when_the_trainer_was_killed_is_not_written(tmp_path):
    save(tmp_path, "step_10", age=60)
    ck = directory(tmp_path)
    before = ck.entries()
    save(tmp_path, "step_20", text='{"half": ')  # an in-place save cut by SIGKILL
    report = ck.report(before, ended_mid_write=True)
    assert report["new"].endswith("step_20") and report["written"] is False
    assert "still being written" in report["doubts"][0]


def test_an_unfinished_later_save_and_a_stale_pointer_are_doubts(tmp_path):
    save(tmp_path, "step_10", age=60)
    ck = directory(tmp_path)
    before = ck.entries()
    save(tmp_path, "step_20", age=5)
    (tmp_path / "latest").write_text("step_10\n")
    report = ck.report(before)
    assert report["written"] is False
    assert report["doubts"] == ["latest names step_10, not step_20: a resume would not load it"]
    (tmp_path / "latest").write_text("step_20\n")
    assert ck.report(before)["written"] is True
    (tmp_path / ".tmp-step_30-9").mkdir()  # a save after it never finished
    (tmp_path / ".tmp-step_30-9" / "optimizer.bin").write_bytes(b"\0" * 10)
    report = ck.report(before)
    assert report["written"] is False and "later save was left unfinished" in report["doubts"][0]


def test_settled_needs_the_pointer_or_a_quiet_window(tmp_path):
    save(tmp_path, "step_10", age=60)
    ck = directory(tmp_path, checkpoint_stable_window=30)
    before = ck.entries()
    save(tmp_path, "step_20")  # in place, just written: maybe still growing
    assert ck.settled(before) is None
    (tmp_path / "latest").write_text("step_20\n")  # the trainer says it is done
    assert ck.settled(before) == "step_20"
    quiet = directory(tmp_path, checkpoint_stable_window=0.2)
    save(tmp_path, "step_30")
    (tmp_path / "latest").unlink()
    assert quiet.settled(before) is None
    time.sleep(0.3)
    assert quiet.settled(before) == "step_30"


def test_loss_and_interval(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("step 100 loss 1\nstep 250 loss 0.9\n")
    ck_dir = tmp_path / "ck"
    save(ck_dir, "step_100", age=30)
    save(ck_dir, "step_200", age=10)
    ck = directory(ck_dir, log_file=str(log))
    loss = ck.loss()
    assert (loss["checkpoint_step"], loss["last_logged_step"], loss["steps_lost"]) == (200, 250, 50)
    assert 19 < loss["checkpoint_interval_s"] < 21 and loss["free_bytes"] > 0
    assert "50 steps not in a checkpoint" in checkpoints.describe_loss(loss)


def test_without_any_checkpoint_every_logged_step_is_lost(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("step 100 loss 1\nstep 250 loss 0.9\n")
    (tmp_path / "ck").mkdir()
    loss = directory(tmp_path / "ck", log_file=str(log)).loss()
    assert (loss["checkpoint"], loss["last_logged_step"], loss["steps_lost"]) == (None, 250, 250)
    assert checkpoints.describe_loss(loss) == "there is no complete checkpoint: a stop loses the whole run (250 steps)"


def test_activity_is_sampled_at_most_twice_a_second(tmp_path):
    activity = checkpoints.Activity(str(tmp_path), window=5)
    (tmp_path / "f").write_text("x")
    now = time.monotonic()
    activity.sample(now)  # within the sample period of the first read: not read again
    assert not activity.recent(now)
    activity.sample(now, force=True)
    assert activity.recent(now) and not activity.recent(now + 6)
