"""module_utils/checkpoint/checkpoints.py and checkpoint_verdict.py: a checkpoint directory read by its
layout - what is complete, what a stop wrote or lost, what the resume loads. (Every framework's layout, with its real file
formats and a save killed at every point: tests/unit/test_checkpoint_layouts.py of the project.)"""

import json
import os
import time
from unittest import mock

import pytest

from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import (
    checkpoint_formats, checkpoint_verdict, checkpoints)


def directory(path, **params):
    return checkpoints.Directory(str(path), **params)


def save(path, name, text='{"w": [1, 2]}', age=0.0):
    (path / name).mkdir(parents=True, exist_ok=True)
    (path / name / "model.json").write_text(text)
    if age:
        aged(path / name, age)


def aged(path, age):
    stamp = time.time() - age
    for root, _dirs, files in os.walk(path):
        for item in files:
            os.utime(os.path.join(root, item), (stamp, stamp))
    os.utime(path, (stamp, stamp))


def test_new_complete_and_temp(tmp_path):
    save(tmp_path, "step_10", age=60)
    ck = directory(tmp_path)
    before = ck.entries()
    (tmp_path / ".tmp-step_20-5").mkdir()
    (tmp_path / ".tmp-step_20-5" / "model.json").write_text("{}")
    report = ck.report(before)
    assert report["format"] == "step_dirs" and report["format_reason"] == "auto: 1 entry like step_10"
    assert report["written"] is False and report["new"] is None
    assert [t["name"] for t in report["temp_files_left"]] == [".tmp-step_20-5"]
    assert report["temp_files_left"][0]["bytes"] == 2
    os.rename(tmp_path / ".tmp-step_20-5", tmp_path / "step_20")
    report = ck.report(before)
    assert report["written"] is True and report["new"].endswith("step_20") and report["new_step"] == 20
    assert report["temp_files_left"] == [] and report["resume"]["name"] == "step_20"
    (tmp_path / "step_30").mkdir()  # empty: not complete
    report = ck.report(before)
    assert report["newest"].endswith("step_20")
    assert [(a["name"], a["complete"], a["problems"]) for a in report["appeared"]] == [
        ("step_20", True, []), ("step_30", False, ["holds no file"])]


def test_the_pointer_temp_file_is_a_temporary_name():
    assert checkpoints.is_temp(".latest.tmp-4242", checkpoints.DEFAULT_TEMP_PATTERNS)
    assert not checkpoints.is_temp(checkpoint_formats.MOVED_ASIDE, checkpoints.DEFAULT_TEMP_PATTERNS)


def test_a_checkpoint_cut_in_place_is_incomplete_by_its_files(tmp_path):
    save(tmp_path, "step_10", age=60)
    ck = directory(tmp_path)
    before = ck.entries()
    save(tmp_path, "step_20", text='{"half": ')  # an in-place save cut by SIGKILL
    report = ck.report(before)
    assert report["new"] is None and report["written"] is False
    assert report["appeared"][0]["problems"][0].startswith("model.json: does not parse as JSON")
    assert report["newest"].endswith("step_10")


def test_a_later_save_left_unfinished_is_listed_apart_and_never_undoes_the_written_one(tmp_path):
    save(tmp_path, "step_10", age=60)
    ck = directory(tmp_path)
    before = ck.entries()
    save(tmp_path, "step_20", age=5)
    (tmp_path / "latest").write_text("step_20\n")
    assert ck.report(before)["written"] is True
    (tmp_path / ".tmp-step_30-9").mkdir()  # a save after it never finished
    (tmp_path / ".tmp-step_30-9" / "optimizer.bin").write_bytes(b"\0" * 10)
    report = ck.report(before)
    assert report["written"] is True and report["doubts"] == [] and report["new"].endswith("step_20")
    assert report["unfinished"] == [".tmp-step_30-9"]


def test_a_checkpoint_the_pointer_does_not_name_is_complete_but_not_written(tmp_path):
    save(tmp_path, "step_10", age=60)
    (tmp_path / "latest").write_text("step_10\n")
    ck = directory(tmp_path)
    before = ck.entries()
    save(tmp_path, "step_20")  # renamed into place; killed before latest was moved
    report = ck.report(before)
    assert report["new"].endswith("step_20") and report["written"] is False
    assert report["doubts"] == ["the trainer's resume would not load it: latest names step_10 (the save did not finish)"]


