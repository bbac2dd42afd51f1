"""No builtin module runs in a CT (docs/security.md): every task of every job's playbook and role
that runs with a CT as its host runs either an action that acts on the controller alone (an action
plugin with ``_requires_connection = False``: debug, assert, set_fact, the collection's
validate_settings ...) or one of this collection's modules whose action plugin checks the CT's
answer before ansible-core reads it (plugin_utils/ct_action.py CTModuleAction). A builtin module in
a CT (file, copy, command, setup by gather_facts) would have its answer - its warnings, its diff,
its failure message - shown as the CT's python3 wrote it.

The tasks are found as ansible-playbook finds them: the plays of every playbook, their blocks,
imported and included task files (every file a templated name can give) and roles (their
``tasks_from``), with the delegation each task inherits. Left out: playbooks/testbed_seed.yml,
which plays the person who started the field's trainer by hand on the testbed, before this
project; and ``make ping``, an ad hoc ansible.builtin.ping that the docs name."""

import glob
import importlib
import os
import re

import pytest
import yaml

from testlib import REPO

from ansible.playbook.block import Block
from ansible.playbook.task import Task
from ansible.plugins.action import ActionBase

from ansible_collections.dflash.lifecycle.plugins.plugin_utils.ct_action import CTModuleAction

JOB_PLAYBOOKS = sorted([os.path.join(REPO, "redeploy.yml")] + [
    path for path in glob.glob(os.path.join(REPO, "playbooks", "*.yml")) if not path.endswith("testbed_seed.yml")])
KEYWORDS = set(Task.fattributes) | set(Block.fattributes) | {"local_action"}
STATEMENTS = ("import_tasks", "include_tasks", "import_role", "include_role")
CT_GROUP = "dflash_trainers"


def load(path):
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle) or []


def action_of(task):
    """The task's action, as it names it (with_* loops and keywords aside)."""
    names = [key for key in task if key not in KEYWORDS and not key.startswith("with_")]
    assert len(names) == 1, f"not one action in {task}"
    return names[0]


def short(action):
    return action.rpartition(".")[2]


def files_named(value, base_dirs):
    """The task files an import or include names: each name a template can give, found beside the
    file that names it, then in the play's directory."""
    names = re.findall(r"'([^']+\.ya?ml)'", value) if "{{" in value else [value]
    assert names, f"no file name in {value!r}"
    found = []
    for name in names:
        path = next((os.path.join(base, name) for base in base_dirs if os.path.isfile(os.path.join(base, name))), None)
        assert path, f"{name} not found in {base_dirs}"
        found.append(path)
    return found


def role_tasks(name, entry):
    """The task files an import of role name (its entry's tasks) runs: its dependencies' first."""
    meta = os.path.join(REPO, "roles", name, "meta", "main.yml")
    found = []
    for dependency in (load(meta) or {}).get("dependencies", []) if os.path.isfile(meta) else []:
        found += role_tasks(dependency["role"] if isinstance(dependency, dict) else dependency, None)
    path = os.path.join(REPO, "roles", name, "tasks", f"{entry or 'main'}.yml")
    assert os.path.isfile(path) or entry is None, path
    return found + ([path] if os.path.isfile(path) else [])


def walk(tasks, path, play_dir, delegated, seen):
    """(file, task name, action) of every task of tasks that runs with the play's host, following
    imports and includes; delegated: an enclosing block or include delegates its tasks."""
    for task in tasks or []:
        here = delegated or "delegate_to" in task or "local_action" in task
        if "block" in task:
            for part in ("block", "rescue", "always"):
                yield from walk(task.get(part), path, play_dir, here, seen)
            continue
        action = action_of(task)
        bases = [os.path.dirname(path), play_dir]
        if short(action) in ("import_tasks", "include_tasks"):
            value = task[action]
            value = value if isinstance(value, str) else value["file"]
            for found in files_named(value, bases):
                if (found, here) not in seen:
                    seen.add((found, here))
                    yield from walk(load(found), found, play_dir, here, seen)
        elif short(action) in ("import_role", "include_role"):
            for found in role_tasks(task[action]["name"], task[action].get("tasks_from")):
                if (found, here) not in seen:
                    seen.add((found, here))
                    yield from walk(load(found), found, play_dir, here, seen)
        elif not here:
            yield os.path.relpath(path, REPO), task.get("name"), action


