"""module_utils/stop/stop_options.py: one place for the defaults, the ladder checked once."""

import signal

import pytest

from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import stop_options


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
    with pytest.raises(stop_options.InvalidParameter) as caught:
        stop_options.validate_ladder(ladder)
    assert str(caught.value).startswith(error)


def test_ladder_accepts_names_and_numbers():
    stages = stop_options.validate_ladder([{"signal": "int", "scope": "main", "wait": 1},
                                           {"signal": 9}])
    assert [s["signal"] for s in stages] == [signal.SIGINT, signal.SIGKILL]
    assert stages[1]["scope"] == "tree"


def test_defaults_come_from_the_argument_spec():
    options = stop_options.StopOptions({"pattern": "x", "no_graceful": None})
    assert options.no_graceful == "wait_for_checkpoint"
    assert options.graceful_wait_cap == 900 and options.next_checkpoint_timeout == 1800
    assert [s["signal"].name for s in options.stages] == ["SIGINT", "SIGTERM", "SIGKILL"]
    assert options.describe_ladder()[0] == {"signal": "SIGINT", "scope": "main", "wait": 120.0}


def test_old_option_names_are_deprecated_aliases():
    spec = stop_options.ARGUMENT_SPEC
    assert spec["graceful_wait_cap"]["aliases"] == ["checkpoint_max_wait"]
    assert spec["next_checkpoint_timeout"]["deprecated_aliases"][0]["name"] == "checkpoint_wait_max"


def test_the_options_given_to_another_module_are_checked_as_staged_stop_checks_them():
    """trainer_process's stop_first: staged_stop's own argument spec, errors named stop_first."""
    options = stop_options.checked({"pidfile": "/run/dflash/trainer.pid", "graceful_wait_cap": "60"}, "stop_first")
    assert options.graceful_wait_cap == 60.0 and options.saves_on == "auto" and options.stages[0]["wait"] == 120
    for bad, error in (({"pidfile": "/p", "saves_on": "SIGUSR1"}, "stop_first: value of saves_on must be one of"),
                       ({"ladder": [{"signal": "SIGINT"}]}, "stop_first: one of the following is required: pidfile, pattern"),
                       ({"pidfile": "/p", "lock_unlock": True}, "stop_first: lock_unlock"),
                       ("pidfile=/p", "stop_first: must be a mapping")):
        with pytest.raises(stop_options.InvalidParameter, match=error):
            stop_options.checked(bad, "stop_first")
    with pytest.raises(stop_options.InvalidParameter, match=r"stop_first\.ladder\[0\]\.signal: unknown signal 'SIGNOPE'"):
        stop_options.checked({"pidfile": "/p", "ladder": [{"signal": "SIGNOPE"}]}, "stop_first")
