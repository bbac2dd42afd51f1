"""The stop that waits for the trainer's own checkpoint, against trainers that do not cooperate:
for each of the seven layouts, a save under way when the stop begins, a save with a long quiet
stretch inside it, periodic saves every fraction of a second; a trainer that saves on SIGINT
although its layout's frameworks do not (saves_on=auto), one that ignores SIGINT, Lightning
finishing its save under SIGTERM.

The trainers are the example trainer with each framework's imitation (real file formats, in the
order the framework's source writes them: tests/testbed/example_trainer/checkpoint_layouts.py),
real processes on the host whose stdout is a log of their own; the stop is the module's own code
on the real /proc (tests/uncooperative.py). Every verdict is compared with the files on disk:
what the framework's own loader loads, and when the save's last write happened.
"""

import os

import pytest

import uncooperative
from uncooperative import LAYOUTS, Trainer, completion_mark, first_signal, framework_finds, stop, step_of

# the promise: the signal that ends the trainer follows the completion mark within this
WITHIN_S = 1.0


@pytest.fixture
def trainers(tmp_path):
    started = []

    def start(layout, **kwargs):
        started.append(Trainer(str(tmp_path / f"run{len(started)}"), layout, **kwargs))
        return started[-1]

    yield start
    for trainer in started:
        trainer.end()


def careful(layout):
    """The setting a careful user writes for these trainers: they save on no signal."""
    return "none" if layout == "step_dirs" else "auto"


def assert_one_verdict(trainer, result, began):
    """The verdict agrees with itself and with the files: the new checkpoint completed after the
    stop began, loads by the framework's own loader at its step, the message says what written
    says, the steps lost match the trainer's own log, and nothing was left running."""
    ckpt, loss, msg = result["checkpoint"], result["loss"], result["msg"]
    assert result["stopped"] and not result["survivors"], msg
    assert trainer.proc.poll() is not None
    assert ckpt["written"] is True and ckpt["doubts"] == [], msg
    name = os.path.basename(ckpt["new"])
    assert completion_mark(trainer, name) >= began - 0.01, (name, msg)
    found = framework_finds(trainer, [ckpt["new"]])
    assert found["loads"][ckpt["new"]] == ckpt["new_step"] == step_of(trainer, name), (found, msg)
    assert f"new checkpoint {ckpt['new']} (" in msg and "NO " not in msg, msg
    if found["pick_loads"] != ckpt["new_step"]:  # the resume loads another: a later save, named unfinished
        assert found["pick"] in ckpt["unfinished"] and not ckpt["resume"]["complete"], (found, ckpt)
    logged = trainer.last_logged_step()
    if loss["saved_on_stop"]:
        assert loss["steps_lost"] == 0 and logged <= ckpt["new_step"], (logged, loss)
    elif logged >= ckpt["new_step"]:
        assert loss["steps_lost"] == logged - ckpt["new_step"], (logged, loss)
    else:
        assert loss["ahead_of_log"] == ckpt["new_step"] - logged, (logged, loss)
    assert result["log"]["path"] == trainer.log, result["log"]
    if trainer.log == trainer.stdout:
        assert f"log: read {trainer.log} (stdout), not log_file" in msg, msg
    else:  # the log file it holds open is the configured one: nothing more to say of it
        assert result["log"]["source"] == f"held open by PID {trainer.proc.pid}" and "log:" not in msg, msg
    return name


def assert_signalled_right_after(trainer, result, name):
    """The first signal went after the save's last write, within WITHIN_S of it, and right after
    the first checkpoint the stop saw land: the verdict's, or on a loaded machine the save before
    it, when the verdict's own save completed in the moment between that landing and the signal
    (a layout that marks no completion lands a save once the next one has begun). Returns the
    first landed checkpoint's name."""
    mark = completion_mark(trainer, name)
    sent = first_signal(result)
    assert sent is not None and 0 <= sent["at"] - mark + 0.01 < WITHIN_S, (sent, mark, result["timeline"])
    landed = [e for e in result["timeline"] if e["event"] == "checkpoint_landed"]
    assert landed and 0 <= sent["t"] - landed[0]["t"] < WITHIN_S, result["timeline"]
    first = os.path.basename(landed[0]["path"])
    # the later save's last write fell between that landing and the signal (the coarse clock of the
    # file system shows a write up to 0.01 s early)
    assert first == name or (step_of(trainer, first) < step_of(trainer, name)
                             and mark >= landed[0]["at"] - 0.01), (first, name, mark, result["timeline"])
    return first


# where the progress lines go: the trainer's stdout, or a log file its logging FileHandler holds
# open (the configured log) while its stdout has none
LOGS = ("stdout", "held log")


