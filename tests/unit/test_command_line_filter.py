"""The shipped run settings: the testbed's reproduce the seed's command line, the production
inventory's the field's, byte for byte as far as the field's record goes (FIELD below)."""

import os
import shlex

import yaml

from testlib import FIELD, REPO, example_settings
from ansible_collections.dflash.lifecycle.plugins.plugin_utils.run_settings import argv as dflash_argv

SEED = os.path.join(REPO, "playbooks", "testbed_seed.yml")
PRODUCTION = os.path.join(REPO, "inventory", "production", "group_vars", "dflash_trainers", "run.yml")
def seed_args():
    with open(SEED, encoding="utf-8") as handle:
        return yaml.safe_load(handle)[0]["vars"]["seed_args"]


def production():
    with open(PRODUCTION, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


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


def test_production_reproduces_the_fields_command_line_byte_for_byte():
    group_vars = production()
    settings = {k: v for k, v in group_vars.items() if k.startswith("dflash_")}
    assert settings.pop("dflash_resume") == "auto"  # --resume only after the recorded part
    argv = dflash_argv(dict(settings, dflash_resume=False), visible_gpus=8,
                       python=group_vars["trainer_run_python"], script=group_vars["trainer_run_script"])
    assert shlex.join(argv) == FIELD
    resumed = dflash_argv(dict(settings, dflash_resume=True), visible_gpus=8,
                          python=group_vars["trainer_run_python"], script=group_vars["trainer_run_script"])
    assert shlex.join(resumed) == FIELD + " --resume"
    assert group_vars["trainer_launch_login_shell"] is True  # the field's `bash -lc`: its profile's python3


def test_production_node_is_the_fields():
    with open(os.path.join(REPO, "inventory", "production", "hosts.yml"), encoding="utf-8") as handle:
        hosts = yaml.safe_load(handle)["all"]["children"]
    assert hosts["proxmox_nodes"]["hosts"]["pve1"]["ansible_host"] == "10.1.2.6"
    assert hosts["dflash_trainers"]["hosts"]["ct200"] == {"pve_node": "pve1", "ansible_pct_vmid": 200}
