"""The payload store (plugin_utils/payload_cache.py) around ansible-core's own AnsiballZ build
(executor/module_common.py modify_module), each "run" with a private directory of its own as
ansible-playbook has: a second run builds nothing and sends the same payload; any change to what
a build reads, and a store others can write, make it build again."""

import base64
import io
import os
import re
import subprocess
import sys
import zipfile

import pytest

from ansible import constants as C
from ansible.executor import module_common
from ansible.template import Templar

from ansible_collections.dflash.lifecycle.plugins.plugin_utils import payload_cache

MODULE = "redeploy_lock"
MODULE_PATH = os.path.join(payload_cache.COLLECTION_PLUGINS, "modules", MODULE + ".py")


def zip_entries(payload):
    """{name: bytes} of the zip inside an AnsiballZ wrapper."""
    data = re.search(rb"zip_data='([A-Za-z0-9+/=]+)'", payload).group(1)
    with zipfile.ZipFile(io.BytesIO(base64.b64decode(data))) as payload_zip:
        return {name: payload_zip.read(name) for name in payload_zip.namelist()}


@pytest.fixture
def runs(tmp_path, monkeypatch):
    """run(n): build the module's payload as run n of ansible-playbook would, between the store's
    restore and keep; returns (the payload, how many builds ansible-core made)."""
    monkeypatch.setattr(payload_cache, "_fingerprint", None)
    builds = []
    finder = module_common.recursive_finder

    def counted(*args, **kwargs):
        builds.append(args[0])
        return finder(*args, **kwargs)

    monkeypatch.setattr(module_common, "recursive_finder", counted)

    def run(number):
        monkeypatch.setattr(C, "DEFAULT_LOCAL_TMP", str(tmp_path / "tmp" / f"ansible-local-{number}"), raising=False)
        before = len(builds)
        payload_cache.restore(MODULE)
        built = module_common.modify_module(
            module_name=f"dflash.lifecycle.{MODULE}", module_path=MODULE_PATH, module_args={},
            templar=Templar(loader=None), task_vars={"ansible_python_interpreter": "/usr/bin/python3"})
        with open(MODULE_PATH, "rb") as handle:  # the module's own text is in the payload
            assert zip_entries(built.b_module_data)[f"ansible_collections/dflash/lifecycle/plugins/modules/{MODULE}.py"] \
                == handle.read()
        payload_cache.keep(MODULE)
        return built.b_module_data, len(builds) - before

    return run


def test_a_second_run_builds_nothing_and_sends_the_same_payload_with_its_bytecode(runs, tmp_path):
    first, built = runs(1)
    assert built == 1
    second, built = runs(2)
    assert built == 0
    sent, sources = zip_entries(second), zip_entries(first)  # the wrapper around them differs: it holds the time
    assert {name: data for name, data in sent.items() if not name.endswith(".pyc")} == sources
    assert sorted(name for name in sent if name.endswith(".pyc")) == sorted(name + "c" for name in sources if name.endswith(".py"))
    third, built = runs(3)
    assert built == 0 and zip_entries(third) == sent
    store = tmp_path / "tmp" / "dflash-ansiballz"
    [key] = os.listdir(store)
    assert oct(os.stat(store).st_mode & 0o777) == "0o700"
    assert os.listdir(store / key) == [f"{payload_cache.FQN_PREFIX}{MODULE}-ZIP_STORED-none"]  # modify_module's default compression


def test_a_changed_module_utils_file_is_a_new_key_and_a_new_build(runs, monkeypatch, tmp_path):
    runs(1)
    real_stat = os.stat
    changed = os.path.join(payload_cache.COLLECTION_PLUGINS, "module_utils", "ct", "lock.py")

    def edited(path, *args, **kwargs):  # the file as an edit leaves it: one byte more, later
        info = real_stat(path, *args, **kwargs)
        if path == changed:
            return os.stat_result((*info[:6], info.st_size + 1, info[7], info[8] + 1, info[9]))
        return info

    monkeypatch.setattr(payload_cache.os, "stat", edited)
    monkeypatch.setattr(payload_cache, "_fingerprint", None)
    _payload, built = runs(2)
    assert built == 1
    assert len(os.listdir(tmp_path / "tmp" / "dflash-ansiballz")) == 2