@pytest.mark.parametrize("log", LOGS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_save_under_way_when_the_stop_begins_is_the_stops(trainers, layout, log):
    trainer = trainers(layout, save_every=25, slow=0.6, held_log=log == "held log")
    trainer.wait_for_save_under_way()
    result, began = stop(trainer, careful(layout))
    name = assert_one_verdict(trainer, result, began)
    assert_signalled_right_after(trainer, result, name)
    assert result["checkpoint"]["new_by"] == "the trainer's own save, which the stop waited for"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_save_quiet_for_longer_than_the_activity_window_is_waited_for(trainers, layout):
    """A save that writes its first file, then nothing for 2 s (an FSDP gather, safetensors
    building its bytes in memory), then the rest: the stop neither signals in the gap nor
    gives up, and the checkpoint is the one that completes after it."""
    trainer = trainers(layout, save_every=25, slow=0.3, pause=2.0)
    trainer.wait_for_save_under_way()
    result, began = stop(trainer, "none", checkpoint_activity_window=1.0)
    name = assert_one_verdict(trainer, result, began)
    assert_signalled_right_after(trainer, result, name)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_periodic_saves_every_fraction_of_a_second_stop_at_the_first_that_lands(trainers, layout):
    trainer = trainers(layout, save_every=10, slow=0.2, log_every=10)
    trainer.wait_for_saves(3)
    result, began = stop(trainer, careful(layout))
    name = assert_one_verdict(trainer, result, began)
    first = assert_signalled_right_after(trainer, result, name)
    completed = [a for a in result["checkpoint"]["appeared"] if a["complete"]
                 and completion_mark(trainer, a["name"]) >= began - 0.01]
    # no save went by once one had landed: the verdict's, or the one that landed and the verdict's
    assert [a["name"] for a in completed] in ([name], [first, name]), result["checkpoint"]["appeared"]


@pytest.mark.parametrize("layout", sorted(uncooperative.layouts.LAYOUTS))
def test_a_trainer_that_saves_on_sigint_under_auto_gets_one_verdict_and_the_setting_named(trainers, layout):
    """Its frameworks save on no signal, this one has a KeyboardInterrupt hook that saves: the
    stop waits for its periodic save, sends SIGINT right after, and the checkpoint the hook writes
    is the stop's, with 0 steps lost, never doubted, and the setting that expects it named."""
    trainer = trainers(layout, save_every=25, slow=0.4, log_every=10, env={"DFLASH_TEST_SAVES_ON": "SIGINT"})
    trainer.wait_for_save_under_way()
    result, began = stop(trainer, "auto")
    name = assert_one_verdict(trainer, result, began)
    ckpt = result["checkpoint"]
    # the hook saves the step it stopped at; a SIGINT that lands before the step after the periodic
    # save makes it write that save again (in place, then its pointer): the signal is named either way
    assert ckpt["new_by"] in ("completed after SIGINT, stage 1",
                              "the trainer's own save, which the stop waited for, written again after SIGINT"), ckpt
    assert ckpt["new_by_signal"] == "SIGINT", ckpt
    assert result["loss"]["saved_on_stop"] and "0 steps lost (the trainer saved on SIGINT and exited)" in result["msg"]
    assert any("set trainer_run_saves_on: SIGINT" in note for note in result["notes"]), result["notes"]
    assert "KeyboardInterrupt at step" in trainer.text() and name in trainer.text().split("KeyboardInterrupt")[-1]


def test_a_sigint_that_lands_in_the_step_just_saved_is_named_by_the_save_written_again(trainers):
    """The race the test above can lose on a loaded machine, made certain: every step spends 1 s in
    a C call, so the SIGINT sent right after the periodic save is handled before the step after it
    counts, and the KeyboardInterrupt hook saves the same step again (DeepSpeed's save_checkpoint
    writes global_stepN in place, then latest). That save is the stop's, written again after the
    signal: the signal and the setting are named, and 0 steps are lost."""
    trainer = trainers("deepspeed", save_every=3, slow=0.4, env={"DFLASH_TEST_SAVES_ON": "SIGINT",
                                                                "DFLASH_TEST_BLOCK_IN_C_SECONDS": "1"})
    trainer.wait_for_save_under_way()
    result, began = stop(trainer, "auto")
    name = assert_one_verdict(trainer, result, began)
    ckpt = result["checkpoint"]
    assert f"KeyboardInterrupt at step {ckpt['new_step']}: saving checkpoint" in trainer.text(), trainer.text()[-1500:]
    assert ckpt["new_by"] == "the trainer's own save, which the stop waited for, written again after SIGINT", ckpt
    assert ckpt["new_by_signal"] == "SIGINT" and name == f"global_step{ckpt['new_step']}", ckpt
    assert result["loss"]["saved_on_stop"] and "0 steps lost (the trainer saved on SIGINT and exited)" in result["msg"]
    assert any("set trainer_run_saves_on: SIGINT" in note for note in result["notes"]), result["notes"]


def test_an_ignored_sigint_is_not_waited_out_once_the_checkpoint_landed(trainers):
    """The nohup case on DCP, with SIGINT sent to the whole tree (skip_ignored_stage does not
    apply): once step-N's .metadata is in place, SIGTERM goes within the bound, no SIGINT wait."""
    trainer = trainers("dcp", save_every=25, slow=0.6, env={"DFLASH_TEST_IGNORE_SIGINT": "1"})
    trainer.wait_for_save_under_way()
    ladder = [dict(uncooperative.LADDER[0], scope="tree"), *uncooperative.LADDER[1:]]
    result, began = stop(trainer, "auto", ladder=ladder)
    name = assert_one_verdict(trainer, result, began)
    assert_signalled_right_after(trainer, result, name)
    assert first_signal(result)["signal"] == "SIGTERM", result["timeline"]
    skipped = [e for e in result["timeline"] if e["event"] == "skipped"]
    assert skipped and "has landed" in skipped[0]["reason"], result["timeline"]


def test_lightning_finishes_its_save_under_way_on_sigterm_and_it_is_the_stops(trainers):
    """Lightning's SIGTERM handler sets a flag: the batch and the save in it finish. A stop of
    SIGTERM first, proceeding without a wait, sends it into the save; the checkpoint completed
    after it is the stop's, 0 steps lost."""
    trainer = trainers("lightning", save_every=25, slow=1.5, log_every=10)
    trainer.wait_for_save_under_way()
    ladder = uncooperative.LADDER[1:]
    result, began = stop(trainer, "auto", ladder=ladder, no_graceful="proceed")
    assert_one_verdict(trainer, result, began)
    ckpt = result["checkpoint"]
    assert ckpt["new_by"] == "completed after SIGTERM, stage 1", ckpt
    assert result["loss"]["saved_on_stop"] and result["loss"]["steps_lost"] == 0
    assert "SIGTERM at step" in trainer.text()
