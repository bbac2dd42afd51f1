"""Checkpoint truth through redeploy.yml, for four layouts at once: a testbed of its own with one
CT per layout (2 nodes, 4 CTs), the example trainer in each saving, resuming and meeting signals
as its framework does (DFLASH_TEST_CHECKPOINT_LAYOUT: real torch.save zips, safetensors and
JSON, in the framework's order of writes; tests/testbed/example_trainer/checkpoint_layouts.py).

The four are one of each way a layout tells its resume and a save's end: step_dirs (the field's
trainer: it saves on SIGINT), hf_trainer (the highest entry, unchecked: the launch moves a cut
one aside), lightning (a pointer, last.ckpt, and a copy across file systems that leaves a cut
file under its final name) and dcp (a mark written last, .metadata). DeepSpeed (a pointer),
SpecForge's scripts (unchecked) and SpecForge (a link, else a mark) take the same paths through
the job; every layout's stop meets real trainers in tests/unit/test_own_checkpoint_stop.py, and
every write of every layout is cut in tests/unit/test_checkpoint_layouts.py. Each CT here costs
the stops and relaunches of all three scenarios (about 17 CPU seconds with its first launch),
within make test's 15 minutes on two CPUs.

Three scenarios, each a stop (`redeploy.yml --tags stop`) judged against what the framework itself
finds on disk (the imitation's own resume rule and loader, run in the CT), then the relaunch
(`--tags launch`) judged by what the relaunched trainer says it resumed from:

1. the trainer saves on SIGINT (its KeyboardInterrupt handler, as the field's), with a
   half-written checkpoint of a higher step already there (an earlier crash);
2. its interrupt save is killed half way (the graceful wait runs out);
3. the defaults (checkpoint_format and saves_on auto): the frameworks save nothing on a signal,
   so the stop waits for the next periodic save to be complete - a save that pauses 3 s after
   its first file, longer than the stable window - then stops.

Each relaunch sets up the next scenario's run: a stop and a relaunch of the CTs cost a redeploy's
controller CPU for each CT, so the scenarios share them (the half-written checkpoint
rides along with the save on SIGINT, whose checks it leaves as they are).
"""

import json
import os
import re
import shlex
import time

import ansible_runner
import pytest

from testlib import REPO, LiveTestbed, agrees_with_the_framework, make_testbed_inventory, testbed_mod

STATE = "/var/lib/dflash-testbed/layouts"
NODES = {"ln1": "127.77.4.1", "ln2": "127.77.4.2"}
LAYOUTS = ("step_dirs", "hf_trainer", "lightning", "dcp")
HOSTS = {layout: (f"lct{510 + i}", "ln1" if i % 2 == 0 else "ln2", 510 + i) for i, layout in enumerate(LAYOUTS)}
CKPT = "/workspace/checkpoints"
LOG = "/workspace/logs/train.log"
# their resume picks the highest entry without looking inside: a half-written one included
UNCHECKED_RESUME = ("hf_trainer",)
SETTINGS = {
    "dflash_env": "{{ {'PYTHONUNBUFFERED': '1', 'DFLASH_STEP_SECONDS': '0.02', 'DFLASH_TEST_CHECKPOINT_KB': '16',"
                  " 'DFLASH_TEST_CHECKPOINT_LAYOUT': layout_under_test} | combine(scenario_env | default({})) }}",
    "dflash_profile_interval": 10,
    "dflash_extra_args": ["--save-interval", "{{ save_interval | default(40) }}"],
    "trainer_run_saves_on": "auto",
    "redeploy_serial": len(LAYOUTS),
}
SIGINT_SAVES = {"DFLASH_TEST_SAVES_ON": "SIGINT"}


