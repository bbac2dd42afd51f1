"""Project-wide checks: the plugins' documentation renders (ansible-lint and ansible-test sanity
run in `make lint`, before the tests)."""

import os

import pytest

from testlib import BIN, REPO, run_tool


def test_ansible_doc_renders_the_connection_plugin():
    res = run_tool([os.path.join(BIN, "ansible-doc"), "-t", "connection", "dflash.lifecycle.pct"])
    assert "CONNECTION dflash.lifecycle.pct" in res.stdout.replace("\x1b[1m", "").replace("\x1b[0m", "")
    assert "ansible_pct_vmid" in res.stdout


@pytest.mark.parametrize("module", ["staged_stop", "release_manifest", "trainer_release", "trainer_preflight",
                                    "trainer_process", "trainer_info", "validate_settings", "redeploy_lock",
                                    "pct_push"])
def test_ansible_doc_renders_each_module(module):
    res = run_tool([os.path.join(BIN, "ansible-doc"), f"dflash.lifecycle.{module}"], check=False)
    assert res.returncode == 0 and not res.stderr.strip(), res.stderr
    assert "EXAMPLES" in res.stdout and "RETURN VALUES" in res.stdout


def test_awx_survey_variables_are_consumed():
    import subprocess as sp
    import yaml
    with open(os.path.join(REPO, "awx", "job_templates.yml"), encoding="utf-8") as handle:
        data = yaml.safe_load(handle)
    variables = {q["variable"] for t in data["controller_templates"]
                 for q in (t.get("survey_spec") or {}).get("spec", [])}
    assert variables == {"trainer_stop_sigint_wait", "trainer_stop_no_graceful",
                         "dflash_resume", "redeploy_serial", "redeploy_lock_takeover",
                         "redeploy_canary_policy", "redeploy_canary_threshold"}
    for name in variables:
        used = sp.run(["grep", "-rlw", name, "redeploy.yml", "roles", "playbooks", "inventory"], cwd=REPO,
                      capture_output=True, text=True, check=False).stdout
        assert used, f"survey variable {name} is used by no playbook or role"
    for template in data["controller_templates"]:
        assert template["ask_limit_on_launch"] is True


@pytest.mark.parametrize("kind,name", [("filter", "dflash_argv"), ("filter", "dflash_gpus_needed"),
                                       ("filter", "dflash_launcher_env"),
                                       ("filter", "dflash_env_pairs"), ("filter", "redeploy_summary"),
                                       ("filter", "redeploy_report"), ("filter", "gang_plan"),
                                       ("filter", "gang_launcher_options"), ("filter", "gang_barrier"),
                                       ("filter", "gang_throughput"), ("filter", "gang_report"), ("filter", "gang_stop_report"),
                                       ("lookup", "lock_holder"), ("inventory", "pve_cluster")])
def test_ansible_doc_renders_the_filters_the_lookup_and_the_inventory_source(kind, name):
    res = run_tool([os.path.join(BIN, "ansible-doc"), "-t", kind, f"dflash.lifecycle.{name}"], check=False)
    assert res.returncode == 0 and "UNDOCUMENTED" not in res.stdout and not res.stderr.strip(), res.stdout + res.stderr
    assert "EXAMPLES" in res.stdout


def test_test_file_names_are_unique():
    # pytest imports test files by their base name (rootdir mode): the project's tests and the
    # collection's unit tests share one namespace
    names = [name for root, _dirs, files in os.walk(REPO) if "/.venv" not in root and "/tests" in root
             for name in files if name.startswith("test_") and name.endswith(".py")]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_a_ct_that_runs_alone_has_no_gang_task_and_a_gang_has_them_all():
    """redeploy.yml's two plays (playbooks/redeploy/tasks.yml): a CT without trainer_run_gang
    runs no barrier, no signal moment, no gang read and no gang report; a gang's CT runs each."""
    inventory = os.path.join(REPO, "inventory", "testbed")
    res = run_tool([os.path.join(BIN, "ansible-playbook"), "-i", inventory, "redeploy.yml", "--list-tasks"])
    alone, _, gangs = res.stdout.partition("play #2")
    assert "play #1 (dflash_trainers:!dflash_gangs)" in alone and "(dflash_trainers:&dflash_gangs)" in gangs
    assert "gang" not in alone.split("TAGS: []", 1)[1].lower(), alone
    assert gangs.count("Hold the gang together") == 6 and "signalled together" in gangs
    assert "Read whether a gang's run still runs" in gangs
    assert "Stop the trainer in stages" in alone and "Start the trainer and wait until it is healthy" in alone
