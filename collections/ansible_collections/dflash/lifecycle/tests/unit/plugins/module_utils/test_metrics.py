"""The run's metrics (module_utils/agent/metrics.py) and the history they read (module_utils/ct/history.py)
without a CT: what a scrape serves from a lifecycle directory, the log read from where the last
scrape left it, the supervisor's state as a state set, the Proxmox hook seen or not, the exporter
started, replaced and ended by ensure, and the launch option's checks. The real exporter, scraped by
a real Prometheus, is tests/integration/test_monitoring.py's."""

import json
import os
import socket
import subprocess
import time
import urllib.request

import pytest

from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import launch_options, metrics, metrics_process
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import history, run_spec


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(data if isinstance(data, str) else json.dumps(data))


@pytest.fixture()
def lifecycle(tmp_path):
    """A lifecycle directory as a launch leaves it: the spec, the pidfile of a live process of this
    test (a sleep), a log, two complete checkpoints (step_dirs: step_N/ with latest naming it)."""
    directory = tmp_path / "lifecycle"
    run = tmp_path / "run"
    sleeper = subprocess.Popen(["sleep", "60"])
    with open(f"/proc/{sleeper.pid}/stat", encoding="utf-8") as handle:
        start = handle.read().rsplit(")", 1)[1].split()[19]
    write(str(run / "trainer.pid"), f"{sleeper.pid} {start} run1\n")
    write(str(run / "launch.json"), {"tokens_per_s": 120.5})
    for step in (100, 200):
        write(str(tmp_path / "ckpt" / f"step_{step}" / "model.bin"), "x")
    write(str(tmp_path / "ckpt" / "latest"), "step_200")
    write(str(tmp_path / "train.log"), "boot\nstep 230 epoch 0 loss 2.5000 tok/s 118.0\n")
    spec = {"version": 1, "wanted": "running", "release": "r1", "launch": {
        "pidfile": str(run / "trainer.pid"), "log_file": str(tmp_path / "train.log"), "health_timeout": 60,
        "checkpoint_dir": str(tmp_path / "ckpt"), "checkpoint_format": "step_dirs",
        "supervise": {"hang_floor_s": 10, "hang_factor": 3},
        "metrics": {"listen": "127.0.0.1:0", "canary_threshold_pct": -5, "exposed_steps_limit": 1000}}}
    write(str(directory / "run.json"), spec)
    yield directory
    sleeper.kill()
    sleeper.wait()


def served(text):
    """{(name, frozenset(labels)): value} of Prometheus's text format."""
    found = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        head, value = line.rsplit(" ", 1)
        name, _brace, labels = head.partition("{")
        pairs = frozenset(tuple(p.split("=", 1)) for p in labels.rstrip("}").split(",") if p)
        found[(name, frozenset((k, v.strip('"')) for k, v in pairs))] = float(value)
    return found


def one(found, name, **labels):
    return found[(name, frozenset(labels.items()))]


def test_a_scrape_serves_the_run_its_progress_and_its_checkpoints(lifecycle):
    collector = metrics.Collector(str(lifecycle))
    text = collector.render()
    found = served(text)
    assert one(found, "dflash_run_up") == 1 and one(found, "dflash_run_wanted_running") == 1
    assert one(found, "dflash_run_supervised") == 1
    assert one(found, "dflash_run_info", release="r1", layout="step_dirs", launcher="python") == 1
    assert (one(found, "dflash_run_step"), one(found, "dflash_run_tokens_per_second"), one(found, "dflash_run_loss")) == (230, 118, 2.5)
    assert one(found, "dflash_checkpoint_newest_step") == 200 and one(found, "dflash_checkpoint_interval_steps") == 100
    assert one(found, "dflash_run_steps_since_checkpoint") == 30
    assert one(found, "dflash_redeploy_tokens_per_second") == 120.5
    assert one(found, "dflash_canary_threshold_ratio") == -0.05
    assert one(found, "dflash_checkpoint_exposed_steps_limit") == 1000
    # no supervisor state yet: only whether one runs
    assert one(found, "dflash_supervisor_up") == 0 and not any(key[0] == "dflash_supervisor_state" for key in found)
    # every metric served has its HELP and TYPE, each once
    for name in {key[0] for key in found}:
        assert text.count(f"# TYPE {name} ") == 1 and text.count(f"# HELP {name} ") == 1