class Layouts:
    def __init__(self, inventory, tmp):
        self.inventory = inventory
        self.bed = testbed_mod.Testbed(inventory)
        self.live = LiveTestbed(self.bed)
        self.tmp = tmp
        self.runs = 0

    def sh(self, layout, command, check=True):
        host, node, vmid = HOSTS[layout]
        res = self.live.in_ct(node, vmid, command)
        assert res.returncode == 0 or not check, f"{host}: {command}: {res.stderr}"
        return res.stdout

    def redeploy(self, tags, **extravars):
        """{layout: {task name: result}} of one redeploy.yml run over every CT."""
        self.runs += 1
        private = os.path.join(self.tmp, f"run{self.runs}")
        os.makedirs(private)
        run = ansible_runner.run(private_data_dir=private, playbook=os.path.join(REPO, "redeploy.yml"),
                                 project_dir=REPO, inventory=self.inventory, extravars=extravars,
                                 cmdline=f"--tags {tags}", quiet=True)
        results = {layout: {} for layout in LAYOUTS}
        by_host = {host: layout for layout, (host, _n, _v) in HOSTS.items()}
        for event in run.events:
            data = event.get("event_data", {})
            if event["event"] in ("runner_on_ok", "runner_on_failed") and data.get("host") in by_host:
                results[by_host[data["host"]]][data["task"]] = data["res"]
        assert run.status == "successful", run.stdout.read()[-6000:]
        return results

    def judge(self, layout, paths=()):
        """What the framework itself finds in the CT (checkpoint_layouts.judge)."""
        out = self.sh(layout, "python3 /opt/dflash/current/checkpoint_layouts.py judge "
                      + " ".join(shlex.quote(p) for p in (layout, CKPT, *paths)))
        return json.loads(out)

    def log(self, layout, name=LOG):
        return self.sh(layout, f"cat {name}", check=False)

    def wait_for_saves(self, count, timeout=90):
        """Until every trainer has logged count periodic saves."""
        deadline = time.monotonic() + timeout
        for layout in LAYOUTS:
            _host, node, vmid = HOSTS[layout]
            self.live.wait_in_ct(node, vmid, f"[ $(grep -c '(step' {LOG}) -ge {count} ]",
                                 max(1, round(deadline - time.monotonic())), f"{layout}: {count} saves",
                                 lambda: self.log(layout)[-2000:])


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("layouts"))
    cts = {host: {"pve_node": node, "ansible_pct_vmid": vmid, "testbed_gpu_count": 2, "dflash_target_gpus": [0],
                  "dflash_drafter_gpus": [1], "layout_under_test": layout}
           for layout, (host, node, vmid) in HOSTS.items()}
    inventory = make_testbed_inventory(os.path.join(tmp, "inventory"), STATE, NODES, cts, SETTINGS)
    layouts = Layouts(inventory, tmp)
    layouts.bed.up_fresh()
    try:
        for layout in LAYOUTS:
            layouts.sh(layout, "mkdir -p /dev/shm/models/target /workspace/data && "
                               "echo '{}' > /dev/shm/models/target/config.json && "
                               "echo 'a b c d e f g h' > /workspace/data/corpus.txt")
        layouts.redeploy("all", scenario_env=SIGINT_SAVES)  # the first run of each CT
        yield layouts
    finally:
        layouts.bed.down()


def stop_of(results):
    return results["Stop the trainer in stages"]


def launch_of(results):
    return results["Start the trainer and wait until it is healthy"]


def interrupted_at(log):
    return int(re.findall(r"KeyboardInterrupt at step (\d+)", log)[-1])


def check_report(bed, layout, stop):
    """The stop's report against the framework's own view of the directory."""
    ckpt = stop["checkpoint"]
    assert ckpt["format"] == layout and ckpt["format_reason"].startswith("auto: "), ckpt
    paths = [a["path"] for a in ckpt["appeared"]]
    truth = bed.judge(layout, paths)
    for entry in ckpt["appeared"]:
        assert agrees_with_the_framework(entry["name"], entry, truth["loads"][entry["path"]], truth["reads"]), (
            layout, entry, truth)
    assert ckpt["resume"]["name"] == truth["pick"], (layout, ckpt["resume"], truth)
    assert agrees_with_the_framework(truth["pick"], ckpt["resume"], truth["pick_loads"], truth["reads"]), (
        layout, ckpt["resume"], truth)
    return ckpt


