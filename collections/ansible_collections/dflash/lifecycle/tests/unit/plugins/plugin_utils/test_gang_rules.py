"""The gang's rules (plugin_utils/gang.py) and its filters over hostvars (plugins/filter/gang.py):
bad input is one clear line naming the variable, before anything is touched."""

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.dflash.lifecycle.plugins.filter import gang as gang_filters
from ansible_collections.dflash.lifecycle.plugins.module_utils import gang_agreement
from ansible_collections.dflash.lifecycle.plugins.plugin_utils import gang

GROUPS = {"big": ["a", "b"], "dflash_gangs": ["a", "b"], "dflash_trainers": ["a", "b", "solo"]}


def values(rank, address="", **extra):
    found = {"trainer_run_gang": "big", "trainer_run_gang_rank": rank, "trainer_run_gang_address": address,
             "trainer_run_launcher": "torchrun", "trainer_run_launcher_options": {"nproc_per_node": 2},
             "dflash_lr": "6e-4", "dflash_env": {"NCCL_SOCKET_IFNAME": f"eth{rank}"}}
    found.update(extra)
    return found


def checked(**members):
    """{host: the validate result it registered} for members {host: values}."""
    return {h: {"gang": gang.identity(h, v, GROUPS, 2)} for h, v in members.items()}


def test_the_identity_of_a_ct_is_checked_naming_the_variable():
    ident = gang.identity("a", values(0, "10.0.0.1"), GROUPS, 2)
    assert (ident["name"], ident["rank"], ident["address"], ident["port"], ident["rendezvous"]) == (
        "big", 0, "10.0.0.1", 29500, "c10d")
    assert "dflash_env" not in ident["agreed"] and ident["agreed"]["dflash_lr"] == "6e-4"
    for bad, words in (
            (values(0, trainer_run_gang="other"), "trainer_run_gang: other is not an inventory group that holds a"),
            (values(None), "trainer_run_gang_rank: a of gang big needs its node rank"),
            (values(0, trainer_run_launcher="python"), "trainer_run_launcher: a gang (big) runs as one torchrun job"),
            (values(0, trainer_run_launcher_options={"nproc_per_node": 2, "nnodes": 3}),
             "trainer_run_launcher_options.nnodes: set by the gang big itself"),
            (values(0, trainer_run_launcher_options={"nproc_per_node": "gpu"}),
             "trainer_run_launcher_options.nproc_per_node: a gang's CTs each run a known number of ranks"),
            (values(0, trainer_run_launcher_options={"nproc_per_node": 4}),
             "nproc_per_node: 4 ranks do not divide the 2 GPUs the run is given"),
            (values(0, trainer_run_gang_rendezvous="etcd"), "trainer_run_gang_rendezvous: one of c10d, static"),
            (values(0, trainer_run_gang_port=70000), "trainer_run_gang_port: a TCP port"),
            (values(0, "10.0.0.1 x"), "trainer_run_gang_address: an address or a host name")):
        with pytest.raises(gang.GangError, match=words.replace("(", r"\(").replace(")", r"\)")):
            gang.identity("a", bad, GROUPS, 2)
    with pytest.raises(gang.GangError, match="must be a child of group dflash_gangs"):
        gang.identity("a", values(0), dict(GROUPS, dflash_gangs=[]), 2)


def test_a_rank_may_drive_several_gpus_an_equal_share_each():
    """DFlash's own trainer is one process over the CT's 8 GPUs: one rank per CT is valid."""
    one = gang.identity("a", values(0, "10.0.0.1", trainer_run_launcher_options={"nproc_per_node": 1}), GROUPS, 8)
    assert (one["ranks"], one["gpus_per_rank"]) == (1, 8)
    two = gang.identity("a", values(0, "10.0.0.1", trainer_run_launcher_options={"nproc_per_node": 2}), GROUPS, 8)
    assert (two["ranks"], two["gpus_per_rank"]) == (2, 4)
    with pytest.raises(gang.GangError, match="3 ranks do not divide the 8 GPUs the run is given .* \\(on a\\)"):
        gang.identity("a", values(0, "10.0.0.1", trainer_run_launcher_options={"nproc_per_node": 3}), GROUPS, 8)


