"""module_utils/gang_agreement.py: a gang's CTs judge their stop together through files in the
checkpoint directory they share, with the controller barrier's rules, and decide alike."""

import json
import os
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils import gang_agreement

CKPT = "/workspace/checkpoints"


def spec(tmp_path, me="ct401", wait=5.0, on_missing="fail"):
    return {"name": "big", "dir": str(tmp_path / "stop"), "me": me, "members": ["ct400", "ct401"], "wait": wait,
            "on_missing_checkpoint": on_missing}


def stop(new=None, newest=None, **more):
    return dict({"msg": "stopped", "stopped": True, "changed": True, "graceful_possible": True,
                 "checkpoint": {"new": new, "new_step": int(new.rsplit("_", 1)[1]) if new else None,
                                "written": new is not None, "newest": newest or new}}, **more)


def told(tmp_path, member, round_name, data):
    os.makedirs(tmp_path / "stop", exist_ok=True)
    (tmp_path / "stop" / f"{member}.{round_name}.json").write_text(json.dumps(data))


def test_rank_0_saving_alone_is_judged_by_what_every_ct_sees_once_all_have_stopped(tmp_path):
    # ct401's ranks left at once: its own stop saw no new checkpoint; ct400's rank 0 wrote step_20
    told(tmp_path, "ct400", "stopped", gang_agreement.stop_summary(stop(f"{CKPT}/step_20")))
    told(tmp_path, "ct400", "seen", {"checkpoint": {"newest": f"{CKPT}/step_20"}})
    agreed = gang_agreement.agree(spec(tmp_path), stop(newest=f"{CKPT}/step_10"), lambda: f"{CKPT}/step_20")
    assert agreed["problems"] == [] and agreed["checkpoint"] == f"{CKPT}/step_20" and agreed["relaunch"] is None
    # this CT's words are there for the other to read
    assert json.loads((tmp_path / "stop" / "ct401.seen.json").read_text()) == {"checkpoint": {"newest": f"{CKPT}/step_20"}}


def test_a_ct_that_does_not_see_the_gangs_checkpoint_fails_the_stop_phase(tmp_path):
    told(tmp_path, "ct400", "stopped", gang_agreement.stop_summary(stop(f"{CKPT}/step_20")))
    told(tmp_path, "ct400", "seen", {"checkpoint": {"newest": f"{CKPT}/step_20"}})
    agreed = gang_agreement.agree(spec(tmp_path), stop(newest=f"{CKPT}/step_10"), lambda: f"{CKPT}/step_10")
    assert agreed["problems"] == [f"ct401 does not see the gang's new checkpoint {CKPT}/step_20 complete (its newest: "
                                  f"{CKPT}/step_10): the CTs of a gang resume from one checkpoint directory (a mount "
                                  "point on shared storage)"]
    assert agreed["relaunch"]["relaunch"] is False and "different newest checkpoints" in agreed["relaunch"]["why"]


def test_a_failed_stop_ends_the_others_wait_at_once_and_nothing_is_relaunched(tmp_path):
    told(tmp_path, "ct400", "stopped", gang_agreement.stop_summary({"failed": True, "msg": "survivors after SIGKILL"}))
    began = time.monotonic()
    agreed = gang_agreement.agree(spec(tmp_path, wait=30), stop(f"{CKPT}/step_20"), lambda: f"{CKPT}/step_20")
    assert time.monotonic() - began < 5
    assert agreed["problems"] == ["ct400: survivors after SIGKILL"]
    assert agreed["relaunch"] == {"relaunch": False, "checkpoint": None,
                                  "why": "the run may still run on ct400 (its stop did not end it)"}


def test_a_silent_member_fails_the_agreement_after_the_wait(tmp_path):
    agreed = gang_agreement.agree(spec(tmp_path, wait=0.4), stop(f"{CKPT}/step_20"), lambda: f"{CKPT}/step_20")
    assert agreed["problems"] == ["ct400 did not report its stop within 0s (its worker, its CT or its job is gone)"]
    assert agreed["relaunch"]["relaunch"] is False


def test_no_new_checkpoint_fails_the_stop_phase_and_the_one_every_ct_sees_is_relaunched(tmp_path):
    told(tmp_path, "ct400", "stopped", gang_agreement.stop_summary(stop(newest=f"{CKPT}/step_10")))
    told(tmp_path, "ct400", "seen", {"checkpoint": {"newest": f"{CKPT}/step_10"}})
    agreed = gang_agreement.agree(spec(tmp_path), stop(newest=f"{CKPT}/step_10"), lambda: f"{CKPT}/step_10")
    assert agreed["problems"][0].startswith("no CT of the gang saw a new sound checkpoint after its stop")
    assert agreed["relaunch"] == {"relaunch": True, "checkpoint": f"{CKPT}/step_10", "why": "every CT's run is gone"}
    # the loss accepted: the same gang launches
    accepted = gang_agreement.agree(spec(tmp_path, on_missing="proceed"), stop(newest=f"{CKPT}/step_10"),
                                    lambda: f"{CKPT}/step_10")
    assert accepted["problems"] == []