def test_a_resume_older_than_the_newest_complete_checkpoint_is_said_with_the_steps_between(tmp_path):
    """latest still names step_10 while step_20 is complete: the trainer's own resume would load
    the older one, and the words name both and the 10 steps between them; a resume of the newest
    (or of an alias of it, the same step) says nothing."""
    save(tmp_path, "step_10", age=60)
    (tmp_path / "latest").write_text("step_10\n")
    save(tmp_path, "step_20")
    report = directory(tmp_path).report(directory(tmp_path).entries())
    words = checkpoint_verdict.older_resume_words(report)
    assert words == (f"the trainer's resume would load {tmp_path}/step_10 (step 10, the one latest names), "
                     f"not the newest complete {tmp_path}/step_20 (step 20): 10 steps between them"), words
    (tmp_path / "latest").write_text("step_20\n")
    report = directory(tmp_path).report({})
    assert checkpoint_verdict.older_resume_words(report) == ""
    assert checkpoint_verdict.older_resume_words(dict(report, resume=dict(report["resume"], path="/c/last.ckpt"), newest_step=20)) == ""


def test_landed_needs_a_complete_checkpoint_and_its_pointer(tmp_path):
    save(tmp_path, "step_10", age=60)
    (tmp_path / "latest").write_text("step_10\n")
    ck = directory(tmp_path, stable_window=0.5)
    before = ck.entries()
    save(tmp_path, "step_20", text='{"w": ')  # being written: quiet or not, not complete
    aged(tmp_path / "step_20", 30)
    assert ck.landed(before) is None
    save(tmp_path, "step_20")
    aged(tmp_path / "step_20", 30)
    assert ck.landed(before) is None  # latest still names step_10: the save is not over
    (tmp_path / "latest").write_text("step_20\n")  # the pointer is the layout's last write
    assert ck.landed(before) == "step_20"


def test_a_completion_mark_lands_at_once_and_without_one_after_the_quiet_window(tmp_path):
    """HF's trainer_state.json is its last write: landed at once, even with the next save begun.
    SpecForge's scripts mark nothing (the model code is copied after the weights): landed once
    quiet for the stable window."""
    ck = directory(tmp_path, stable_window=0.5)
    before = ck.entries()
    (tmp_path / "checkpoint-30").mkdir()
    (tmp_path / "checkpoint-30" / "trainer_state.json").write_text('{"global_step": 30}')
    (tmp_path / "checkpoint-40").mkdir()  # the next save, begun
    assert ck.landed(before) == "checkpoint-30"
    scripts = tmp_path / "scripts"
    ck = directory(scripts, stable_window=0.5)
    before = ck.entries()
    (scripts / "epoch_0_step_30").mkdir(parents=True)
    for name in ("training_state.pt", "config.json", "model.safetensors"):
        (scripts / "epoch_0_step_30" / name).write_bytes(b"")
    checkpoints._CHECKED.clear()
    # the files' own checks are test_checkpoint_formats.py's: here each counts as whole
    with mock.patch.object(checkpoints.checkpoint_files, "file_problem", return_value=None):
        assert ck.landed(before) is None
        time.sleep(0.6)
        assert ck.landed(before) == "epoch_0_step_30"


