"""The node's hookscript (module_utils/node/installed_hookscript.py), run as pve-container runs it -
the file alone, copied into a snippets directory, as `<script> <vmid> <phase>` - against a `pct`,
`pvesh` and `ssh` of the test's own on PATH that play a hostile CT and the cluster. What a CT prints
is shown capped and cleaned, and reaches no command; the node acts on its own policy alone; every
wait ends at the phase's bound. (The real thing, on the testbed's LXC CTs and sshd nodes:
tests/integration/test_hostile_ct.py.)"""

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from ansible_collections.dflash.lifecycle.plugins.module_utils.node import hookscript
from ansible_collections.dflash.lifecycle.plugins.module_utils.node import installed_hookscript as hook

SOURCE = hook.__file__
TEMPLATE = "{{ lookup('ansible.builtin.pipe', 'touch /tmp/dflash-pwned-node') }}"


def tool(path, body):
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


@pytest.fixture
def node(tmp_path):
    """A node: its snippets directory with the script, and a bin/ whose pct, pvesh and ssh log their argv,
    one line each under a flock: the hook calls them side by side, and two writes each would interleave."""
    snippets, bin_dir = tmp_path / "snippets", tmp_path / "bin"
    (snippets / hook.POLICY_DIR).mkdir(parents=True)
    bin_dir.mkdir()
    script = snippets / "dflash-lifecycle-hook.py"
    script.write_text(hookscript.script_text())  # what the install writes
    script.chmod(0o755)
    log = tmp_path / "calls.log"
    for name in ("pct", "ssh"):
        tool(bin_dir / name, f'{{ flock 9; printf "%s\\0" {name} "$@" >&9; printf "\\n" >&9; }} 9>> {log}\n'
                             f'. {tmp_path}/{name}.behaviour\n')
        (tmp_path / f"{name}.behaviour").write_text("echo 'dflash pre-stop: stopped PID 7, 0 steps lost'\n")
    return tmp_path


def policy(node, vmid, **fields):
    path = node / "snippets" / hook.POLICY_DIR / f"{vmid}.json"
    path.write_text(json.dumps(dict({"name": f"ct{vmid}", "lifecycle_dir": "/var/lib/dflash/lifecycle",
                                     "pre_stop_s": 20, "post_start_s": 5, "gang_margin_s": 1, "gang": []}, **fields)))
    path.chmod(0o644)


def behave(node, name, body):
    (node / f"{name}.behaviour").write_text(body)


def run(node, vmid, phase, timeout=60):
    began = time.monotonic()
    done = subprocess.run([str(node / "snippets" / "dflash-lifecycle-hook.py"), str(vmid), phase], capture_output=True,
                          text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL,
                          env=dict(os.environ, PATH=f"{node}/bin:/usr/sbin:/usr/bin:/sbin:/bin"))
    done.took = time.monotonic() - began
    return done


def calls(node):
    path = node / "calls.log"
    if not path.exists():
        return []
    return [line.strip("\0").split("\0") for line in path.read_text().split("\n") if line.strip("\0")]


def test_the_installed_file_stands_alone_and_its_own_ct_gets_one_pct_exec_of_its_hook(node):
    source = open(SOURCE, encoding="utf-8").read()
    assert "ansible" not in "".join(line for line in source.splitlines() if line.startswith(("import", "from")))
    policy(node, 200)
    done = run(node, 200, "pre-stop")
    assert done.returncode == 0 and done.stdout == "[ct200] dflash pre-stop: stopped PID 7, 0 steps lost\n", done
    assert calls(node) == [["pct", "exec", "200", "--", "/bin/sh", "-c", hook.IN_CT, "sh",
                            "/var/lib/dflash/lifecycle/hook", "pre-stop"]]
    assert run(node, 200, "pre-start").stdout == "" and len(calls(node)) == 1  # other phases cost nothing


def test_what_a_ct_prints_is_shown_capped_cleaned_and_marked_with_the_ct(node):
    """Megabytes, a million lines, escape sequences, bidirectional overrides, a template, a line with no end."""
    policy(node, 200)
    behave(node, "pct", r"""printf 'dflash pre-stop: \033[2J\033]0;owned\007 \342\200\256evil %s\r\n' "$0"
printf '%s\n' '""" + TEMPLATE + r"""'
python3 -c "import sys; sys.stdout.write('x' * 3000000 + '\n' + 'line\n' * 1000000)"
printf 'no end'
""")
    done = run(node, 200, "pre-stop")
    lines = done.stdout.splitlines()
    assert all(line.startswith("[ct200] ") for line in lines), lines[:5]
    assert len(lines) == hook.LINES_SHOWN + 1 and lines[-1].startswith("[ct200] ... ") and "more bytes of its output " \
        "not shown" in lines[-1], lines[-3:]
    assert all(len(line) <= len("[ct200] ") + hook.LINE_CHARS for line in lines)
    text = done.stdout
    assert not any(char in text for char in "\x1b\x07\r\u202e") and "{{" not in text, lines[:3]
    assert "[ct200] dflash pre-stop: [2J]0;owned evil" in text and "{ { lookup(" in text
    assert done.took < 15, done.took


