"""module_utils/stop/ladder.py: which stage can make the trainer checkpoint."""

import signal

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import ladder
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop.stop_options import DEFAULT_LADDER, validate_ladder

BIT = {s: 1 << (s - 1) for s in (signal.SIGINT, signal.SIGTERM)}


def main_with(fake, ign=0, cgt=0):
    fake.add(8, "python3", 1, sig_ign=ign, sig_cgt=cgt)
    return proctable.read_process(8, fake.path)


SIGINT_SAVES = ({signal.SIGINT}, "saves_on=SIGINT")
SAVES_NOTHING = (set(), "saves_on=auto: a HF transformers Trainer trainer saves nothing on a signal")


def assess(main, saving):
    return ladder.assess(main, validate_ladder(DEFAULT_LADDER), *saving)


def test_a_caught_signal_the_trainer_saves_on_is_the_graceful_stage(fake):
    _d, stage, reason = assess(main_with(fake, cgt=BIT[signal.SIGINT]), SIGINT_SAVES)
    assert stage == 0 and reason == "SIGINT is caught by PID 8 and the trainer saves on it (saves_on=SIGINT)"


def test_a_caught_sigint_alone_is_no_graceful_stage(fake):
    """Python's own KeyboardInterrupt handler shows as caught (SigCgt): HF Trainer's SIGINT ends
    it wherever it is, a save included."""
    _d, stage, reason = assess(main_with(fake, cgt=BIT[signal.SIGINT]), SAVES_NOTHING)
    assert stage is None
    assert reason.startswith("SIGINT is caught by PID 8, but no checkpoint is expected to follow it (saves_on=auto: a HF "
                             "transformers Trainer trainer saves nothing on a signal) (Python's own")
    assert "can checkpoint" not in reason


def test_sigint_ignored_and_sigterm_saving_makes_sigterm_graceful(fake):
    main = main_with(fake, ign=BIT[signal.SIGINT], cgt=BIT[signal.SIGTERM])
    dispositions, stage, reason = assess(main, ({signal.SIGTERM}, "saves_on=SIGTERM"))
    assert dispositions == {"SIGINT": "ignored", "SIGTERM": "caught", "SIGKILL": "default"}
    assert stage == 1
    assert reason.startswith("SIGINT is ignored by PID 8, as after a background launch")
    assert reason.endswith("SIGTERM is caught by PID 8 and the trainer saves on it (saves_on=SIGTERM)")


def test_a_trainer_saving_on_sigint_that_ignores_it_has_no_graceful_stage(fake):
    """The field's stop: `nohup bash run.sh &` left SIGINT ignored, so the handler never runs."""
    _d, stage, reason = assess(main_with(fake, ign=BIT[signal.SIGINT], cgt=BIT[signal.SIGTERM]), SIGINT_SAVES)
    assert stage is None and reason.startswith("SIGINT is ignored by PID 8")
    assert "SIGTERM is caught by PID 8, but no checkpoint is expected to follow it" in reason


def test_a_signal_it_saves_on_but_does_not_catch_is_no_graceful_stage(fake):
    _d, stage, reason = assess(main_with_default(fake), SIGINT_SAVES)
    assert stage is None
    assert reason.startswith("the trainer saves on SIGINT (saves_on=SIGINT), but PID 9 does not catch it")


def test_a_later_stage_that_saves_is_graceful_past_a_signal_that_would_end_it(fake):
    # SIGINT at its default would end the trainer: SIGTERM, which it saves on, is the graceful
    # stage, and the climb skips SIGINT (test_stop_run)
    _d, stage, _reason = assess(main_with_default(fake), ({signal.SIGTERM}, "saves_on=SIGTERM"))
    assert stage == 1


def test_not_knowing_what_the_trainer_does_is_no_graceful_stage(fake):
    _d, stage, reason = assess(main_with(fake, cgt=BIT[signal.SIGINT]),
                               (None, "saves_on=auto, and the checkpoint layout is not known yet"))
    assert stage is None and reason.startswith("what the trainer does on a signal is not known")


def main_with_default(fake):
    fake.add(9, "python3", 1, sig_cgt=BIT[signal.SIGTERM])
    return proctable.read_process(9, fake.path)
