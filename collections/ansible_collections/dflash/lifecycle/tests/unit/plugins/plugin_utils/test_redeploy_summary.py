"""plugin_utils/redeploy_summary.py: the summary says what the results show, and says plainly
when no trainer runs."""

from ansible_collections.dflash.lifecycle.plugins.filter.redeploy import FilterModule

FILTERS = FilterModule().filters()
MANIFEST = {"release": "new1"}
STATUS = {"present": False, "current": "old0", "previous": "older", "drift": {},
          "changes": {"modified": ["t.py"], "added": [], "removed": []}}
PREFLIGHT = {"release_status": STATUS, "trainer_running": True}
STOP = {"changed": True, "stopped": True, "stopped_by": {"stage": 0, "signal": "SIGINT", "scope": "main"},
        "timeline": [{"elapsed": 2.5}], "checkpoint": {"new": "/ck/step_9", "written": True},
        "loss": {"steps_lost": 0}, "other_gpu_holders": [{"pid": 7}]}
LAUNCH = {"pid": 42, "run_id": "abc", "first_progress_s": 1.0, "healthy_after_s": 3.0,
          "tokens_per_s": 14210.5, "argv": ["python3", "-u", "t.py", "--note", "two words"]}


def summarize(**results):
    data = FILTERS["redeploy_summary"]("ct200", **results)
    return data, FILTERS["redeploy_report"](data)


def test_a_redeploy_that_worked():
    data, lines = summarize(manifest=MANIFEST, preflight=PREFLIGHT, stop=STOP, launch=LAUNCH)
    assert lines[0] == ("ct200: release new1 (new: 1 modified, 0 added, 0 removed), stopped by SIGINT in "
                        "2.5s, checkpoint /ck/step_9 (0 steps lost), PID 42, first progress after 1.0s, healthy after "
                        "3.0s, 14210.5 tok/s")
    assert lines[1] == "python3 -u t.py --note 'two words'"
    assert data["trainer_running"] is True and data["errors"] == [] and data["other_gpu_holders"] == 1


def test_the_layout_what_was_moved_aside_and_what_the_run_resumed_from():
    stop = dict(STOP, checkpoint={"new": None, "written": False, "format": "hf_trainer",
                                  "newest": "/ck/checkpoint-400"}, loss={"steps_lost": 37})
    launch = dict(LAUNCH, resume={"path": "/ck/checkpoint-400"},
                  moved_aside=[{"name": "checkpoint-437", "to": "/ck/.incomplete/checkpoint-437-20261201T100000"}])
    data, lines = summarize(manifest=MANIFEST, preflight=PREFLIGHT, stop=stop, launch=launch)
    assert ("stopped by SIGINT in 2.5s, NO new checkpoint (hf_trainer), newest complete /ck/checkpoint-400 "
            "(37 steps lost), moved the incomplete checkpoint-437 aside to /ck/.incomplete/checkpoint-437-"
            "20261201T100000, PID 42, resumed from /ck/checkpoint-400, first progress") in lines[0]
    assert data["moved_aside"][0]["name"] == "checkpoint-437"


def test_a_resume_older_than_the_newest_checkpoint_is_in_the_stop_words():
    stop = dict(STOP, checkpoint={"new": "/ck/global_step90", "written": False, "format": "deepspeed",
                                  "newest": "/ck/global_step90", "newest_step": 90,
                                  "resume": {"path": "/ck/global_step50", "step": 50, "complete": True,
                                             "rule": "the tag latest names"}})
    data, lines = summarize(manifest=MANIFEST, preflight=PREFLIGHT, stop=stop, launch=LAUNCH)
    assert ("(the trainer's resume would load /ck/global_step50 (step 50, the tag latest names), not the newest "
            "complete /ck/global_step90 (step 90): 40 steps between them)") in lines[0], lines[0]
    assert data["resume_older"].startswith("the trainer's resume would load /ck/global_step50")


