"""The Proxmox hook's rules: where the node's script goes and what a CT's hookscript allows
(module_utils/node/hookscript.py), what a launch keeps on the CT's disk and what a stop asked for
marks (module_utils/ct/run_spec.py), and the CT side's decisions (module_utils/agent/hook.py)."""

import json
import os
import subprocess
import sys
import zipfile

import pytest

from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import hook, launch_options, payload, rollback
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import run_spec
from ansible_collections.dflash.lifecycle.plugins.module_utils.node import ct_config, hookscript

LOCAL = {"storage": "local", "type": "dir", "path": "/var/lib/vz", "content": "iso,vztmpl,backup,snippets"}
OURS = "local:snippets/dflash-lifecycle-hook.py"


def test_the_script_goes_into_the_storages_snippets_directory():
    assert hookscript.snippets_dir("local", LOCAL, "pve1") == "/var/lib/vz/snippets"
    assert hookscript.snippets_dir("local", dict(LOCAL, nodes="pve1,pve2"), "pve2") == "/var/lib/vz/snippets"


@pytest.mark.parametrize("scfg, named", [
    (None, "storage 'local' does not exist"),
    (dict(LOCAL, disable="1"), "storage 'local' is disabled"),
    (dict(LOCAL, nodes="pve1"), "storage 'local' is not available on node 'pve2' (its nodes: pve1)"),
    (dict(LOCAL, content="iso,backup"), "does not hold snippets (content: iso,backup); add it with `pvesm set local "
                                        "--content iso,backup,snippets`"),
    ({"storage": "local", "type": "rbd", "content": "snippets"}, "(type rbd) has no directory for snippets"),
])
def test_a_storage_the_node_cannot_hold_the_script_in_is_refused_naming_the_variable(scfg, named):
    with pytest.raises(hookscript.Refused) as err:
        hookscript.snippets_dir("local", scfg, "pve2")
    assert str(err.value).startswith("pve_hook_storage: ") and named in str(err.value), str(err.value)


def test_a_cts_hookscript_is_set_when_it_has_none_and_left_when_it_is_ours():
    assert hookscript.plan_ct(200, None, OURS, None) == (OURS, None)
    assert hookscript.plan_ct(200, OURS, OURS, None) == (None, None)
    assert ct_config.value("arch: amd64\nhookscript: local:snippets/x.pl\nmemory: 4096\n", "hookscript") == \
        "local:snippets/x.pl"
    assert ct_config.value("arch: amd64\n", "hookscript") is None


def test_a_cts_configuration_says_whether_it_is_privileged_and_its_nics_static_addresses():
    config = ("arch: amd64\nhostname: ct200\nnet1: name=eth1,bridge=vmbr1,ip=dhcp,ip6=fd00::7/64,type=veth\n"
              "net0: name=eth0,bridge=vmbr0,gw=10.1.2.1,hwaddr=BC:24:11:00:00:01,ip=10.1.2.30/24,type=veth\n"
              "unprivileged: 1\n")
    assert ct_config.unprivileged(config) and not ct_config.unprivileged("arch: amd64\n")
    assert ct_config.static_addresses(config) == ["10.1.2.30", "fd00::7"]
    assert ct_config.static_addresses("net0: name=eth0,bridge=vmbr0,ip=dhcp,ip6=auto\n") == []


def test_someone_elses_hookscript_is_refused_naming_it_unless_chained_to():
    with pytest.raises(hookscript.Refused) as err:
        hookscript.plan_ct(200, "local:snippets/backup.pl", OURS, None)
    assert "CT 200 already has the hookscript local:snippets/backup.pl: refused" in str(err.value)
    assert "pve_hook_chain: local:snippets/backup.pl" in str(err.value)
    assert hookscript.plan_ct(200, "local:snippets/backup.pl", OURS, "local:snippets/backup.pl") == (
        OURS, "local:snippets/backup.pl")
    with pytest.raises(hookscript.Refused, match="pve_hook_chain: 'local:snippets/other.pl'"):
        # a chain that names another script does not make a foreign one ours to replace
        hookscript.plan_ct(200, "local:snippets/backup.pl", OURS, "local:snippets/other.pl")
    with pytest.raises(hookscript.Refused, match="is not a <storage>:snippets/<file> volume"):
        hookscript.plan_ct(200, None, OURS, "/var/lib/vz/snippets/backup.pl")


LAUNCH = {"command": ["/bin/sh", "/run/dflash/trainer.sh"], "pidfile": "/run/dflash/trainer.pid",
          "pattern": "train_dflash_pipeline[.]py", "log_file": "/workspace/logs/train.log", "resumes": False,
          "secrets_env": "HF_TOKEN=hf_secret\n", "stop_first": {"pidfile": "/run/dflash/trainer.pid"},
          "activate": {"base": "/opt/dflash", "release": "r2"}, "release": "r2",
          "gang_health": None, "change_record": "/var/lib/dflash/last-change.json"}