def play_tasks(playbook, play):
    """(file, task name, action) of every task of a play that runs with its host: its roles' first."""
    seen = set()
    for role in play.get("roles") or []:
        role = role if isinstance(role, dict) else {"role": role}
        for found in role_tasks(role.get("role") or role["name"], role.get("tasks_from")):
            yield from walk(load(found), found, os.path.dirname(playbook), "delegate_to" in role, seen)
    for section in ("pre_tasks", "tasks", "post_tasks", "handlers"):
        yield from walk(play.get(section), playbook, os.path.dirname(playbook), False, seen)


def ct_plays():
    for playbook in JOB_PLAYBOOKS:
        for play in load(playbook):
            if CT_GROUP in str(play.get("hosts", "")):
                yield playbook, play


def runs_in_ct(action):
    """Whether action, run with a CT as its host, runs a module there whose answer nothing checks."""
    if short(action) == "meta":
        return False
    if action.startswith("dflash.lifecycle."):
        module = f"ansible_collections.dflash.lifecycle.plugins.action.{short(action)}"
    elif "." not in action or action.startswith(("ansible.builtin.", "ansible.legacy.")):
        module = f"ansible.plugins.action.{short(action)}"
    else:
        return True  # another collection's: nothing here checks what it answers
    try:
        plugin = importlib.import_module(module).ActionModule
    except ModuleNotFoundError:
        return True  # ansible-core's normal action: the module runs in the CT, its answer taken as it is
    assert issubclass(plugin, ActionBase)
    return plugin._requires_connection and not issubclass(plugin, CTModuleAction)


def test_the_walk_finds_the_jobs_tasks_and_would_name_a_builtin_module_in_a_ct():
    found = [task for playbook, play in ct_plays() for task in play_tasks(playbook, play)]
    actions = {action for _path, _name, action in found}
    # the jobs' own calls into the CT, through imports of task files and roles alike
    assert {"dflash.lifecycle.trainer_preflight", "dflash.lifecycle.staged_stop", "dflash.lifecycle.trainer_process",
            "dflash.lifecycle.trainer_info", "dflash.lifecycle.pve_hook_mark"} <= actions, sorted(actions)
    # a play's roles too (metrics_targets'); a delegated task is not the CT's
    assert any(path.startswith("roles/metrics_targets") for path, _name, _action in found)
    assert not any(action == "ansible.builtin.command" for _path, _name, action in found)
    assert any(path == os.path.join("playbooks", "redeploy", "gang_barrier.yml") or path.startswith("roles/trainer_run")
               for path, _name, _action in found)
    assert [runs_in_ct(action) for action in ("ansible.builtin.copy", "ansible.builtin.file", "ansible.builtin.command",
                                              "community.general.x")] == [True] * 4
    assert [runs_in_ct(action) for action in ("ansible.builtin.debug", "ansible.builtin.set_fact",
                                              "dflash.lifecycle.validate_settings", "dflash.lifecycle.trainer_info")] \
        == [False] * 4


@pytest.mark.parametrize("playbook", [os.path.relpath(path, REPO) for path in JOB_PLAYBOOKS])
def test_no_task_with_a_ct_host_runs_a_module_whose_answer_is_not_checked(playbook):
    plays = [play for path, play in ct_plays() if os.path.relpath(path, REPO) == playbook]
    for play in plays:
        assert play.get("gather_facts") is False, f"{playbook}: gather_facts would run ansible.builtin.setup in each CT"
    unchecked = [(path, name, action) for play in plays
                 for path, name, action in play_tasks(os.path.join(REPO, playbook), play) if runs_in_ct(action)]
    assert unchecked == []
