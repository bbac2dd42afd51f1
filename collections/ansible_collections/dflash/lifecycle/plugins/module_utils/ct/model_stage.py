# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Put a model back into shared memory from its persistent copy (Python 3.8 compatible).

The field's target model lives in /dev/shm, a tmpfs that every CT restart wipes (a node reboot,
a migration, a memory or config change). A tmpfs is charged to the CT's memory cgroup, so a copy
that does not fit beside the trainer's own host memory gets the trainer OOM-killed later: it is
refused before a byte is copied. The copy goes into a directory beside the target and is renamed
into place once every file is complete and verified, so a cut copy never stands at the path the
trainer loads; a rerun removes what a cut copy left and copies again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import threading
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import rundir

INDEX = "model.safetensors.index.json"
CHUNK = 16 * 1024 * 1024
GB = 1e9


class StageError(Exception):
    """A model that cannot be staged: the message is one line naming the model and why."""


def gb(count):
    return f"{count / GB:.1f} GB"


def files_of(root):
    """{relative path: (size, modification time in ns)} of the regular files under root. A copy
    keeps its source's modification time, so a shard rewritten at its old size still differs."""
    found = {}
    for top, dirs, names in os.walk(root):
        dirs.sort()
        for name in names:
            path = os.path.join(top, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                found[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns)
    return found


def sizes(files):
    return {rel: stamp[0] for rel, stamp in files.items()}


def existing(path):
    """path, or its nearest parent that exists (a restarted CT's /dev/shm holds no directory)."""
    path = os.path.realpath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def mount_of(path):
    """(mount point, file system type) of the mount that holds path (or its nearest existing
    parent), from /proc/self/mountinfo."""
    path = existing(path)
    best = ("/", "unknown")
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        for line in handle:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")
            fstype = fields[fields.index("-") + 1]
            inside = path == point or path.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best[0]):
                best = (point, fstype)
    return best


def manifest(source, files):
    """What a copy is verified by: the shards model.safetensors.index.json names, and the
    SHA-256 sums of every *.sha256 file (sha256sum's format) - or names and sizes alone."""
    sums, sources = {}, []
    for rel in sorted(files):
        if not rel.endswith(".sha256"):
            continue
        sources.append(rel)
        with open(os.path.join(source, rel), encoding="utf-8") as handle:
            for line in handle:
                parts = line.strip().split(None, 1)
                if len(parts) == 2 and len(parts[0]) == 64:
                    sums[os.path.normpath(os.path.join(os.path.dirname(rel), parts[1].lstrip("*")))] = parts[0].lower()
    shards = []
    if INDEX in files:
        with open(os.path.join(source, INDEX), encoding="utf-8") as handle:
            shards = sorted(set((json.load(handle).get("weight_map") or {}).values()))
    words = []
    if sums:
        words.append(f"SHA-256 of {len(sums)} files ({', '.join(sources)})")
    if shards:
        words.append(f"the {len(shards)} shards of {INDEX}")
    words.append("names and sizes")
    return {"sha256": sums, "shards": shards, "verified_by": ", ".join(words)}


def _read_int(path):
    with open(path, encoding="utf-8") as handle:
        text = handle.read().strip()
    return None if text == "max" else int(text)


def _stat_field(path, key):
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            name, _space, value = line.partition(" ")
            if name == key:
                return int(value)
    return 0


def memory_room(cgroup_root="/sys/fs/cgroup", proc_cgroup="/proc/self/cgroup"):
    """What the CT's memory cgroup can still take: the limit minus what is in use, less the
    page cache it can reclaim, over this process's cgroup and every one above it (the tightest
    counts). cgroup v2 (Proxmox VE 7 and later): memory.max, memory.current, inactive_file;
    v1: memory.limit_in_bytes, memory.usage_in_bytes, total_inactive_file. None when neither is
    readable."""
    v2 = os.path.exists(os.path.join(cgroup_root, "cgroup.controllers"))
    with open(proc_cgroup, encoding="utf-8") as handle:
        lines = [line.rstrip("\n").split(":", 2) for line in handle]
    if v2:
        own = next((path for hierarchy, _controllers, path in lines if hierarchy == "0"), "/")
        base, files = cgroup_root, ("memory.max", "memory.current", "memory.stat", "inactive_file")
    else:
        own = next((path for _hierarchy, controllers, path in lines if "memory" in controllers.split(",")), "/")
        base = os.path.join(cgroup_root, "memory")
        files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.stat", "total_inactive_file")
    tightest = None
    path = own
    while True:
        directory = os.path.join(base, path.lstrip("/"))
        try:
            limit = _read_int(os.path.join(directory, files[0]))
            usage = _read_int(os.path.join(directory, files[1]))
            reclaimable = _stat_field(os.path.join(directory, files[2]), files[3])
        except (OSError, ValueError):
            limit = None
        # v1 writes "no limit" as a page-rounded LONG_MAX
        if limit is not None and limit < 1 << 60:
            room = {"cgroup": "v2" if v2 else "v1", "path": directory, "limit": limit, "usage": usage,
                    "reclaimable": reclaimable, "free": max(0, limit - usage + reclaimable)}
            if tightest is None or room["free"] < tightest["free"]:
                tightest = room
        if path in ("/", ""):
            return tightest
        path = os.path.dirname(path.rstrip("/")) or "/"