def test_the_gang_as_a_whole_a_rank_twice_a_rank_missing_no_rank_0_address_and_settings_that_differ():
    assert gang.members_problems("big", checked(a=values(0, "10.0.0.1"), b=values(1, "10.0.0.2")), ["a", "b"]) == []
    twice = gang.members_problems("big", checked(a=values(0, "10.0.0.1"), b=values(0, "10.0.0.2")), ["a", "b"])
    assert "trainer_run_gang_rank: 0 is given to a and b of gang big" in twice
    assert any("rank 1 missing" in line for line in twice)
    blank = gang.members_problems("big", checked(a=values(0), b=values(1, "10.0.0.2")), ["a", "b"])
    assert blank == ["trainer_run_gang_address: missing on a, rank 0 of gang big: the other CTs reach the rendezvous there"]
    c10d = gang.members_problems("big", checked(a=values(0, "10.0.0.1"), b=values(1)), ["a", "b"])
    assert c10d and c10d[0].startswith("trainer_run_gang_address: missing on b of gang big: under the c10d")
    static = {"trainer_run_gang_rendezvous": "static"}
    assert gang.members_problems("big", checked(a=values(0, "10.0.0.1", **static), b=values(1, **static)),
                                 ["a", "b"]) == []
    differ = gang.members_problems("big", checked(a=values(0, "10.0.0.1"), b=values(1, "10.0.0.2", dflash_lr="1e-3")),
                                   ["a", "b"])
    assert differ == ["dflash_lr: b has '1e-3', a '6e-4': the CTs of gang big run one job and set it alike (only "
                      "trainer_run_gang_rank and trainer_run_gang_address differ)"]


def test_a_job_that_leaves_a_ct_out_or_a_serial_that_splits_the_gang_is_refused():
    both = checked(a=values(0, "10.0.0.1"), b=values(1, "10.0.0.2"))
    limited = gang.members_problems("big", both, ["a"])
    assert limited[0] == "b of gang big not in this job (--limit): a gang is redeployed whole; name its group (HOST=big)"
    split = gang.members_problems("big", dict(both, b=None), ["a", "b"])
    assert split[0].startswith("redeploy_serial splits gang big (2 CTs): b would run in another batch")
    failed = gang.members_problems("big", dict(both, b={"failed": True, "msg": "dflash_lr: ..."}), ["a", "b"])
    assert failed == ["the settings of b failed (above)"]


def test_the_plan_and_the_torchrun_options_of_each_ct():
    identities = {h: r["gang"] for h, r in checked(b=values(1, "10.0.0.2"), a=values(0, "10.0.0.1")).items()}
    a, b = gang.plan("a", identities, "alice"), gang.plan("b", identities, "alice")
    assert a["members"] == ["a", "b"] and a["first"] == "a" and a["endpoint"] == "10.0.0.1:29500"
    assert a["rdzv_id"] == b["rdzv_id"] != gang.plan("a", identities, "bob")["rdzv_id"]  # one per job
    options = gang.launcher_options(b, {"nproc_per_node": 2}, attempt=2)
    assert options == {"nproc_per_node": 2, "nnodes": 2, "rdzv_backend": "c10d", "rdzv_endpoint": "10.0.0.1:29500",
                       "rdzv_id": b["rdzv_id"] + "-2", "local_addr": "10.0.0.2"}
    static = {h: dict(i, rendezvous="static") for h, i in identities.items()}
    assert gang.launcher_options(gang.plan("b", static), {})["node_rank"] == 1
    six = {h: dict(i, address=f"fd00::{i['rank'] + 1}") for h, i in identities.items()}
    assert gang.plan("b", six)["endpoint"] == "[fd00::1]:29500"


def plan_of(**identities):
    return gang.plan("a", {h: r["gang"] for h, r in checked(**identities).items()})


def test_after_a_phase_a_member_that_failed_or_did_not_answer_stops_the_gang():
    plan = plan_of(a=values(0, "10.0.0.1"), b=values(1, "10.0.0.2"))
    ok = {"changed": False}
    assert gang.phase_problems(plan, {"a": ok, "b": ok}, "push") == []
    assert gang.phase_problems(plan, {"a": ok, "b": None}, "preflight") == [
        "b did not pass its preflight (unreachable, or it failed before)"]
    assert gang.phase_problems(plan, {"a": ok, "b": {"failed": True, "msg": "CT is being\n redeployed by x"}},
                               "preflight") == ["b: CT is being redeployed by x"]
    assert gang.phase_problems(plan, {"a": {"release": "r1"}, "b": {"release": "r2"}}, "release") == [
        "the release differs: a r1, b r2 (trainer_code_src must be the same code for every CT)"]


