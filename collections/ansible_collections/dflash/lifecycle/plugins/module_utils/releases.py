# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Content-addressed releases of the trainer code.

Controller side: build the manifest (path, mode, sha256 of every selected file) and one
tar archive of it.  Target side (inside the CT): install an archive as
``<base>/releases/<hash>/`` -- unpacked under a temporary name, every file checked
against the controller's manifest, every .py compiled by the CT's own python, then
renamed into place, so a half-pushed release is never visible as complete -- and switch
``<base>/current`` (with ``<base>/previous`` for rollback) by atomic symlink renames.
Python 3.8 compatible: the target side runs on the CT's interpreter.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import os
import py_compile
import shutil
import subprocess
import tarfile
import tempfile
import time

META = ".dflash-release.json"
TMP_PREFIX = ".tmp-"


class ReleaseError(Exception):
    pass


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _selected(rel, include, exclude):
    def hit(patterns):
        return any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(os.path.basename(rel), p)
                   for p in patterns)
    return hit(include) and not hit(exclude)


def build_manifest(src, include=("*",), exclude=()):
    """{relpath: {"sha256", "mode"}} of the selected regular files under src."""
    if not os.path.isdir(src):
        raise ReleaseError(f"source directory {src} does not exist")
    files = {}
    for root, dirs, names in os.walk(src):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, src)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            if _selected(rel, include, exclude):
                mode = 0o755 if os.stat(path).st_mode & 0o111 else 0o644
                files[rel] = {"sha256": sha256_file(path), "mode": mode}
    if not files:
        raise ReleaseError(f"no file of {src} matches include {list(include)} / exclude {list(exclude)}")
    return files


def release_id(manifest):
    """The content hash: same files, same modes -> same release."""
    digest = hashlib.sha256()
    for rel in sorted(manifest):
        digest.update(f"{rel}\0{manifest[rel]['mode']:o}\0{manifest[rel]['sha256']}\n".encode())
    return digest.hexdigest()[:16]


def _extract(tar, dest, members=None):
    """The "data" filter where this Python has it (3.8.17+/3.11.4+); the manifest check
    before extraction keeps names inside dest on older ones."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, members=members, filter="data")
    else:
        tar.extractall(dest, members=members)


def check_paths(manifest):
    for rel in manifest:
        parts = rel.split("/")
        if rel.startswith("/") or ".." in parts or "" in parts:
            raise ReleaseError(f"unsafe path in manifest: {rel!r}")


def git_export(repo, ref, dest):
    """The tree of ref in repo, written to dest (no .git)."""
    archive = subprocess.run(["git", "-C", repo, "archive", "--format=tar", ref],
                             capture_output=True, check=False)
    if archive.returncode != 0:
        raise ReleaseError(f"git archive {ref} in {repo} failed: "
                           f"{archive.stderr.decode(errors='replace').strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        _extract(tar, dest)


def write_archive(src, manifest, path):
    """One gzipped tar of the manifest's files (owner root, modes as in the manifest)."""
    with tarfile.open(path, "w:gz", compresslevel=6) as tar:
        for rel in sorted(manifest):
            info = tar.gettarinfo(os.path.join(src, rel), arcname=rel)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mode = manifest[rel]["mode"]
            with open(os.path.join(src, rel), "rb") as handle:
                tar.addfile(info, handle)
    return sha256_file(path)


# -- target side ------------------------------------------------------------------------------

def build_release(params):
    """On the controller: the manifest and archive of the source tree (or a git ref of it)."""
    export = None
    try:
        src = params["src"]
        if params.get("git_repo"):
            export = tempfile.mkdtemp(prefix="dflash-git-")
            git_export(params["git_repo"], params.get("git_ref") or "HEAD", export)
            src = export
        manifest = build_manifest(src, params["include"], params["exclude"])
        release = release_id(manifest)
        os.makedirs(params["archive_dir"], mode=0o700, exist_ok=True)
        archive = os.path.join(params["archive_dir"], f"{release}.tar.gz")
        archive_sha256 = write_archive(src, manifest, archive)
    finally:
        if export:
            shutil.rmtree(export, ignore_errors=True)
    return {"release": release, "files": manifest, "archive": archive,
            "archive_sha256": archive_sha256, "archive_bytes": os.path.getsize(archive)}


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


