"""The pct stand-in behaves like Proxmox VE's pct (pve-container src/PVE/CLI/pct.pm).

Every command goes over real SSH to a testbed node, as the playbooks' do.
CT 300 (node pve2) runs commands; CT 301 (pve2) is stopped and started.
"""

import re
import time

import pytest

NODE = "pve2"
PARAM_ERROR = ("400 Parameter verification failed.\n"
               "vmid: invalid format - value does not look like a valid VM ID\n")


@pytest.fixture
def node(testbed):
    def run(command, **kwargs):
        return testbed.ssh(NODE, command, **kwargs)
    return run


@pytest.mark.parametrize("vmid", ["99", "0100", "abc", "1234567890", "-1"])
def test_vmid_rule(node, vmid):
    res = node(f"pct status '{vmid}'")
    assert res.returncode == 255
    assert res.stderr.startswith(PARAM_ERROR)
    assert "pct status <vmid> [OPTIONS]" in res.stderr


def test_unknown_ct_names_the_config_file(node):
    for command in ("status 999", "exec 999 -- true", "start 999", "stop 999", "config 999"):
        res = node(f"pct {command}")
        assert res.returncode == 255, command
        assert res.stderr == "Configuration file 'nodes/pve2/lxc/999.conf' does not exist\n"


def test_ct_of_another_node_is_not_visible(node):
    res = node("pct status 200")  # CT 200 lives on pve1
    assert res.returncode == 255
    assert "nodes/pve2/lxc/200.conf' does not exist" in res.stderr


def test_root_check(node):
    res = node("setpriv --reuid=65534 --regid=65534 --clear-groups pct list")
    assert res.returncode == 255
    assert res.stderr == "please run as root\n"


def test_list_header_and_columns(node):
    res = node("pct list", check=True)
    lines = res.stdout.splitlines()
    assert lines[0] == "%-10s %-10s %-12s %-20s" % ("VMID", "Status", "Lock", "Name")
    assert lines[1].split() == ["300", "running", "ct300"]
    assert lines[2].split()[:2] == ["301", "running"]


def test_list_prints_nothing_without_cts(testbed, tmp_path):
    # a node directory with no CT configs at all
    res = testbed.ssh(NODE, "d=$(mktemp -d) && mkdir -p $d/empty/bin && "
                            "cp \"$(command -v pct)\" \"$(command -v pct).py\" $d/empty/bin/ && $d/empty/bin/pct list; "
                            "rc=$?; rm -rf $d; exit $rc")
    assert res.returncode == 0
    assert res.stdout == ""


def test_exec_pgid_and_sid_are_zero_without_tty(node):
    res = node("pct exec 300 -- sh -c 'sleep 5 >/dev/null 2>&1 & "
               "ps -o pgid=,sid= -p $!; kill $!'", check=True)
    assert res.stdout.split() == ["0", "0"]


def test_exec_is_lxc_attach_without_wrapper(node):
    # pct execs lxc-attach: the command's parent in the CT is the attach
    # process (PID 0 as seen from inside: outside the CT's PID namespace)
    res = node("pct exec 300 -- sh -c 'ps -o ppid= -p $$'", check=True)
    assert res.stdout.strip() == "0"


def test_exec_exit_codes(node):
    assert node("pct exec 300 -- sh -c 'exit 7'").returncode == 7
    assert node("pct exec 300 -- sh -c 'kill -TERM $$'").returncode == 128 + 15
    assert node("pct exec 300 -- sh -c 'kill -KILL $$'").returncode == 128 + 9
    assert node("pct exec 300 -- /nonexistent").returncode == 127


def test_exec_keeps_stdout_stderr_and_stdin_apart(node):
    res = node("pct exec 300 -- sh -c 'cat; echo err >&2'", input="from stdin\n")
    assert res.stdout == "from stdin\n"
    assert res.stderr == "err\n"


def test_exec_keep_env(node):
    res = node("FOO=bar pct exec 300 -- sh -c 'echo ${FOO:-unset}'", check=True)
    assert res.stdout == "bar\n"
    res = node("FOO=bar pct exec 300 --keep-env 0 -- sh -c 'echo ${FOO:-unset}'", check=True)
    assert res.stdout == "unset\n"


def test_exec_runs_with_the_cli_handlers_path(node):
    # pve-common CLIHandler.pm run_cli_handler: PATH=/sbin:/bin:/usr/sbin:/usr/bin, whatever the
    # caller's, kept into the CT by --keep-env; the NVIDIA driver's nvidia-smi is in /usr/bin
    res = node("PATH=/usr/local/bin:$PATH pct exec 300 -- sh -c 'echo $PATH; readlink -f $(command -v nvidia-smi)'",
               check=True)
    assert res.stdout == "/sbin:/bin:/usr/sbin:/usr/bin\n/usr/bin/nvidia-smi\n"
    assert node("pct exec 300 -- ls /usr/local/bin", check=True).stdout == ""  # not the host's


def test_fake_nvidia_smi_answers_the_queries_the_project_makes(node):
    gpus = node("pct exec 300 -- nvidia-smi --query-gpu=index,memory.used,memory.total "
                "--format=csv,noheader,nounits", check=True).stdout.splitlines()
    assert len(gpus) == 8 and gpus[0].split(", ")[0] == "0" and gpus[0].split(", ")[2] == "81559"
    node("pct exec 300 -- sh -c 'mkdir -p /run/nvidia-testbed && echo {\\\"held_mib\\\": {\\\"3\\\": 7000}} "
         "> /run/nvidia-testbed/state.json'", check=True)
    try:
        used = node("pct exec 300 -- nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits",
                    check=True).stdout.splitlines()
        assert used[3].startswith("3, ") and int(used[3].split(", ")[1]) >= 7000
    finally:
        node("pct exec 300 -- rm -f /run/nvidia-testbed/state.json", check=True)