def preflight(listing, seen, missing, checked=True):
    return {"checkpoint": {"listing": listing, "gang_marks": {
        "dir": "/c/.dflash-gang/big-1", "seen": seen, "missing": missing, "waited_s": 10.0, "checked": checked}}}


def test_the_cts_share_the_checkpoint_directory_by_the_marks_they_see():
    """Listings taken while the run saves differ (a save or a rotation between the two reads):
    they never refuse the gang; a mark missing does, and the listings then name the difference."""
    plan = plan_of(a=values(0, "10.0.0.1"), b=values(1, "10.0.0.2"))
    before = {"step_10": [100, True], "step_20": [200, True]}
    raced = {"step_20": [200, True], "step_30": [300, True]}  # step_30 saved, step_10 rotated in between
    both = ["a", "b"]
    assert gang.phase_problems(plan, {"a": preflight(before, both, []), "b": preflight(raced, both, [])},
                               "preflight") == []
    own = {"step_10": [100, True], "step_20": [150, False], "step_5": [50, True]}
    assert gang.phase_problems(plan, {"a": preflight(before, ["a"], ["b"]), "b": preflight(own, ["b"], ["a"])},
                               "preflight") == [
        "a does not see the marks of b in /c/.dflash-gang/big-1 within 10.0s: the CTs of a gang resume from one "
        "directory (a mount point on shared storage)",
        "b does not see the marks of a in /c/.dflash-gang/big-1 within 10.0s (only on b: step_5; differ: step_20 "
        "(200 bytes, complete on a, 150 bytes, incomplete on b)): the CTs of a gang resume from one directory (a "
        "mount point on shared storage)"]
    # check mode writes no mark: nothing proven, nothing refused
    assert gang.phase_problems(plan, {"a": preflight(before, [], both, checked=False),
                                      "b": preflight(own, [], both, checked=False)}, "preflight") == []


def stop(new=None, newest=None, step=None, possible=True, signalled_at=None):
    return {"changed": True, "graceful_possible": possible, "signalled_at": signalled_at,
            "checkpoint": {"written": new is not None, "new": new, "new_step": step, "newest": newest or new}}


def test_the_gang_checkpoint_is_judged_over_every_ct_after_the_stop():
    plan = plan_of(a=values(0, "10.0.0.1"), b=values(1, "10.0.0.2"))
    both = {"a": stop("/c/step_20", step=20), "b": stop("/c/step_20", step=20)}
    assert gang.phase_problems(plan, both, "stop") == []
    # one CT's ranks wrote it, the other sees it (shared storage): the gang has its checkpoint
    assert gang.phase_problems(plan, {"a": stop("/c/step_20", step=20), "b": stop(newest="/c/step_20")}, "stop") == []
    unseen = gang.phase_problems(plan, {"a": stop("/c/step_20", step=20), "b": stop(newest="/c/step_10")}, "stop")
    assert unseen == ["b does not see the gang's new checkpoint /c/step_20 complete (its newest: /c/step_10): the CTs of "
                      "a gang resume from one checkpoint directory (a mount point on shared storage)"]
    none = {"a": stop(newest="/c/step_10"), "b": stop(newest="/c/step_10")}
    assert gang.phase_problems(plan, none, "stop")[0].startswith("no CT of the gang saw a new sound checkpoint")
    assert gang.phase_problems(plan, none, "stop", on_missing_checkpoint="proceed") == []
    assert gang.phase_problems(plan, none, "stop", check_mode=True) == []


def test_the_gang_checkpoint_is_what_every_ct_sees_once_all_have_stopped():
    """Rank 0 saves alone: b's ranks left at once, so b's own stop ended before step_20 was
    complete. What b reads once every CT has stopped is what counts."""
    plan = plan_of(a=values(0, "10.0.0.1"), b=values(1, "10.0.0.2"))
    early = {"a": stop("/c/step_20", step=20), "b": stop(newest="/c/step_10")}
    now = {"a": {"checkpoint": {"newest": "/c/step_20"}}, "b": {"checkpoint": {"newest": "/c/step_20"}}}
    assert gang.phase_problems(plan, early, "stop", after=now) == []
    cut = dict(now, b={"checkpoint": {"newest": "/c/step_10"}})
    assert gang.phase_problems(plan, early, "stop", after=cut)[0].startswith(
        "b does not see the gang's new checkpoint /c/step_20 complete (its newest: /c/step_10)")
    # a CT whose read failed or was skipped is judged by its stop's own look
    assert gang.phase_problems(plan, early, "stop", after=dict(now, b={"skipped": True}))[0].startswith("b does not")