def test_loss_interval_and_a_checkpoint_ahead_of_the_log(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("step 100 loss 1\nstep 250 loss 0.9\n")
    ck_dir = tmp_path / "ck"
    save(ck_dir, "step_100", age=30)
    save(ck_dir, "step_200", age=10)
    ck = directory(ck_dir, log_file=str(log))
    loss = ck.loss()
    assert (loss["checkpoint_step"], loss["last_logged_step"], loss["steps_lost"]) == (200, 250, 50)
    assert 19 < loss["checkpoint_interval_s"] < 21 and loss["free_bytes"] > 0
    assert "50 steps not in a checkpoint" in checkpoint_verdict.describe_loss(loss)
    save(ck_dir, "step_300", age=1)  # the log trails the checkpoint
    loss = ck.loss()
    assert loss["steps_lost"] is None and loss["ahead_of_log"] == 50
    assert "50 steps ahead of the log's last step 250" in checkpoint_verdict.describe_loss(loss)


def test_a_checkpoint_written_in_answer_to_the_stop_loses_nothing(tmp_path):
    """A trainer that logs every 10 steps, stopped at step 893 by the signal it saves on: its
    interrupt checkpoint is 3 steps ahead of the log's last line and holds every step."""
    log = tmp_path / "train.log"
    log.write_text("step 880 loss 1\nstep 890 loss 0.9\n")
    ck_dir = tmp_path / "ck"
    save(ck_dir, "step_800", age=60)
    signalled_at = time.time() - 2
    save(ck_dir, "step_893", age=1)
    ck = directory(ck_dir, log_file=str(log))
    assert ck.loss()["ahead_of_log"] == 3 and ck.loss()["steps_lost"] is None  # still running: not known
    loss = ck.loss(answered_at=signalled_at)
    assert (loss["steps_lost"], loss["ahead_of_log"], loss["saved_on_stop"]) == (0, None, True)
    # written before the signal: a periodic save, not the answer; the steps lost stay unknown
    loss = ck.loss(answered_at=time.time())
    assert (loss["steps_lost"], loss["ahead_of_log"], loss["saved_on_stop"]) == (None, 3, False)
    # a log past the answer's step counts the steps the checkpoint does not hold
    log.write_text("step 890 loss 0.9\nstep 900 loss 0.8\n")
    loss = ck.loss(answered_at=signalled_at)
    assert (loss["steps_lost"], loss["saved_on_stop"]) == (7, False)


def test_the_interval_is_the_running_trainers_own_when_it_saved(tmp_path):
    save(tmp_path, "step_100", age=600)  # an earlier run's
    save(tmp_path, "step_200", age=500)
    ck = directory(tmp_path)
    assert 99 < ck.periodic_interval() < 101
    ck.since = time.time() - 40  # this run started 40 s ago and saved 10 s ago
    save(tmp_path, "step_300", age=10)
    assert 29 < ck.periodic_interval() < 31


def test_the_newest_checkpoint_is_the_highest_step_not_the_newest_mtime(tmp_path):
    save(tmp_path, "step_900", age=5)
    save(tmp_path, "step_1000", age=60)
    assert directory(tmp_path).complete()[-1][0] == "step_1000"


def test_without_any_checkpoint_every_logged_step_is_lost(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("step 100 loss 1\nstep 250 loss 0.9\n")
    (tmp_path / "ck").mkdir()
    loss = directory(tmp_path / "ck", log_file=str(log)).loss()
    assert (loss["checkpoint"], loss["last_logged_step"], loss["steps_lost"]) == (None, 250, 250)
    assert checkpoint_verdict.describe_loss(loss) == "there is no complete checkpoint: a stop loses the whole run (250 steps)"


def test_an_incomplete_pick_of_the_resume_is_moved_aside_never_deleted(tmp_path):
    for step in (100, 200):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (tmp_path / "checkpoint-300").mkdir()
    (tmp_path / "checkpoint-300" / "config.json").write_text("{}")  # cut before trainer_state.json
    (tmp_path / "checkpoint-400").mkdir()
    ck = directory(tmp_path)
    planned = ck.prepare_resume(check_mode=True)
    assert [m["name"] for m in planned["moved"]] == ["checkpoint-400", "checkpoint-300"]
    assert planned["resume"]["name"] == "checkpoint-200" and os.path.isdir(tmp_path / "checkpoint-400")
    with pytest.raises(checkpoints.ResumeRefused, match="would load .*checkpoint-400, which is incomplete"):
        ck.prepare_resume("fail")
    done = ck.prepare_resume()
    assert done["resume"]["name"] == "checkpoint-200" and done["resume"]["complete"]
    moved = sorted(os.listdir(tmp_path / ".incomplete"))
    assert [m.rsplit("-", 1)[0] for m in moved] == ["checkpoint-300", "checkpoint-400"]
    assert (tmp_path / ".incomplete" / moved[0] / "config.json").exists()
    assert "no trainer_state.json" in done["moved"][1]["problems"][0]
    assert ck.report({})["temp_files_left"] == []  # .incomplete/ is not a temporary file


def test_a_pick_a_pointer_names_is_refused_not_moved(tmp_path):
    (tmp_path / "global_step10").mkdir()
    (tmp_path / "global_step10" / "mp_rank_00_model_states.pt").write_bytes(b"PK\x03\x04 cut")
    (tmp_path / "latest").write_text("global_step10")
    with pytest.raises(checkpoints.ResumeRefused, match="a pointer names it"):
        directory(tmp_path).prepare_resume()
    assert os.path.isdir(tmp_path / "global_step10")


@pytest.mark.parametrize("setting,custom,holds,message", [
    ("step_dirs", None, ["checkpoint-32"], "checkpoint_format=step_dirs matches nothing in {d}, which holds "
     "checkpoint-32; checkpoint_format=hf_trainer matches it (1 entry like checkpoint-32)"),
    ("custom", {"pattern": "ckpt_*"}, ["notes.txt"], "checkpoint_format=custom (pattern ckpt_*) matches nothing "
     "in {d}, which holds notes.txt; no known layout matches it either"),
])
def test_a_layout_that_matches_nothing_there_fails_naming_what_is_there(tmp_path, setting, custom, holds, message):
    for name in holds:
        (tmp_path / name).mkdir()
    ck = directory(tmp_path, checkpoint_format=setting, custom=custom)
    with pytest.raises(checkpoint_formats.InvalidLayout) as caught:
        ck.check()
    assert str(caught.value).startswith(message.format(d=tmp_path))


def test_a_named_layout_in_an_empty_or_foreign_directory_is_fine(tmp_path):
    directory(tmp_path, checkpoint_format="hf_trainer").check()
    (tmp_path / "runs").mkdir()  # HF's tensorboard logs before the first checkpoint
    directory(tmp_path, checkpoint_format="hf_trainer").check()


def test_auto_waits_for_the_first_checkpoint_to_know_the_layout(tmp_path):
    ck = directory(tmp_path)
    assert ck.saving("auto")[0] is None and "not known yet" in ck.saving("auto")[2]
    assert ck.resolve() == (None, f"{tmp_path} holds no checkpoint yet")
    (tmp_path / "epoch=0-step=5.ckpt").write_bytes(b"")
    assert ck.resolve()[0].name == "lightning" and ck.saving("auto")[0] == frozenset()
    assert ck.saving("SIGINT")[0] == {checkpoint_formats.signal.SIGINT}


def test_save_in_progress_is_a_recent_temporary_or_incomplete_entry(tmp_path):
    save(tmp_path, "step_10", age=60)
    ck = directory(tmp_path, activity_window=5)
    assert ck.save_in_progress() == []
    (tmp_path / ".tmp-step_20-3").mkdir()
    assert ck.save_in_progress() == [".tmp-step_20-3"]
    aged(tmp_path / ".tmp-step_20-3", 30)  # left by a save long ago: not in progress
    assert ck.save_in_progress() == []
    save(tmp_path, "step_30", text="{")
    assert ck.save_in_progress() == ["step_30"]


def test_activity_is_sampled_at_most_twice_a_second(tmp_path):
    ck = directory(tmp_path)
    activity = checkpoint_verdict.Activity(ck.fingerprint, window=5)
    (tmp_path / "f").write_text("x")
    now = time.monotonic()
    activity.sample(now)  # within the sample period of the first read: not read again
    assert not activity.recent(now)
    activity.sample(now, force=True)
    assert activity.recent(now) and not activity.recent(now + 6)


def test_the_fingerprint_leaves_out_what_is_not_the_layouts(tmp_path):
    save(tmp_path, "checkpoint-5")
    (tmp_path / "checkpoint-5" / "trainer_state.json").write_text('{"global_step": 5}')
    ck = directory(tmp_path)
    before = ck.fingerprint()
    (tmp_path / "runs").mkdir()  # tensorboard events beside the checkpoints
    (tmp_path / "runs" / "events.out").write_bytes(b"x" * 100)
    assert ck.fingerprint() == before
    (tmp_path / "checkpoint-5" / "optimizer.pt").write_bytes(b"x")
    assert ck.fingerprint() != before


def test_a_checkpoint_whose_pointer_moves_during_the_stop_is_the_stops(tmp_path):
    """step_500 was renamed into place just before the stop began, and the SIGINT cut the write of
    latest; the trainer's handler found step_500 saved and moved latest: step_500 is the stop's."""
    save(tmp_path, "step_327", age=60)
    (tmp_path / "latest").write_text("step_327\n")
    save(tmp_path, "step_500")
    ck = directory(tmp_path)
    before = ck.snapshot()
    assert ck.report(before)["new"] is None
    (tmp_path / "latest").write_text("step_500\n")
    report = ck.report(before)
    assert report["new"].endswith("step_500") and report["written"] is True and report["doubts"] == []
    assert report["new_completed_at"] >= os.lstat(tmp_path / "latest").st_mtime


def test_a_pointer_written_again_naming_the_step_saved_before_is_the_stops_answer(tmp_path):
    """The SIGINT came in the step after a periodic save of step_500, pointer and all: the
    trainer's handler (the example trainer's save_checkpoint) found step_500 complete at its step
    and wrote latest again, to a temporary name renamed over it. That is its answer to the stop:
    step_500, nothing lost, not "no new checkpoint". A pointer left alone is no answer."""
    log = tmp_path / "train.log"
    log.write_text("step 450 loss 1\nstep 500 loss 0.9\n")
    ck_dir = tmp_path / "ck"
    save(ck_dir, "step_500", age=5)
    (ck_dir / "latest").write_text("step_500\n")
    aged(ck_dir / "latest", 5)
    ck = directory(ck_dir, log_file=str(log))
    before = ck.snapshot()
    assert ck.report(before)["new"] is None  # nothing written yet
    signalled_at = time.time()
    (ck_dir / ".latest.tmp-7").write_text("step_500\n")
    os.rename(ck_dir / ".latest.tmp-7", ck_dir / "latest")
    report = ck.report(before)
    assert report["new"].endswith("step_500") and report["written"] is True
    assert report["new_completed_at"] >= signalled_at - 0.01
    loss = ck.loss(answered_at=signalled_at)
    assert (loss["steps_lost"], loss["saved_on_stop"]) == (0, True)
    # a log past the step the pointer names: the steps after it are counted as lost
    log.write_text("step 500 loss 0.9\nstep 510 loss 0.8\n")
    loss = ck.loss(answered_at=signalled_at)
    assert (loss["steps_lost"], loss["saved_on_stop"]) == (10, False)


def test_a_trainer_that_logs_every_10_steps_may_have_lost_9_steps_more_than_its_log_shows(tmp_path):
    """Stopped without saving, a trainer that prints a progress line every 10 steps was anywhere
    from its last line's step to 9 steps past it: the loss is a range, never the lower bound alone.
    Checkpoint and resume lines between its progress lines do not change its cadence."""
    log = tmp_path / "train.log"
    log.write_text("step 180 loss 1\ncheckpoint saved: /ck/step_200 (step 200, interval)\nstep 190 loss 1\n"
                   "step 200 loss 1\nstep 210 loss 0.9\nstep 220 loss 0.9\n")
    ck_dir = tmp_path / "ck"
    save(ck_dir, "step_200", age=10)
    loss = directory(ck_dir, log_file=str(log)).loss(answered_at=time.time())
    assert (loss["log_every"], loss["steps_lost"], loss["steps_lost_up_to"]) == (10, 20, 29)
    assert checkpoint_verdict.lost_words(loss) == "20 to 29"
    assert "20 to 29 steps not in a checkpoint" in checkpoint_verdict.describe_loss(loss)
    # a trainer that logs every step: the count is exact
    log.write_text("".join(f"step {n} loss 1\n" for n in range(200, 221)))
    loss = directory(ck_dir, log_file=str(log)).loss()
    assert (loss["log_every"], loss["steps_lost"], loss["steps_lost_up_to"]) == (1, 20, 20)
    assert checkpoint_verdict.lost_words(loss) == "20"
    # no cadence seen twice yet: nothing is guessed
    assert checkpoint_verdict.log_every([100, 250]) is None
    assert checkpoint_verdict.log_every([10, 20, 30, 33]) == 10
