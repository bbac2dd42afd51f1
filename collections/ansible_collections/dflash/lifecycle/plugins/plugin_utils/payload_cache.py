# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Keep this collection's AnsiballZ payloads from one ansible-playbook run to the next.

ansible-core builds a module's payload once per run (executor/module_common.py
_find_module_utils): it parses every module_utils file the module imports, some 70 with
ansible-core's own, 0.1-0.2 s of controller CPU per module, and keeps the result in the run's
private directory (DEFAULT_LOCAL_TMP/ansiballz_cache), which is removed when the run ends. A
redeploy runs two or three of these modules once each, so it paid every build on its critical
path, between the old run's stop and the new run's first progress line. This keeps the built
entry, as ansible-core wrote it, in a store next to that directory and puts it back into the next
run's cache before the module runs: ansible-core then finds it there and builds nothing.

The store is keyed by a fingerprint of everything a build reads: the Python and ansible-core
versions, and the path, size and modification time of every file of ansible-core's module_utils,
of the module_common that builds, and of this collection's modules and module_utils (the
entry holds controller paths too). Any change makes a new key, so a stale payload is never
used; entries under other keys are pruned but for the newest few (another checkout of the project
shares the store). A store that is not the user's own or that others can write is not read, and
an error of the file system (a file gone while it is read, a full disk) is a cache miss, never a
failed task: ansible-core then builds the payload itself, as it always did.

A stored payload also carries bytecode: beside each Python file of the zip, its ``.pyc``,
compiled by the controller's Python as a checked-hash pyc (PEP 552). In the CT, AnsiballZ imports
the payload with zipimport, which compiles every source it imports, every call (zipimport never
writes bytecode), and which takes a ``.pyc`` first only when its magic number is the CT's Python
version and its hash is that of the source beside it: a CT of another Python version compiles the
sources as before, and no ``.pyc`` stands for another text than its own source.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import hashlib
import importlib.util
import io
import marshal
import os
import pickle
import shutil
import stat
import sys
import tempfile
import zipfile

from ansible import constants as C
from ansible import release
from ansible.executor import module_common
from ansible.module_utils import basic

COLLECTION_PLUGINS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the Python module path ansible-core gives a module of this collection in the payload
FQN_PREFIX = "ansible_collections.dflash.lifecycle.plugins.modules."
# entries of other fingerprints kept (other checkouts, a version switched back to)
KEEP_FINGERPRINTS = 4

_fingerprint = None


def fingerprint():
    """The key of every input of a payload build, computed once per process."""
    global _fingerprint  # pylint: disable=global-statement
    if _fingerprint is None:
        digest = hashlib.sha256(f"{sys.version}\0{release.__version__}\0".encode())
        roots = (os.path.dirname(os.path.abspath(basic.__file__)), os.path.join(COLLECTION_PLUGINS, "modules"),
                 os.path.join(COLLECTION_PLUGINS, "module_utils"))
        paths = [os.path.abspath(module_common.__file__)]
        for root in roots:
            for directory, subdirs, files in os.walk(root):
                subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
                paths.extend(os.path.join(directory, name) for name in sorted(files) if name.endswith(".py"))
        for path in paths:
            info = os.stat(path)
            digest.update(f"{path}\0{info.st_size}\0{info.st_mtime_ns}\0".encode())
        _fingerprint = digest.hexdigest()[:32]
    return _fingerprint


def run_cache():
    """ansible-core's cache of this run (module_common._find_module_utils), where it looks first."""
    return os.path.join(C.DEFAULT_LOCAL_TMP, "ansiballz_cache")


def store_root():
    """The store, beside the runs' private directories (the local_tmp setting), the user's own."""
    return os.path.join(os.path.dirname(C.DEFAULT_LOCAL_TMP), "dflash-ansiballz")