def check_resumed(bed, layout, launch, step):
    """The relaunched trainer resumed from what the launch said, at step."""
    assert launch["resume"]["step"] == step and launch["resume"]["complete"], (layout, launch["resume"])
    said = re.search(r"resumed from (\S+) at step (\d+)", bed.log(layout))
    assert said and int(said.group(2)) == step, (layout, bed.log(layout)[-1500:])
    assert os.path.basename(said.group(1).rstrip("/")) in (launch["resume"]["name"],
                                                           os.path.basename(os.path.realpath(launch["resume"]["path"])))


def stop_on_sigint(bed):
    """The stop of trainers that save on SIGINT: each one's new checkpoint is the step it was
    interrupted at, the newest complete one, and no step is lost. {layout: (stop, step)}."""
    stopped = bed.redeploy("stop", trainer_run_saves_on="SIGINT")
    found = {}
    for layout in LAYOUTS:
        stop = stop_of(stopped[layout])
        ckpt = check_report(bed, layout, stop)
        step = interrupted_at(bed.log(layout))
        assert stop["stopped_by"]["signal"] == "SIGINT", (layout, stop["msg"])
        assert ckpt["written"] and ckpt["new_step"] == step == ckpt["newest_step"], (layout, stop["msg"])
        assert stop["loss"]["steps_lost"] == 0, (layout, stop["msg"])
        found[layout] = (stop, step)
    return found


def test_1_a_save_on_sigint_is_the_new_checkpoint_and_the_resume_loads_it_past_a_half_written_newer_one(bed):
    bed.wait_for_saves(2)
    for layout in LAYOUTS:  # an earlier crash's checkpoint of a higher step, cut half way
        if layout == "step_dirs":  # an in-place save cut short (DFLASH_TEST_CHECKPOINT_IN_PLACE)
            bed.sh(layout, f"mkdir -p {CKPT}/step_900000 && printf '{{\"weights\": [[0.1' > {CKPT}/step_900000/model.json")
        else:
            # half way; for Lightning, whose copy across file systems leaves its cut file under the
            # final name, half way through that file (the second is last.ckpt)
            bed.sh(layout, "DFLASH_TEST_LIGHTNING_CROSS_FS=1 python3 /opt/dflash/current/checkpoint_layouts.py "
                           f"cut {layout} {CKPT} 900000 {0.25 if layout == 'lightning' else 0.5}", check=False)
    stopped = stop_on_sigint(bed)
    steps = {layout: step for layout, (_stop, step) in stopped.items()}
    for layout, (stop, step) in stopped.items():
        ckpt = stop["checkpoint"]
        if layout in UNCHECKED_RESUME:  # their resume would load the cut one
            assert ckpt["resume"]["step"] == 900000 and not ckpt["resume"]["complete"], ckpt["resume"]
        else:
            assert ckpt["resume"]["step"] == step, ckpt["resume"]
    # the run test 2 stops: a 30 s interrupt save, and no periodic save after the second, so the
    # interrupt step is a new one (not a periodic save's step rewritten in place: that case is
    # tests/unit/test_checkpoint_layouts.py's, at every write)
    launched = bed.redeploy("launch", scenario_env=dict(SIGINT_SAVES, DFLASH_TEST_SLOW_CHECKPOINT_SECONDS="30",
                                                        DFLASH_TEST_SLOW_SAVES="interrupt",
                                                        DFLASH_TEST_INTERVAL_SAVES="2"))
    for layout in LAYOUTS:
        launch = launch_of(launched[layout])
        assert [m["name"].endswith("900000") for m in launch["moved_aside"]] == (
            [True] if layout in UNCHECKED_RESUME else []), (layout, launch["moved_aside"])
        check_resumed(bed, layout, launch, steps[layout])