def test_exec_missing_command(node):
    res = node("pct exec 300")
    assert res.returncode == 255
    assert re.fullmatch(r"missing command at \S+pct\.pm line \d+\.\n", res.stderr)


def test_push_semantics(node):
    setup = ("set -e; f=$(mktemp); printf 'hello' > $f; "
             "pct exec 300 -- sh -c 'rm -rf /tmp/pushdir; mkdir /tmp/pushdir'; ")
    # relative destination is relative to / in the CT; --perms octal without a leading 0
    res = node(setup + "pct push 300 $f tmp/pushdir/a --perms 640 --user nobody --group nogroup; "
               "pct exec 300 -- stat -c '%a %U %G %s' /tmp/pushdir/a; rm -f $f", check=True)
    assert res.stdout == "640 nobody nogroup 5\n"
    # an existing file is truncated in place: same inode, content replaced
    res = node("set -e; f=$(mktemp); printf 'x' > $f; "
               "a=$(pct exec 300 -- stat -c %i /tmp/pushdir/a); pct push 300 $f /tmp/pushdir/a; "
               "b=$(pct exec 300 -- stat -c %i /tmp/pushdir/a); "
               "echo $a $b $(pct exec 300 -- cat /tmp/pushdir/a); rm -f $f", check=True)
    first, second, content = res.stdout.split()
    assert first == second and content == "x"


def test_push_failure_still_exits_zero(node):
    # no parent directories are created, and like the real pct the exit status is 0
    res = node("f=$(mktemp); pct push 300 $f /no/such/dir/file; echo rc=$?; rm -f $f")
    assert "rc=0" in res.stdout
    assert "failed to create file: /no/such/dir/file: No such file or directory" in res.stderr
    res = node("pct push 300 /no/such/local/file /tmp/x; echo rc=$?")
    assert "rc=0" in res.stdout
    assert "failed to open /no/such/local/file for reading" in res.stderr
    assert node("pct exec 300 -- test -e /no/such/dir/file").returncode == 1


def test_pull_semantics(node):
    res = node("set -e; pct exec 300 -- sh -c 'printf pulled > /tmp/pullme'; d=$(mktemp -d); "
               "pct pull 300 /tmp/pullme $d/out --perms 600; stat -c '%a' $d/out; cat $d/out; "
               "rm -rf $d", check=True)
    assert res.stdout == "600\npulled"
    res = node("d=$(mktemp -d); pct pull 300 /no/such/file $d/out; echo rc=$?; rm -rf $d")
    assert "rc=0" in res.stdout
    assert "failed to open /no/such/file: No such file or directory" in res.stderr


def test_stop_start_shutdown_and_stopped_ct_errors(node):
    try:
        assert node("pct stop 301").returncode == 0
        assert node("pct status 301").stdout == "status: stopped\n"
        res = node("pct exec 301 -- true")
        assert (res.returncode, res.stderr) == (255, "container '301' not running!\n")
        res = node("f=$(mktemp); pct push 301 $f /tmp/x; echo rc=$?; rm -f $f")
        assert res.stderr == "can only push files to a running CT\n"
        assert "rc=255" in res.stdout
        res = node("pct pull 301 /etc/hostname /tmp/x")
        assert res.returncode == 255
        assert res.stderr.startswith("can only pull files from a running VM at ")
        res = node("pct stop 301")
        assert (res.returncode, res.stderr) == (255, "CT 301 not running\n")
        assert node("pct list").stdout.splitlines()[2].split()[:2] == ["301", "stopped"]
        assert node("pct start 301").returncode == 0
        assert node("pct status 301").stdout == "status: running\n"
        res = node("pct start 301")
        assert (res.returncode, res.stderr) == (255, "CT 301 already running\n")
        assert node("pct shutdown 301 --timeout 20").returncode == 0
        assert node("pct status 301").stdout == "status: stopped\n"
    finally:
        if node("pct status 301").stdout != "status: running\n":
            node("pct start 301", check=True)


def test_migrate_refuses_what_pve_container_refuses(node):
    """PVE::API2::LXC migrate_vm: a running CT moves only with --restart (a boolean, its value
    optional as every boolean of pve-common's CLI), never to its own node or an unknown one."""
    for command, error in (("pct migrate 300 pve1", "can't migrate running container without --online or --restart\n"),
                           ("pct migrate 300 pve1 --online", "lxc live migration is currently not implemented\n"),
                           ("pct migrate 300 pve9 --restart", "no such cluster node 'pve9'\n"),
                           ("pct migrate 300 pve2 --restart", "400 Parameter verification failed.\n"
                                                              "target: target is local node.\n")):
        res = node(command)
        assert res.returncode == 255 and res.stderr.startswith(error), (command, res.stderr)
    assert node("pct status 300").stdout == "status: running\n"
    assert node("pct list").stdout.splitlines()[1].split()[0] == "300"  # still on pve2


def test_every_invocation_is_counted(testbed, node):
    before = len(testbed.pct_invocations(NODE))
    node("pct status 300; pct list; pct status 99")
    calls = testbed.pct_invocations(NODE)[before:]
    assert [c["argv"] for c in calls] == [["status", "300"], ["list"], ["status", "99"]]
    assert all(c["time"] <= time.time() for c in calls)