def test_a_ct_whose_run_ended_after_its_launch_is_named_with_its_error():
    plan = plan_of(a=values(0, "10.0.0.1"), b=values(1, "10.0.0.2"))
    launched = {"a": {"pid": 10, "run_id": "r-a"}, "b": {"pid": 20, "run_id": "r-b"}}
    alive = {"a": {"running": True, "run_id": "r-a"}, "b": {"running": True, "run_id": "r-b"}}
    assert gang.phase_problems(plan, launched, "launch", after=alive) == []
    traceback = ["Traceback (most recent call last):", "RuntimeError: fails on node rank 1"]
    ended = dict(alive, b={"running": False, "run_id": None, "log_tail": ["..."], "traceback": traceback})
    assert gang.phase_problems(plan, launched, "launch", after=ended) == [
        "b: its run (PID 20) ended after its launch was healthy: RuntimeError: fails on node rank 1"]


def test_the_skew_is_the_spread_of_the_first_signals():
    assert gang.skew({"a": stop(signalled_at=100.0105), "b": stop(signalled_at=100.0100)}) == {
        "skew_ms": 0.5, "first": "b", "order": [["b", 0.0], ["a", 0.5]], "spare": None, "by_request": False,
        "steps": {}}
    # the CT ready the least time before the moment
    spared = {"a": dict(stop(signalled_at=100.0105), signal_spare_s=1.2),
              "b": dict(stop(signalled_at=100.0100), signal_spare_s=0.4)}
    assert gang.skew(spared)["spare"] == ["b", 0.4]
    assert gang.skew({"a": stop(signalled_at=100.0), "b": stop()}) is None


def test_a_gang_stopped_by_its_requests_names_the_step_of_every_ct_and_says_when_they_differ():
    def requested(at, step):
        return dict(stop(signalled_at=at), stopped_by={"stage": -1, "signal": None, "scope": "request"},
                    request={"taken": True, "acknowledged": {"id": "x", "step": step}})

    big = {"name": "big", "size": 2, "members": ["a", "b"]}
    line = gang.stop_report(big, {"a": requested(50.0, 120), "b": requested(50.001, 120)})
    assert line.startswith("gang big (2 CTs): stop requested together (skew of the requests written 1.0 ms, a first; the ranks of every "
                           "CT stopped at step 120)"), line
    line = gang.stop_report(big, {"a": requested(50.0, 120), "b": requested(50.001, 130)})
    assert "the ranks stopped at DIFFERENT steps: a 120, b 130)" in line, line


class HostVars(dict):
    """hostvars as a filter sees them: {host: {variable: value}}."""


def test_the_filters_read_the_members_results_through_hostvars():
    results = checked(a=values(0, "10.0.0.1"), b=values(1, "10.0.0.2"))
    hostvars = HostVars({h: {"trainer_run_checked": r} for h, r in results.items()})
    plan = gang_filters.gang_plan("b", hostvars, GROUPS, "alice")
    assert plan["rank"] == 1 and plan["members"] == ["a", "b"]
    assert gang_filters.gang_barrier("a", hostvars, GROUPS, "settings", job_hosts=["a", "b"]) == []
    hostvars["a"]["trainer_preflight_result"] = {"checkpoint": {"listing": {}}}
    assert gang_filters.gang_barrier("a", hostvars, GROUPS, "preflight") == [
        "b did not pass its preflight (unreachable, or it failed before)"]
    hostvars["a"]["trainer_preflight_result"]["throughput_before"] = {"tokens_per_s": None}
    hostvars["b"]["trainer_preflight_result"] = {"throughput_before": {"tokens_per_s": 20000.0}}
    assert gang_filters.gang_throughput(plan, hostvars, "before") == {"tokens_per_s": 20000.0}
    # the stop's report: each member's stop result, and the margin signal_moment chose for the batch
    for host, at, spare in (("a", 50.0, 0.9), ("b", 50.002, 0.4)):
        hostvars[host].update(trainer_stop_result=dict(stop("/c/step_20", step=20, signalled_at=at), signal_spare_s=spare),
                              trainer_stop_signal_margin={"margin_s": 1.6, "measured_s": 0.8})
    assert gang_filters.gang_stop_report("a", hostvars, GROUPS) == (
        "gang big (2 CTs): stop signalled together (skew of the signals sent 2.0 ms, a first; margin 1.6 s, 2x the measured start of the "
        "stop, 0.8 s, the slowest CT (b) ready 0.4 s before the moment) (a +0.0 ms, b +2.0 ms), checkpoint /c/step_20")
    with pytest.raises(AnsibleFilterError, match="not a CT of a gang"):
        gang_filters.gang_plan("solo", HostVars(solo={}), GROUPS)
    broken = HostVars({h: {"trainer_run_checked": r} for h, r in checked(a=values(0), b=values(1, "x")).items()})
    assert gang_filters.gang_report("a", broken, GROUPS)[0].startswith(
        "not redeployed as a gang: gang big: trainer_run_gang_address: missing on a")


