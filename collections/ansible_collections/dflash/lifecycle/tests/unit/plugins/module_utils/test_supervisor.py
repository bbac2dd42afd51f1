"""The supervisor's rules (module_utils/agent/: policy.py, rounds.py, watch.py, hang.py, supervision.py) without a CT: the policy's bounds, the
back-off, the learned hang timeout, an exit status in words, the gang's rounds and their count,
the beats a log and a heartbeat give, what status and the next redeploy say, and the stand-down a
stop asked for leaves (module_utils/ct/run_spec.py)."""

import json
import os
import signal
import time

import pytest

from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import hang, policy, restart, rounds, supervision
from ansible_collections.dflash.lifecycle.plugins.module_utils.agent.watch import Watch
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import run_spec

POLICY = policy.policy_of({"supervise": {"backoff_s": 10, "backoff_max_s": 360, "hang_floor_s": 60, "hang_factor": 5}})


@pytest.mark.parametrize("given, problem", [
    ({"backoff_s": -1}, "supervise.backoff_s: -1 must be at least 0"),
    ({"backoff_s": 10, "backoff_max_s": 5}, "supervise.backoff_max_s: 5 must be at least supervise.backoff_s (10)"),
    ({"crash_loop_restarts": 0}, "supervise.crash_loop_restarts: 0 must be at least 1"),
    ({"crash_loop_window_s": 0}, "supervise.crash_loop_window_s: 0 must be above 0"),
    ({"hang_floor_s": 0}, "supervise.hang_floor_s: 0 must be above 0"),
    ({"hang_factor": 0.5}, "supervise.hang_factor: 0.5 must be at least 1"),
    ({"webhook_timeout_s": 60}, "supervise.webhook_timeout_s: 60 must be above 0 (and at most 30"),
    ({"webhook": "ftp://x"}, "supervise.webhook: 'ftp://x' must be an http:// or https:// URL"),
])
def test_a_value_outside_its_rule_is_named(given, problem):
    problems = policy.policy_problems(given)
    assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_the_defaults_and_a_role_variables_names_hold():
    assert policy.policy_problems(policy.policy_of({"supervise": {}})) == []
    assert policy.policy_problems({"backoff_s": -2}, lambda key: f"trainer_launch_supervise_{key}") == [
        "trainer_launch_supervise_backoff_s: -2 must be at least 0"]
    assert policy.policy_of({}) is None, "a run launched without supervise has no supervisor"


def test_the_back_off_doubles_from_its_first_wait_up_to_its_cap():
    assert [policy.backoff(POLICY, n) for n in range(1, 8)] == [10, 20, 40, 80, 160, 320, 360]


def test_the_hang_timeout_is_learned_from_the_runs_own_intervals_with_a_floor_and_a_start_up_bound():
    assert policy.hang_timeout(POLICY, [], startup=300) == 300, "no interval seen yet: the start-up bound"
    assert policy.hang_timeout(POLICY, [2.0, 3.0], startup=300) == 60, "the floor"
    assert policy.hang_timeout(POLICY, [20.0, 45.0, 30.0], startup=300) == 225, "five times the longest"


def test_an_exit_status_is_said_with_its_code_or_signal():
    assert policy.exit_words(1 << 8) == ("exited with status 1", {"signal": None, "code": 1})
    assert policy.exit_words(signal.SIGKILL) == ("killed by SIGKILL", {"signal": "SIGKILL", "code": None})


def _spec(directory, **launch):
    os.makedirs(directory, mode=0o700, exist_ok=True)
    base = {"pidfile": "/run/dflash/trainer.pid", "supervise": {"crash_loop_window_s": 600}, "log_file": "/x/train.log"}
    spec = {"version": run_spec.VERSION, "launch": dict(base, **launch), "stop": {}, "wanted": "running",
            "launched_at": time.time(), "round": 0, "rounds_dir": os.path.join(directory, "rounds")}
    with open(run_spec.spec_path(directory), "w", encoding="utf-8") as handle:
        json.dump(spec, handle)
    return spec


