# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Content-addressed releases of the trainer code, the CT half (Python 3.8 compatible).

``<base>/releases/<id>/`` holds one release and its manifest (``.dflash-release.json``:
every file's mode and sha256); ``<base>/current`` and ``<base>/previous`` are symlinks into
``releases/``. An archive from the controller (plugin_utils/release_archive.py) is unpacked
under a temporary name, every file checked against the manifest, every .py compiled by the
CT's own python, then renamed into place: a half-pushed release is never visible.

A release whose files no longer match its manifest has drifted: a file changed, added or
removed in place (an editor, ``cat >`` or ``pct push`` through the legacy path
``/root/train_dflash_pipeline.py``, which links into ``current``). Every read of the installed
releases verifies them by checksum, so a drifted release is never reported as installed;
reinstalling it sets the drifted tree aside as ``releases/.drifted-<id>-<time>/`` (the edit is
kept, never deleted) and unpacks the release afresh.
"""

from __future__ import annotations

import hashlib
import json
import os
import py_compile
import shutil
import tarfile
import tempfile
import time

META = ".dflash-release.json"
TMP_PREFIX = ".tmp-"
DRIFTED_PREFIX = ".drifted-"
# written by Python itself next to imported modules: not part of a release, not drift
IGNORED_DIRS = ("__pycache__",)
LAUNCH_FAILURES = "launch-failures.json"


class ReleaseError(Exception):
    pass


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def releases_dir(base):
    return os.path.join(base, "releases")


def read_meta(path):
    try:
        with open(os.path.join(path, META)) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def link_target(path):
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def check_paths(manifest):
    for rel in manifest:
        parts = rel.split("/")
        if rel.startswith("/") or ".." in parts or "" in parts or rel == META:
            raise ReleaseError(f"unsafe path in manifest: {rel!r}")


def verify(path, manifest):
    """Drift of the release tree at path against its manifest: files modified (content or
    mode), added and removed. Empty lists when it matches."""
    found = set()
    for root, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d not in IGNORED_DIRS)
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), path)
            if rel != META:
                found.add(rel)
    modified = []
    for rel in sorted(found & set(manifest)):
        full = os.path.join(path, rel)
        try:
            mode = os.lstat(full).st_mode & 0o777
            same = not os.path.islink(full) and sha256_file(full) == manifest[rel]["sha256"]
        except OSError:
            same, mode = False, None
        if not same or mode != manifest[rel]["mode"]:
            modified.append(rel)
    return {"modified": modified, "added": sorted(found - set(manifest)),
            "removed": sorted(set(manifest) - found)}


def drifted(drift):
    return bool(drift and (drift["modified"] or drift["added"] or drift["removed"]))


def status(base, release=None):
    """What is installed: releases, current, previous, the current file list, and the drift of
    the releases that matter (current, previous and release), verified by checksum."""
    installed = []
    rdir = releases_dir(base)
    if os.path.isdir(rdir):
        for name in sorted(os.listdir(rdir)):
            meta = read_meta(os.path.join(rdir, name))
            if not name.startswith((TMP_PREFIX, DRIFTED_PREFIX)) and meta is not None:
                installed.append({"id": name, "installed_at": meta.get("installed_at")})
    ids = {r["id"] for r in installed}
    current = link_target(os.path.join(base, "current"))
    previous = link_target(os.path.join(base, "previous"))
    drift = {}
    for rid in dict.fromkeys((current, previous, release)):  # each release verified once
        if rid in ids:
            meta = read_meta(os.path.join(rdir, rid))
            found = verify(os.path.join(rdir, rid), meta.get("files", {}))
            if drifted(found):
                drift[rid] = found
    current_meta = read_meta(os.path.join(rdir, current)) if current in ids else None
    return {
        "releases": installed,
        "current": current,
        "previous": previous,
        # installed and whole: a drifted release is not the release its id names
        "present": release in ids and release not in drift,
        "drift": drift,
        "current_files": sorted((current_meta or {}).get("files", {})),
        "current_manifest": (current_meta or {}).get("files", {}),
        "launch_failures": read_launch_failures(base),
    }


def compared(base, release, files):
    """status() with the changes from the current release to release's manifest (files), and a
    diff of the two file lists when release is not installed (or has drifted)."""
    state = status(base, release)
    state["changes"] = changes(state["current_manifest"], files)
    if not state["present"]:
        state["diff"] = {"before": "".join(f + "\n" for f in state["current_files"]),
                         "after": "".join(f + "\n" for f in sorted(files)),
                         "before_header": f"{base}/current", "after_header": release}
    return state


def changes(old, new):
    """Files added, removed and modified between two manifests."""
    return {
        "added": sorted(set(new) - set(old)),
        "removed": sorted(set(old) - set(new)),
        "modified": sorted(r for r in set(new) & set(old) if new[r] != old[r]),
    }


def unpack(archive, dest, manifest):
    """The archive's regular files that the manifest names, written by us into dest: no link,
    device or owner from the archive is ever applied (Pythons without tarfile's data filter
    included)."""
    with tarfile.open(archive) as tar:
        members = {m.name: m for m in tar.getmembers() if m.isfile()}
        unexpected, missing = sorted(set(members) - set(manifest)), sorted(set(manifest) - set(members))
        if unexpected or missing:
            raise ReleaseError(f"archive does not match the manifest: unexpected {unexpected}, "
                               f"missing {missing}")
        for rel in sorted(manifest):
            target = os.path.join(dest, rel)
            os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as out, tar.extractfile(members[rel]) as source:
                shutil.copyfileobj(source, out)
            os.chmod(target, manifest[rel]["mode"])


def compile_tree(root, manifest):
    """py_compile every .py with this interpreter (the CT's), into a private temporary
    directory; 'file:line: message' on error."""
    errors = []
    scratch = tempfile.mkdtemp(prefix="dflash-pyc-")  # 0700, ours: nobody can plant it
    try:
        for rel in sorted(r for r in manifest if r.endswith(".py")):
            try:
                py_compile.compile(os.path.join(root, rel), cfile=os.path.join(scratch, "out.pyc"),
                                   doraise=True)
            except py_compile.PyCompileError as err:
                value = err.exc_value
                line = getattr(value, "lineno", None) or "?"
                message = getattr(value, "msg", None) or str(value)
                errors.append(f"{rel}:{line}: {message}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return errors


def set_aside(path, release):
    """Move a drifted release out of the way, kept for the operator. Returns where."""
    aside = os.path.join(os.path.dirname(path), f"{DRIFTED_PREFIX}{release}-{time.strftime('%Y%m%dT%H%M%S')}")
    os.rename(path, aside)
    return aside


def install(base, release, archive, archive_sha256, manifest, keep=5):
    """Install archive as release; a drifted copy is set aside first. Returns (changed,
    details)."""
    check_paths(manifest)
    rdir = releases_dir(base)
    final = os.path.join(rdir, release)
    details = {"release": release, "path": final}
    meta = read_meta(final)
    if meta is not None:
        drift = verify(final, meta.get("files", {}))
        if not drifted(drift):
            return False, details
        details.update(repaired_drift=drift, drifted_copy=None)
    if not os.path.isfile(archive):
        raise ReleaseError(f"{archive} is not in the CT: the copy into the container failed "
                           "(pct push exits 0 even when it could not write the file)")
    try:
        got = sha256_file(archive)
        if got != archive_sha256:
            raise ReleaseError(f"{archive} has sha256 {got}, the controller sent {archive_sha256}: "
                               "the copy into the container is incomplete or corrupt")
        os.makedirs(rdir, mode=0o755, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{release}-", dir=rdir)
        try:
            unpack(archive, tmp, manifest)
            for rel, entry in manifest.items():
                if sha256_file(os.path.join(tmp, rel)) != entry["sha256"]:
                    raise ReleaseError(f"{rel}: checksum differs from the controller's")
            errors = compile_tree(tmp, manifest)
            if errors:
                raise ReleaseError("compile gate failed, nothing was changed: " + "; ".join(errors))
            with open(os.path.join(tmp, META), "w") as handle:
                json.dump({"id": release, "installed_at": time.time(), "files": manifest}, handle)
            os.chmod(tmp, 0o755)
            if "repaired_drift" in details:
                details["drifted_copy"] = set_aside(final, release)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    except (OSError, tarfile.TarError) as err:
        raise ReleaseError(f"install of {release} failed: {err}") from None
    finally:
        if os.path.exists(archive):
            os.unlink(archive)
    details["pruned"] = prune(base, keep, protect={release})
    return True, details


def _switch_link(path, target):
    tmp = f"{path}.{TMP_PREFIX}{os.getpid()}"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.rename(tmp, path)  # atomic: the link is always old or new, never missing


def _installed(base, release):
    return read_meta(os.path.join(releases_dir(base), release)) is not None


def activate(base, release, legacy_links=()):
    """current -> release, previous -> the former current. Returns changed."""
    if not _installed(base, release):
        raise ReleaseError(f"release {release} is not installed in {base}")
    current = link_target(os.path.join(base, "current"))
    changed = current != release
    if changed:
        if current:
            _switch_link(os.path.join(base, "previous"), os.path.join("releases", current))
        _switch_link(os.path.join(base, "current"), os.path.join("releases", release))
    for link, rel in legacy_links:
        target = os.path.join(base, "current", rel)
        if os.path.islink(link) and os.readlink(link) == target:
            continue
        if os.path.exists(link) and not os.path.islink(link):
            os.rename(link, f"{link}.pre-dflash-lifecycle")  # the hand-copied file is kept
        _switch_link(link, target)
        changed = True
    return changed


def switch(base, release, legacy_links=(), check_mode=False):
    """activate() for a module's options (legacy_links as [{path, target}]): changed and the
    current and previous releases after it. Check mode only says whether current would move."""
    if check_mode:
        changed = link_target(os.path.join(base, "current")) != release
    else:
        changed = activate(base, release, [(link["path"], link["target"]) for link in legacy_links])
    return {"changed": changed, "current": link_target(os.path.join(base, "current")),
            "previous": link_target(os.path.join(base, "previous"))}


def rollback(base, check_mode=False):
    """Swap current and previous. Returns the release now current. Refuses a previous release
    that is missing, has drifted, or failed to launch."""
    previous = link_target(os.path.join(base, "previous"))
    current = link_target(os.path.join(base, "current"))
    if not previous or not _installed(base, previous):
        raise ReleaseError(f"no previous release to roll back to in {base}")
    failure = read_launch_failures(base).get(previous)
    if failure:
        raise ReleaseError(f"previous release {previous} failed to launch ({failure['error'][:200]}); "
                           "not rolling back to it")
    drift = verify(os.path.join(releases_dir(base), previous),
                   read_meta(os.path.join(releases_dir(base), previous)).get("files", {}))
    if drifted(drift):
        raise ReleaseError(f"previous release {previous} has drifted from its manifest ({drift}); "
                           "not rolling back to it")
    if not check_mode:
        _switch_link(os.path.join(base, "current"), os.path.join("releases", previous))
        if current:
            _switch_link(os.path.join(base, "previous"), os.path.join("releases", current))
    return previous


def restore(base, current, previous, check_mode=False):
    """Point current and previous back at exactly these releases (the rescue of a failed
    launch returns to what ran before the redeploy). Returns changed."""
    for name, release in (("current", current), ("previous", previous)):
        if release and not _installed(base, release):
            raise ReleaseError(f"cannot restore {name}: release {release} is not installed in {base}")
    changed = False
    for name, release in (("current", current), ("previous", previous)):
        link = os.path.join(base, name)
        if link_target(link) == release:
            continue
        changed = True
        if check_mode:
            continue
        if release:
            _switch_link(link, os.path.join("releases", release))
        elif os.path.lexists(link):
            os.unlink(link)
    return changed


def read_launch_failures(base):
    try:
        with open(os.path.join(base, LAUNCH_FAILURES)) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def record_launch(base, release, error=None):
    """Remember that release failed to launch (error), or clear it after a healthy launch."""
    failures = read_launch_failures(base)
    if error is None and release not in failures:
        return
    if error is None:
        del failures[release]
    else:
        failures[release] = {"error": error, "at": time.time()}
    path = os.path.join(base, LAUNCH_FAILURES)
    tmp = f"{path}.{TMP_PREFIX}{os.getpid()}"
    with open(tmp, "w") as handle:
        json.dump(failures, handle)
    os.rename(tmp, path)


def prune(base, keep, protect=()):
    """Delete all but the newest `keep` releases; never current, previous or protect."""
    state = status(base)
    keepers = set(protect) | {state["current"], state["previous"]}
    ordered = sorted(state["releases"], key=lambda r: r["installed_at"] or 0, reverse=True)
    removed = []
    for index, entry in enumerate(ordered):
        if index >= keep and entry["id"] not in keepers:
            shutil.rmtree(os.path.join(releases_dir(base), entry["id"]))
            removed.append(entry["id"])
    return removed
