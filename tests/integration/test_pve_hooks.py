"""Proxmox's own stops and starts with the project's hookscript installed by the README's command
(`make pve-hooks`), on the testbed's ct300 (unprivileged): `pct shutdown` and `pct reboot` keep the
run's checkpoint from the stop with 0 steps lost and bring the run back on its release, resuming from
that checkpoint with its model restaged into the wiped /dev/shm; a relaunch after a restart that
wiped a model no job stages is refused by the preflight's rule and said; a run stopped with `make stop`
stays stopped across a reboot; someone else's hookscript is refused, or chained to when asked; a
storage a node lacks and a node that does not answer are refused before anything changes; a CT whose
hook cannot run at pre-stop says what is lost. The testbed's pct runs the hookscript as pve-container
does (tests/testbed/pct.py: PVE::LXC::vm_start, vm_stop, vm_reboot)."""

import contextlib
import json
import os
import re
import shlex
import shutil
import time

import pytest
import yaml

from testlib import END_RUNS, REPO, TESTBED_INVENTORY, interrupt_save_lines, make, wait_for

CT, NODE, OTHER_NODE, VMID = "ct300", "pve2", "pve1", "300"
REDEPLOY = os.path.join(REPO, "redeploy.yml")
TARGET, SOURCE = "/dev/shm/models/target", "/workspace/models/target"
SETTINGS = {"trainer_model_stage": {TARGET: SOURCE}, "trainer_model_stage_reserve_gb": 0.05,
            "trainer_run_min_free_gb": 0.1, "trainer_launch_health_seconds": 1}
OURS = "local:snippets/dflash-lifecycle-hook.py"


def sh(testbed, command, check=True, node=NODE):
    return testbed.in_ct(node, VMID, command, check=check, timeout=120)


def hookscript(testbed):
    found = re.search(r"^hookscript: (.*)$", testbed.ssh(NODE, f"pct config {VMID}", check=True).stdout, re.M)
    return found.group(1) if found else None


def snippets(testbed, node):
    return os.path.join(testbed.bed.node_dir(node), "var/lib/vz/snippets")


def log_text(testbed, before=False):
    """The run's log; before: with the log of the run before the last launch (train.log.1) ahead of it."""
    logs = "/workspace/logs/train.log.1 /workspace/logs/train.log" if before else "/workspace/logs/train.log"
    return sh(testbed, f"cat {logs} 2>/dev/null", check=False).stdout


def trainer_pids(testbed):
    return sh(testbed, "pgrep -f 'train_dflash_pipeline[.]py' || true", check=False).stdout.split()


def progress_after(testbed, marker):
    """The first progress line the log has after the line holding marker, or None."""
    text = log_text(testbed)
    at = text.rfind(marker)
    return re.search(r"^.* step \d+ .*tok/s.*$", text[at:], re.M) if at >= 0 else None


def kill_trainers(testbed):
    sh(testbed, END_RUNS, check=False)  # the run's supervisor first: it would relaunch the trainer


def write_model(testbed):
    """The model's persistent copy on the CT's disk: a config and one safetensors shard
    (huggingface/safetensors: an 8-byte little-endian header length, the JSON header, the bytes)."""
    sh(testbed, f"mkdir -p {SOURCE} /workspace/data && echo 'a b c d' > /workspace/data/corpus.txt && "
                f"echo '{{\"model_type\": \"qwen3\"}}' > {SOURCE}/config.json && python3 -c "
                + shlex.quote("import json, struct\n"
                              "h = json.dumps({'w': {'dtype': 'U8', 'shape': [4096], 'data_offsets': [0, 4096]}}).encode()\n"
                              "h += b' ' * (-len(h) % 8)\n"
                              f"open('{SOURCE}/model.safetensors', 'wb').write(struct.pack('<Q', len(h)) + h + bytes(4096))\n"))


@pytest.fixture(scope="module")
def hooked(testbed):
    """ct300 running the example trainer with its model staged from a persistent copy, and the
    hookscript installed through `make pve-hooks` before that run's launch, on a CT that no launch of
    this project touched yet (a trainer started by hand until the first redeploy); afterwards the
    hookscript off and the run ended."""
    kill_trainers(testbed)
    sh(testbed, "rm -rf /var/lib/dflash")  # no lifecycle directory: the install makes it
    write_model(testbed)
    installed = make("pve-hooks", f"HOST={CT}")
    assert installed.returncode == 0, installed.stdout[-4000:] + installed.stderr
    launched = testbed.playbook(REDEPLOY, "-l", CT, "-e", json.dumps(SETTINGS), check=False)
    assert launched.returncode == 0, launched.stdout[-4000:]
    try:
        yield installed
    finally:
        for node in (NODE, OTHER_NODE):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(snippets(testbed, node), "other.sh"))
        if testbed.ssh(NODE, f"pct status {VMID}").stdout.strip() != "status: running":
            testbed.ssh(NODE, f"pct start {VMID}")
        testbed.ssh(NODE, f"pct set {VMID} --delete hookscript")
        kill_trainers(testbed)
        sh(testbed, f"rm -rf {TARGET}", check=False)


