"""module_utils/ct/model_stage.py: what a model staged into shared memory is compared and verified by,
what the CT's memory cgroup can still take (v1 and v2 files as the kernel writes them), and the
copy that lands whole or not at all. The copies go to the host's own /dev/shm, a real tmpfs."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import model_stage

GIB = 1024 ** 3


@pytest.fixture
def shm(tmp_path):
    """A directory in /dev/shm (a tmpfs), removed afterwards."""
    path = f"/dev/shm/dflash-unit-{os.getpid()}-{time.monotonic_ns()}"
    os.mkdir(path)
    yield path
    subprocess.run(["rm", "-rf", path], check=True)


def model(root, shards=3, size=3 << 20, sha256=True, index=True):
    """A model directory: config.json, shards, model.safetensors.index.json and a sha256sum file."""
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "config.json"), "w", encoding="utf-8") as handle:
        json.dump({"model_type": "qwen3"}, handle)
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    for number, name in enumerate(names):
        with open(os.path.join(root, name), "wb") as handle:
            handle.write(bytes([number]) * size)
    if index:
        with open(os.path.join(root, model_stage.INDEX), "w", encoding="utf-8") as handle:
            json.dump({"metadata": {}, "weight_map": {f"w{i}": n for i, n in enumerate(names)}}, handle)
    if sha256:
        with open(os.path.join(root, "model.sha256"), "w", encoding="utf-8") as handle:
            for name in names:
                with open(os.path.join(root, name), "rb") as shard:
                    handle.write(f"{hashlib.sha256(shard.read()).hexdigest()}  {name}\n")
    return names


def room(free=64 * GIB):
    return {"cgroup": "v1", "path": "/sys/fs/cgroup/memory", "limit": free, "usage": 0, "reclaimable": 0, "free": free}


def test_a_missing_model_is_staged_whole_and_then_matches(shm, tmp_path):
    source, target = str(tmp_path / "persistent"), os.path.join(shm, "models", "target")
    model(source)
    plan = model_stage.plan(target, source, 0, room())
    assert plan["needed"] and plan["state"] == "missing" and plan["fits"]
    assert plan["files"] == 6 and plan["bytes"] == sum(os.path.getsize(os.path.join(source, n)) for n in os.listdir(source))
    assert plan["verified_by"] == ("SHA-256 of 3 files (model.sha256), the 3 shards of model.safetensors.index.json, "
                                   "names and sizes")
    seen = []
    staged = model_stage.stage(plan, workers=2, progress=lambda **fields: seen.append(fields))
    assert staged["state"] == "staged" and staged["workers"] == 2 and staged["rate"] > 0
    assert seen[-1]["bytes_done"] == seen[-1]["bytes"] == plan["bytes"]
    assert model_stage.files_of(target) == model_stage.files_of(source)  # names, sizes, times
    assert sorted(os.listdir(os.path.dirname(target))) == ["target"]  # nothing left beside it
    again = model_stage.plan(target, source, 0, room())
    assert not again["needed"] and again["state"] == "matches"
    assert model_stage.words(again).startswith(f"model {target} matches {source} (6 files,")


def test_a_shard_rewritten_at_its_old_size_differs_by_its_time(shm, tmp_path):
    source, target = str(tmp_path / "persistent"), os.path.join(shm, "target")
    names = model(source, sha256=False, index=False)
    model_stage.stage(model_stage.plan(target, source, 0, room()))
    time.sleep(0.01)
    with open(os.path.join(source, names[1]), "r+b") as handle:
        handle.write(b"\xff")
    plan = model_stage.plan(target, source, 0, room())
    assert plan["state"] == "differs" and plan["differences"][0].startswith(f"{names[1]}: changed in the persistent copy at")
    with open(os.path.join(source, names[2]), "ab") as handle:
        handle.write(b"\0")
    os.remove(os.path.join(source, names[0]))
    with open(os.path.join(target, "stray.bin"), "wb") as handle:
        handle.write(b"x")
    differences = model_stage.plan(target, source, 0, room())["differences"]
    assert differences == [f"{names[0]}: not in the persistent copy", "stray.bin: not in the persistent copy",
                           differences[2], f"{names[2]}: {3 << 20} bytes, not {(3 << 20) + 1}"]


def test_a_copy_that_does_not_match_its_sha256_never_reaches_the_target(shm, tmp_path):
    source, target = str(tmp_path / "persistent"), os.path.join(shm, "target")
    names = model(source)
    model_stage.stage(model_stage.plan(target, source, 0, room()))
    before = model_stage.files_of(target)
    with open(os.path.join(source, names[0]), "r+b") as handle:  # bit rot after its sum was taken
        handle.write(b"\x7f")
    plan = model_stage.plan(target, source, 0, room())
    with pytest.raises(model_stage.StageError, match=f"{names[0]}: SHA-256 [0-9a-f]{{64}} does not match"):
        model_stage.stage(plan)
    assert model_stage.files_of(target) == before


def test_a_killed_copy_leaves_the_target_as_it_was_and_the_rerun_converges(shm, tmp_path):
    source, target = str(tmp_path / "persistent"), os.path.join(shm, "target")
    model(source, size=8 << 20)
    model_stage.stage(model_stage.plan(target, source, 0, room()))
    before = model_stage.files_of(target)
    model(source, size=9 << 20)  # a new revision
    # the copy dies by SIGKILL after its first chunk, as when its CT session is cut
    script = ("import os, signal, sys\n"
              "from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import model_stage\n"
              f"p = model_stage.plan({target!r}, {source!r}, 0, {room()!r})\n"
              "model_stage.stage(p, workers=1, progress=lambda **f: os.kill(os.getpid(), signal.SIGKILL))\n")
    collections = os.path.abspath(os.path.join(os.path.dirname(model_stage.__file__), *[os.pardir] * 6))
    env = dict(os.environ, PYTHONPATH=collections)
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False)
    assert res.returncode == -signal.SIGKILL, res.stderr
    staging, _replaced = model_stage.aside(target)
    assert os.path.isdir(staging) and model_stage.files_of(target) == before
    plan = model_stage.plan(target, source, 0, room())
    assert plan["needed"] and plan["leftover"] > 0  # the cut copy's room counts as free
    model_stage.stage(plan)
    assert model_stage.files_of(target) == model_stage.files_of(source) and not os.path.exists(staging)


def test_a_model_that_does_not_fit_names_its_size_the_reserve_and_what_the_ct_can_take(shm, tmp_path):
    source, target = str(tmp_path / "persistent"), os.path.join(shm, "target")
    model(source, size=1 << 20)
    plan = model_stage.plan(target, source, int(2e9), room(free=int(1.5e9)))
    assert not plan["fits"] and plan["can_take"] == int(1.5e9)
    assert model_stage.refusal(plan) == (
        f"model {target} does not fit: it needs 0.0 GB plus a reserve of 2.0 GB for the trainer's own memory "
        "(trainer_model_stage_reserve_gb), and the CT can take 1.5 GB (memory cgroup v1: limit 1.5 GB, in use "
        f"0.0 GB, 0.0 GB of it reclaimable page cache; its tmpfs has {model_stage.gb(plan['shm_free'])} free)")
    assert model_stage.plan(target, source, int(1e9), room(free=int(1.5e9)))["fits"]


@pytest.mark.parametrize("case, message", [
    ("no source", "the persistent copy {source} does not exist"),
    ("no config", "{source} is not a model directory (no config.json)"),
    ("not tmpfs", "{target} is not in /dev/shm or another tmpfs (it is on"),
    ("shard missing", "the persistent copy lacks 1 shards that model.safetensors.index.json names"),
    ("relative", "both paths must be absolute"),
])
def test_bad_input_is_one_line_naming_the_model(shm, tmp_path, case, message):
    source, target = str(tmp_path / "persistent"), os.path.join(shm, "target")
    if case != "no source":
        names = model(source)
    if case == "no config":
        os.remove(os.path.join(source, "config.json"))
    if case == "not tmpfs":
        target = str(tmp_path / "on-disk")
    if case == "shard missing":
        os.remove(os.path.join(source, names[1]))
    if case == "relative":
        target = "models/target"
    with pytest.raises(model_stage.StageError) as err:
        model_stage.plan(target, source, 0, room())
    assert str(err.value).startswith(f"{target} from {source}: ")
    assert message.format(source=source, target=target) in str(err.value)
    assert not os.path.exists(target) or case == "not tmpfs"


def cgroup_v1(root, levels):
    """A cgroup v1 memory hierarchy: levels are (path, limit, usage, inactive_file)."""
    for path, limit, usage, inactive in levels:
        directory = root / "memory" / path.lstrip("/")
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "memory.limit_in_bytes").write_text(f"{limit}\n")
        (directory / "memory.usage_in_bytes").write_text(f"{usage}\n")
        (directory / "memory.stat").write_text(f"cache 0\nshmem {usage}\ntotal_inactive_file {inactive}\n")


def test_memory_room_under_cgroup_v1_is_the_tightest_level_with_its_page_cache_reclaimable(tmp_path):
    unlimited = 9223372036854771712  # v1's "no limit"
    cgroup_v1(tmp_path, [("/", unlimited, 10 * GIB, 0), ("/lxc", 8 * GIB, 6 * GIB, GIB),
                         ("/lxc/ns", unlimited, 5 * GIB, 0)])
    (tmp_path / "self-cgroup").write_text("9:name=systemd:/lxc/ns\n4:memory:/lxc/ns\n0::/lxc/ns\n")
    found = model_stage.memory_room(str(tmp_path), str(tmp_path / "self-cgroup"))
    assert found == {"cgroup": "v1", "path": str(tmp_path / "memory" / "lxc"), "limit": 8 * GIB, "usage": 6 * GIB,
                     "reclaimable": GIB, "free": 3 * GIB}


def test_memory_room_under_cgroup_v2(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    (tmp_path / "memory.max").write_text("max\n")
    directory = tmp_path / "lxc" / "200"
    directory.mkdir(parents=True)
    (directory / "memory.max").write_text(f"{64 * GIB}\n")
    (directory / "memory.current").write_text(f"{60 * GIB}\n")
    (directory / "memory.stat").write_text(f"anon 1\nfile 5\ninactive_file {2 * GIB}\nshmem 54\n")
    (tmp_path / "self-cgroup").write_text("0::/lxc/200\n")
    found = model_stage.memory_room(str(tmp_path), str(tmp_path / "self-cgroup"))
    assert found["cgroup"] == "v2" and found["limit"] == 64 * GIB and found["free"] == 6 * GIB


def test_memory_room_without_a_limit_is_none(tmp_path):
    cgroup_v1(tmp_path, [("/", 9223372036854771712, GIB, 0)])
    (tmp_path / "self-cgroup").write_text("4:memory:/\n")
    assert model_stage.memory_room(str(tmp_path), str(tmp_path / "self-cgroup")) is None


def test_the_users_of_a_model_are_the_processes_that_hold_or_map_its_files(shm):
    path = os.path.join(shm, "target")
    os.mkdir(path)
    with open(os.path.join(path, "shard"), "wb") as handle:
        handle.write(b"x" * 4096)
    holder = subprocess.Popen(["sleep", "30"], stdin=open(os.path.join(path, "shard"), "rb"))  # noqa: SIM115
    try:
        users = model_stage.users_of([path])
        assert [u["pid"] for u in users] == [holder.pid] and users[0]["cmd"] == "sleep 30"
        assert model_stage.users_of([os.path.join(shm, "other")]) == []
    finally:
        holder.kill()
        holder.wait()
