# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The run's spec on the CT's disk: what the CT needs to stop its run and to bring it back with no
controller (Python 3.8 compatible).

Proxmox stops and starts a CT on its own (a node reboot, ``pct shutdown``/``reboot``, a restart
migration, HA); its hookscript then runs the CT's own hook (module_utils/ct/pve_hook.py). That hook
needs the run's settings when no controller is there, after ``/run`` was wiped by the restart, so
every launch keeps them in the lifecycle directory (``/var/lib/dflash/lifecycle``, on the CT's
disk):

- ``run.json`` (0600: the launch's options hold the run's secrets): the launch's options as they
  started the run, the stop's options, the models to stage, and what is wanted of the run -
  ``running`` since a launch, ``stopped`` since a stop that a person or a job asked for (a failed
  redeploy left down included);
- ``agent.zip``: the code of this collection that the launch ran (the module's own AnsiballZ
  payload), so the hook runs what launched the run, never an older copy;
- ``hook``: the one command the node's hookscript runs in the CT,
  ``pct exec <vmid> -- <dir>/hook <phase>``; it names the CT's Python interpreter.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
import zipfile
import zlib

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct.rundir import UnsafePath, read_json, secure_dir, write_atomic

DEFAULT_DIR = "/var/lib/dflash/lifecycle"
VERSION = 1
# the launch's options that belong to the one launch that had them, not to the run
ONE_LAUNCH_ONLY = ("stop_first", "activate", "gang_stop", "lifecycle", "rollback_launch", "progress_file")
# the stop's options that belong to one job's stop: a gang's moment, the controller's detaching
ONE_STOP_ONLY = ("signal_at",)
AGENT_MAIN = ("import sys\n"
              "from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import pve_hook\n"
              "sys.exit(pve_hook.main(sys.argv[1:]))\n")


def spec_path(directory):
    return os.path.join(directory, "run.json")


def read(directory):
    """The spec, or None when the CT has none (no launch by this collection yet) or it cannot be read."""
    try:
        spec = read_json(spec_path(directory))
    except (OSError, ValueError):
        return None
    return spec if isinstance(spec, dict) and spec.get("version") == VERSION else None


def _write(directory, spec):
    os.makedirs(os.path.dirname(directory), exist_ok=True)
    try:
        secure_dir(directory)
    except UnsafePath as err:
        raise OSError(str(err)) from None
    write_atomic(spec_path(directory), json.dumps(spec, sort_keys=True))


def record_launch(lifecycle, params, pid):
    """After a healthy launch of params (trainer_process's), PID pid: keep the run's spec, the agent's
    code and the hook command in lifecycle["dir"]. Raises OSError only."""
    directory = lifecycle["dir"]
    before = read(directory) or {}
    spec = {
        "version": VERSION,
        "launch": {key: value for key, value in params.items() if key not in ONE_LAUNCH_ONLY},
        "stop": {key: value for key, value in (lifecycle.get("stop") or {}).items() if key not in ONE_STOP_ONLY},
        "stage_models": lifecycle.get("stage_models"),
        "lock_path": lifecycle.get("lock_path"),
        "release": params.get("release"),
        "launched_at": time.time(),
        "pid": pid,
        "wanted": "running",
        "wanted_by": "the launch",
        "wanted_at": time.time(),
        "paused": before.get("paused"),  # the last Proxmox stop's account stays until the next one
    }
    _write(directory, spec)
    write_agent(directory)
    write_atomic(os.path.join(directory, "hook"),
                 f"#!/bin/sh\n# written by dflash.lifecycle's launch: the CT's side of its Proxmox hookscript\n"
                 f"exec {sys.executable} {os.path.join(directory, 'agent.zip')} \"$@\"\n", 0o700)


def mark(directory, wanted, by, **fields):
    """Record what is wanted of the run now (running, stopped) and why; nothing when the CT has no
    spec. Raises OSError only."""
    spec = read(directory)
    if spec is None:
        return None
    spec.update(fields, wanted=wanted, wanted_by=by, wanted_at=time.time())
    _write(directory, spec)
    return spec