def test_1_the_install_says_what_it_did_changes_nothing_the_second_time_and_status_names_it(testbed, hooked):
    assert f"{CT} (CT {VMID} on {NODE}): hookscript {OURS} (was none)" in " ".join(hooked.stdout.split())
    assert hookscript(testbed) == OURS
    for node in (NODE, OTHER_NODE):  # every node a CT may start on, its migration targets included
        assert os.access(os.path.join(snippets(testbed, node), "dflash-lifecycle-hook.py"), os.X_OK)
    again = make("pve-hooks", f"HOST={CT}")
    assert again.returncode == 0 and re.search(rf"{CT}\s+: ok=\d+\s+changed=0 ", again.stdout), again.stdout[-3000:]
    status = make("status", f"HOST={CT}")
    assert f"pve_hook: 'set ({OURS}): a Proxmox stop checkpoints the run first" in " ".join(status.stdout.split()), \
        status.stdout[-3000:]


def shut_down_and_start(testbed, how):
    """`pct <how>` of the running trainer: (what the pre-stop hook said, its checkpoint, the log's last
    step before the stop), then the run back: (post-start's words, the progress line after the resume)."""
    wait_for("a progress line", lambda: re.search(r" step \d+ .*tok/s", log_text(testbed)))
    if how == "shutdown":
        stopped = testbed.ssh(NODE, f"pct shutdown {VMID}", check=True, timeout=300)
        assert testbed.ssh(NODE, f"pct status {VMID}").stdout.strip() == "status: stopped"
        started = time.monotonic()
        start = testbed.ssh(NODE, f"pct start {VMID}", check=True)
    else:
        stopped = start = testbed.ssh(NODE, f"pct reboot {VMID}", check=True, timeout=300)
        started = time.monotonic()
    said = re.search(rf"^\[{CT}\] dflash pre-stop: (.*)$", stopped.stdout, re.M)
    assert said, stopped.stdout + stopped.stderr
    return said.group(1), start, started


@pytest.mark.parametrize("how", ["shutdown", "reboot"])
def test_2_a_proxmox_stop_keeps_the_checkpoint_with_0_steps_lost_and_its_start_brings_the_run_back(testbed, hooked, how):
    release = sh(testbed, "readlink /opt/dflash/current").stdout.strip()
    said, start, started = shut_down_and_start(testbed, how)
    checkpoint = re.search(r"new checkpoint (/workspace/checkpoints/step_(\d+)) \(completed after SIGINT", said)
    assert checkpoint and "0 steps lost" in said, said
    step = checkpoint.group(2)
    # the trainer's own words: its KeyboardInterrupt handler saved the step it had reached (at a
    # periodic save's step, found that save complete)
    log = log_text(testbed, before=True)
    assert interrupt_save_lines(log, checkpoint.group(1), step), log[-2000:]
    assert "goes on detached in the CT" in start.stdout, start.stdout  # post-start returned at once
    resumed = wait_for("the run back", lambda: progress_after(testbed, f"resumed from {checkpoint.group(1)} at step {step}"))
    assert resumed, log_text(testbed)[-2000:]
    assert sh(testbed, "readlink /opt/dflash/current").stdout.strip() == release
    assert sh(testbed, f"test -f {TARGET}/model.safetensors", check=False).returncode == 0  # restaged
    assert len(trainer_pids(testbed)) == 1
    # the run's supervisor let the hook's stop end the run (it did not relaunch it before the CT stopped),
    # and the relaunch brought a supervisor of its own
    supervised = sh(testbed, "cat /var/lib/dflash/lifecycle/supervisor.log").stdout
    assert re.search(r"the trainer exited with status 130: the stop of Proxmox pre-stop hook at .*; standing down",
                     supervised) and "restart 1 in" not in supervised.split("Proxmox pre-stop hook")[-1], supervised
    # the relaunch's worker ends once it measured the new run's throughput
    wait_for("the relaunch's end", lambda: '"finished_at": null' not in sh(testbed, "cat /var/lib/dflash/last-change.json").stdout)
    status = " ".join(make("status", f"HOST={CT}").stdout.split())
    assert re.search(r"last_change: 'the launch started at .* by Proxmox post-start hook finished at .*: "
                     r"trainer PID \d+ healthy", status), status[-3000:]
    assert "the last Proxmox stop (" in status and f"stopped it by SIGINT, checkpoint {checkpoint.group(1)}, 0 steps lost" \
        in status, status[-3000:]
    print(f"{how}: the run's first progress line {time.monotonic() - started:.1f} s after the CT's start returned")


