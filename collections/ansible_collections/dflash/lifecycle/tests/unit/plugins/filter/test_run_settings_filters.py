"""The dflash_* filters and the settings rules behind them (plugin_utils/run_settings.py)."""

import os
import shlex
import subprocess

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.dflash.lifecycle.plugins.filter.run_settings import FilterModule
from ansible_collections.dflash.lifecycle.plugins.plugin_utils import run_settings

FILTERS = FilterModule().filters()
SETTINGS = {
    "target_model": "/dev/shm/models/target", "data_dir": "/workspace/data",
    "output_dir": "/workspace/checkpoints", "target_gpus": [0, 1, 2, 3, 4], "drafter_gpus": [5, 6, 7],
    "epochs": 6, "lr": "6e-4", "warmup_ratio": "0.03", "weight_decay": "0.01", "grad_accum": 4,
    "grad_clip": "1.0", "token_budget": 16384, "max_seq_len": 2048, "max_batch_size": 16,
    "block_size": 16, "max_anchors": 8, "num_draft_layers": 1, "gamma": 7, "noise_start": "0.3",
    "noise_end": "0.05", "noise_type": "uniform", "use_soft_labels": True, "profile_interval": 50,
    "extra_args": ["--save-interval", "500"], "resume": True,
}


def test_script_and_python_lead_the_argv():
    argv = FILTERS["dflash_argv"](SETTINGS, python="/usr/bin/python3", script="/opt/dflash/current/t.py")
    assert argv[:3] == ["/usr/bin/python3", "-u", "/opt/dflash/current/t.py"]
    assert argv[-1] == "--resume" and "6e-4" in argv  # a string keeps its spelling


@pytest.mark.parametrize("changes,error", [
    ({"target_model": "models/target"}, "dflash_target_model: must be an absolute path"),
    ({"output_dir": 5}, "dflash_output_dir: must be an absolute path"),
    ({"epochs": 0}, "dflash_epochs: must be >= 1"),
    ({"epochs": "six"}, "dflash_epochs: expected an integer"),
    ({"epochs": 2.5}, "dflash_epochs: expected an integer"),
    ({"lr": "0"}, "dflash_lr: must be > 0"),
    ({"lr": "1e-3; rm -rf /"}, "dflash_lr: expected a number"),
    ({"lr": True}, "dflash_lr: expected a number"),
    ({"warmup_ratio": 1}, "dflash_warmup_ratio: must be in [0, 1)"),
    ({"weight_decay": -0.1}, "dflash_weight_decay: must be >= 0"),
    ({"noise_start": "1.5"}, "dflash_noise_start: must be in [0, 1]"),
    ({"noise_type": "salt"}, "dflash_noise_type: must be one of uniform, gaussian, none"),
    ({"use_soft_labels": "yes"}, "dflash_use_soft_labels: must be true or false"),
    ({"target_gpus": "0,1"}, "dflash_target_gpus: expected a non-empty list"),
    ({"target_gpus": []}, "dflash_target_gpus: expected a non-empty list"),
    ({"target_gpus": [0, 0, 1]}, "dflash_target_gpus: GPU 0 is listed twice"),
    ({"target_gpus": [0, -1]}, "dflash_target_gpus: GPU ids are integers >= 0"),
    ({"drafter_gpus": [4, 5]}, "dflash_drafter_gpus: GPUs [4] are also in dflash_target_gpus"),
    ({"noise_end": "0.4"}, "dflash_noise_end: must be <= dflash_noise_start"),
    ({"max_seq_len": 2050, "token_budget": 99999}, "dflash_max_seq_len: must be a multiple of dflash_block_size"),
    ({"token_budget": 1024}, "dflash_token_budget: must be >= dflash_max_seq_len"),
    ({"extra_args": "--save-interval 5"}, "dflash_extra_args: must be a list"),
    ({"extra_args": ["save-interval"]}, "dflash_extra_args: must start with a --flag"),
    ({"resume": "auto"}, "dflash_resume: auto must be resolved"),
    ({"resume": "maybe"}, "dflash_resume: must be true, false or auto"),
    ({"gamma": None}, "dflash_gamma: is required"),
])
def test_each_validation_rule_names_the_variable(changes, error):
    settings = dict(SETTINGS, **changes)
    with pytest.raises(AnsibleFilterError) as caught:
        FILTERS["dflash_argv"](settings, visible_gpus=8)
    assert str(caught.value).startswith(error)
    if "resume" not in changes:  # the preflight's GPU count comes from the same checked settings
        with pytest.raises(AnsibleFilterError) as caught:
            FILTERS["dflash_gpus_needed"](settings)
        assert str(caught.value).startswith(error)


def test_gpus_needed_is_the_highest_id_plus_one():
    assert FILTERS['dflash_gpus_needed'](SETTINGS) == 8  # GPUs 0-4 target, 5-7 drafter
    assert FILTERS['dflash_gpus_needed'](dict(SETTINGS, target_gpus=[9], drafter_gpus=[2])) == 10


def test_gpu_ids_must_be_visible():
    with pytest.raises(AnsibleFilterError, match=r"dflash_drafter_gpus: GPU ids \[5, 6, 7\] are not visible: the CT sees 4 GPUs"):
        FILTERS['dflash_argv'](dict(SETTINGS, target_gpus=[0, 1]), visible_gpus=4)


def test_env_names_are_checked():
    assert FILTERS['dflash_env_pairs']({"HF_HOME": "/x y"}) == [["HF_HOME", "/x y"]]
    with pytest.raises(AnsibleFilterError, match="not a valid environment variable name"):
        FILTERS['dflash_env_pairs']({"BAD-NAME": "1"})


