# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller half of a release: the manifest and the archive of the trainer code.

The manifest maps every selected file to its mode and sha256; the release id is the hash of
the manifest, so the same files make the same release. The archive is written in a private
directory of the user running Ansible (0700, owned by them, not a symlink), created with
O_EXCL|O_NOFOLLOW and hashed from the same file descriptor it was written through: no other
user can plant a file, a directory or a symlink in its way, nor swap the archive between
writing and hashing. The CT half (install, verify, switch) is module_utils/ct/releases.py.
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import io
import os
import shutil
import stat
import subprocess
import tarfile
import tempfile

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct.releases import ReleaseError, sha256_file


def default_archive_dir():
    """$XDG_CACHE_HOME/dflash-lifecycle/releases, or ~/.cache/dflash-lifecycle/releases."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "dflash-lifecycle", "releases")


def private_dir(path):
    """path as a directory only the caller can use: created 0700 (parents too), refused when it
    is a symlink, owned by someone else or open to others."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ReleaseError(f"archive_dir: {path} must be a real directory, not a symlink")
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise ReleaseError(f"archive_dir: {path} must be owned by uid {os.geteuid()} with mode 0700 "
                           f"(found uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})")
    return path


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


def git_export(repo, ref, dest):
    """The tree of ref in repo, written to dest (no .git); only regular files and directories."""
    archive = subprocess.run(["git", "-C", repo, "archive", "--format=tar", ref],
                             capture_output=True, check=False)
    if archive.returncode != 0:
        raise ReleaseError(f"git archive {ref} in {repo} failed: "
                           f"{archive.stderr.decode(errors='replace').strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            if member.name.startswith("/") or ".." in parts:
                raise ReleaseError(f"git archive {ref}: unsafe path {member.name!r}")
            target = os.path.join(dest, member.name)
            if member.isdir():
                os.makedirs(target, exist_ok=True)
            elif member.isfile():
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with tar.extractfile(member) as source, open(target, "xb") as out:
                    shutil.copyfileobj(source, out)
                os.chmod(target, 0o755 if member.mode & 0o111 else 0o644)


def write_archive(src, manifest, directory, release):
    """One gzipped tar of the manifest's files (owner root, modes as in the manifest), created
    with O_EXCL in directory and renamed to <release>.tar.gz. Returns (path, sha256, bytes),
    the hash read back through the descriptor that wrote it. The same files give the same bytes
    (no time or temporary name in the gzip header): two jobs on one controller that build the
    same release at once replace <release>.tar.gz with an equal file, and neither's push sees
    another checksum than its own."""
    final = os.path.join(directory, f"{release}.tar.gz")
    fd, tmp = tempfile.mkstemp(prefix=f".{release}-", suffix=".tar.gz", dir=directory)  # O_EXCL, 0600
    try:
        with os.fdopen(fd, "w+b") as handle:
            with gzip.GzipFile(filename="", mode="wb", compresslevel=6, fileobj=handle, mtime=0) as packed, \
                    tarfile.open(fileobj=packed, mode="w") as tar:
                for rel in sorted(manifest):
                    info = tar.gettarinfo(os.path.join(src, rel), arcname=rel)
                    info.uid = info.gid = 0
                    info.uname = info.gname = "root"
                    info.mode = manifest[rel]["mode"]
                    with open(os.path.join(src, rel), "rb") as content:
                        tar.addfile(info, content)
            handle.flush()
            handle.seek(0)
            digest = hashlib.sha256()
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
            size = handle.tell()
        os.replace(tmp, final)
    except BaseException:
        os.unlink(tmp)
        raise
    return final, digest.hexdigest(), size


def build_release(src, include, exclude, archive_dir=None, git_repo=None, git_ref="HEAD"):
    """The manifest and archive of the source tree (or a git ref of it)."""
    export = None
    try:
        if git_repo:
            export = tempfile.mkdtemp(prefix="dflash-git-")
            git_export(git_repo, git_ref or "HEAD", export)
            src = export
        manifest = build_manifest(src, include, exclude)
        release = release_id(manifest)
        directory = private_dir(archive_dir or default_archive_dir())
        archive, archive_sha256, size = write_archive(src, manifest, directory, release)
    finally:
        if export:
            shutil.rmtree(export, ignore_errors=True)
    return {"release": release, "files": manifest, "archive": archive,
            "archive_sha256": archive_sha256, "archive_bytes": size}