def test_installed_already_and_drift():
    _data, lines = summarize(manifest=MANIFEST, preflight={"release_status": dict(STATUS, present=True)},
                             stop=STOP, launch=LAUNCH)
    assert lines[0].startswith("ct200: release new1 (installed already),")
    drift = {"new1": {"modified": ["t.py"], "added": [], "removed": []}}
    data, lines = summarize(manifest=MANIFEST, preflight={"release_status": dict(STATUS, drift=drift)},
                            install={"changed": True}, stop=STOP, launch=LAUNCH)
    assert "(drifted in place: 1 modified, 0 added, 0 removed, reinstalled)" in lines[0]
    assert data["drift"] == drift


def test_a_stop_that_lost_work_says_no_trainer_runs():
    failed_stop = dict(STOP, failed=True, stopped_by={"stage": 0, "signal": "SIGINT", "scope": "main"},
                       checkpoint={"new": None, "written": False},
                       msg="the trainer stopped, but no new sound checkpoint in /ck: none completed during the stop.")
    data, lines = summarize(manifest=MANIFEST, preflight=PREFLIGHT, stop=failed_stop)
    # said first, with since when and the way back, even when the stop's moment is not in its result
    assert lines[0] == ("ct200 is DOWN since this job (it found a trainer running and leaves none): `make start "
                        "HOST=ct200` starts it again. ct200: release new1 (new: 1 modified, 0 added, 0 removed), "
                        "stop failed, not launched")
    assert lines[2] == "NO TRAINER IS RUNNING in this CT" and data["trainer_running"] is False
    # a stop that failed before it sent anything (two trainers matched) left the run as it was
    ambiguous = {"changed": False, "failed": True, "stopped": True, "stopped_by": None,
                 "msg": "2 processes match pattern 'train_dflash'"}
    data, lines = summarize(manifest=MANIFEST, preflight=PREFLIGHT, stop=ambiguous)
    assert data["trainer_running"] is True and "NO TRAINER" not in " ".join(lines) and "DOWN" not in lines[0]
    # nothing ran before the job and its launch failed
    data, lines = summarize(manifest=MANIFEST, preflight=dict(PREFLIGHT, trainer_running=False),
                            stop={"changed": False, "stopped": True, "stopped_by": None, "msg": "no trainer running"},
                            launch={"failed": True, "msg": "the trainer (PID 50) exited with status 1"})
    assert lines[0].startswith("ct200 is DOWN since before this job (its preflight found no trainer running): "
                               "`make start HOST=ct200` starts it again. ct200: release new1"), lines
    # the stop signalled the run (its first signal's wall-clock moment): the first line says it is down
    data, lines = summarize(manifest=MANIFEST, preflight=PREFLIGHT, stop=dict(failed_stop, signalled_at=1796170000.0))
    assert lines[0] == ("ct200 is DOWN since 2026-12-02 00:06:40 UTC, when this job stopped it: `make start HOST=ct200` "
                        "starts it again. ct200: release new1 (new: 1 modified, 0 added, 0 removed), stop failed, "
                        "not launched")
    # a CT of a gang: the gang's report says the gang is down, with the gang's command
    data, lines = summarize(checked={"gang": {"name": "big"}}, manifest=MANIFEST, preflight=PREFLIGHT,
                            stop=dict(failed_stop, signalled_at=1796170000.0))
    assert lines[0].startswith("ct200: release new1") and data["gang"] == "big"
    assert lines[1].startswith("stop failed: the trainer stopped, but no new sound checkpoint")
    assert lines[2] == "NO TRAINER IS RUNNING in this CT" and data["trainer_running"] is False