STOP = {"pidfile": "/run/dflash/trainer.pid", "signal_at": 1796490000.0, "lifecycle_dir": "/var/lib/dflash/lifecycle"}


def launched(tmp_path):
    directory = str(tmp_path / "lifecycle")
    lifecycle = {"dir": directory, "stop": STOP, "stage_models": None, "lock_path": "/run/dflash/redeploy.lock"}
    run_spec.record_launch(lifecycle, dict(LAUNCH, lifecycle=lifecycle), 4242)
    payload.write_agent(directory)
    return directory


def test_a_launch_keeps_the_runs_spec_without_what_belonged_to_that_one_launch(tmp_path):
    directory = launched(tmp_path)
    spec = run_spec.read(directory)
    assert spec["wanted"] == "running" and spec["pid"] == 4242 and spec["release"] == "r2"
    assert "stop_first" not in spec["launch"] and "activate" not in spec["launch"] and "lifecycle" not in spec["launch"]
    assert spec["launch"]["secrets_env"] == "HF_TOKEN=hf_secret\n"
    assert "signal_at" not in spec["stop"]  # a gang's moment is one job's
    assert os.stat(run_spec.spec_path(directory)).st_mode & 0o777 == 0o600  # it holds the run's secrets
    with open(os.path.join(directory, "hook"), encoding="utf-8") as handle:
        assert f"exec {sys.executable} {directory}/agent.zip" in handle.read()


def test_a_stop_asked_for_marks_the_run_stopped_and_a_ct_without_a_spec_is_left_alone(tmp_path):
    directory = launched(tmp_path)
    run_spec.mark(directory, "stopped", "the stop of root@vm ansible-playbook pid 7")
    summary = run_spec.summary(directory)
    assert summary["wanted"] == "stopped" and "a CT start leaves it down" in summary["words"]
    assert run_spec.mark(str(tmp_path / "none"), "stopped", "x") is None
    assert not os.path.exists(tmp_path / "none")


def test_relaunch_options_resume_the_run_as_it_was_with_nothing_of_the_launch_before(tmp_path):
    spec = run_spec.read(launched(tmp_path))
    params = run_spec.relaunch_params(spec)
    assert params["stop_first"] is None and params["activate"] is None and params["rollback_on_failure"] is False
    assert params["resume_auto"] is True  # a run launched fresh resumes from the checkpoint the stop kept
    assert params["command"] == LAUNCH["command"] and params["secrets_env"] == LAUNCH["secrets_env"]
    assert params["lifecycle"]["stop"] == spec["stop"]
    # what the relaunch keeps in its turn: the next Proxmox stop finds it all again
    assert {key for key, value in params["lifecycle"].items() if value is None} == {
        "dir", "stage_models", "gang_base"}
    # the run's next generation: the supervisor's rounds go on where the job's launch began them
    assert params["lifecycle"]["rounds_dir"] == spec["rounds_dir"] and params["lifecycle"]["round"] == spec["round"] + 1
    gang = dict(spec, launch=dict(spec["launch"], gang_health={"dir": "/ckpt/.dflash-gang/g-1", "me": "a",
                                                               "members": ["a", "b"]}))
    assert run_spec.relaunch_params(gang, "/ckpt/.dflash-gang/g-1/ct-restarts/1796490000")["gang_health"]["dir"] == \
        "/ckpt/.dflash-gang/g-1/ct-restarts/1796490000"


def test_the_agent_runs_as_a_zip_application_and_says_what_it_does_in_a_ct_without_a_spec(tmp_path):
    directory = launched(tmp_path)
    agent = os.path.join(directory, "agent.zip")
    with zipfile.ZipFile(agent) as built:
        names = built.namelist()
    assert "__main__.py" in names and "ansible_collections/dflash/lifecycle/plugins/module_utils/agent/hook.py" in names
    assert payload.write_agent(directory) is False  # the same code: not rewritten
    os.unlink(run_spec.spec_path(directory))
    for phase in ("pre-stop", "post-start"):
        done = subprocess.run([sys.executable, agent, phase], capture_output=True, text=True, check=False)
        assert done.returncode == 0 and "no run launched by dflash.lifecycle in this CT" in done.stdout, done
    assert subprocess.run([sys.executable, agent, "pre-start"], check=False).returncode == 0
    wrong = subprocess.run([sys.executable, agent, "bogus"], capture_output=True, text=True, check=False)
    assert wrong.returncode == 2 and "usage: hook pre-stop [MOMENT]|post-start" in wrong.stderr