def test_the_gang_report_says_release_skew_checkpoint_loss_and_each_ct():
    plan = plan_of(a=values(0, "10.0.0.1"), b=values(1, "10.0.0.2"))
    summaries = {"a": {"release": "r2", "checkpoint": "/c/step_20", "steps_lost": 0, "pid": 10, "ranks": 2,
                       "healthy_seconds": 3.1, "tokens_per_s": 20000.0, "resumed_from": "/c/step_20", "errors": [],
                       "stopped_by": {"signal": "SIGINT"}},
                 "b": {"release": "r2", "checkpoint": "/c/step_20", "steps_lost": None, "pid": 20, "ranks": 2,
                       "healthy_seconds": 3.0, "tokens_per_s": None, "resumed_from": "/c/step_20", "errors": [],
                       "stopped_by": {"signal": "SIGINT"}}}
    stops = {"a": stop("/c/step_20", step=20, signalled_at=50.0), "b": stop("/c/step_20", step=20, signalled_at=50.0012)}
    assert gang.report(plan, summaries, stops) == [
        "gang big (2 CTs, c10d rendezvous at 10.0.0.1:29500): release r2, stop signalled together (skew of the signals sent 1.2 ms, a "
        "first), checkpoint /c/step_20 (0 steps lost), every CT running; a logs 20000.0 tok/s",
        "  a (rank 0): PID 10, 2 ranks (1 GPU(s) each) healthy after 3.1s, resumed from /c/step_20",
        "  b (rank 1): PID 20, 2 ranks (1 GPU(s) each) healthy after 3.0s, resumed from /c/step_20"]
    # b's ranks left at once and its stop saw an older save of rank 0 complete: the gang's checkpoint
    # is the newest any stop saw written, with the loss its own stop stated
    raced = dict(summaries, b=dict(summaries["b"], checkpoint="/c/step_10"))
    raced_stops = dict(stops, b=stop("/c/step_10", step=10, signalled_at=50.0012))
    assert "checkpoint /c/step_20 (0 steps lost), every CT running" in gang.report(plan, raced, raced_stops)[0]
    # the margin before the gang's moment: measured, against the CT that was ready the least time before it
    spared = {"a": dict(stops["a"], signal_spare_s=0.912), "b": dict(stops["b"], signal_spare_s=0.644)}
    assert "stop signalled together (skew of the signals sent 1.2 ms, a first; margin 1.84 s, 2x the measured start of the stop, 0.92 s, " \
           "the slowest CT (b) ready 0.644 s before the moment), checkpoint" in gang.report(
               plan, summaries, spared, margin={"margin_s": 1.84, "measured_s": 0.92})[0]
    late = dict(spared, b=dict(spared["b"], signal_spare_s=-0.31))
    assert "margin 3.0 s, redeploy_gang_signal_margin, b ready only 0.31 s after the moment (its signal went late))" \
        in gang.report(plan, summaries, late, margin={"margin_s": 3.0, "measured_s": None})[0]
    # a CT with no stop result (it failed before its stop): the others' checkpoint still stands
    assert "checkpoint /c/step_20 (0 steps lost)" in gang.report(plan, raced, {"b": None, "a": raced_stops["a"]})[0]
    compared = {"verdict": "ok", "before": 19000.0, "after": 20000.0, "change_pct": 5.3, "threshold_pct": -5.0,
                "action": None, "stages": [], "why": ""}
    with_canary = {h: dict(s, canary=compared) for h, s in summaries.items()}
    assert gang.report(plan, with_canary, stops)[0].endswith(
        "a logs 20000.0 tok/s; canary: tok/s 19000.0 -> 20000.0 (+5.3%, threshold -5.0%)")
    down = dict(summaries, b=dict(summaries["b"], pid=None, errors=["launch failed: x"]))
    lines = gang.report(plan, down, stops)
    assert "running on 1 of 2 CTs (NOT on b)" in lines[0] and lines[1] == "b: launch failed: x"
    assert gang.report(plan, summaries, stops, check_mode=True)[0].startswith("gang big: 2 CTs a (rank 0), b (rank 1);")