def test_a_rescued_launch_names_the_release_it_returned_to():
    failed = {"failed": True, "msg": "the trainer (PID 50) exited with status 1", "activated": {"changed": True}}
    data, lines = summarize(manifest=MANIFEST, preflight=PREFLIGHT, stop=STOP, failed_launch=failed,
                            launch=dict(LAUNCH, pid=51), restored={"changed": True, "current": "old0"})
    assert "launch failed, rolled back to old0: PID 51 running again" in lines[0]
    assert data["errors"] == ["launch failed: the trainer (PID 50) exited with status 1"]
    assert data["trainer_running"] is True and data["rolled_back_to"] == "old0"


def test_a_failed_launch_and_a_failed_rollback_give_both_causes_and_no_command_line():
    failed = {"failed": True, "msg": "the trainer (PID 50) printed a Python traceback"}
    relaunch = {"failed": True, "msg": "the trainer (PID 52) exited with status 2"}
    data, lines = summarize(manifest=MANIFEST, preflight=PREFLIGHT, stop=STOP, failed_launch=failed,
                            launch=relaunch, rescue_error="the trainer (PID 52) exited with status 2",
                            argv=["python3", "t.py"])
    assert lines[0].endswith("launch failed")
    assert lines[1] == ("launch failed: the trainer (PID 50) printed a Python traceback; rollback failed: "
                        "the trainer (PID 52) exited with status 2")
    assert lines[2] == "NO TRAINER IS RUNNING in this CT; newest checkpoint /ck/step_9"
    assert data["pid"] is None and data["rolled_back_to"] is None


def test_a_launch_that_failed_in_the_preflights_call_is_the_launchs_failure_not_the_preflights():
    """A CT that runs alone, nothing to push: the preflight's call stopped and launched (its launch
    option), and failed by that launch only after every check passed."""
    failed = {"failed": True, "msg": "the trainer (PID 50) exited with status 1", "stop": STOP}
    preflight = dict(PREFLIGHT, release_status=dict(STATUS, present=True), failed=True, msg=failed["msg"],
                     launch=failed)
    data, lines = summarize(manifest=MANIFEST, preflight=preflight, stop=STOP, failed_launch=failed,
                            launch=dict(LAUNCH, pid=51, settings="the settings of its healthy launch at X"))
    # no release to go back to: the run of before relaunched, on the settings it ran with
    assert lines[0].startswith("ct200: release new1 (installed already), stopped by SIGINT in 2.5s, checkpoint "
                               "/ck/step_9 (0 steps lost), launch failed, the run of before relaunched: PID 51 "
                               "running again (on the settings of its healthy launch at X), first progress"), lines
    assert data["errors"] == ["launch failed: the trainer (PID 50) exited with status 1"]
    assert lines[1] == "launch failed: the trainer (PID 50) exited with status 1"
    # a check that failed is the preflight's own (the call launched nothing)
    data, _lines = summarize(manifest=MANIFEST, preflight=dict(PREFLIGHT, failed=True, msg="preflight failed: gpus"))
    assert data["errors"] == ["preflight failed: preflight failed: gpus"]


def test_check_mode_and_untouched_trainer():
    data, lines = summarize(manifest=MANIFEST, preflight=PREFLIGHT,
                            stop={"changed": True, "stopped": False, "msg": "would stop PID 9 and 2 more"},
                            launch={"changed": True, "msg": "would start /bin/sh trainer.sh"},
                            argv=["python3", "t.py"])
    assert lines[0].endswith("would stop PID 9 and 2 more, would start /bin/sh trainer.sh")
    assert lines[-1] == "python3 t.py" and data["trainer_running"] is True
    data, lines = summarize(checked={"failed": True, "msg": "dflash_lr: expected a number, got 'fast'"})
    assert lines == ["ct200: no release built, not stopped, not launched",
                     "settings failed: dflash_lr: expected a number, got 'fast'", "no command line: not launched"]
    assert data["trainer_running"] is None  # nothing read the CT: unknown, not said to be down


MODEL = {"target": "/dev/shm/m", "source": "/workspace/models/m", "files": 14, "bytes": 54 * 10 ** 9,
         "verified_by": "the 11 shards of model.safetensors.index.json, names and sizes", "fits": True,
         "can_take": 120 * 10 ** 9, "differences": []}