def test_a_store_others_can_write_is_not_read(runs, tmp_path):
    runs(1)
    store = tmp_path / "tmp" / "dflash-ansiballz"
    os.chmod(store, 0o777)
    _payload, built = runs(2)
    assert built == 1


def test_only_the_newest_keys_are_kept(runs, tmp_path):
    store = tmp_path / "tmp" / "dflash-ansiballz"
    os.makedirs(store, mode=0o700)
    for age in range(payload_cache.KEEP_FINGERPRINTS + 2):
        old = store / f"old{age}"
        old.mkdir()
        os.utime(old, (1000 + age, 1000 + age))
    runs(1)
    kept = sorted(os.listdir(store))
    assert len(kept) == payload_cache.KEEP_FINGERPRINTS
    assert payload_cache.fingerprint() in kept
    assert "old0" not in kept and f"old{payload_cache.KEEP_FINGERPRINTS + 1}" in kept


def test_a_file_gone_while_the_key_is_computed_is_a_build_not_a_failed_task(runs, monkeypatch, tmp_path):
    runs(1)
    real_stat = os.stat

    def vanishing(path, *args, **kwargs):  # a module_utils file removed by a checkout under way
        if str(path).endswith(os.path.join("module_utils", "ct", "lock.py")):
            raise FileNotFoundError(path)
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(payload_cache.os, "stat", vanishing)
    monkeypatch.setattr(payload_cache, "_fingerprint", None)
    _payload, built = runs(2)
    assert built == 1


def importing(payload_zip, module):
    """The file Python imported module from, payload_zip first on its path (a Python of its own, as
    AnsiballZ's in the CT)."""
    return subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(payload_zip)!r}); "
                           f"import {module} as m; print(m.__file__); print(m.ANSWER)"],
                          capture_output=True, text=True, check=True).stdout.splitlines()


def test_the_bytecode_is_taken_only_for_its_own_source_and_python(tmp_path):
    source = b"ANSWER = 'from source'\n"
    plain = tmp_path / "plain.zip"
    with zipfile.ZipFile(plain, "w") as payload:
        payload.writestr("probe_mod.py", source)
    compiled = tmp_path / "compiled.zip"
    compiled.write_bytes(base64.b64decode(payload_cache.with_bytecode(base64.b64encode(plain.read_bytes()))))
    assert importing(compiled, "probe_mod") == [f"{compiled}/probe_mod.pyc", "from source"]
    with zipfile.ZipFile(compiled) as payload:
        pyc = payload.read("probe_mod.pyc")
    assert payload_cache.with_bytecode(base64.b64encode(compiled.read_bytes())) is None  # compiled once

    # bytecode of another text beside this source (a source changed after the build): the source runs
    edited = tmp_path / "edited.zip"
    with zipfile.ZipFile(edited, "w") as payload:
        payload.writestr("probe_mod.py", b"ANSWER = 'edited'\n")
        payload.writestr("probe_mod.pyc", pyc)
    assert importing(edited, "probe_mod") == [f"{edited}/probe_mod.py", "edited"]

    # bytecode of another Python version (a CT whose Python is not the controller's): the source runs
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as payload:
        payload.writestr("probe_mod.py", source)
        payload.writestr("probe_mod.pyc", bytes([pyc[0] ^ 1]) + pyc[1:])
    assert importing(other, "probe_mod") == [f"{other}/probe_mod.py", "from source"]


def test_a_source_that_does_not_compile_here_keeps_the_payload_as_it_is():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as payload:
        payload.writestr("fine.py", b"X = 1\n")
        payload.writestr("newer_syntax.py", b"X = (1\n")
    assert payload_cache.with_bytecode(base64.b64encode(buffer.getvalue())) is None