@pytest.mark.parametrize("phase, bound", [("pre-stop", 3), ("post-start", 2)])
def test_a_hook_that_never_returns_is_ended_at_the_phases_bound_and_the_log_says_so(node, phase, bound):
    policy(node, 200, pre_stop_s=3, post_start_s=2)
    behave(node, "pct", "echo 'working'; trap '' TERM; sleep 600\n")  # deaf to SIGTERM too
    done = run(node, 200, phase)
    assert bound <= done.took < bound + hook.KILL_GRACE_S + 2, done.took
    assert f"dflash {phase}: the node cut CT 200's hook short at its bound of {bound} s" in done.stdout, done.stdout
    assert ("WITHOUT a checkpoint" if phase == "pre-stop" else "the run was not brought back") in done.stdout


def test_a_ct_process_that_keeps_the_output_open_after_its_hook_ended_holds_nothing(node):
    policy(node, 200)
    holder = node / "holder.pid"  # the process that keeps the output open, ended by its PID after the test
    behave(node, "pct", f"echo 'dflash post-start: detached'; (sleep 600 & echo $! > {shlex.quote(str(holder))}) ; exit 0\n")
    try:
        done = run(node, 200, "post-start")
        assert done.returncode == 0 and done.took < 1 + hook.EXIT_GRACE_S + 2, done.took
        assert done.stdout == "[ct200] dflash post-start: detached\n", done.stdout
    finally:
        if holder.exists():
            os.kill(int(holder.read_text()), signal.SIGKILL)


def test_a_failing_hook_is_said_with_what_it_may_cost(node):
    policy(node, 200)
    behave(node, "pct", "exit 255\n")
    done = run(node, 200, "pre-stop")
    assert "dflash pre-stop: the hook in CT 200 did not end well (exit 255): if its trainer still runs, the CT's stop " \
           "ends it WITHOUT a checkpoint from this stop" in done.stdout


CLUSTER = [{"type": "lxc", "vmid": 200, "node": "pve1"}, {"type": "lxc", "vmid": 401, "node": "pve2"},
           {"type": "lxc", "vmid": 402, "node": "pve1"}, {"type": "qemu", "vmid": 403, "node": "pve2"}]
STATUS = [{"type": "cluster", "name": "c"}, {"type": "node", "name": "pve1", "ip": "127.77.0.1", "local": 1},
          {"type": "node", "name": "pve2", "ip": "127.77.0.2", "local": 0}]


def cluster(node, resources=tuple(CLUSTER), status=tuple(STATUS)):
    tool(node / "bin" / "pvesh", f"""case "$2" in
/cluster/resources) echo {shlex.quote(json.dumps(list(resources)))} ;;
/cluster/status) echo {shlex.quote(json.dumps(list(status)))} ;;
*) exit 255 ;;
esac
""")


def test_a_gangs_members_are_reached_where_the_cluster_says_with_proxmoxs_own_ssh_and_one_moment(node):
    cluster(node)
    policy(node, 200, gang=[{"name": "ct200", "vmid": 200}, {"name": "ct401", "vmid": 401}, {"name": "ct402", "vmid": 402}])
    began = time.time()
    done = run(node, 200, "pre-stop")
    assert done.returncode == 0, done
    made = calls(node)
    local = sorted(call for call in made if call[0] == "pct")
    assert [call[2] for call in local] == ["200", "402"]  # its own CT, and a member on this node
    moment = float(local[0][-1])
    assert began + 1 <= moment <= time.time() + 1 and local[1][-1] == local[0][-1]
    (far,) = [call for call in made if call[0] == "ssh"]
    assert far[1:-1] == [*hook.SSH_OPTIONS, "-o", "HostKeyAlias=pve2", "root@127.77.0.2"]
    words = shlex.split(far[-1])
    assert words[:3] == ["timeout", "-k", "5"] and 15 <= int(words[3]) <= 20
    assert words[4:] == ["pct", "exec", "401", "--", "/bin/sh", "-c", hook.IN_CT, "sh",
                         "/var/lib/dflash/lifecycle/hook", "pre-stop", local[0][-1]]
    assert sorted(line.split("]")[0] for line in done.stdout.splitlines()) == ["[ct200", "[ct401", "[ct402"]