def users_of(paths, proc="/proc"):
    """[{pid, cmd}] of the processes that map or hold open a file under any of paths."""
    prefixes = tuple(p.rstrip("/") + "/" for p in paths)
    found = []
    for name in os.listdir(proc):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        held = set()
        try:
            with open(os.path.join(proc, name, "maps"), encoding="utf-8", errors="replace") as handle:
                held.update(line.split(None, 5)[5].strip() for line in handle if len(line.split(None, 5)) == 6)
            fd_dir = os.path.join(proc, name, "fd")
            for fd in os.listdir(fd_dir):
                try:
                    held.add(os.readlink(os.path.join(fd_dir, fd)))
                except OSError:
                    continue
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if any(h.startswith(prefixes) or h.rstrip("/") + "/" in prefixes for h in held):
            try:
                with open(os.path.join(proc, name, "cmdline"), "rb") as handle:
                    cmd = handle.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
            except OSError:
                cmd = ""
            found.append({"pid": int(name), "cmd": cmd[:200]})
    return found


def in_use(target, users):
    """A model held by users (users_of) in words."""
    return f"model {target} is in use by " + ", ".join(f"PID {u['pid']} ({u['cmd'][:80]})" for u in users)


def aside(target):
    """The two directories beside target: the copy being made, the old copy being replaced."""
    parent, name = os.path.split(target.rstrip("/"))
    return os.path.join(parent, f".{name}.staging"), os.path.join(parent, f".{name}.replaced")


def plan(target, source, reserve_bytes, room=None):
    """What staging target from source takes: whether it is needed (the target is missing, or
    differs from the source in its files, sizes or modification times), its bytes, what it is verified by, and
    whether it fits. Raises StageError for a source that is no model or a target in no tmpfs."""
    where = f"{target} from {source}"
    if not os.path.isabs(target) or not os.path.isabs(source):
        raise StageError(f"{where}: both paths must be absolute")
    if not os.path.isdir(source):
        raise StageError(f"{where}: the persistent copy {source} does not exist")
    if not os.path.isfile(os.path.join(source, "config.json")):
        raise StageError(f"{where}: {source} is not a model directory (no config.json)")
    point, fstype = mount_of(os.path.dirname(target.rstrip("/")))
    if fstype != "tmpfs":
        raise StageError(f"{where}: {target} is not in /dev/shm or another tmpfs "
                         f"(it is on {fstype}, mounted at {point})")
    wanted = files_of(source)
    checks = manifest(source, wanted)
    absent = [s for s in checks["shards"] if s not in wanted]
    if absent:
        raise StageError(f"{where}: the persistent copy lacks {len(absent)} shards that {INDEX} names "
                         f"({', '.join(absent[:3])})")
    have = files_of(target) if os.path.isdir(target) else None
    differences = [] if have is not None else ["missing"]
    if have is not None:
        differences += [f"{rel}: missing" for rel in sorted(set(wanted) - set(have))]
        differences += [f"{rel}: not in the persistent copy" for rel in sorted(set(have) - set(wanted))]
        for rel in sorted(set(wanted) & set(have)):
            if have[rel][0] != wanted[rel][0]:
                differences.append(f"{rel}: {have[rel][0]} bytes, not {wanted[rel][0]}")
            elif have[rel][1] != wanted[rel][1]:
                differences.append(f"{rel}: changed in the persistent copy at "
                                   + time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(wanted[rel][1] / 1e9)) + " UTC")
    size = sum(sizes(wanted).values())
    # what a cut copy of an earlier run left is removed before copying: its room counts as free
    leftover = sum(sum(sizes(files_of(d)).values()) for d in aside(target) if os.path.isdir(d))
    room = memory_room() if room is None else room
    shm = os.statvfs(existing(os.path.dirname(target.rstrip("/"))))
    shm_free = shm.f_bavail * shm.f_frsize + leftover
    can_take = shm_free if room is None else min(shm_free, room["free"] + leftover)
    needed = bool(differences)
    fits = not needed or (size <= shm_free and (room is None or size + reserve_bytes <= room["free"] + leftover))
    return {"target": target, "source": source, "needed": needed,
            "state": "matches" if not needed else "missing" if have is None else "differs",
            "differences": differences[:10], "bytes": size, "files": len(wanted),
            "verified_by": checks["verified_by"], "reserve": reserve_bytes, "can_take": can_take,
            "shm_free": shm_free, "memory": room, "leftover": leftover, "fits": fits}