def test_a_model_staged_after_a_ct_restart_is_reported_with_its_rate():
    staged = {"changed": True, "models": [dict(MODEL, state="staged", needed=False, seconds=61.2, rate=882352941,
                                               workers=4)]}
    data, lines = summarize(manifest=MANIFEST, preflight=dict(PREFLIGHT, model_stage=[dict(MODEL, needed=True)]),
                            stop=STOP, staged=staged, launch=LAUNCH)
    assert lines[1] == ("model /dev/shm/m staged from /workspace/models/m: 54.0 GB in 61.2s (882 MB/s, 4 streams), "
                        "verified by the 11 shards of model.safetensors.index.json, names and sizes")
    assert data["models"][0]["seconds"] == 61.2  # the figures AWX gets


def test_a_model_to_stage_in_check_mode_and_a_staging_that_failed_after_the_stop():
    plan = dict(MODEL, needed=True, state="missing")
    _data, lines = summarize(manifest=MANIFEST, preflight=dict(PREFLIGHT, model_stage=[plan]),
                             staged={"skipped": True}, launch=dict(LAUNCH, check_mode=True, pid=None))
    assert lines[1] == ("model /dev/shm/m missing: 54.0 GB to stage from /workspace/models/m, fits "
                        "(the CT can take 120.0 GB)")
    data, lines = summarize(manifest=MANIFEST, preflight=dict(PREFLIGHT, model_stage=[plan]),
                            stop=dict(STOP, signalled_at=1796200000.0),
                            staged={"failed": True, "msg": "model /dev/shm/m: staging failed: [Errno 28]"})
    assert lines[0].startswith("ct200 is DOWN since 2026-12-02 ")
    assert "model staging failed: model /dev/shm/m: staging failed: [Errno 28]" in data["errors"]
    # a model that matches says nothing
    _data, lines = summarize(manifest=MANIFEST, preflight=dict(PREFLIGHT, model_stage=[dict(MODEL, needed=False)]),
                             stop=STOP, launch=LAUNCH)
    assert not any("model /dev/shm/m" in line for line in lines)


def test_a_stop_by_the_request_and_a_request_not_taken_say_so():
    by_request = dict(STOP, stopped_by={"stage": -1, "signal": None, "scope": "request"},
                      request={"taken": True, "acknowledged": {"id": "r1", "step": 1234}})
    _data, lines = summarize(manifest=MANIFEST, preflight=PREFLIGHT, stop=by_request, launch=LAUNCH)
    assert "stopped by the stop request (taken at step 1234, no signal sent) in 2.5s, checkpoint /ck/step_9" in lines[0]
    # a launcher's agent left in its exit barrier once its workers had exited got SIGTERM, and
    # SIGKILL where that did not end it: each signal said
    for signals, words in ((["SIGTERM"], "SIGTERM"), (["SIGTERM", "SIGKILL"], "SIGTERM, then SIGKILL")):
        agent_ended = dict(by_request, request=dict(by_request["request"], agent_ended={"signals": signals, "pids": [7]}))
        _data, lines = summarize(manifest=MANIFEST, preflight=PREFLIGHT, stop=agent_ended, launch=LAUNCH)
        assert (f"stopped by the stop request (taken at step 1234, no signal sent to the workers, {words} to the agent "
                "left in its exit barrier) in 2.5s") in lines[0]
    not_taken = dict(STOP, request={"taken": False, "why": "no acknowledgement in /l within 30s (request_ack_timeout)"})
    _data, lines = summarize(manifest=MANIFEST, preflight=PREFLIGHT, stop=not_taken, launch=LAUNCH)
    assert ("stopped by SIGINT (the stop request was not taken: no acknowledgement in /l within 30s "
            "(request_ack_timeout)) in 2.5s") in lines[0]
