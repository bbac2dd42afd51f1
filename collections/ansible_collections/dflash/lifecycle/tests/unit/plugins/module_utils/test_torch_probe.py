"""module_utils/launch/torch_probe.py: the preflight asks for torch the way the launch starts the run."""

import sys

from ansible_collections.dflash.lifecycle.plugins.module_utils.launch import torch_probe


def fake_torch(root, version="2.13.0", reads_timeout=True):
    """A torch package as its own files show it: version.py and the launcher's api.py."""
    package = root / "torch"
    (package / "distributed" / "launcher").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "version.py").write_text(f"__version__ = '{version}'\n")
    (package / "distributed" / "launcher" / "api.py").write_text(
        "os.environ.get('TORCH_ELASTIC_SHUTDOWN_TIMEOUT')\n" if reads_timeout else "timeout = 30\n")
    return package


def test_torch_found_only_through_the_runs_environment_is_found(tmp_path, monkeypatch):
    """The field's dflash_env puts torch on the PYTHONPATH: the bare interpreter has none."""
    monkeypatch.delenv("PYTHONPATH", raising=False)
    package = fake_torch(tmp_path / "site")
    bare = torch_probe.torch_support_of_python(sys.executable)
    assert bare["path"] is None and "has no torch" in bare["error"]
    run_env = {"env": {"PYTHONPATH": str(tmp_path / "site")}, "secrets_file": str(tmp_path / "none.env"),
               "login_shell": False}
    found = torch_probe.torch_support_of_python(sys.executable, run_env)
    assert found["error"] is None and found["path"] == str(package)
    assert (found["version"], found["reads_shutdown_timeout"]) == ("2.13.0", True)


def test_the_secrets_file_is_sourced_and_values_stay_quoted(tmp_path):
    secrets = tmp_path / "secrets.env"
    secrets.write_text("WANDB_API_KEY='k e y'\n")
    run_env = {"env": {"DFLASH_TAG": "a b; echo injected"}, "secrets_file": str(secrets)}
    code = "import os; print(os.environ['WANDB_API_KEY']); print(os.environ['DFLASH_TAG'])"
    stdout, _stderr = torch_probe.run_python(sys.executable, code, run_env)
    assert stdout.splitlines() == ["k e y", "a b; echo injected"]


def test_without_a_run_environment_the_interpreter_runs_as_it_is():
    assert torch_probe.as_the_run(["/usr/bin/python3", "-c", "1"]) == ["/usr/bin/python3", "-c", "1"]
    login = torch_probe.as_the_run(["/usr/bin/python3"], {"login_shell": True, "env": {}})
    assert login[:3] == ["/bin/bash", "-l", "-c"] and login[3].endswith("exec /usr/bin/python3")