def test_a_run_stopped_on_purpose_stays_stopped_at_either_phase(tmp_path, capsys):
    directory = launched(tmp_path)
    run_spec.mark(directory, "stopped", "the stop of root@vm ansible-playbook pid 7")
    assert hook.pre_stop(directory) == 0
    assert hook.post_start(directory) == 0
    out = capsys.readouterr().out
    assert out.count("the run was stopped on purpose (the stop of root@vm ansible-playbook pid 7 at ") == 2
    assert not os.path.exists(os.path.join(directory, "resume.log"))  # nothing was started


@pytest.mark.parametrize("meanwhile, at_first", [("relaunched", 4343), ("relaunched", None), ("stopped", 4343)])
def test_a_pre_stop_stops_what_the_locks_holder_left_and_its_supervisor_stands_down(tmp_path, monkeypatch, capsys, meanwhile, at_first):
    """`pct reboot` just after a start: the pre-stop waits for the lock of post-start's relaunch, whose
    trainer runs in its health wait (or has not started yet) and which records the launch. The stop is
    of that trainer, and the new run's supervisor finds a stand-down newer than its launch: the Proxmox
    stop is not taken for a crash (a CI run saw `crash: ... restart 1`). A `make stop` that held the
    lock leaves nothing to stop."""
    import time

    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import lock
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import staged_stop, trainer_finding

    directory = launched(tmp_path)
    trainer = {"pid": at_first}
    stops = []

    def holder_ends(path, holder, cap, ttl):
        time.sleep(0.01)  # the relaunch launches after the pre-stop's first word
        if meanwhile == "relaunched":
            lifecycle = {"dir": directory, "stop": STOP, "lock_path": "/run/dflash/redeploy.lock"}
            run_spec.record_launch(lifecycle, dict(LAUNCH, change_record=str(tmp_path / "last-change.json")), 4343)
            trainer["pid"] = 4343
        else:
            run_spec.mark(directory, "stopped", "the stop of root@vm ansible-playbook pid 7")
        return None

    def stop(options, lease, record_dir, cause):
        assert cause == "proxmox"  # what the CT's history counts the stop under
        stops.append(run_spec.stood_down(directory, run_spec.read(directory)["launched_at"]))
        return {"msg": "stopped", "stopped_by": {"signal": "SIGINT"}}

    monkeypatch.setattr(lock, "wait_for", holder_ends)
    monkeypatch.setattr(trainer_finding, "running", lambda pidfile, pattern: trainer["pid"])
    monkeypatch.setattr(staged_stop, "run_in_module", stop)
    assert hook.pre_stop(directory) == 0
    out = capsys.readouterr().out
    if meanwhile == "relaunched":
        assert len(stops) == 1 and stops[0]["by"] == hook.PRE_STOP_HOLDER, (stops, out)
    else:
        assert stops == [] and "the run was stopped on purpose (the stop of root@vm ansible-playbook pid 7" in out, out


def test_a_gang_relaunches_once_every_member_is_up_since_the_newest_pause(tmp_path, monkeypatch):
    a = {"dir": str(tmp_path / "meet"), "me": "a", "members": ["a", "b"]}
    b = dict(a, me="b")
    hook._tell(a, "paused", {})
    hook._tell(b, "paused", {})
    hook._tell(b, "up", {})
    gang_round, missing = hook.gang_meets(a, 5)
    assert missing is None and gang_round == f"{json.loads((tmp_path / 'meet/paused/b.json').read_text())['at']:.0f}"
    hook._tell(b, "paused", {})  # b's CT stops again: a's word of before no longer counts
    monkeypatch.setattr(hook, "GANG_POLL_SECONDS", 0.05)
    gang_round, missing = hook.gang_meets(dict(b, members=["a", "b", "c"]), 0.2)
    assert gang_round is None and missing.startswith("a, c did not come back within 0 s") and "THE GANG STAYS DOWN" in missing


def test_the_pre_stop_bound_holds_the_lock_wait_the_stop_budget_and_the_margin():
    """The node ends a pre-stop at this bound: with the defaults, 3 s of a gang's margin, 900 s for a
    job that holds the lock, the stop's worst case (1800 s for the next checkpoint, the ladder's 160 s with
    its graceful stage grown to 900 s, 10 s of diagnostics a stage) and 30 s of the agent's own."""
    assert hook.pre_stop_bound({}, 3) == 3 + 900 + 1800 + (120 + 30 + 10 + 780) + 30 + 30
    short = {"graceful_wait_cap": 60, "no_graceful": "proceed", "next_checkpoint_timeout": 10, "request_ack_timeout": 5,
             "ladder": [{"signal": "SIGINT", "scope": "main", "wait": "20"}, {"signal": "SIGKILL", "scope": "tree", "wait": 5}]}
    assert hook.pre_stop_bound(short, 0) == 60 + (5 + 60) + (20 + 5 + 40) + 2 * 10 + 30
    with pytest.raises(ValueError, match=r"ladder\[0\]\.wait"):
        hook.pre_stop_bound({"ladder": [{"signal": "SIGINT", "wait": "soon"}]}, 3)


