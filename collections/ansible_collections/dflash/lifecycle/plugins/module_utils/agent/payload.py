# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agent's code in the CT: agent.zip, a zip application of this collection's module_utils and the
ansible.module_utils it imports, as the module that launched the run had them (Python 3.8
compatible).

The run's supervisor and the Proxmox hook run it (``python3 <lifecycle dir>/agent.zip <command>``,
module_utils/agent/main.py), so they run the code that launched the run, never an older copy, with
no controller and no collection installed in the CT.
"""

from __future__ import annotations

import io
import os
import sys
import zipfile
import zlib


AGENT_MAIN = ("import sys\n"
              "from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import main\n"
              "sys.exit(main.main(sys.argv[1:]))\n")


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
    the source trees), with a __main__ that runs main.py's main."""
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


def run_detached(directory, command, log_name, env=None):
    """``agent.zip <command>`` of directory, detached from its caller: a session of its own,
    reparented to the CT's init, stdin on /dev/null, its output appended to log_name in directory;
    env: its whole environment (None: the caller's). Returns once it is on its own."""
    child = os.fork()
    if child == 0:
        try:
            os.setsid()
            if os.fork() == 0:
                log = os.open(os.path.join(directory, log_name), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(log, 1)
                os.dup2(log, 2)
                os.chdir("/")
                os.execve(sys.executable, [sys.executable, os.path.join(directory, "agent.zip"), command],
                          os.environ if env is None else env)
        finally:
            os._exit(0)
    os.waitpid(child, 0)