@pytest.mark.parametrize("status, resources, why", [
    ([dict(STATUS[2], ip="127.0.0.1; touch /tmp/dflash-pwned-node")] + STATUS[:2], CLUSTER, "has no address"),
    ([dict(STATUS[2], ip="-oProxyCommand=touch /tmp/dflash-pwned-node")] + STATUS[:2], CLUSTER, "has no address"),
    (STATUS, [dict(CLUSTER[1], node="pve2 $(touch /tmp/dflash-pwned-node)")] + CLUSTER[:1], "is not a CT of a node"),
    (STATUS, [dict(CLUSTER[1], node="pve9")] + CLUSTER[:1], "is not a CT of a node"),
    (STATUS, CLUSTER[:1] + CLUSTER[3:], "is not a CT of a node"),  # gone, or a VM of that id
])
def test_a_member_the_cluster_does_not_place_on_a_node_it_knows_is_not_reached(node, status, resources, why):
    cluster(node, resources, status)
    policy(node, 200, gang=[{"name": "ct401", "vmid": 401}])
    done = run(node, 200, "pre-stop")
    assert "dflash pre-stop: ct401 (CT 401) NOT REACHED: " in done.stdout and why in done.stdout, done.stdout
    assert [call[0] for call in calls(node)] == ["pct"] and not os.path.exists("/tmp/dflash-pwned-node")
    assert calls(node)[0][-1] == "pre-stop"  # no moment: no member to meet


def test_a_cluster_that_does_not_answer_holds_the_hook_no_longer_than_its_bound(node):
    tool(node / "bin" / "pvesh", "exec sleep 600\n")  # one process, as pvesh is: the hook ends it at its bound
    policy(node, 200, pre_stop_s=3, gang=[{"name": "ct401", "vmid": 401}])
    done = run(node, 200, "pre-stop")
    assert done.took < 3 + hook.KILL_GRACE_S + 2 and "NOT REACHED: the cluster's membership could not be read" \
        in done.stdout, (done.took, done.stdout)


@pytest.mark.parametrize("field, value, named", [
    ("name", "ct200; touch /tmp/x", "name:"), ("name", "$(id)", "name:"),
    ("lifecycle_dir", "/var/lib/../../tmp", "lifecycle_dir:"), ("lifecycle_dir", "relative/hook", "lifecycle_dir:"),
    ("lifecycle_dir", "/var/lib/dflash lifecycle", "lifecycle_dir:"), ("pre_stop_s", "60", "pre_stop_s:"),
    ("pre_stop_s", 0, "pre_stop_s:"), ("post_start_s", 1e9, "post_start_s:"), ("post_start_s", True, "post_start_s:"),
    ("gang", [{"name": "ct401", "vmid": "401 -o x"}], "gang[0].vmid:"),
    ("gang", [{"name": "ct401", "vmid": 401, "address": "10.0.0.1"}], "gang[0]:"),
    ("gang", "401", "gang:"), ("extra", 1, "unknown fields extra"),
])
def test_a_policy_field_out_of_its_form_is_refused_naming_it(field, value, named):
    with pytest.raises(hook.PolicyError, match=named.replace("[", r"\[").replace("]", r"\]")):
        hook.checked_policy("200", {field: value})


def test_a_policy_file_anyone_but_root_may_write_is_not_the_nodes_word(node):
    policy(node, 200, gang=[{"name": "ct401", "vmid": 401}])
    (node / "snippets" / hook.POLICY_DIR / "200.json").chmod(0o666)
    done = run(node, 200, "pre-stop")
    assert "its policy" in done.stdout and "is refused (not a file of root's that only root may write): the " \
        "defaults hold" in done.stdout, done.stdout
    assert [call[2] for call in calls(node)] == ["200"]  # no gang: the refused file named one


def test_printable_keeps_lines_only_when_asked_and_breaks_every_template_opener():
    assert hook.printable("a\nb\tc\x1b[0m\x00") == "ab c[0m"
    assert hook.printable("a\nb", lines=True) == "a\nb"
    assert hook.printable("{{{%{#x}}") == "{ { { %{ #x}}"
    assert hook.printable("é" * 10, limit=5) == "éééé…"
    assert "{{" not in hook.printable("{" * 100 + "{%{#")
    assert sys.maxunicode and hook.printable("\U0010ffff\ue000") == ""  # unassigned, private use