def test_the_legacy_script_and_ours_on_another_storage_are_ours_to_replace():
    legacy = "local:snippets/dflash-lifecycle-hook.sh"
    assert hookscript.is_ours(legacy) and hookscript.is_ours("nfs:snippets/dflash-lifecycle-hook.py")
    assert not hookscript.is_ours("local:snippets/other.py") and not hookscript.is_ours(None)
    assert hookscript.plan_ct(200, legacy, OURS, None) == (OURS, None)
    with pytest.raises(hookscript.Refused, match="is this project's own hookscript"):
        hookscript.plan_ct(200, None, OURS, legacy)


def test_a_second_relaunch_in_one_ct_waits_for_the_first(tmp_path, monkeypatch):
    """A gang's CT is asked to come back by its own node and by each other member's: the relaunches
    run one after the other, so the second finds the run the first launched."""
    import fcntl
    import threading
    import time

    order = []
    monkeypatch.setattr(hook, "_resume", lambda directory, phase: order.append(("relaunch", time.monotonic())) or 0)
    guard = os.open(tmp_path / "resume.lock", os.O_WRONLY | os.O_CREAT, 0o600)
    fcntl.flock(guard, fcntl.LOCK_EX)  # the first relaunch, under way
    second = threading.Thread(target=hook.resume, args=(str(tmp_path),))
    second.start()
    time.sleep(0.3)
    assert order == [] and second.is_alive()
    released = time.monotonic()
    os.close(guard)  # the first one's end
    second.join(5)
    assert len(order) == 1 and order[0][1] >= released


def test_a_rollback_names_the_settings_it_goes_back_to_and_those_the_job_changed(tmp_path):
    spec = run_spec.read(launched(tmp_path))
    words = run_spec.settings_words(spec)
    assert words.startswith("the settings of its healthy launch at ") and words.endswith(f"(release {spec['release']})")
    failed = dict(spec["launch"], checkpoint_dir="/mnt/elsewhere", secrets_env="HF_TOKEN=other\n", stop_first={"x": 1},
                  lock_holder="the job")
    assert run_spec.settings_words(spec, failed).endswith("; this job's differed in checkpoint_dir, secrets_env")
    assert run_spec.settings_words(spec, dict(spec["launch"])).endswith("; this job's were the same")


def test_a_launch_keeps_the_run_before_it_and_a_rescue_relaunches_either_on_its_own_settings(tmp_path):
    directory = str(tmp_path / "lifecycle")
    lifecycle = {"dir": directory, "stop": STOP, "stage_models": None, "lock_path": "/run/dflash/redeploy.lock"}
    options = {key: value for key, value in LAUNCH.items() if key != "release"}  # the launch sets it, not its caller
    good = dict(launch_options.checked(dict(options, lifecycle=lifecycle), "t")[0], release="r2")
    run_spec.record_launch(lifecycle, good, 4242)
    assert run_spec.read(directory)["before"] is None  # the first launch: no run before it
    rejected = dict(good, wrapper_script="export BROKEN=1\n", release="r3")
    run_spec.record_launch(lifecycle, rejected, 4343)
    spec = run_spec.read(directory)
    assert spec["launch"]["wrapper_script"] == "export BROKEN=1\n" and spec["before"]["release"] == "r2"
    assert "before" not in spec["before"]  # one run back, never a chain
    job = dict(rejected, settings_from="launch_before_last")
    del job["release"]
    params, said = rollback.run_before(job)
    assert params.get("wrapper_script") is None and params["release"] == "r2"
    assert params["lifecycle"]["dir"] == directory and params["stop_first"] is None
    assert said["settings"].endswith("(release r2); this job's differed in wrapper_script"), said
    params, said = rollback.run_before(dict(job, settings_from="last_launch"))
    assert params["wrapper_script"] == "export BROKEN=1\n" and said["settings"].endswith("this job's were the same")
    assert rollback.run_before(dict(job, settings_from="job")) == (dict(job, settings_from="job"), {})
    nothing = dict(job, lifecycle=dict(lifecycle, dir=str(tmp_path / "none")))
    assert rollback.run_before(nothing) == (nothing, {"settings": "this job's settings (the CT keeps no earlier "
                                                                  "launch of the run)"})
