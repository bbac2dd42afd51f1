"""filter_plugins/dflash_command_line.py: the seed's command line, validation, hostile values."""

import os
import shlex
import subprocess
import sys

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from testlib import REPO, example_settings

sys.path.insert(0, os.path.join(REPO, "filter_plugins"))
from dflash_command_line import dflash_argv, dflash_env_pairs, dflash_gpus_needed  # noqa: E402

SEED = os.path.join(REPO, "playbooks", "testbed_seed.yml")


def seed_args():
    with open(SEED, encoding="utf-8") as handle:
        return yaml.safe_load(handle)[0]["vars"]["seed_args"]


def test_seed_command_line_reproduced_byte_for_byte():
    argv = dflash_argv(example_settings(), visible_gpus=8)
    assert argv == seed_args()
    assert shlex.join(argv) == (
        "--target-model /dev/shm/models/target --data-dir /workspace/data "
        "--output-dir /workspace/checkpoints --target-gpus 0,1,2,3,4 --drafter-gpus 5,6,7 "
        "--epochs 6 --lr 6e-4 --warmup-ratio 0.03 --weight-decay 0.01 --grad-accum 4 "
        "--grad-clip 1.0 --token-budget 16384 --max-seq-len 2048 --max-batch-size 16 "
        "--block-size 16 --max-anchors 8 --num-draft-layers 1 --gamma 7 --noise-start 0.3 "
        "--noise-end 0.05 --noise-type uniform --use-soft-labels --profile-interval 50 "
        "--save-interval 500 --resume")


def test_script_and_python_lead_the_argv():
    argv = dflash_argv(example_settings(), python="/usr/bin/python3", script="/opt/dflash/current/t.py")
    assert argv[:3] == ["/usr/bin/python3", "-u", "/opt/dflash/current/t.py"]


@pytest.mark.parametrize("changes,error", [
    ({"target_model": "models/target"}, "dflash_target_model: must be an absolute path"),
    ({"output_dir": 5}, "dflash_output_dir: must be an absolute path"),
    ({"epochs": 0}, "dflash_epochs: must be >=1"),
    ({"epochs": "six"}, "dflash_epochs: expected an integer"),
    ({"epochs": 2.5}, "dflash_epochs: expected an integer"),
    ({"lr": "0"}, "dflash_lr: must be >0"),
    ({"lr": "1e-3; rm -rf /"}, "dflash_lr: expected a number"),
    ({"lr": True}, "dflash_lr: expected a number"),
    ({"warmup_ratio": 1}, "dflash_warmup_ratio: must be in [0, 1)"),
    ({"weight_decay": -0.1}, "dflash_weight_decay: must be >=0"),
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
    ({"resume": "auto"}, "dflash_resume: must be true or false"),
    ({"gamma": None}, "dflash_gamma: is required"),
])
def test_each_validation_rule_names_the_variable(changes, error):
    settings = dict(example_settings(), **changes)
    # the preflight's GPU count is taken from the same checked settings: it fails alike
    for render in (lambda: dflash_argv(settings, visible_gpus=8), lambda: dflash_gpus_needed(settings)):
        with pytest.raises(AnsibleFilterError) as caught:
            render()
        assert str(caught.value).startswith(error)


def test_gpus_needed_is_the_highest_id_plus_one():
    assert dflash_gpus_needed(example_settings()) == 8  # GPUs 0-4 target, 5-7 drafter
    assert dflash_gpus_needed(dict(example_settings(), target_gpus=[9], drafter_gpus=[2])) == 10


def test_gpu_ids_must_be_visible():
    with pytest.raises(AnsibleFilterError, match=r"dflash_drafter_gpus: GPU ids \[5, 6, 7\] are not visible: the CT sees 4 GPUs"):
        dflash_argv(dict(example_settings(), target_gpus=[0, 1]), visible_gpus=4)


def test_env_names_are_checked():
    assert dflash_env_pairs({"HF_HOME": "/x y"}) == [["HF_HOME", "/x y"]]
    with pytest.raises(AnsibleFilterError, match="not a valid environment variable name"):
        dflash_env_pairs({"BAD-NAME": "1"})


@pytest.mark.parametrize("hostile", ["x; touch /tmp/pwned", "$(touch /tmp/pwned)",
                                     "`touch /tmp/pwned`", "' ; touch /tmp/pwned ; '", "a\"b"])
def test_hostile_values_reach_the_program_literally(tmp_path, hostile):
    settings = dict(example_settings(), data_dir="/data/" + hostile, extra_args=["--tag", hostile])
    argv = dflash_argv(settings)
    script = tmp_path / "run.sh"
    # the wrapper is rendered with every element quoted, as the launch role does
    script.write_text("exec printf '%s\\n' " + " ".join(shlex.quote(a) for a in argv) + "\n")
    out = subprocess.run(["sh", str(script)], capture_output=True, text=True, check=True,
                         cwd=tmp_path).stdout.splitlines()
    assert out == argv
    assert not (tmp_path / "pwned").exists() and not os.path.exists("/tmp/pwned")
