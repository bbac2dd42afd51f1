"""module_utils/ct/writable.py and the launch's preflight rules: a directory the run cannot write is
refused by name, with its owner as the CT sees it and the fix, before anything is touched.

The unprivileged CT's view (a mount point of the node's root shown as nobody) is faked here through
the files the module reads (the id map, mountinfo, the overflow uid); the testbed's unprivileged CT
shows the real one (tests/integration/test_unprivileged_ct.py)."""

import os
import pathlib
import pickle
import shutil
import tempfile

import pytest

from ansible_collections.dflash.lifecycle.plugins.module_utils import preflight
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import writable

NOBODY = 65534


@pytest.fixture(name="tmp_path")
def place():
    """A directory the checks' user owns: nobody's, when the tests run as root (root writes anything)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="dflash-writable-"))
    path.chmod(0o755)
    if os.geteuid() == 0:
        os.chown(path, NOBODY, NOBODY)
    yield path
    shutil.rmtree(path)


def as_user(work):
    """work() as the checks' user: run by a child that drops to nobody when the tests run as root."""
    if os.geteuid() != 0:
        return work()
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(reader)
        try:
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            answer = pickle.dumps(("ok", work()))
        except BaseException as err:  # pylint: disable=broad-except
            answer = pickle.dumps(("raised", repr(err)))
        os.write(writer, answer)
        os._exit(0)
    os.close(writer)
    with os.fdopen(reader, "rb") as handle:
        state, value = pickle.loads(handle.read())
    os.waitpid(pid, 0)
    assert state == "ok", value
    return value


def _unwritable(tmp_path, name="node-owned"):
    """A directory of another owner (root's) that the checks' user cannot write; 0555 when not root."""
    path = tmp_path / name
    path.mkdir()
    if os.geteuid() == 0:
        os.chown(path, 0, 0)
    else:
        path.chmod(0o555)
    return path


def test_a_writable_directory_and_a_missing_one_below_it_pass_and_the_probe_leaves_nothing(tmp_path):
    assert as_user(lambda: writable.refusal("dflash_output_dir", str(tmp_path / "ckpt" / "deeper"))) is None
    assert not (tmp_path / "ckpt").exists()  # nothing is made: the launch makes it
    assert as_user(lambda: writable.refusal("trainer_run_dir", str(tmp_path))) is None
    assert os.listdir(tmp_path) == []


def test_a_directory_the_ct_cannot_write_names_itself_its_owner_and_the_fix(tmp_path):
    path = _unwritable(tmp_path)
    words = as_user(lambda: writable.refusal("dflash_output_dir", str(path / "ckpt")))
    assert words.startswith(f"dflash_output_dir {path}/ckpt: not writable by root in the CT: {path} (in {path}/ckpt) "
                            f"is owned by ")
    assert "in the CT, chown root" in words
    assert as_user(lambda: writable.refusal("x", str(path), probe=False)) is not None  # check mode asks access(2)
    assert len(as_user(lambda: writable.refusals({"a": str(path), "b": str(tmp_path), "c": None}))) == 1


def test_a_node_owned_mount_point_in_an_unprivileged_ct_names_the_chown_on_the_node(tmp_path, monkeypatch):
    path = _unwritable(tmp_path)
    uid_map = tmp_path / "uid_map"
    uid_map.write_text("         0     100000      65536\n")
    overflow = tmp_path / "overflowuid"
    overflow.write_text(f"{os.stat(path).st_uid}\n")  # the owner shows as the overflow uid, as nobody does
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"36 25 0:31 / / rw,relatime - ext4 /dev/root rw\n"
                         f"40 36 0:31 /srv/ckpt {path} rw,relatime - ext4 /dev/root rw\n")
    monkeypatch.setattr(writable, "OVERFLOW_UID_FILE", str(overflow))
    id_map, mount_of = writable.id_map, writable.mount_of
    monkeypatch.setattr(writable, "id_map", lambda: id_map(str(uid_map)))
    monkeypatch.setattr(writable, "mount_of", lambda where: mount_of(where, str(mountinfo)))
    words = as_user(lambda: writable.refusal("dflash_output_dir", str(path)))
    assert words.endswith(f"its owner is a node uid outside the CT's id map (0 100000 65536), on the mount point "
                          f"{path}: on the node, chown 100000:100000 its source (the CT's root as the node sees it), "
                          "or map its owner into the CT with lxc.idmap"), words
    mountinfo.write_text(f"40 36 0:31 /srv/ckpt {path} ro,relatime - ext4 /dev/root rw\n")
    read_only = as_user(lambda: writable.refusal("d", str(path)))
    assert read_only.endswith(f"it is on {path}, mounted read-only: mount it read-write in the CT's config"), read_only


def test_every_launch_refuses_a_missing_model_unless_it_stages_it_and_an_unwritable_directory(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    log_dir = _unwritable(tmp_path, "logs")
    params = {"model_dirs": [str(model), "/dev/shm/gone"], "log_file": str(log_dir / "train.log"),
              "checkpoint_dir": str(tmp_path / "ckpt"), "pidfile": str(tmp_path / "run" / "trainer.pid"),
              "lifecycle": {"dir": str(tmp_path / "lifecycle")}}
    refused = as_user(lambda: preflight.launch_refusals(params))
    assert refused[0] == ("model_dirs /dev/shm/gone: missing: the model lives in /dev/shm, which is wiped when the CT "
                          "restarts; copy it back, or set trainer_model_stage to its persistent copy")
    assert len(refused) == 2 and refused[1].startswith(f"log_file {log_dir}: not writable by root in the CT")
    staged = dict(params, log_file=str(tmp_path / "train.log"),
                  stage_models={"models": {"/dev/shm/gone/": str(model)}})
    assert as_user(lambda: preflight.launch_refusals(staged)) == []