def test_a_gang_whose_stop_failed_is_relaunched_or_said_down_with_the_command_that_starts_it():
    stopped = {"a": dict(stop("/c/step_20", step=20), stopped=True), "b": dict(stop(newest="/c/step_10"), stopped=True)}
    seen = {"a": {"checkpoint": {"newest": "/c/step_20"}}, "b": {"checkpoint": {"newest": "/c/step_20"}}}
    assert gang_agreement.relaunchable(stopped, seen) == {"relaunch": True, "checkpoint": "/c/step_20",
                                                          "why": "every CT's run is gone"}
    still = dict(stopped, b={"failed": True, "stopped": False, "msg": "1 process(es) survived"})
    assert gang_agreement.relaunchable(still, seen)["why"] == "the run may still run on b (its stop did not end it)"
    assert gang_agreement.relaunchable(stopped, dict(seen, b={"checkpoint": {"newest": "/c/step_10"}}))["relaunch"] is False
    assert gang_agreement.relaunchable(stopped, {"a": None, "b": None})["why"] == "no complete checkpoint every CT sees"
    plan = plan_of(a=values(0, "10.0.0.1"), b=values(1, "10.0.0.2"))
    down = {h: {"release": "r2", "pid": None, "errors": ["gang big after its stop: ..."], "stopped_at": at}
            for h, at in (("a", 1796170000.0), ("b", 1796170000.002))}
    assert gang.report(plan, down, stopped)[0].startswith(
        "gang big is DOWN since 2026-12-02 00:06:40 UTC, when this job stopped it: `make start HOST=big` starts it "
        "again. gang big (2 CTs")
    again = {h: {"release": "r2", "pid": 10, "ranks": 2, "errors": ["gang big after its stop: ..."],
                 "relaunched_after_stop": True} for h in ("a", "b")}
    assert gang.report(plan, again, stopped)[0].endswith(
        "(the release of before, relaunched from its checkpoint after the stop phase failed)")


def test_the_gang_stop_report_says_the_skew_each_signal_and_the_checkpoint():
    plan = plan_of(a=values(0, "10.0.0.1"), b=values(1, "10.0.0.2"))
    stops = {"a": stop("/c/step_20", step=20, signalled_at=50.0), "b": stop(newest="/c/step_20", signalled_at=50.0031)}
    assert gang.stop_report(plan, stops) == (
        "gang big (2 CTs): stop signalled together (skew of the signals sent 3.1 ms, a first) (a +0.0 ms, b +3.1 ms), checkpoint /c/step_20")
    # rank 0 saved alone: b's stop ended on an older save of rank 0, before the one the gang resumes from
    early = {"a": stop("/c/step_25", step=25, signalled_at=50.0), "b": stop("/c/step_20", step=20, signalled_at=50.0)}
    assert gang.stop_report(plan, early).endswith(
        ", checkpoint /c/step_25 (b: its own stop ended before that save was complete)")
    assert gang.stop_report(plan, {"a": stop(signalled_at=50.0), "b": None}) == (
        "gang big (2 CTs): skew of the signals sent not known (fewer than two CTs sent a signal), no stop result from b, "
        "NO new checkpoint")


def test_a_gang_rolls_back_only_to_one_previous_release():
    plan = plan_of(a=values(0, "10.0.0.1"), b=values(1, "10.0.0.2"))
    same = {"a": {"changed": True, "rolled_back_to": "r1"}, "b": {"changed": True, "rolled_back_to": "r1"}}
    assert gang.phase_problems(plan, same, "rollback") == []
    apart = dict(same, b={"changed": True, "rolled_back_to": "r0"})
    assert gang.phase_problems(plan, apart, "rollback") == [
        "the previous release differs: a r1, b r0 (the CTs of a gang run one release; roll them forward with "
        "redeploy.yml instead)"]
    refused = dict(same, b={"failed": True, "msg": "previous release r0 failed to launch"})
    assert gang.phase_problems(plan, refused, "rollback") == ["b: previous release r0 failed to launch"]