def refusal(p):
    """The one line that says why the model does not fit: its size, the reserve, what the CT can
    take."""
    memory = p["memory"]
    cgroup = (f"memory cgroup {memory['cgroup']}: limit {gb(memory['limit'])}, in use {gb(memory['usage'])}, "
              f"{gb(memory['reclaimable'])} of it reclaimable page cache" if memory else "no memory cgroup limit")
    return (f"model {p['target']} does not fit: it needs {gb(p['bytes'])} plus a reserve of {gb(p['reserve'])} "
            f"for the trainer's own memory (trainer_model_stage_reserve_gb), and the CT can take "
            f"{gb(p['can_take'])} ({cgroup}; its tmpfs has {gb(p['shm_free'])} free)")


def words(p):
    """A plan, or a staged model, in a line."""
    if p.get("seconds") is not None:
        return (f"model {p['target']} staged from {p['source']}: {gb(p['bytes'])} in {p['seconds']:.1f}s "
                f"({p['rate'] / 1e6:.0f} MB/s, {p['workers']} streams), verified by {p['verified_by']}")
    if not p["needed"]:
        return f"model {p['target']} matches {p['source']} ({p['files']} files, {gb(p['bytes'])})"
    why = "missing" if p["state"] == "missing" else "differs: " + "; ".join(p["differences"][:3])
    return (f"model {p['target']} {why}: {gb(p['bytes'])} to stage from {p['source']}, "
            + ("fits" if p["fits"] else "does NOT fit") + f" (the CT can take {gb(p['can_take'])})")