def test_the_log_is_read_from_where_the_last_scrape_left_it(lifecycle, tmp_path):
    collector = metrics.Collector(str(lifecycle))
    log = tmp_path / "train.log"
    collector.render()
    offset = collector.log.offset
    with open(log, "a", encoding="utf-8") as handle:
        handle.write("step 231 epoch 0 loss 2.4 tok/s 119.0\nstep 232 epoch 0 loss 2.3 tok/s 1")  # a line half written
    found = served(collector.render())
    assert one(found, "dflash_run_step") == 231 and collector.log.offset > offset
    with open(log, "a", encoding="utf-8") as handle:
        handle.write("20.0\n")
    found = served(collector.render())
    assert (one(found, "dflash_run_step"), one(found, "dflash_run_tokens_per_second")) == (232, 120)
    # a new log (a launch rotates it): read from its start
    os.replace(log, f"{log}.1")
    write(str(log), "step 7 tok/s 50\n")
    assert one(served(collector.render()), "dflash_run_step") == 7


def test_a_save_that_lands_between_scrapes_is_seen_by_the_next(lifecycle, tmp_path):
    """The checkpoints are listed again when the directory changes, and while a save is under way
    at a listing, not only every CHECKPOINT_TTL_S: else the steps a save just kept stay counted as
    exposed for up to a minute (DflashCheckpointExposed fired on a run saving every 25 s)."""
    collector = metrics.Collector(str(lifecycle))
    ckpt, log = tmp_path / "ckpt", tmp_path / "train.log"
    assert one(served(collector.render()), "dflash_run_steps_since_checkpoint") == 30
    # a save under way: its entry there, its weights not yet
    os.makedirs(ckpt / "step_300")
    with open(log, "a", encoding="utf-8") as handle:
        handle.write("step 300 epoch 0 loss 2.4 tok/s 119.0\n")
    found = served(collector.render())
    assert one(found, "dflash_checkpoint_newest_step") == 200 and one(found, "dflash_run_steps_since_checkpoint") == 100
    stamp = os.stat(ckpt).st_mtime_ns
    write(str(ckpt / "step_300" / "model.bin"), "x")  # inside the entry: the directory itself unchanged
    assert os.stat(ckpt).st_mtime_ns == stamp
    with open(log, "a", encoding="utf-8") as handle:
        handle.write("step 330 epoch 0 loss 2.3 tok/s 119.0\n")
    found = served(collector.render())
    assert one(found, "dflash_checkpoint_newest_step") == 300 and one(found, "dflash_run_steps_since_checkpoint") == 30
    # the next save whole between two scrapes: its new entry changes the directory
    write(str(ckpt / "step_400" / "model.bin"), "x")
    with open(log, "a", encoding="utf-8") as handle:
        handle.write("step 410 epoch 0 loss 2.2 tok/s 119.0\n")
    found = served(collector.render())
    assert one(found, "dflash_checkpoint_newest_step") == 400 and one(found, "dflash_run_steps_since_checkpoint") == 10
    # nothing changed and nothing under way: the listing of before is served, not made again
    listed_at = collector.checkpoints[1]
    collector.render()
    assert collector.checkpoints[1] == listed_at


def test_a_stopped_run_is_down_and_wanted_stopped(lifecycle):
    spec = json.loads((lifecycle / "run.json").read_text())
    os.unlink(spec["launch"]["pidfile"])
    spec["wanted"] = "stopped"
    write(str(lifecycle / "run.json"), spec)
    found = served(metrics.Collector(str(lifecycle)).render())
    assert one(found, "dflash_run_up") == 0 and one(found, "dflash_run_wanted_running") == 0
    assert one(found, "dflash_run_info", release="r1", layout="step_dirs", launcher="") == 1


def test_a_run_a_failed_job_left_down_is_still_wanted_until_someone_stops_it(lifecycle):
    spec = json.loads((lifecycle / "run.json").read_text())
    os.unlink(spec["launch"]["pidfile"])
    write(str(lifecycle / "run.json"), dict(spec, wanted="stopped", wanted_by="the stop of job 7"))
    run_spec.left_down(str(lifecycle), "job 7", "the new run crashed at start")
    assert run_spec.read(str(lifecycle))["wanted"] == "stopped"  # the Proxmox hook relaunches nothing
    assert one(served(metrics.Collector(str(lifecycle)).render()), "dflash_run_wanted_running") == 1
    run_spec.mark(str(lifecycle), "stopped", "the stop of make stop")
    assert "left_down" not in run_spec.read(str(lifecycle))
    assert one(served(metrics.Collector(str(lifecycle)).render()), "dflash_run_wanted_running") == 0