def test_an_unknown_key_names_the_nearest_one():
    assert run_settings.unknown(["dflash_warmup_ratoi", "dflash_lr", "dflash_serial", "dflash_zzz"]) == [
        "dflash_serial: renamed to redeploy_serial (a job setting, not a trainer flag)",
        "dflash_warmup_ratoi: not a DFlash setting (a trainer flag, dflash_extra_args, dflash_env, "
        "dflash_secret_env or dflash_resume); did you mean dflash_warmup_ratio?",
        "dflash_zzz: not a DFlash setting (a trainer flag, dflash_extra_args, dflash_env, "
        "dflash_secret_env or dflash_resume)",
    ]


@pytest.mark.parametrize("value,choice", [(True, True), ("false", False), ("auto", "auto"), ("yes", True)])
def test_resume_choice(value, choice):
    assert run_settings.resume_choice(value) == choice


@pytest.mark.parametrize("hostile", ["x; touch /tmp/pwned", "$(touch /tmp/pwned)",
                                     "`touch /tmp/pwned`", "' ; touch /tmp/pwned ; '", "a\"b"])
def test_hostile_values_reach_the_program_literally(tmp_path, hostile):
    settings = dict(SETTINGS, data_dir="/data/" + hostile, extra_args=["--tag", hostile])
    argv = FILTERS['dflash_argv'](settings)
    script = tmp_path / "run.sh"
    # the wrapper is rendered with every element quoted, as the launch role does
    script.write_text("exec printf '%s\\n' " + " ".join(shlex.quote(a) for a in argv) + "\n")
    out = subprocess.run(["sh", str(script)], capture_output=True, text=True, check=True,
                         cwd=tmp_path).stdout.splitlines()
    assert out == argv
    assert not (tmp_path / "pwned").exists() and not os.path.exists("/tmp/pwned")


def test_a_launcher_leads_the_argv_with_what_keeps_it_safe_for_a_stop():
    argv = FILTERS["dflash_argv"](SETTINGS, python="/v/bin/python", script="/opt/t.py", launcher="torchrun",
                                  launcher_options={"nproc_per_node": 2, "standalone": True}, shutdown_timeout=900)
    assert argv[:11] == ["/v/bin/python", "-u", "-m", "torch.distributed.run", "--nproc-per-node", "2",
                         "--standalone", "--max-restarts", "0", "--shutdown-timeout", "900"]
    assert argv[11] == "/opt/t.py" and argv[12] == "--target-model"
    assert FILTERS["dflash_launcher_env"]("torchrun", 900) == {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "900"}
    assert FILTERS["dflash_launcher_env"]("python", 900) == {}


@pytest.mark.parametrize("launcher,options,visible,error", [
    ("torchrun", {"nproc_per_node": 9}, None, "nproc_per_node: 9 ranks do not divide the 8 GPUs the run is given"),
    ("torchrun", {"nproc_per_node": 3}, None, "nproc_per_node: 3 ranks do not divide the 8 GPUs the run is given"),
    ("torchrun", {"shutdown_timeout": 30}, None, "shutdown_timeout: 30 s is shorter than the stop's graceful wait cap"),
    ("torchrun", {"nproc_per_nodes": 2}, None, "nproc_per_nodes: torchrun has no such option; did you mean"),
    ("python", {"nproc_per_node": 2}, None, "trainer_run_launcher_options: set, but trainer_run_launcher is python"),
    ("srun", {}, None, "trainer_run_launcher: 'srun' is not one of python, torchrun, accelerate, deepspeed"),
])
def test_bad_launcher_settings_fail_in_one_line_naming_the_variable(launcher, options, visible, error):
    with pytest.raises(AnsibleFilterError, match=error):
        FILTERS["dflash_argv"](dict(SETTINGS, target_gpus=[0, 1, 2, 3, 4], drafter_gpus=[5, 6, 7]),
                               visible_gpus=visible, script="/opt/t.py", launcher=launcher,
                               launcher_options=options, shutdown_timeout=900)


def test_a_launch_deadline_shorter_than_the_graceful_cap_names_its_variable():
    with pytest.raises(AnsibleFilterError, match="trainer_launch_shutdown_timeout: 60 s is shorter than the stop's "
                                                 r"graceful wait cap \(trainer_stop_graceful_wait_cap, 900 s\)"):
        FILTERS["dflash_argv"](SETTINGS, script="/opt/t.py", launcher="torchrun", shutdown_timeout=60, graceful_cap=900)


@pytest.mark.parametrize("path,error", [
    ("", None), ("/run/dflash/stop-request", None), ("/dev/shm/dflash-stop", None),
    ("run/dflash/stop-request", "is not an absolute path"),
    ("/run/dflash", "is not inside trainer_run_dir (/run/dflash) or /dev/shm"),
    ("/run/dflash/../x", "is not inside trainer_run_dir (/run/dflash) or /dev/shm"),
    ("/tmp/stop-request", "is not inside trainer_run_dir (/run/dflash) or /dev/shm"),
])
def test_the_stop_request_path_lies_where_trainer_and_stop_reach_it(path, error):
    if error is None:
        run_settings.stop_request_path_checked(path, "/run/dflash")
        return
    with pytest.raises(run_settings.SettingsError, match=f"^trainer_run_stop_request_path: {path} {error}".replace(
            "(", r"\(").replace(")", r"\)")):
        run_settings.stop_request_path_checked(path, "/run/dflash")
