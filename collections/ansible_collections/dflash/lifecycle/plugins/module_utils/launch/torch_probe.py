# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which torch a run has, read from the torch package's own files without importing it (Python
3.8 compatible): the one a running process mapped (the stop), or the one an interpreter would
import, asked the way the launch will start it (the preflight).

The run finds torch through its environment: the launch's wrapper sources the secrets file,
exports the run's environment (``dflash_env``: a PYTHONPATH, a venv's PATH) and may run through
a login shell whose profile activates a venv. A probe that ran the bare interpreter would look
for another torch, or none ("python3 has no torch" for a run that has one), so ``as_the_run``
builds the probe's command line the same way.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess

# torch's launcher reads its shutdown timeout from this variable (torch 2.x launcher/api.py); the
# launch sets it for torchrun and accelerate, where it is the agent's deadline (accelerate has no
# option for it)
SHUTDOWN_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"


def as_the_run(argv, run_env=None):
    """argv started as the launch's wrapper starts the trainer: run_env {env: {name: value},
    secrets_file, login_shell}; argv itself when run_env is empty."""
    if not run_env:
        return list(argv)
    lines = []
    secrets = run_env.get("secrets_file")
    if secrets:
        lines.append(f"if [ -f {shlex.quote(secrets)} ]; then set -a; . {shlex.quote(secrets)}; set +a; fi")
    lines += [f"export {name}={shlex.quote(str(value))}" for name, value in sorted((run_env.get("env") or {}).items())]
    lines.append("exec " + " ".join(shlex.quote(a) for a in argv))
    shell = ["/bin/bash", "-l"] if run_env.get("login_shell") else ["/bin/sh"]
    return shell + ["-c", "\n".join(lines)]


def run_python(python, code, run_env=None, timeout=60):
    """(stdout, stderr) of `python -c code` as the run would run it; raises OSError, TimeoutExpired."""
    out = subprocess.run(as_the_run([python, "-c", code], run_env), capture_output=True, text=True,
                         timeout=timeout, check=False)
    return out.stdout, out.stderr


def has_module(python, module, run_env=None):
    """Whether python, as the run starts it, finds module (accelerate, deepspeed)."""
    try:
        stdout, _stderr = run_python(python, f"import importlib.util as u; print(bool(u.find_spec('{module}')))",
                                     run_env)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return stdout.strip() == "True"


def torch_support(pid, proc_root="/proc"):
    """The torch the process runs, from the libraries it mapped: its version and whether its
    launcher reads a shutdown timeout (all None when no torch is found)."""
    try:
        with open(os.path.join(proc_root, str(pid), "maps"), encoding="utf-8", errors="replace") as handle:
            path = next((m.group(1) for m in (re.search(r"(/\S+/torch)/lib/libtorch", line) for line in handle) if m),
                        None)
    except OSError:
        path = None
    return torch_facts(path)


def torch_support_of_python(python, run_env=None):
    """The same for an interpreter that has not started yet (the launch's check), from the torch
    package it would import as the run starts it - found without importing it."""
    code = ("import importlib.util as u; s = u.find_spec('torch'); "
            "print(s.submodule_search_locations[0] if s else '')")
    try:
        stdout, stderr = run_python(python, code, run_env)
    except (OSError, subprocess.TimeoutExpired) as err:
        return dict(torch_facts(None), error=str(err))
    path = stdout.strip().splitlines()[-1] if stdout.strip() else None
    return dict(torch_facts(path), error=None if path else (
        stderr.strip() or f"{python} has no torch" + (" in the run's environment" if run_env else "")))


def torch_facts(path):
    """{path, version, reads_shutdown_timeout} of the torch package at path (its own files)."""
    found = {"version": None, "path": path, "reads_shutdown_timeout": None}
    if not path:
        return found
    try:
        with open(os.path.join(path, "version.py"), encoding="utf-8") as handle:
            version = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", handle.read())
            found["version"] = version.group(1) if version else None
        with open(os.path.join(path, "distributed", "launcher", "api.py"), encoding="utf-8") as handle:
            found["reads_shutdown_timeout"] = SHUTDOWN_ENV in handle.read()
    except OSError:
        pass
    return found