def test_the_supervisors_state_counts_and_hang_timeout(lifecycle):
    write(str(lifecycle / "supervisor.json"), {
        "state": "backing off 4 s (restart 2 within the window)", "supervisor": os.getpid(),
        "supervisor_start": int(open(f"/proc/{os.getpid()}/stat").read().rsplit(")", 1)[1].split()[19]),
        "restarts_by_cause": {"crash": 2}, "ends_by_kind": {"crash": 2, "hang": 1}, "learned": {"gaps": [2.5], "timeout_s": None}})
    found = served(metrics.Collector(str(lifecycle)).render())
    assert one(found, "dflash_supervisor_up") == 1
    assert [s for s in metrics.STATES if one(found, "dflash_supervisor_state", state=s) == 1] == ["backing_off"]
    assert one(found, "dflash_supervisor_restarts_total", cause="crash") == 2
    assert one(found, "dflash_supervisor_restarts_total", cause="hang") == 0
    assert one(found, "dflash_supervisor_ends_total", kind="hang") == 1
    # learned none yet: the policy's timeout on the gaps seen (3 x 2.5 s, at least the 10 s floor)
    assert one(found, "dflash_supervisor_hang_timeout_seconds") == 10
    # every label served is one the shipped scrape job keeps (metrics.LABELS)
    assert {key for _name, labels in found for key, _value in labels} <= set(metrics.LABELS)


@pytest.mark.parametrize("words, alive, name", [
    ("watching", True, "watching"), ("watching", False, "gone"), ("relaunching (round 2)", True, "relaunching"),
    ("DOWN", False, "down"), ("stood down", False, "stood_down"), ("hung, left running (restart: never)", True, "hung"),
    ("stopping (hang)", False, "gone"), ("finished", False, "finished"), ("something new", True, None)])
def test_the_supervisors_words_become_one_state(words, alive, name):
    assert metrics.state_name(words, alive) == name


@pytest.mark.parametrize("marker, post_start, present", [
    (None, None, False),  # never set: no `make pve-hooks`
    ({"installed": False, "set_at": 2000, "written_at": 2000}, 2000, False),  # taken off
    ({"installed": True, "set_at": 2000, "written_at": 2000}, None, True),  # set after the CT started
    ({"installed": True, "set_at": 500, "written_at": 500}, 1010, True),  # set before, and it ran at this start
    ({"installed": True, "set_at": 500, "written_at": 500}, 800, False),  # set before, and this start ran no hook
    # a controller whose clock runs ahead: its set_at is after the start, the file's write is not
    ({"installed": True, "set_at": 5000, "written_at": 500}, None, False),
])
def test_the_proxmox_hook_is_seen_by_its_marker_and_its_post_start(marker, post_start, present):
    assert metrics.hook_present(marker, post_start, booted=1000) is present


def test_the_hook_markers_time_is_its_write_on_the_node_not_the_controllers_clock(tmp_path):
    """The marker says set_at by the controller's clock; what it is judged by is the file's
    modification time, the clock the CT's start time is on."""
    path = tmp_path / "pve-hook.json"
    assert history.hook_marker(str(tmp_path)) is None
    path.write_text(json.dumps({"installed": True, "set_at": 5000.0, "written_at": 9000.0}) + "\n")
    os.utime(path, (500.0, 500.0))
    marker = history.hook_marker(str(tmp_path))
    assert marker == {"installed": True, "set_at": 5000.0, "written_at": 500.0}
    assert metrics.hook_present(marker, None, booted=1000) is False
    path.write_text("[1, 2]\n")
    assert history.hook_marker(str(tmp_path)) is None


def test_labels_are_escaped_and_unknown_figures_left_out():
    text = metrics.render([("dflash_run_info", {"release": 'a"b\\c\nd'}, 1.0), ("dflash_run_up", {}, 0.0)])
    assert 'dflash_run_info{release="a\\"b\\\\c\\nd"} 1.0' in text and "dflash_run_up 0.0" in text
    assert "dflash_run_step" not in text


@pytest.mark.parametrize("listen, problem", [
    ("0.0.0.0:9733", None), ("[::]:9733", None), ("10.0.0.5:9733", None),
    ("9733", "is not HOST:PORT"), ("host:0", "a port from 1 to 65535"), ("::1:9733", "in brackets")])
def test_the_listen_address_is_checked(listen, problem):
    found = launch_options.problems({"metrics": {"listen": listen}, "lifecycle": {"dir": "/var/lib/dflash/lifecycle"}})
    assert (found == []) if problem is None else (len(found) == 1 and problem in found[0] and found[0].startswith("metrics.listen")), found
    assert launch_options.problems({"metrics": {"listen": "0.0.0.0:9733"}}) == [
        "metrics: needs lifecycle.dir, where the metrics are read from"]


