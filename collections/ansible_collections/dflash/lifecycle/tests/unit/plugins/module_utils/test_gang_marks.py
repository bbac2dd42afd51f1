"""module_utils/preflight.py gang_marks: a gang's CTs prove they share the checkpoint directory by
the marks each writes there and reads of the others, not by listings taken at two moments."""

import os
import threading
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils import preflight
from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoint_formats, checkpoints


def wanted(me, wait=5.0):
    return {"job": "big-abc-1", "me": me, "members": ["ct400", "ct401"], "wait": wait}


def test_two_cts_of_one_directory_see_each_others_marks(tmp_path):
    found = {}
    other = threading.Thread(target=lambda: found.update(ct401=preflight.gang_marks(str(tmp_path), wanted("ct401"))))
    other.start()
    time.sleep(0.3)  # the other CT's preflight starts a little later
    found["ct400"] = preflight.gang_marks(str(tmp_path), wanted("ct400"))
    other.join()
    for host in ("ct400", "ct401"):
        assert found[host]["seen"] == ["ct400", "ct401"] and found[host]["missing"] == [], found
    assert found["ct401"]["waited_s"] >= 0.2 and found["ct400"]["waited_s"] < 0.2


def test_a_ct_with_a_directory_of_its_own_misses_the_others_mark(tmp_path):
    own = preflight.gang_marks(str(tmp_path / "own"), wanted("ct401", wait=0.3))
    assert own["seen"] == ["ct401"] and own["missing"] == ["ct400"] and own["waited_s"] >= 0.3


def test_the_marks_are_no_checkpoint_and_old_jobs_are_forgotten(tmp_path):
    old = tmp_path / checkpoint_formats.GANG_MARKS / "big-old-1"
    old.mkdir(parents=True)
    (old / "ct400").write_text("ct400 0\n")
    stamp = time.time() - 2 * 86400
    os.utime(old, (stamp, stamp))
    (tmp_path / "step_10").mkdir()
    (tmp_path / "step_10" / "model.json").write_text("{}")
    preflight.gang_marks(str(tmp_path), wanted("ct400", wait=0))
    assert sorted(os.listdir(tmp_path / checkpoint_formats.GANG_MARKS)) == ["big-abc-1"]
    directory = checkpoints.Directory(str(tmp_path))
    assert list(directory.entries()) == ["step_10"] and directory.temp_entries() == []


def test_check_mode_writes_no_mark(tmp_path):
    found = preflight.gang_marks(str(tmp_path), wanted("ct400"), check_mode=True)
    assert found["checked"] is False and not os.path.exists(tmp_path / checkpoint_formats.GANG_MARKS)


def test_the_stop_request_path_is_checked_before_anything_is_touched(tmp_path):
    """(module_utils/preflight.py stop_request_place, beside the gang's marks: both are places
    the preflight proves before a stop needs them.)"""
    def place(path, run_dir):
        checks = []
        preflight.stop_request_place(str(path), str(run_dir), lambda *a, **k: checks.append(a))
        return checks[0]

    assert place(tmp_path / "stop-request", tmp_path)[1:] == (True, f"{tmp_path} is writable", "")
    assert place(tmp_path / "run" / "stop-request", tmp_path / "run")[1:] == (
        True, f"{tmp_path / 'run'} is missing (the launch creates it)", "")
    missing = place(tmp_path / "elsewhere" / "stop-request", tmp_path / "run")
    assert missing[1:3] == (False, f"{tmp_path / 'elsewhere'} is missing"), missing
    assert "trainer_run_stop_request_path" in missing[3]
    (tmp_path / "adir").mkdir()
    assert place(tmp_path / "adir", tmp_path)[1:3] == (False, f"{tmp_path / 'adir'} is a directory")
