"""plugin_utils/role_variables.py: the names a project's roles know, read from the roles."""

import pytest

from ansible_collections.dflash.lifecycle.plugins.plugin_utils import role_variables


@pytest.fixture
def roles(tmp_path):
    role = tmp_path / "roles" / "trainer_demo"
    for sub in ("meta", "defaults", "vars", "tasks"):
        (role / sub).mkdir(parents=True)
    (role / "meta" / "argument_specs.yml").write_text(
        "argument_specs:\n  main:\n    options:\n      trainer_demo_wait: {type: float, default: 1}\n"
        "  other:\n    options:\n      trainer_demo_other: {type: str}\n")
    (role / "defaults" / "main.yml").write_text("trainer_demo_wait: 1\n")
    (role / "vars" / "main.yml").write_text("trainer_demo_argv: []\n")
    (role / "tasks" / "main.yml").write_text("- ansible.builtin.ping:\n  register: trainer_demo_result\n")
    (tmp_path / "roles" / "trainer_run").mkdir()
    return tmp_path


def test_known_names_and_suggestions(roles):
    project = role_variables.Project(str(roles / "roles"))
    assert project.unknown(["trainer_demo_wait", "trainer_demo_argv", "trainer_demo_result",
                            "trainer_demo_other"]) == []
    assert project.unknown(["trainer_demo_wiat"]) == [
        "trainer_demo_wiat: no role of this project knows this variable; did you mean trainer_demo_wait?"]
    assert project.unknown(["trainer_stop_pidfile"])[0].startswith("trainer_stop_pidfile: renamed to trainer_run_pidfile")
    assert project.unknown(["trainer_stop_checkpoint_max_wait"]) == []  # deprecated: still works
    assert project.deprecated(["trainer_stop_checkpoint_max_wait"]) == [
        "trainer_stop_checkpoint_max_wait is renamed to trainer_stop_graceful_wait_cap; the old name still works until 0.3.0"]
    assert list(project.options("trainer_demo")) == ["trainer_demo_wait"]
    assert list(project.options("trainer_demo.other")) == ["trainer_demo_other"]
    with pytest.raises(ValueError):
        project.options("trainer_nope")


def test_the_roles_dir_is_found_beside_or_above_the_playbook(roles):
    assert role_variables.find_roles_dir({"playbook_dir": str(roles)}) == str(roles / "roles")
    (roles / "playbooks").mkdir()
    assert role_variables.find_roles_dir({"playbook_dir": str(roles / "playbooks")}) == str(roles / "roles")
    with pytest.raises(ValueError):
        role_variables.find_roles_dir({"playbook_dir": "/nonexistent"})


def test_the_takeover_code_is_known_though_no_role_holds_it(roles):
    """redeploy_lock_takeover is read untemplated by the CT modules' action plugin, never by a role."""
    assert role_variables.Project(str(roles / "roles")).unknown(["redeploy_lock_takeover"]) == []