def test_a_stop_a_redeploy_and_the_hooks_start_are_kept(tmp_path):
    directory = str(tmp_path)
    stop = {"changed": True, "targets": [{"pid": 5}], "stopped": True, "started_at": 1000.0, "duration_s": 3.2,
            "stopped_by": {"stage": 0, "signal": "SIGINT", "scope": "group"}, "loss": {"steps_lost": 0}}
    history.record_stop(directory, stop, "redeploy")
    assert history.read(directory)["stop"] == dict(history.read(directory)["stop"], duration_s=3.2, stage=1,
                                                   signal="SIGINT", steps_lost=0, failed=False)
    # the stop request is stage 0; a stop that found no trainer is no stop of a run
    assert history.stop_facts(dict(stop, stopped_by={"stage": -1, "signal": None, "scope": "request"}))["stage"] == 0
    assert history.stop_facts({"changed": False, "targets": []}) is None
    # healthy 12 s after its wait began, first progress at 4 s of it, the wait ending at 1020: 1012 - 1000
    history.record_launch(directory, stop, {"first_progress_s": 4.0, "healthy_after_s": 12.0}, now=1020.0)
    assert history.read(directory)["redeploys"] == {"count": 1, "at": 1020.0, "gpu_idle_s": 12.0}
    history.record_launch(directory, stop, {"first_progress_s": None, "healthy_after_s": 12.0}, now=1030.0)
    assert history.read(directory)["redeploys"] == {"count": 2, "at": 1030.0, "gpu_idle_s": None}
    history.record_post_start(directory)
    assert time.time() - history.read(directory)["post_start_at"] < 5
    assert set(history.read(directory)) == {"stop", "redeploys", "post_start_at", "totals"}
    # a directory no launch made yet (a CT's first redeploy stops a run started by hand) is made for it
    history.record_stop(str(tmp_path / "lifecycle"), stop, "stop")
    assert history.read(str(tmp_path / "lifecycle"))["stop"]["stage"] == 1


def test_the_totals_add_up_over_a_crash_a_hang_a_redeploy_and_a_proxmox_stop(tmp_path):
    """Each way down counts its steps lost and the GPUs' idle to the next run's first progress line
    under its cause (a failed launch records nothing: the next healthy one counts the whole idle); a
    healthy launch with no progress line of its own (a gang member whose ranks log none) ends the
    idle uncounted."""
    directory = str(tmp_path)

    def stopped(at, lost):
        return {"changed": True, "targets": [{"pid": 5}], "stopped": True, "started_at": at, "duration_s": 2.0,
                "stopped_by": {"stage": 0, "signal": "SIGINT", "scope": "group"}, "loss": {"steps_lost": lost}}

    def back(now, first=4.0, healthy=6.0, stop=None):  # the new run's first line at now - healthy + first
        history.record_launch(directory, stop, {"first_progress_s": first, "healthy_after_s": healthy}, now=now)

    history.record_crash(directory, 46, 1000.0)
    back(1020.0)  # first progress at 1018: 18 s idle
    history.record_stop(directory, stopped(2000.0, 7), "hang")
    back(2032.0)  # 30 s
    history.record_stop(directory, stopped(3000.0, 0), "redeploy")
    back(3012.0, stop=stopped(3000.0, 0))  # 10 s, and a redeploy
    history.record_stop(directory, stopped(4000.0, 0), "proxmox")
    back(4302.0)  # its relaunch failed once: the next healthy launch, 300 s after the pre-stop's first signal
    history.record_crash(directory, None, 5000.0)  # no checkpoint to count from: nothing counted, the idle still is
    back(5011.0)
    history.record_crash(directory, 3, 6000.0)
    history.record_launch(directory, None, {"first_progress_s": None, "healthy_after_s": 5.0}, now=6100.0)
    totals = history.read(directory)["totals"]
    assert totals["steps_lost"] == {"crash": 49.0, "hang": 7.0}
    assert totals["gpu_idle_s"] == {"crash": 27.0, "hang": 30.0, "redeploy": 10.0, "proxmox": 300.0}
    assert history.read(directory)["redeploys"]["count"] == 1 and "down" not in history.read(directory)
    served = served_of(directory)
    assert one(served, "dflash_steps_lost_total", cause="crash") == 49
    assert one(served, "dflash_gpu_idle_seconds_total", cause="proxmox") == 300
    assert one(served, "dflash_gpu_idle_seconds_total", cause="stop") == 0  # every cause served, from 0


