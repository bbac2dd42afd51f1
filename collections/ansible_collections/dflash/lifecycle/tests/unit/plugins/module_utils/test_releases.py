"""module_utils/ct/releases.py (the CT half) with archives from plugin_utils/release_archive.py."""

import io
import json
import os
import tarfile

import pytest

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import releases
from ansible_collections.dflash.lifecycle.plugins.plugin_utils import release_archive


def source(tmp_path, name="src", **files):
    src = tmp_path / name
    src.mkdir()
    for rel, text in (files or {"train_dflash_pipeline.py": "print('v1')\n", "dflash_model.py": "X = 1\n"}).items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    return src


def built(tmp_path, src):
    return release_archive.build_release(str(src), ["*"], ["__pycache__/*", "*.pyc"], str(tmp_path / "archives"))


def installed(tmp_path, src):
    build = built(tmp_path, src)
    base = tmp_path / "opt"
    changed, details = releases.install(str(base), build["release"], build["archive"],
                                        build["archive_sha256"], build["files"])
    return str(base), build, changed, details


def test_install_verify_and_status(tmp_path):
    base, build, changed, _details = installed(tmp_path, source(tmp_path))
    assert changed and not os.path.exists(build["archive"])  # the pushed archive is consumed
    releases.activate(base, build["release"])
    state = releases.compared(base, build["release"], build["files"])
    assert state["present"] and state["drift"] == {} and state["current"] == build["release"]
    assert state["changes"] == {"added": [], "removed": [], "modified": []}


def test_an_edit_in_place_is_drift_and_a_reinstall_repairs_it(tmp_path):
    src = source(tmp_path)
    base, build, _changed, _details = installed(tmp_path, src)
    releases.activate(base, build["release"])
    tree = os.path.join(base, "releases", build["release"])
    with open(os.path.join(tree, "train_dflash_pipeline.py"), "a") as handle:
        handle.write("print('edited by hand')\n")
    os.makedirs(os.path.join(tree, "__pycache__"))  # Python's own: not drift
    open(os.path.join(tree, "__pycache__", "x.pyc"), "w").close()
    open(os.path.join(tree, "notes.txt"), "w").close()
    os.unlink(os.path.join(tree, "dflash_model.py"))
    state = releases.status(base, build["release"])
    assert state["present"] is False
    assert state["drift"] == {build["release"]: {"modified": ["train_dflash_pipeline.py"],
                                                 "added": ["notes.txt"], "removed": ["dflash_model.py"]}}
    again = built(tmp_path, src)
    changed, details = releases.install(base, again["release"], again["archive"],
                                        again["archive_sha256"], again["files"])
    assert changed and details["repaired_drift"]["modified"] == ["train_dflash_pipeline.py"]
    assert "edited by hand" in open(os.path.join(details["drifted_copy"], "train_dflash_pipeline.py")).read()
    assert releases.status(base, build["release"])["present"] is True
    assert [r["id"] for r in releases.status(base)["releases"]] == [build["release"]]  # the copy is no release


def test_a_mode_change_is_drift(tmp_path):
    base, build, _changed, _details = installed(tmp_path, source(tmp_path))
    os.chmod(os.path.join(base, "releases", build["release"], "dflash_model.py"), 0o600)
    assert releases.status(base, build["release"])["drift"][build["release"]]["modified"] == ["dflash_model.py"]


def test_the_same_release_built_twice_is_the_same_archive(tmp_path):
    """Two jobs on one controller building one release at once (make restart of two CTs, two AWX
    jobs) replace <release>.tar.gz in turn: each push is verified against the checksum its own
    build read, so the bytes must not depend on when, or into which temporary file, it was built."""
    src = source(tmp_path)
    first = built(tmp_path, src)
    os.utime(first["archive"], (1, 1))
    import time
    time.sleep(1.1)  # the gzip header's time has a resolution of a second
    second = built(tmp_path, src)
    assert (second["release"], second["archive_sha256"]) == (first["release"], first["archive_sha256"])


def test_the_archive_dir_must_be_private(tmp_path):
    src = source(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    with pytest.raises(releases.ReleaseError, match="mode 0700"):
        release_archive.build_release(str(src), ["*"], [], str(shared))
    os.chown(shared, 65534, 65534)
    os.chmod(shared, 0o700)
    with pytest.raises(releases.ReleaseError, match="owned by uid 0"):
        release_archive.build_release(str(src), ["*"], [], str(shared))
    (tmp_path / "real").mkdir(mode=0o700)
    os.symlink(tmp_path / "real", tmp_path / "link")
    with pytest.raises(releases.ReleaseError, match="not a symlink"):
        release_archive.build_release(str(src), ["*"], [], str(tmp_path / "link"))


def test_a_planted_symlink_in_place_of_the_archive_is_replaced_not_followed(tmp_path):
    src = source(tmp_path)
    first = built(tmp_path, src)
    os.unlink(first["archive"])
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    os.symlink(victim, first["archive"])
    again = built(tmp_path, src)
    assert not os.path.islink(again["archive"]) and victim.read_text() == "keep me"
    assert releases.sha256_file(again["archive"]) == again["archive_sha256"]


def test_unpack_applies_no_owner_link_or_device_from_the_archive(tmp_path):
    payload = b"print(1)\n"
    archive = tmp_path / "a.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("t.py")
        info.size, info.uid, info.gid, info.mode = len(payload), 4242, 4242, 0o6777
        tar.addfile(info, io.BytesIO(payload))
        link = tarfile.TarInfo("evil")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    dest = tmp_path / "dest"
    dest.mkdir()
    releases.unpack(str(archive), str(dest), {"t.py": {"sha256": "x", "mode": 0o644}})
    st = os.stat(dest / "t.py")
    assert (st.st_uid, st.st_mode & 0o7777) == (os.geteuid(), 0o644)
    assert sorted(os.listdir(dest)) == ["t.py"]


def test_compile_errors_are_clean_and_a_planted_pyc_path_is_harmless(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    (tmp_path / ".dflash-pyc").mkdir()  # another CT user's plant at the old fixed path
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "bad.py").write_text("def main(:\n")
    (tree / "good.py").write_text("X = 1\n")
    errors = releases.compile_tree(str(tree), {"bad.py": {}, "good.py": {}})
    assert len(errors) == 1 and errors[0].startswith("bad.py:1: ")
    assert sorted(os.listdir(tmp_path)) == [".dflash-pyc", "tree"]  # its scratch dir is gone


def test_rollback_refuses_a_release_that_failed_to_launch_and_restore_is_exact(tmp_path):
    base, one, _c, _d = installed(tmp_path, source(tmp_path, "one"))
    two = built(tmp_path, source(tmp_path, "two", **{"train_dflash_pipeline.py": "print('v2')\n"}))
    releases.install(base, two["release"], two["archive"], two["archive_sha256"], two["files"])
    releases.activate(base, one["release"])
    releases.activate(base, two["release"])  # previous: one
    releases.record_launch(base, one["release"], "exited with status 1")
    with pytest.raises(releases.ReleaseError, match="failed to launch"):
        releases.rollback(base)
    releases.record_launch(base, one["release"])  # a healthy launch clears it
    assert releases.rollback(base) == one["release"]
    assert releases.restore(base, two["release"], None) is True
    assert (releases.link_target(os.path.join(base, "current")), releases.link_target(os.path.join(base, "previous"))) == (two["release"], None)
    assert json.load(open(os.path.join(base, releases.LAUNCH_FAILURES))) == {}