def test_2_an_interrupt_save_killed_half_way_is_no_checkpoint_and_the_loss_is_stated(bed):
    bed.wait_for_saves(2)
    stopped = bed.redeploy(
        "stop", trainer_run_saves_on="SIGINT", trainer_stop_graceful_wait_cap=3,
        trainer_stop_on_missing_checkpoint="proceed",
        trainer_stop_ladder=[{"signal": "SIGINT", "scope": "main", "wait": 2},
                             {"signal": "SIGTERM", "scope": "tree", "wait": 3},
                             {"signal": "SIGKILL", "scope": "tree", "wait": 5}])
    previous = {}
    for layout in LAYOUTS:
        stop = stop_of(stopped[layout])
        ckpt = check_report(bed, layout, stop)
        cut_at = interrupted_at(bed.log(layout))
        assert "saving checkpoint" in bed.log(layout) and stop["stopped_by"]["signal"] != "SIGINT", layout
        assert ckpt["written"] is False and "NO new checkpoint" in stop["msg"], (layout, stop["msg"])
        previous[layout] = ckpt["newest_step"]
        assert previous[layout] < cut_at and stop["loss"]["steps_lost"] == cut_at - previous[layout], stop["loss"]
        # the trainer logs every 10 steps: up to 9 steps after its last line may be lost too
        lost = cut_at - previous[layout]
        assert stop["loss"]["log_every"] == 10 and stop["loss"]["steps_lost_up_to"] == lost + 9, stop["loss"]
        assert f"{lost} to {lost + 9} steps after the newest checkpoint lost" in stop["msg"]
        cut = [a for a in ckpt["appeared"] if a["step"] == cut_at]
        assert all(not a["complete"] and a["problems"] for a in cut), (layout, cut)
        if layout in UNCHECKED_RESUME:  # their resume would load the cut one
            assert cut and ckpt["resume"]["step"] == cut_at and not ckpt["resume"]["complete"], ckpt["resume"]
            assert "the trainer's resume would load the incomplete" in stop["msg"]
        else:
            assert ckpt["resume"]["step"] == previous[layout] and ckpt["resume"]["complete"], ckpt["resume"]
    # the run test 3 stops: the layouts' own saves_on, and periodic saves that pause after their first file
    launched = bed.redeploy("launch", save_interval=200,
                            scenario_env={"DFLASH_TEST_SAVE_PAUSE_SECONDS": "3", "DFLASH_TEST_SLOW_SAVES": "interval"})
    for layout in LAYOUTS:
        launch = launch_of(launched[layout])
        moved = [m["name"] for m in launch["moved_aside"]]
        assert len(moved) == (1 if layout in UNCHECKED_RESUME else 0), (layout, launch["moved_aside"])
        for name in moved:  # kept, never deleted (beside test 1's, moved aside before it)
            assert any(kept.startswith(name + "-") for kept in bed.sh(layout, f"ls {CKPT}/.incomplete").split()), name
        check_resumed(bed, layout, launch, previous[layout])


def test_3_with_the_defaults_a_save_with_a_quiet_gap_is_waited_out_then_the_stop_follows_it(bed):
    bed.wait_for_saves(2, timeout=120)
    stopped = bed.redeploy("stop")
    for layout in LAYOUTS:
        stop = stop_of(stopped[layout])
        ckpt = check_report(bed, layout, stop)
        events = [e["event"] for e in stop["timeline"]]
        assert ckpt["written"] and ckpt["new_step"] == ckpt["newest_step"], (layout, stop["msg"])
        if layout == "step_dirs":  # auto: its layout saves on SIGINT
            assert stop["graceful_possible"] and stop["stopped_by"]["signal"] == "SIGINT", stop["msg"]
            assert ckpt["new_step"] == interrupted_at(bed.log(layout))
            continue
        assert stop["graceful_possible"] is False and "saves nothing on a signal" in stop["graceful_reason"]
        assert events.index("checkpoint_landed") < events.index("signal"), stop["timeline"]
        (landed,) = [e["path"] for e in stop["timeline"] if e["event"] == "checkpoint_landed"]
        assert landed == ckpt["new"] and all(a["complete"] for a in ckpt["appeared"]), ckpt["appeared"]
        assert 0 <= stop["loss"]["steps_lost"] < 200, stop["loss"]
        assert "KeyboardInterrupt at step" in bed.log(layout) and "saving checkpoint" not in bed.log(layout)
    launched = bed.redeploy("launch")
    for layout in LAYOUTS:
        check_resumed(bed, layout, launch_of(launched[layout]), stop_of(stopped[layout])["checkpoint"]["new_step"])