def test_a_gangs_rounds_count_once_for_every_member_and_give_one_clock(tmp_path):
    shared = str(tmp_path / "ckpt" / ".dflash-gang" / "job" / "supervise")
    members = []
    for name in ("ct400", "ct401"):
        _spec(str(tmp_path / name), gang_health={"dir": "x", "me": name, "members": ["ct400", "ct401"]})
        sup = supervision.Supervisor(str(tmp_path / name), "agent.zip")
        sup.rounds_dir = shared
        members.append(sup)
    first, second = members
    rounds.tell_down(first, {"cause": "crash: the trainer killed by SIGKILL"})
    assert set(rounds.downs(second)) == {"ct400"}
    rounds.tell_down(second, {"cause": "ct400 of the gang went down"})
    count, clock = rounds.restarts_in_window(first, time.time())
    assert (count, clock) == rounds.restarts_in_window(second, time.time()) and count == 1
    assert clock == rounds.downs(first)["ct400"]["at"], "the round's first end: one back-off for the gang"
    for sup in members:
        sup.round = 1
        rounds.tell_down(sup, {"cause": "the relaunch failed"})
    assert rounds.restarts_in_window(first, time.time())[0] == 2
    assert rounds.restarts_in_window(first, time.time() + 3600)[0] == 0, "ends older than the window do not count"


def test_a_job_launch_begins_a_lone_cts_rounds_afresh(tmp_path):
    directory = str(tmp_path / "lifecycle")
    os.makedirs(os.path.join(directory, "rounds", "0", "down"))
    run_spec.record_launch({"dir": directory}, {"pidfile": "/run/dflash/trainer.pid"}, 42)
    assert not os.path.exists(os.path.join(directory, "rounds")) and run_spec.read(directory)["round"] == 0
    run_spec.record_launch({"dir": directory, "rounds_dir": os.path.join(directory, "rounds"), "round": 3},
                           {"pidfile": "/run/dflash/trainer.pid"}, 43)
    assert run_spec.read(directory)["round"] == 3, "the supervisor's relaunch keeps counting"


def watching(log, beat, main_pid=21720):
    """A Watch of the run whose agent is main_pid, begun at the log's end as find_log begins it (no
    process to find it from), the log its launcher's too."""
    watch = Watch.__new__(Watch)
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import progress
    watch.progress, watch.reader, watch.main_pid = progress, progress.LogReader(), main_pid
    watch.launcher_log, watch.launcher_log_start = str(log), log.stat().st_size
    watch.log, watch.offset, watch.partial = str(log), log.stat().st_size, b""
    watch.heartbeat, watch.heartbeat_at, watch.since = str(beat), 0.0, time.time() - 10
    watch.gaps, watch.beats, watch.last_beat, watch.last_step = [], 0, 100.0, None
    return watch


def test_beats_come_from_progress_lines_and_the_helpers_heartbeat_and_teach_the_gaps(tmp_path):
    log, beat = tmp_path / "train.log", tmp_path / "stop-request.alive"
    log.write_text("head\n")
    watch = watching(log, beat)
    assert not watch.beat(101.0), "no new line, no heartbeat file"
    with open(log, "a", encoding="utf-8") as handle:
        handle.write("step 10 loss 3.2 tok/s 300.0\nstep 2")  # the second line is half written
    assert watch.beat(102.0) and watch.last_step == 10 and watch.gaps == [], "the first beat teaches no gap"
    with open(log, "a", encoding="utf-8") as handle:
        handle.write("0 loss 3.1 tok/s 299.0\n")
    assert watch.beat(104.5) and watch.last_step == 20 and watch.gaps == [2.5]
    beat.write_text("")
    assert watch.beat(105.0) and watch.gaps == [2.5, 0.5], "the helper's heartbeat is a beat"
    assert not watch.beat(106.0), "the same heartbeat again is none"