def test_3_a_run_stopped_with_make_stop_stays_stopped_across_a_reboot(testbed, hooked):
    stopped = make("stop", f"HOST={CT}")
    assert stopped.returncode == 0, stopped.stdout[-3000:]
    reboot = testbed.ssh(NODE, f"pct reboot {VMID}", check=True, timeout=300)
    assert reboot.stdout.count("the run was stopped on purpose (the stop of ") == 2, reboot.stdout  # pre-stop, post-start
    time.sleep(3)
    assert trainer_pids(testbed) == []
    status = " ".join(make("status", f"HOST={CT}").stdout.split())
    assert "run_across_ct_restarts: 'wanted stopped (the stop of " in status, status[-3000:]
    started = make("start", f"HOST={CT}", extra=SETTINGS)
    assert started.returncode == 0, started.stdout[-3000:]


def test_4_a_hook_that_cannot_run_at_pre_stop_lets_the_stop_go_on_and_says_what_is_lost(testbed, hooked):
    sh(testbed, "echo broken > /var/lib/dflash/lifecycle/agent.zip")
    stopped = testbed.ssh(NODE, f"pct shutdown {VMID}", check=True, timeout=300)
    assert "dflash pre-stop: the hook in CT 300 did not end well" in stopped.stdout and \
        "WITHOUT a checkpoint from this stop" in stopped.stdout, stopped.stdout + stopped.stderr
    assert testbed.ssh(NODE, f"pct status {VMID}").stdout.strip() == "status: stopped"
    start = testbed.ssh(NODE, f"pct start {VMID}", check=True)
    assert "dflash post-start: the hook in CT 300 failed" in start.stdout, start.stdout
    again = make("start", f"HOST={CT}", extra=SETTINGS)  # the launch writes the agent again
    assert again.returncode == 0, again.stdout[-3000:]
    assert sh(testbed, "python3 /var/lib/dflash/lifecycle/agent.zip pre-start; echo $?").stdout.strip() == "0"


def test_5_a_relaunch_after_a_ct_restart_applies_the_preflights_rules_and_says_its_refusal(testbed, hooked):
    """A run launched with its model copied into /dev/shm by hand (no trainer_model_stage): the CT's
    restart wipes the model, and the hook's relaunch refuses to start without it, as `make restart`
    would, saying so in the CT's record and in `make status` - never a trainer started to crash."""
    kill_trainers(testbed)
    sh(testbed, f"rm -rf {TARGET} && mkdir -p /dev/shm/models && cp -a {SOURCE} {TARGET}")
    by_hand = {key: value for key, value in SETTINGS.items() if not key.startswith("trainer_model_stage")}
    started = make("start", f"HOST={CT}", extra=by_hand)
    assert started.returncode == 0, started.stdout[-3000:]
    testbed.ssh(NODE, f"pct reboot {VMID}", check=True, timeout=300)
    refusal = f"model_dirs {TARGET}: missing: the model lives in /dev/shm, which is wiped when the CT restarts"
    wait_for("the relaunch's refusal", lambda: refusal in sh(testbed, "cat /var/lib/dflash/last-change.json").stdout)
    assert trainer_pids(testbed) == []
    status = " ".join(make("status", f"HOST={CT}").stdout.split())
    assert refusal in status and "nothing was started" in status, status[-3000:]
    again = make("start", f"HOST={CT}", extra=SETTINGS)  # the model staged again from its persistent copy
    assert again.returncode == 0, again.stdout[-3000:]


