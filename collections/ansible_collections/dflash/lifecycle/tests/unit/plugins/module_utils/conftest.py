"""A fake /proc tree for the unit tests of the process rules (fixture: fake)."""

import os

import pytest


class FakeProc:
    """Processes written as /proc files under root: stat, cmdline, status, environ, exe, fd."""

    def __init__(self, root):
        self.root = root
        root.mkdir(exist_ok=True)
        (root / "stat").write_text("cpu 0 0\nbtime 1700000000\n")

    def add(self, pid, comm, ppid, pgid=0, sid=0, state="S", start=1000, cmdline=None,
            sig_ign=0, sig_cgt=0, environ=None, exe=None, fds=()):
        base = self.root / str(pid)
        base.mkdir(parents=True)
        # stat fields 3.. : state ppid pgrp session ... num_threads (20) ... starttime (22)
        fields = [state, ppid, pgid, sid] + [0] * 13 + [1, 0, start] + [0] * 30
        (base / "stat").write_text(f"{pid} ({comm}) " + " ".join(str(f) for f in fields) + "\n")
        (base / "cmdline").write_bytes(((cmdline or comm).replace(" ", "\0") + "\0").encode())
        (base / "status").write_text(
            f"Name:\t{comm}\nSigIgn:\t{sig_ign:016x}\nSigCgt:\t{sig_cgt:016x}\n")
        (base / "environ").write_bytes(b"".join(
            f"{k}={v}\0".encode() for k, v in (environ or {"PATH": "/usr/bin"}).items()))
        if exe:
            os.symlink(exe, base / "exe")
        (base / "fd").mkdir()
        for index, target in enumerate(fds):
            os.symlink(target, base / "fd" / str(index + 3))
        return base

    def hold(self, pid, fd, target, flags=0o102001):
        """fd of pid names target, opened with flags (/proc/PID/fdinfo; the default O_WRONLY|O_APPEND
        |O_CREAT is how a logging FileHandler or a shell's >> opens a log)."""
        base = self.root / str(pid)
        (base / "fdinfo").mkdir(exist_ok=True)
        os.symlink(str(target), base / "fd" / str(fd))
        (base / "fdinfo" / str(fd)).write_text(f"pos:\t0\nflags:\t{flags:07o}\nmnt_id:\t20\n")

    def remove(self, pid):
        for path in sorted((self.root / str(pid)).rglob("*"), reverse=True):
            path.unlink() if path.is_symlink() or path.is_file() else path.rmdir()
        (self.root / str(pid)).rmdir()

    @property
    def path(self):
        return str(self.root)


@pytest.fixture
def fake(tmp_path):
    return FakeProc(tmp_path / "proc")