def test_a_rank_killed_is_read_only_from_the_lines_of_the_run_watched(tmp_path):
    """torchrun's word on a rank a signal ended (torch 2.13's elastic/multiprocessing/api.py) counts
    for the run watched only when written since the watch began: the same log's earlier run, whose
    agent had the same PID (a PID the CT reused), says nothing of this one. Read whether or not the
    log has progress lines (a gang member's ranks other than global rank 0 log none)."""
    killed = ("E1207 16:47:57.957000 21720 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
              "(exitcode: -9) local_rank: 0 (pid: 21725) of binary: /opt/venv/bin/python3\n")
    log = tmp_path / "train.log"
    log.write_text("step 10 loss 3.2 tok/s 300.0\n" + killed)  # the earlier run's end
    watch = watching(log, tmp_path / "stop-request.alive")
    with open(log, "a", encoding="utf-8") as handle:
        handle.write("W1207 16:50:01.000000 21720 torch/distributed/run.py:774] OMP_NUM_THREADS set to 1\n")
    assert watch.own_rank_killed() is None
    with open(log, "a", encoding="utf-8") as handle:
        handle.write(killed)
    assert watch.own_rank_killed() == \
        "its worker local_rank 0 (PID 21725) was killed by SIGKILL, as its agent PID 21720 logged"


def test_status_and_the_next_redeploy_say_each_end_once(tmp_path):
    directory = str(tmp_path)
    end = {"cause": "crash: the trainer killed by SIGKILL", "at": time.time(), "checkpoint": "/ckpt/step_200",
           "relaunch": "trainer PID 7 healthy, resumed from /ckpt/step_200"}
    with open(policy.state_path(directory), "w", encoding="utf-8") as handle:
        json.dump({"state": "watching", "supervisor": 999999999, "supervisor_start": 1, "ends": [end],
                   "restarts": 1, "trainer": {"pid": 7}}, handle)
    words = policy.words(directory)
    assert words.startswith("GONE while watching (PID 999999999): the run is not supervised; 1 restarts since "
                            "the launch; ends: "), words
    assert "crash: the trainer killed by SIGKILL, checkpoint /ckpt/step_200 -> trainer PID 7 healthy" in words
    said = policy.restarts_since(directory, mark=True)
    assert said.startswith("the supervisor saw 1 end(s) of the run since the last job: ") and said.endswith(
        "resumed from /ckpt/step_200; now: watching"), said
    assert policy.restarts_since(directory) is None, "reported once"


def test_a_stop_asked_for_leaves_a_stand_down_the_supervisor_reads(tmp_path):
    directory = str(tmp_path)
    assert run_spec.stood_down(directory, 0) is None
    run_spec.stand_down(directory, "root@vm ansible-playbook pid 1")
    marker = run_spec.stood_down(directory, time.time() - 5)
    assert marker["by"] == "root@vm ansible-playbook pid 1"
    assert run_spec.stood_down(directory, time.time() + 5) is None, "a stand-down older than the run is another run's"
    run_spec.stand_down_cleared(directory)
    assert run_spec.stood_down(directory, 0) is None
    run_spec.stand_down(str(tmp_path / "none"), "a job")  # a CT with no spec: nothing to tell
    assert not os.path.exists(tmp_path / "none")


