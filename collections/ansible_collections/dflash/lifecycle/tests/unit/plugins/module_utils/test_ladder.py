"""module_utils/ladder.py: which stage can make the trainer checkpoint."""

import signal

from ansible_collections.dflash.lifecycle.plugins.module_utils import ladder, proctable
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop_options import DEFAULT_LADDER, validate_ladder

BIT = {s: 1 << (s - 1) for s in (signal.SIGINT, signal.SIGTERM)}


def main_with(fake, ign=0, cgt=0):
    fake.add(8, "python3", 1, sig_ign=ign, sig_cgt=cgt)
    return proctable.read_process(8, fake.path)


def test_sigint_caught_is_the_graceful_stage(fake):
    _d, stage, reason = ladder.assess(main_with(fake, cgt=BIT[signal.SIGINT]), validate_ladder(DEFAULT_LADDER))
    assert stage == 0 and reason == "SIGINT is caught by PID 8: its handler can checkpoint"


def test_sigint_ignored_and_sigterm_caught_makes_sigterm_graceful(fake):
    main = main_with(fake, ign=BIT[signal.SIGINT], cgt=BIT[signal.SIGTERM])
    dispositions, stage, reason = ladder.assess(main, validate_ladder(DEFAULT_LADDER))
    assert dispositions == {"SIGINT": "ignored", "SIGTERM": "caught", "SIGKILL": "default"}
    assert stage == 1
    assert reason.startswith("SIGINT is ignored by PID 8, as after a background launch")
    assert reason.endswith("SIGTERM is caught by PID 8: its handler can checkpoint")


def test_no_handler_means_no_graceful_stage(fake):
    _d, stage, reason = ladder.assess(main_with(fake, ign=BIT[signal.SIGINT]), validate_ladder(DEFAULT_LADDER))
    assert stage is None and "SIGTERM is not caught by PID 8" in reason
    # SIGINT at its default ends the trainer before a caught SIGTERM could run its handler
    _d, stage, reason = ladder.assess(main_with_default(fake), validate_ladder(DEFAULT_LADDER))
    assert stage is None and reason == "SIGINT is not caught by PID 9: it ends it without a checkpoint"


def main_with_default(fake):
    fake.add(9, "python3", 1, sig_cgt=BIT[signal.SIGTERM])
    return proctable.read_process(9, fake.path)