def summary(directory):
    """What the CT's Proxmox hook would do with the run, for `make status`: {wanted, wanted_by,
    wanted_at, release, paused, words}, or None when the CT keeps no spec."""
    spec = read(directory)
    if spec is None:
        return None
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(spec.get("wanted_at") or 0))
    if spec.get("wanted") == "running":
        words = f"wanted running (since {spec.get('wanted_by')} at {stamp}): a CT start brings release " \
                f"{spec.get('release') or '(current)'} back"
    else:
        words = f"wanted stopped ({spec.get('wanted_by')} at {stamp}): a CT start leaves it down"
    paused = spec.get("paused")
    if paused:
        words += (f"; the last Proxmox stop ({time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(paused['at']))}) "
                  f"{'FAILED its stop' if paused.get('failed') else 'stopped it by ' + str(paused.get('stopped_by'))}, "
                  f"checkpoint {paused.get('checkpoint')}, {paused.get('steps_lost')} steps lost")
    return dict({key: spec.get(key) for key in ("wanted", "wanted_by", "wanted_at", "release", "paused")}, words=words)


def _package_root():
    """The directory (or zip archive) that holds the ansible_collections package this code runs from."""
    here = os.path.abspath(__file__)
    marker = os.sep + os.path.join("ansible_collections", "dflash", "lifecycle") + os.sep
    return here[:here.index(marker)]


def _payload_entries(payload):
    """The entries of an AnsiballZ payload the agent takes: this collection and ansible.module_utils."""
    return [info for info in payload.infolist()
            if info.filename.startswith(("ansible/module_utils/", "ansible_collections/"))
            or info.filename == "ansible/__init__.py"]


def agent_bytes():
    """The agent as a zip application: this collection's module_utils and the ansible.module_utils
    it imports, as the module that runs this has them (its AnsiballZ payload when it is one, else
    the source trees), with a __main__ that runs pve_hook."""
    # imported here so that AnsiballZ, which packs what a module imports, packs the agent's entry point
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import pve_hook  # noqa: F401 pylint: disable=unused-import

    buffer = io.BytesIO()
    root = _package_root()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as agent:
        if zipfile.is_zipfile(root):
            with zipfile.ZipFile(root) as payload:
                for info in _payload_entries(payload):
                    agent.writestr(info, payload.read(info))
        else:
            import ansible.module_utils

            ours = os.path.join("ansible_collections", "dflash", "lifecycle", "plugins", "module_utils")
            trees = [(os.path.join(root, ours), ours),
                     (os.path.dirname(ansible.module_utils.__file__), "ansible/module_utils")]
            for top, name in trees:
                for folder, dirs, files in os.walk(top):
                    dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                    if "__init__.py" not in files:  # zipimport finds no namespace package
                        agent.writestr(os.path.normpath(os.path.join(name, os.path.relpath(folder, top), "__init__.py")), "")
                    for file in sorted(files):
                        if file.endswith(".py"):
                            path = os.path.join(folder, file)
                            agent.write(path, os.path.join(name, os.path.relpath(path, top)))
            for package in ("ansible", "ansible_collections", "ansible_collections/dflash",
                            "ansible_collections/dflash/lifecycle", "ansible_collections/dflash/lifecycle/plugins"):
                agent.writestr(f"{package}/__init__.py", "")
        agent.writestr("__main__.py", AGENT_MAIN)
    return buffer.getvalue()


def _contents(archive):
    """{(name, CRC)} of a zip, or None when it cannot be read."""
    try:
        with zipfile.ZipFile(archive) as opened:
            return {(info.filename, info.CRC) for info in opened.infolist()}
    except (OSError, zipfile.BadZipFile):
        return None


def write_agent(directory):
    """agent.zip in directory, replaced only when its code changed (a launch of the same release of
    this collection compares the payload's CRCs and builds nothing). Returns whether it changed."""
    path = os.path.join(directory, "agent.zip")
    root = _package_root()
    old = _contents(path)
    if old is not None and zipfile.is_zipfile(root):
        with zipfile.ZipFile(root) as payload:
            wanted = {(info.filename, info.CRC) for info in _payload_entries(payload)}
        if old == wanted | {("__main__.py", zlib.crc32(AGENT_MAIN.encode()))}:
            return False
    data = agent_bytes()
    if old is not None and old == _contents(io.BytesIO(data)):
        return False
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.rename(tmp, path)
    return True