class Copier:
    """Copies files on a few threads (the kernel copies, or Python reads and hashes where a
    SHA-256 is to be checked: hashlib and file I/O both leave the GIL), counting bytes."""

    def __init__(self, total, progress=None):
        self.total, self.done, self.began = total, 0, time.monotonic()
        self.lock = threading.Lock()
        self.progress = progress or (lambda **_: None)

    def count(self, amount, source_fd):
        os.posix_fadvise(source_fd, 0, os.lseek(source_fd, 0, os.SEEK_CUR), os.POSIX_FADV_DONTNEED)
        with self.lock:
            self.done += amount
            done = self.done
        elapsed = time.monotonic() - self.began
        rate = done / elapsed if elapsed > 0 else 0.0
        self.progress(bytes_done=done, bytes=self.total, rate=round(rate),
                      eta=round((self.total - done) / rate, 1) if rate else None, elapsed=round(elapsed, 1))

    def copy(self, src, dst, sha256=None):
        """Copy src to dst, with its mode and modification time; with sha256, the bytes written
        are hashed and must match it."""
        digest = hashlib.sha256() if sha256 else None
        with open(src, "rb") as reader, open(dst, "wb") as writer:
            # read ahead further, and drop what was read: the source's page cache would be charged
            # to the CT's memory cgroup beside the model, and reclaimed under the copy's feet
            os.posix_fadvise(reader.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
            kernel = digest is None
            while kernel:
                try:
                    sent = os.sendfile(writer.fileno(), reader.fileno(), None, CHUNK)
                except OSError:  # no sendfile between these file systems: read and write below
                    reader.seek(writer.tell())
                    kernel = False
                    continue
                if not sent:
                    break  # the whole file was sent
                self.count(sent, reader.fileno())
            else:  # a SHA-256 to check, or no sendfile
                for chunk in iter(lambda: reader.read(CHUNK), b""):
                    writer.write(chunk)
                    if digest is not None:
                        digest.update(chunk)
                    self.count(len(chunk), reader.fileno())
        shutil.copystat(src, dst)
        if digest is not None and digest.hexdigest() != sha256:
            raise StageError(f"{src}: SHA-256 {digest.hexdigest()} does not match its manifest's {sha256}")


def stage(p, workers=4, progress=None):
    """Copy p's source into the directory beside its target, verify it, rename it into place.
    The caller has made sure nothing uses the target. Returns p with the figures of the copy."""
    from concurrent.futures import ThreadPoolExecutor  # only a copy needs it, not every preflight

    staging, replaced = aside(p["target"])
    for leftover in (staging, replaced):  # a cut copy of an earlier run
        if os.path.lexists(leftover):
            shutil.rmtree(leftover)
    wanted = files_of(p["source"])
    checks = manifest(p["source"], wanted)
    os.makedirs(os.path.dirname(staging), 0o755, exist_ok=True)
    os.mkdir(staging, 0o755)
    copier = Copier(sum(sizes(wanted).values()), progress)
    for rel in wanted:
        os.makedirs(os.path.dirname(os.path.join(staging, rel)), exist_ok=True)
    # the biggest first, so that the streams end together
    order = sorted(wanted, key=lambda rel: -wanted[rel][0])
    streams = max(1, min(workers, len(order)))
    with ThreadPoolExecutor(streams) as pool:
        for future in [pool.submit(copier.copy, os.path.join(p["source"], rel), os.path.join(staging, rel),
                                   checks["sha256"].get(rel)) for rel in order]:
            future.result()
    landed = files_of(staging)
    if landed != wanted:  # names, sizes and times
        wrong = sorted(rel for rel in set(wanted) | set(landed) if landed.get(rel) != wanted.get(rel))
        raise StageError(f"model {p['target']}: the copy differs from {p['source']} in {', '.join(wrong[:3])}")
    seconds = time.monotonic() - copier.began
    if os.path.isdir(p["target"]):
        os.rename(p["target"], replaced)
        os.rename(staging, p["target"])
        shutil.rmtree(replaced)
    else:
        os.rename(staging, p["target"])
    return dict(p, needed=False, state="staged", seconds=round(seconds, 2), workers=streams,
                rate=round(copier.done / seconds) if seconds > 0 else 0, verified_by=checks["verified_by"])


class StageRefused(StageError):
    """Nothing was copied, or the copy failed without replacing its target; models: the plans
    as far as they got."""

    def __init__(self, msg, models):
        super().__init__(msg)
        self.models = models


def stage_all(models, reserve_gb, workers, progress_file, trainer_running, check_mode=False):
    """Stage every model (target -> source) whose plan needs it, one after the other: the model_stage
    module's work, and the redeploy's between its stop and its launch. trainer_running() -> the
    running trainer (with .pid) or None: a model is never staged under it. Returns (changed, the
    plans and copies, msg); raises StageRefused."""
    if workers < 1:
        raise StageRefused(f"workers: {workers}: at least 1", [])
    try:
        plans = [plan(target, str(source), int(reserve_gb * GB)) for target, source in sorted(models.items())]
    except StageError as err:
        raise StageRefused(f"models: {err}. Nothing was copied", []) from None
    unfit = [p for p in plans if not p["fits"]]
    if unfit and not check_mode:
        raise StageRefused("; ".join(refusal(p) for p in unfit) + ". Nothing was copied", plans)
    running = trainer_running() if any(p["needed"] for p in plans) and not check_mode else None
    if running is not None:
        raise StageRefused(f"the trainer PID {running.pid} runs: a model is never staged under it (a redeploy "
                           "stops it first). Nothing was copied", plans)
    done = []
    for p in plans:
        if not p["needed"] or check_mode:
            done.append(p)
            continue
        users = users_of([p["target"]])
        if users:
            raise StageRefused(in_use(p["target"], users) + ": it is not replaced under a running "
                               "process. Nothing was copied", plans)
        rundir.secure_dir(os.path.dirname(progress_file))
        progress = rundir.ProgressFile(progress_file, lambda p=p: {"target": p["target"]})
        try:
            done.append(stage(p, workers, progress))
        except (OSError, StageError) as err:
            raise StageRefused(f"model {p['target']}: staging failed: {err}. The target was not replaced",
                               done + [p]) from None
        finally:
            progress.close()
    return (any(p["needed"] or p["state"] == "staged" for p in done), done, "; ".join(words(p) for p in done))