def _own_directory(path):
    """path made if missing, and whether it is a directory of this user that no one else can write."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.lstat(path)
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o022


def _write_atomically(target, write):
    """write(path) made into target so that a reader sees the whole file or none (ansible-core's
    workers read it unlocked)."""
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".part-")
    os.close(handle)
    try:
        write(temporary)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def pyc_of(source, name):
    """The checked-hash pyc (PEP 552) of a module's source, as importlib writes one: zipimport
    takes it only on a Python of this magic number and with this source beside it."""
    code = compile(source, name, "exec", dont_inherit=True)
    return importlib.util.MAGIC_NUMBER + (0b11).to_bytes(4, "little") + importlib.util.source_hash(source) \
        + marshal.dumps(code)


def with_bytecode(zip_data):
    """An AnsiballZ zip (base64, as the cache entry holds it) with a .pyc beside each .py; None when
    it has bytecode already or a source does not compile here (the payload is then kept as it is)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(base64.b64decode(zip_data))) as payload, \
            zipfile.ZipFile(buffer, "w") as out:
        names = set(payload.namelist())
        for info in payload.infolist():
            data = payload.read(info)
            out.writestr(info, data)
            if info.filename.endswith(".py"):
                if info.filename + "c" in names:
                    return None
                try:
                    pyc = pyc_of(data, info.filename)
                except (SyntaxError, ValueError):
                    return None
                compiled = zipfile.ZipInfo(info.filename + "c", info.date_time)
                compiled.compress_type = info.compress_type
                out.writestr(compiled, pyc)
    return base64.b64encode(buffer.getvalue())


def _pickle_to(value, path):
    """value written to path as module_common._CachedModule.dump writes a cache entry."""
    with open(path, "wb") as out:
        pickle.dump(value, out)


def _store_with_bytecode(source, target):
    """The cache entry source, its payload given bytecode, at target, whole or not at all; copied as
    it is when ansible-core's entry is not the one this code knows (module_common._CachedModule)."""
    try:
        entry = module_common._CachedModule.load(source)  # pylint: disable=protected-access
        zip_data = with_bytecode(entry.zip_data)
    except (AttributeError, TypeError, ValueError, EOFError, zipfile.BadZipFile, pickle.UnpicklingError):
        zip_data = None
    if zip_data is None:
        _write_atomically(target, functools.partial(shutil.copyfile, source))
    else:
        _write_atomically(target, functools.partial(_pickle_to, dataclasses.replace(entry, zip_data=zip_data)))


def _entries(directory, module):
    """The cache entries of module in directory (one per compression and extension set)."""
    prefix = FQN_PREFIX + module + "-"
    return [name for name in os.listdir(directory)
            if name.startswith(prefix) and not name.endswith((".lock", "-part"))]


def restore(module):
    """Before module runs: put its stored payloads into this run's cache, where ansible-core
    looks before it builds one."""
    root, cache = store_root(), run_cache()
    try:
        stored = os.path.join(root, fingerprint())
        if not os.path.isdir(stored) or not _own_directory(root) or not _own_directory(stored):
            return
        os.makedirs(cache, exist_ok=True)
        have = set(os.listdir(cache))
        for name in _entries(stored, module):
            if name not in have:
                _write_atomically(os.path.join(cache, name), functools.partial(shutil.copyfile, os.path.join(stored, name)))
        os.utime(stored)  # the newest fingerprints are the ones kept
    except OSError:
        return


def keep(module):
    """After module ran: store the payloads this run built for it, and prune old fingerprints."""
    root, cache = store_root(), run_cache()
    try:
        stored = os.path.join(root, fingerprint())
        if not os.path.isdir(cache) or not _own_directory(root) or not _own_directory(stored):
            return
        have = set(os.listdir(stored))
        new = [name for name in _entries(cache, module) if name not in have]
        for name in new:
            _store_with_bytecode(os.path.join(cache, name), os.path.join(stored, name))
        if new:
            keys = sorted((entry for entry in os.scandir(root) if entry.is_dir(follow_symlinks=False)),
                          key=lambda entry: entry.stat().st_mtime_ns, reverse=True)
            for entry in keys[KEEP_FINGERPRINTS:]:
                if entry.name != fingerprint():
                    shutil.rmtree(entry.path, ignore_errors=True)
    except OSError:
        return