def test_the_supervisors_own_run_still_exiting_is_not_someone_elses_trainer(tmp_path):
    """After its run ended the supervisor asks again before it relaunches: a trainer someone else
    started makes it stand down. The run it started itself, still exiting (seen: a gang member's
    torchrun agent, its command line gone, not yet a zombie), is its child: no reason to stand
    down. A process that is not its child, named by the pidfile, is someone else's."""
    import subprocess

    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable
    from ansible_collections.dflash.lifecycle.plugins.module_utils.launch import launch

    directory, pidfile = str(tmp_path / "lifecycle"), str(tmp_path / "run" / "trainer.pid")
    run_spec._write(directory, {"version": run_spec.VERSION, "wanted": "running"})
    sup = type("Sup", (), {"directory": directory, "launch": {"pidfile": pidfile}})()
    since = time.time()
    own = subprocess.Popen(["sleep", "30"])  # our child, alive: the run that ended, still exiting
    # someone else's: a sleep whose parent (a shell) exited, so it is not our child
    other = int(subprocess.run(["sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True,
                               check=True).stdout)
    try:
        assert restart.ask_again(sup, since) is None  # no pidfile
        launch.write_pidfile(pidfile, own.pid, proctable.read_process(own.pid).starttime, "run-1")
        assert restart.ask_again(sup, since) is None
        launch.write_pidfile(pidfile, other, proctable.read_process(other).starttime, "run-2")
        assert restart.ask_again(sup, since) == f"a trainer runs again (PID {other}), started by someone else"
        run_spec.mark(directory, "stopped", "alice")
        assert restart.ask_again(sup, since) == "alice: the run is wanted stopped"
    finally:
        own.kill()
        own.wait()
        os.kill(other, signal.SIGKILL)


def post_to_loopback(policy, event):
    """(headers, body) of the POST that post_event makes of event, as a receiver on loopback gets it;
    asserts that the caller went on at once and the child posted."""
    import http.server
    import threading

    got = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802  (http.server's name)
            # header names as HTTP takes them: in any case
            got.append(({k.lower(): v for k, v in self.headers.items()}, self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Hook)  # loopback only
    threading.Thread(target=server.handle_request, daemon=True).start()
    hooked = dict(POLICY, webhook=f"http://127.0.0.1:{server.server_port}/dflash", webhook_timeout_s=3, **policy)
    began = time.monotonic()
    supervision.post_event(hooked, event)
    assert time.monotonic() - began < 0.5, "the POST runs in a child: the caller goes on at once"
    child_status = os.wait()[1]
    server.server_close()
    assert child_status == 0 and len(got) == 1
    return got[0]


def test_the_webhook_gets_the_event_from_a_process_of_its_own_and_never_holds_the_caller_up():
    event = {"event": "crash", "ct": "ct200", "cause": "crash: the trainer killed by SIGKILL"}
    headers, body = post_to_loopback({}, event)
    assert headers["content-type"] == "application/json" and json.loads(body) == event
    assert "x-dflash-signature" not in headers


def test_a_cts_events_are_signed_with_its_own_key_and_name_it_so_none_speaks_for_another():
    """The receiver's check as docs/security.md gives it, written here from the docs (not the
    agent's code): the key of the CT the header names, derived from the team's secret; the signature
    over the timestamp and the body; the body naming the same CT."""
    import hashlib
    import hmac

    secret = "team secret from the vault"

    def key_of(ct):
        return hmac.new(secret.encode(), b"dflash-lifecycle webhook\0" + ct.encode(), hashlib.sha256).hexdigest()

    def receiver_takes(headers, body):
        ct, stamp = headers["x-dflash-ct"], headers["x-dflash-timestamp"]
        expected = hmac.new(key_of(ct).encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
        return (hmac.compare_digest(headers["x-dflash-signature"], f"sha256={expected}")
                and json.loads(body)["ct"] == ct and abs(time.time() - int(stamp)) < 300)

    # a CT that runs alone calls itself "this CT": its events name it as the inventory does
    headers, body = post_to_loopback({"webhook_ct": "ct200", "webhook_key": key_of("ct200")},
                                     {"event": "down", "ct": "this CT", "why": "crash loop"})
    assert json.loads(body)["ct"] == "ct200" and receiver_takes(headers, body)
    # ct201's root, with its own key, posts an event that names ct200: no receiver takes it
    for forged in ({"webhook_ct": "ct200", "webhook_key": key_of("ct201")},
                   {"webhook_ct": "ct201", "webhook_key": key_of("ct201")}):
        headers, body = post_to_loopback(forged, {"event": "healthy", "ct": "ct200"})
        if headers["x-dflash-ct"] == "ct201":  # signed as itself: the body then names ct201, not ct200
            assert receiver_takes(headers, body) and json.loads(body)["ct"] == "ct201"
        else:
            assert not receiver_takes(headers, body)
        tampered = body.replace(b'"ct201"', b'"ct200"')
        assert tampered == body or not receiver_takes(dict(headers, **{"x-dflash-ct": "ct200"}), tampered)


def test_a_hangs_stop_waits_the_runs_cadence_before_its_last_stage_and_requires_no_checkpoint():
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import stop_options

    options = hang.as_hang(stop_options.StopOptions({"pidfile": "/run/x.pid", "require_checkpoint": True}),
                           hang.hang_grace([2.5, 7.25, 4.0]))
    assert [(s["signal"].name, s["wait"]) for s in options.stages] == [("SIGINT", 7.25), ("SIGTERM", 7.25), ("SIGKILL", 10)]
    assert options.request_ack_timeout == 7.25 and options.graceful_wait_cap == 900, "a save under way still grows it"
    assert (options.on_missing_checkpoint, options.no_graceful, options.require_checkpoint) == ("proceed", "proceed", False)
    assert hang.hang_grace([0.4]) == hang.HANG_GRACE_FLOOR_S
    assert hang.hang_grace([]) == hang.HANG_GRACE_UNKNOWN_S
    long_stage = hang.as_hang(stop_options.StopOptions({"pidfile": "/x", "ladder": [
        {"signal": "SIGINT", "wait": 5}, {"signal": "SIGKILL", "wait": 10}]}), 60)
    assert [s["wait"] for s in long_stage.stages] == [5, 10], "never longer than the run's own stage"


@pytest.mark.parametrize("loss, words", [
    ({"saved_on_stop": True, "steps_lost": 0}, "it saved a checkpoint on its stop: 0 steps lost"),
    ({"saved_on_stop": False, "steps_lost": 46, "checkpoint": "/w/ckpt/step_400"},
     "no checkpoint from its stop: 46 steps since step_400 lost"),
    ({"saved_on_stop": False, "steps_lost": 90, "checkpoint": None}, "no checkpoint from its stop: 90 steps of the run (no checkpoint) lost"),
    ({}, "no checkpoint from its stop; the steps lost are not known"),
])
def test_a_supervisors_stop_says_what_it_lost(loss, words):
    assert hang.loss_words({"loss": loss}) == words


def test_the_metrics_process_is_started_again_when_it_is_gone_counted_and_held_off_when_it_dies_at_once(
        tmp_path, monkeypatch):
    from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import metrics_process, supervise

    directory = str(tmp_path)
    _spec(directory, metrics={"listen": "0.0.0.0:9733"})
    sup = supervision.Supervisor(directory, os.path.join(directory, "agent.zip"))
    serving, started = [None], []
    monkeypatch.setattr(metrics_process, "running", lambda d: serving[0])
    monkeypatch.setattr(metrics_process, "ensure", lambda d, wait_s: started.append(wait_s))
    keeper = supervise.MetricsKeeper(sup)
    keeper.tick(1000.0)  # gone: started again at once, without waiting for it
    assert started == [0] and sup.state["metrics_restarts"] == 1
    serving[0] = (4242, 1, "0.0.0.0:9733", "x")
    for now in (1002.0, 1005.0, 1010.0):
        keeper.tick(now)
    assert started == [0]  # it serves: looked at every METRICS_EVERY_S, left alone
    serving[0] = None
    keeper.tick(1015.0)  # gone again within the back-off of its last start: held off until it ends
    keeper.tick(1059.0)
    assert started == [0]
    keeper.tick(1060.0)
    assert started == [0, 0] and sup.state["metrics_restarts"] == 2
    assert "the metrics process on 0.0.0.0:9733 was gone: started again (2 since the launch)" in open(
        os.path.join(directory, "supervisor.log"), encoding="utf-8").read()
    assert metrics_process.words(directory, 2) == ("NOT SERVED on 0.0.0.0:9733: its process is gone (the run's "
                                                   "supervisor starts it again within seconds; a stopped run's comes back "
                                                   "with its next launch or CT start); the supervisor started it again 2 "
                                                   "time(s) since the launch")
