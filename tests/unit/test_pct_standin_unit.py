"""Pure parts of the pct stand-in and of the connection plugin, without LXC or SSH."""

import os
import shlex
import subprocess

import pytest

import pct
from ansible_collections.dflash.lifecycle.plugins.connection.pct import pct_exec_command


@pytest.mark.parametrize("vmid,ok", [("100", True), ("999999999", True), ("99", False),
                                     ("1000000000", False), ("0100", False), ("1e3", False)])
def test_vmid_rule(vmid, ok):
    if ok:
        assert pct.parse("status", [vmid], ["vmid"], set())[0] == {"vmid": vmid}
    else:
        with pytest.raises(pct.ParamError, match="value does not look like a valid VM ID"):
            pct.parse("status", [vmid], ["vmid"], set())


def test_exec_extra_args_after_double_dash():
    values, extra = pct.parse("exec", ["200", "--keep-env", "0", "--", "ls", "-la", "--"],
                              ["vmid"], {"keep-env"})
    assert values == {"vmid": "200", "keep-env": "0"}
    assert extra == ["ls", "-la", "--"]


def test_create_file_exclusive_then_truncate_in_place(tmp_path):
    path = str(tmp_path / "f")
    fd = pct.create_file(path, "0640", None, None)
    os.write(fd, b"long content")
    os.close(fd)
    inode = os.stat(path).st_ino
    assert oct(os.stat(path).st_mode & 0o777) == "0o640"
    fd = pct.create_file(path, None, None, None)
    os.write(fd, b"x")
    os.close(fd)
    assert os.stat(path).st_ino == inode
    assert open(path, "rb").read() == b"x"


def test_create_file_does_not_create_parents(tmp_path):
    with pytest.raises(pct.PctError, match="failed to create file: .*No such file or directory"):
        pct.create_file(str(tmp_path / "missing" / "f"), None, None, None)


def test_create_file_rejects_bad_mode(tmp_path):
    with pytest.raises(pct.PctError, match="invalid mode: '09'"):
        pct.create_file(str(tmp_path / "f"), "09", None, None)


@pytest.mark.parametrize("command", [
    "echo 'a b' \"c\" $HOME; touch x",
    "/bin/sh -c 'echo \"$(id)\"'",
    "printf '%s' `whoami` ; exit 3",
])
def test_exec_command_quoting_round_trip(tmp_path, command):
    # a fake pct that prints its argv: the node shell must hand pct exactly
    # [exec, vmid, --, /bin/sh, -c, command]
    fake = tmp_path / "pct"
    fake.write_text("#!/bin/sh\nfor a in \"$@\"; do printf '%s\\0' \"$a\"; done\n")
    fake.chmod(0o755)
    line = pct_exec_command(str(fake), "200", command)
    out = subprocess.run(["sh", "-c", line], capture_output=True, check=True).stdout
    assert out.split(b"\0")[:-1] == [b"exec", b"200", b"--", b"/bin/sh", b"-c", command.encode()]
    assert shlex.split(line)[-1] == command