def served_of(directory):
    return served(metrics.Collector(directory).render())


def test_the_runs_tokens_are_its_throughput_over_time_kept_across_processes(lifecycle):
    """Integrated at each scrape while the run logs progress (at most a minute between two), written to
    the lifecycle directory, and taken up by the next metrics process where the last one left it."""
    log = lifecycle.parent / "train.log"
    collector = metrics.Collector(str(lifecycle))
    began = os.stat(log).st_mtime
    first = served(collector.render(now=began + 1))
    assert one(first, "dflash_run_tokens_total") == 0  # the first scrape starts the count
    second = served(collector.render(now=began + 16))
    assert one(second, "dflash_run_tokens_total") == 15 * 118  # 15 s at the last line's 118 tok/s
    # a new process (the old one killed) goes on from what was kept; a long gap counts a minute at most
    again = served(metrics.Collector(str(lifecycle)).render(now=began + 100))
    assert one(again, "dflash_run_tokens_total") == 15 * 118 + 60 * 118
    # a run whose last progress line is older than its freshness trains nothing
    stale = served(metrics.Collector(str(lifecycle)).render(now=began + 1000))
    assert one(stale, "dflash_run_tokens_total") == 75 * 118


def test_the_runs_gpus_are_served_with_their_roles_and_the_uuids_the_launch_was_given(lifecycle):
    spec = json.loads((lifecycle / "run.json").read_text())
    spec["launch"]["metrics"]["gpu_roles"] = {"target": [0, 1], "drafter": [2]}
    write(str(lifecycle / "run.json"), spec)
    record = os.path.join(os.path.dirname(spec["launch"]["pidfile"]), "launch.json")
    write(record, dict(json.load(open(record)), gpu_uuids={"0": "GPU-aa", "1": "GPU-bb", "2": "GPU-cc"}))
    found = served(metrics.Collector(str(lifecycle)).render())
    assert {labels for name, labels in found if name == "dflash_run_gpu_info"} == {
        frozenset({("gpu", "0"), ("uuid", "GPU-aa"), ("role", "target")}),
        frozenset({("gpu", "1"), ("uuid", "GPU-bb"), ("role", "target")}),
        frozenset({("gpu", "2"), ("uuid", "GPU-cc"), ("role", "drafter")})}
    # every label served is one the shipped scrape job keeps
    assert {key for _name, labels in found for key, _value in labels} <= set(metrics.LABELS)


def test_ensure_starts_the_exporter_and_replaces_one_on_another_address(lifecycle):
    """The exporter as a launch starts it, serving this lifecycle directory (agent.zip stands in as a
    script that runs agent/main.py's metrics from this checkout's collection)."""
    collections = os.path.abspath(os.path.join(os.path.dirname(metrics.__file__), *[".."] * 6))
    write(str(lifecycle / "agent.zip"), "import sys\nsys.path.insert(0, %r)\n" % collections
          + "from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder\n"
          + "_AnsibleCollectionFinder(paths=[%r])._install()\n" % collections
          + "from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import main\n"
          + "sys.exit(main.main(sys.argv[1:]))\n")
    ports = []
    for _port in range(2):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            ports.append(probe.getsockname()[1])
    spec = json.loads((lifecycle / "run.json").read_text())
    try:
        for port in ports:
            spec["launch"]["metrics"]["listen"] = f"127.0.0.1:{port}"
            write(str(lifecycle / "run.json"), spec)
            assert metrics_process.ensure(str(lifecycle), wait_s=20) is None, (lifecycle / "metrics.log").read_text()
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            assert one(served(body), "dflash_run_step") == 230
            assert metrics_process.running(str(lifecycle))[2] == f"127.0.0.1:{port}"
        with pytest.raises(OSError):  # the first address is no longer served
            urllib.request.urlopen(f"http://127.0.0.1:{ports[0]}/metrics", timeout=5)
        first = metrics_process.running(str(lifecycle))
        assert metrics_process.ensure(str(lifecycle)) is None and metrics_process.running(str(lifecycle)) == first  # nothing to do
        del spec["launch"]["metrics"]
        write(str(lifecycle / "run.json"), spec)
        assert metrics_process.ensure(str(lifecycle)) is None and metrics_process.running(str(lifecycle)) is None  # none asked for
    finally:
        found = metrics_process.running(str(lifecycle))
        if found:
            os.kill(found[0], 15)