def test_6_a_storage_a_node_lacks_and_a_node_that_does_not_answer_are_refused_before_anything_changes(
        testbed, hooked, tmp_path):
    before = {node: os.stat(os.path.join(snippets(testbed, node), "dflash-lifecycle-hook.py")).st_mtime_ns
              for node in (NODE, OTHER_NODE)}
    missing = make("pve-hooks", f"HOST={CT}", extra={"pve_hook_storage": "nope", "pve_hook_state": "absent"})
    assert missing.returncode != 0 and "pve_hook_storage: storage 'nope' does not exist" in missing.stdout, \
        missing.stdout[-3000:]
    configs = [os.path.join(testbed.bed.node_dir(node), "etc/pve/storage.cfg") for node in (NODE, OTHER_NODE)]
    saved = [open(path, encoding="utf-8").read() for path in configs]
    try:
        for path, text in zip(configs, saved):
            with open(path, "a", encoding="utf-8") as handle:  # the cluster's storage.cfg: the same on every node
                handle.write(f"dir: onlyone\n\tpath {testbed.bed.node_dir(OTHER_NODE)}/var/lib/onlyone\n"
                             f"\tcontent snippets\n\tnodes {OTHER_NODE}\n")
        partial = make("pve-hooks", f"HOST={CT}", extra={"pve_hook_storage": "onlyone", "pve_hook_state": "absent"})
        assert partial.returncode != 0 and \
            f"storage 'onlyone' is not available on node '{NODE}' (its nodes: {OTHER_NODE})" in " ".join(partial.stdout.split())
    finally:
        for path, text in zip(configs, saved):
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text)
    inventory = tmp_path / "inventory"
    shutil.copytree(TESTBED_INVENTORY, inventory)
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    hosts["all"]["children"]["proxmox_nodes"]["hosts"]["pve0"] = {"ansible_host": "127.77.0.9"}  # no sshd there
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    down = make("pve-hooks", f"HOST={CT}", extra={"pve_hook_state": "absent"}, inventory=str(inventory))
    assert down.returncode != 0 and "node(s) pve0 did not answer" in " ".join(down.stdout.split()), down.stdout[-3000:]
    assert hookscript(testbed) == OURS  # none of the three took it off
    assert before == {node: os.stat(os.path.join(snippets(testbed, node), "dflash-lifecycle-hook.py")).st_mtime_ns
                      for node in (NODE, OTHER_NODE)}


def test_7_someone_elses_hookscript_is_refused_never_overwritten_or_chained_to_when_asked(testbed, hooked):
    phases = os.path.join(testbed.bed.node_dir(NODE), "other-hook.phases")
    for node in (NODE, OTHER_NODE):
        path = os.path.join(snippets(testbed, node), "other.sh")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(f"#!/bin/sh\necho \"$1 $2\" >> {phases}\n")
        os.chmod(path, 0o755)
    testbed.ssh(NODE, f"pct set {VMID} --hookscript local:snippets/other.sh", check=True)
    refused = make("pve-hooks", f"HOST={CT}")
    assert refused.returncode != 0 and \
        f"CT {VMID} already has the hookscript local:snippets/other.sh: refused, it is not replaced" in \
        " ".join(refused.stdout.split()), refused.stdout[-3000:]
    assert hookscript(testbed) == "local:snippets/other.sh"
    chained = make("pve-hooks", f"HOST={CT}", extra={"pve_hook_chain": "local:snippets/other.sh"})
    assert chained.returncode == 0, chained.stdout[-3000:]
    assert hookscript(testbed) == OURS
    wait_for("a progress line", lambda: re.search(r" step \d+ .*tok/s", log_text(testbed)))
    reboot = testbed.ssh(NODE, f"pct reboot {VMID}", check=True, timeout=300)
    assert "0 steps lost" in reboot.stdout, reboot.stdout
    with open(phases, encoding="utf-8") as handle:  # theirs ran too, in pve-container's order
        assert handle.read().split("\n") == [f"{VMID} pre-stop", f"{VMID} post-stop", f"{VMID} pre-start",
                                             f"{VMID} post-start", ""]
    removed = make("pve-hooks", f"HOST={CT}", extra={"pve_hook_chain": "local:snippets/other.sh",
                                                     "pve_hook_state": "absent"})
    assert removed.returncode == 0, removed.stdout[-3000:]
    assert hookscript(testbed) == "local:snippets/other.sh"  # theirs back, as it was
    for node in (NODE, OTHER_NODE):  # ours stays: another CT may name it, and one whose script is gone cannot start
        assert os.access(os.path.join(snippets(testbed, node), "dflash-lifecycle-hook.py"), os.X_OK)
        assert not os.path.exists(os.path.join(snippets(testbed, node), "dflash-lifecycle-hook.d", f"{VMID}.chain"))
    os.unlink(phases)

