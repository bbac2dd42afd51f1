"""Project-wide checks: the plugins' documentation renders (ansible-lint and ansible-test sanity
run in `make lint`, before the tests)."""

import functools
import os

import pytest
import yaml

from testlib import BIN, REPO, run_tool


MODULES = ("staged_stop", "release_manifest", "trainer_release", "trainer_preflight", "trainer_process",
           "trainer_info", "validate_settings", "redeploy_lock", "pct_push", "pve_hook_mark")
PLUGINS = {"connection": ("pct",),
           "filter": ("dflash_argv", "dflash_gpus_needed", "dflash_launcher_env", "dflash_env_pairs",
                      "redeploy_summary", "redeploy_report", "gang_plan", "gang_launcher_options", "gang_barrier",
                      "gang_throughput", "gang_report", "gang_stop_report", "pct_config", "prometheus_target",
                      "prometheus_target_rules", "webhook_key"),
           "lookup": ("lock_holder",), "inventory": ("pve_cluster",), "module": MODULES}


@functools.lru_cache(maxsize=None)
def rendered(kind):
    """{name: its page} of every plugin of kind, from one ansible-doc run (a start-up costs about
    a second of CPU); fails on anything on stderr."""
    names = [f"dflash.lifecycle.{name}" for name in PLUGINS[kind]]
    res = run_tool([os.path.join(BIN, "ansible-doc"), "-t", kind, *names], check=False)
    assert res.returncode == 0 and not res.stderr.strip(), res.stdout + res.stderr
    text = res.stdout.replace("\x1b[1m", "").replace("\x1b[0m", "")
    pages = {}
    for page in text.split(f"> {kind.upper()} ")[1:]:
        pages[page.split(None, 1)[0]] = page
    assert sorted(pages) == sorted(names), text[:2000]
    return pages


def test_ansible_doc_renders_the_connection_plugin():
    assert "ansible_pct_vmid" in rendered("connection")["dflash.lifecycle.pct"]


@pytest.mark.parametrize("module", MODULES)
def test_ansible_doc_renders_each_module(module):
    page = rendered("module")[f"dflash.lifecycle.{module}"]
    assert "EXAMPLES" in page and "RETURN VALUES" in page


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


@pytest.mark.parametrize("kind,name", [(kind, name) for kind in ("filter", "lookup", "inventory")
                                       for name in PLUGINS[kind]])
def test_ansible_doc_renders_the_filters_the_lookup_and_the_inventory_source(kind, name):
    page = rendered(kind)[f"dflash.lifecycle.{name}"]
    assert "UNDOCUMENTED" not in page and "EXAMPLES" in page


def test_test_file_names_are_unique():
    # pytest imports test files by their base name (rootdir mode): the project's tests and the
    # collection's unit tests share one namespace
    names = [name for root, _dirs, files in os.walk(REPO) if "/.venv" not in root and "/tests" in root
             for name in files if name.startswith("test_") and name.endswith(".py")]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_a_ct_that_runs_alone_has_no_gang_task_and_a_gang_has_them_all(tmp_path):
    """redeploy.yml's two plays (playbooks/redeploy/tasks.yml): a CT without trainer_run_gang
    runs no barrier, no signal moment, no gang read and no gang report; a gang's CT runs each.
    The gangs' play includes the tasks (a job without a gang never parses them twice), so its
    tasks are listed from a playbook that imports them with that play's variables."""
    inventory = os.path.join(REPO, "inventory", "testbed")
    res = run_tool([os.path.join(BIN, "ansible-playbook"), "-i", inventory, "redeploy.yml", "--list-tasks"])
    alone, _, gangs_play = res.stdout.partition("play #2")
    assert "play #1 (dflash_trainers:!dflash_gangs)" in alone and "(dflash_trainers:&dflash_gangs)" in gangs_play
    assert "gang" not in alone.split("TAGS: []", 1)[1].lower(), alone
    assert "Stop the trainer in stages" in alone and "Start the trainer and wait until it is healthy" in alone
    with open(os.path.join(REPO, "redeploy.yml"), encoding="utf-8") as handle:
        plays = yaml.safe_load(handle)
    (include,) = plays[1]["tasks"]
    assert include["ansible.builtin.include_tasks"] == "playbooks/redeploy/tasks.yml" and "always" in include["tags"]
    listing = tmp_path / "gang_play.yml"
    listing.write_text(yaml.safe_dump([dict(plays[1], tasks=[{
        "ansible.builtin.import_tasks": os.path.join(REPO, include["ansible.builtin.include_tasks"])}])]))
    gangs = run_tool([os.path.join(BIN, "ansible-playbook"), "-i", inventory, str(listing), "--list-tasks"]).stdout
    assert gangs.count("Hold the gang together") == 6 and "signalled together" in gangs, gangs
    assert "Read whether a gang's run still runs" in gangs
    assert "Stop the trainer in stages" in gangs and "Start the trainer and wait until it is healthy" in gangs


def test_a_lone_cts_stop_has_no_gang_task_and_a_gangs_has_them_all(tmp_path):
    """playbooks/stop.yml's two plays (playbooks/redeploy/stop.yml), as redeploy.yml's: a CT that
    runs alone goes through no gang task, not even a skipped one (each costs a task worker); a
    gang's CT holds the gang after its settings and its stop, signals at the gang's moment, and
    reads and reports the gang's checkpoint."""
    inventory = os.path.join(REPO, "inventory", "testbed")
    stop_yml = os.path.join(REPO, "playbooks", "stop.yml")
    res = run_tool([os.path.join(BIN, "ansible-playbook"), "-i", inventory, stop_yml, "--list-tasks"])
    alone, _, gangs_play = res.stdout.partition("play #2")
    assert "play #1 (dflash_trainers:!dflash_gangs)" in alone and "(dflash_trainers:&dflash_gangs)" in gangs_play
    assert "gang" not in alone.split("TAGS: []", 1)[1].lower(), alone
    assert "Stop the trainer in stages" in alone and "Report how the trainer stopped" in alone
    with open(stop_yml, encoding="utf-8") as handle:
        plays = yaml.safe_load(handle)
    (include,) = plays[1]["tasks"]
    listing = tmp_path / "gang_play.yml"
    listing.write_text(yaml.safe_dump([dict(plays[1], tasks=[{"ansible.builtin.import_tasks": os.path.join(
        REPO, "playbooks", include["ansible.builtin.include_tasks"])}])]))
    gangs = run_tool([os.path.join(BIN, "ansible-playbook"), "-i", inventory, str(listing), "--list-tasks"]).stdout
    assert gangs.count("Hold the gang together") == 2 and "signalled together" in gangs, gangs
    assert "Read the gang's checkpoint directory" in gangs and "Report the stop of the gang" in gangs, gangs