def status(base, release=None):
    """What is installed: releases, current, previous, and the current file list."""
    installed = []
    rdir = releases_dir(base)
    if os.path.isdir(rdir):
        for name in sorted(os.listdir(rdir)):
            meta = read_meta(os.path.join(rdir, name))
            if not name.startswith(TMP_PREFIX) and meta is not None:
                installed.append({"id": name, "installed_at": meta.get("installed_at")})
    current = link_target(os.path.join(base, "current"))
    current_meta = read_meta(os.path.join(rdir, current)) if current else None
    return {
        "releases": installed,
        "current": current,
        "previous": link_target(os.path.join(base, "previous")),
        "present": release is not None and any(r["id"] == release for r in installed),
        "current_files": sorted((current_meta or {}).get("files", {})),
        "current_manifest": (current_meta or {}).get("files", {}),
    }


def compared(base, release, files):
    """status() with the changes from the current release to release's manifest (files), and a
    diff of the two file lists when release is not installed yet."""
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


def _safe_members(tar, manifest):
    names = {m.name for m in tar.getmembers() if m.isfile()}
    unexpected = sorted(names - set(manifest))
    missing = sorted(set(manifest) - names)
    if unexpected or missing:
        raise ReleaseError(f"archive does not match the manifest: unexpected {unexpected}, "
                           f"missing {missing}")
    for member in tar.getmembers():
        if member.isfile():
            yield member


def compile_tree(root, manifest):
    """py_compile every .py with this interpreter (the CT's); 'file:line: message' on error."""
    errors = []
    for rel in sorted(r for r in manifest if r.endswith(".py")):
        path = os.path.join(root, rel)
        try:
            py_compile.compile(path, cfile=os.path.join(tempfile.gettempdir(), ".dflash-pyc"),
                               doraise=True)
        except py_compile.PyCompileError as err:
            value = err.exc_value
            line = getattr(value, "lineno", None) or "?"
            message = getattr(value, "msg", None) or str(value)
            errors.append(f"{rel}:{line}: {message}")
    return errors


def install(base, release, archive, archive_sha256, manifest, keep=5):
    """Install archive as release; returns (changed, details)."""
    check_paths(manifest)
    rdir = releases_dir(base)
    final = os.path.join(rdir, release)
    if read_meta(final) is not None:
        return False, {"release": release, "path": final}
    if not os.path.isfile(archive):
        raise ReleaseError(f"{archive} is not in the CT: the copy into the container failed "
                           "(pct push exits 0 even when it could not write the file)")
    got = sha256_file(archive)
    if got != archive_sha256:
        raise ReleaseError(f"{archive} has sha256 {got}, the controller sent {archive_sha256}: "
                           "the copy into the container is incomplete or corrupt")
    os.makedirs(rdir, mode=0o755, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{release}-", dir=rdir)
    try:
        with tarfile.open(archive) as tar:
            _extract(tar, tmp, list(_safe_members(tar, manifest)))
        for rel, entry in manifest.items():
            if sha256_file(os.path.join(tmp, rel)) != entry["sha256"]:
                raise ReleaseError(f"{rel}: checksum differs from the controller's")
            os.chmod(os.path.join(tmp, rel), entry["mode"])
        errors = compile_tree(tmp, manifest)
        if errors:
            raise ReleaseError("compile gate failed, nothing was changed: " + "; ".join(errors))
        with open(os.path.join(tmp, META), "w") as handle:
            json.dump({"id": release, "installed_at": time.time(), "files": manifest}, handle)
        os.chmod(tmp, 0o755)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.unlink(archive)
    pruned = prune(base, keep, protect={release})
    return True, {"release": release, "path": final, "pruned": pruned}


def _switch_link(path, target):
    tmp = f"{path}.{TMP_PREFIX}{os.getpid()}"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.rename(tmp, path)  # atomic: the link is always old or new, never missing


def activate(base, release, legacy_links=()):
    """current -> release, previous -> the former current. Returns changed."""
    if read_meta(os.path.join(releases_dir(base), release)) is None:
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


def rollback(base):
    """Swap current and previous. Returns the release now current."""
    previous = link_target(os.path.join(base, "previous"))
    current = link_target(os.path.join(base, "current"))
    if not previous or read_meta(os.path.join(releases_dir(base), previous)) is None:
        raise ReleaseError(f"no previous release to roll back to in {base}")
    _switch_link(os.path.join(base, "current"), os.path.join("releases", previous))
    if current:
        _switch_link(os.path.join(base, "previous"), os.path.join("releases", current))
    return previous


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
