"""module_utils/agent/launch_options.py and transaction.py: launch options given to the preflight
are validated as trainer_process's own, the preflight's call launches only when nothing is to be
done before, and the transaction's outcome says what it did, then what runs."""

import pytest

from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import launch_options, transaction

OPTIONS = {"command": ["/bin/sh", "/run/dflash/trainer.sh"], "pidfile": "/run/dflash/trainer.pid",
           "log_file": "/workspace/logs/train.log", "secrets_env": "HF_TOKEN=hf_secret\n",
           "stop_first": {"pidfile": "/run/dflash/trainer.pid"}}
INSTALLED = {"release_status": {"present": True}, "model_stage_needed": False}
RELEASE = {"base": "/opt/dflash", "release": "3f2a9c0d1e2b4a5f", "files": {}}


def test_launch_options_get_trainer_process_defaults_and_their_secrets_are_named():
    params, secrets = launch_options.checked(OPTIONS, "launch")
    assert params["health_seconds"] == 5 and params["refuse_busy"] is True and params["activate"] is None
    assert params["stop_first"] == OPTIONS["stop_first"]  # validated by the stop itself, as stop_first always is
    assert "HF_TOKEN=hf_secret\n" in secrets  # kept out of the task's output (no_log)


@pytest.mark.parametrize("options, named", [
    ("not a mapping", "must be a mapping of dflash.lifecycle.trainer_process's options"),
    ({"pidfile": "/run/dflash/trainer.pid", "log_file": "/l"}, "missing required arguments: command"),
    (dict(OPTIONS, lock_unlock=True), "lock_unlock"),  # the launch runs under the preflight's own lock
    (dict(OPTIONS, health_seconds="soon"), "argument 'health_seconds' is of type str"),
])
def test_bad_launch_options_are_refused_naming_the_option(options, named):
    with pytest.raises(launch_options.InvalidLaunch) as err:
        launch_options.checked(options, "launch")
    assert str(err.value).startswith("launch: ") and named in str(err.value), str(err.value)


def test_the_preflights_call_launches_only_when_nothing_is_to_be_done_before_the_launch():
    assert launch_options.deferred(False, RELEASE, INSTALLED, OPTIONS) is None
    assert launch_options.deferred(False, None, dict(INSTALLED, release_status=None), OPTIONS) is None  # no release to compare
    assert launch_options.deferred(False, RELEASE, dict(INSTALLED, release_status={"present": False}), OPTIONS) == (
        "release 3f2a9c0d1e2b4a5f is to be pushed first")
    assert launch_options.deferred(False, RELEASE, dict(INSTALLED, model_stage_needed=True), OPTIONS) == (
        "a model is to be staged between the stop and the launch")
    # a launch that stages the model after its stop itself needs nothing done before it
    stages = dict(OPTIONS, stage_models={"models": {"/dev/shm/m": "/workspace/m"}})
    assert launch_options.deferred(False, RELEASE, dict(INSTALLED, model_stage_needed=True), stages) is None
    assert launch_options.deferred(True, RELEASE, INSTALLED, OPTIONS).startswith("check mode")


def test_the_transactions_outcome_says_what_it_did_then_what_runs():
    assert transaction.outcome_words({"msg": "trainer PID 7 healthy"}, "trainer PID 7 runs") == "trainer PID 7 healthy"
    rolled = {"failed": True, "msg": "no progress line within 300s",
              "rollback": {"msg": "rolled back: trainer PID 9 healthy"}}
    assert transaction.outcome_words(rolled, "trainer PID 9 runs") == (
        "no progress line within 300s; rolled back: trainer PID 9 healthy; trainer PID 9 runs")
    down = {"failed": True, "msg": "the stop failed, nothing was started: survivors"}
    assert transaction.outcome_words(down, "NO TRAINER IS RUNNING").endswith("; NO TRAINER IS RUNNING")
