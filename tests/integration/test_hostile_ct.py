"""A hostile CT gains nothing (docs/security.md), on the testbed's real LXC CTs, sshd nodes and the
`pct` stand-in that runs hookscripts as pve-container does. The CT's root:

1. replaces the run's hook the node's hookscript runs at pre-stop and post-start: it prints "peers"
   lines with shell words, $(...), ${IFS}, sed commands, an option for an address and another CT's
   VMID, escape sequences, templates, megabytes and a million lines - and at its next stop and start
   it never returns;
2. replaces the CT's python3 (a bind mount in its own mount namespace), so every module's answer is
   its forgery: wrong types, or a template and escape sequences in every string field;
3. plants a lock file and a log with the same.

In each case: no marker file appears on the nodes (the host here), in the CT or on the controller;
no connection reaches an address the node's own files do not list (a listener on a loopback
address that the forged lines name counts them); another CT's run is untouched; the node's stop
ends within its bound and says so; the controller's job ends with one clear line naming the CT,
with no escape sequence and no template in its output."""

import base64
import contextlib
import glob
import json
import os
import re
import shlex
import socket
import subprocess
import threading
import time

import pytest

from testlib import BIN, END_RUNS, REPO, make, run_tool

HOSTILE, HOSTILE_NODE, HOSTILE_VMID = "ct200", "pve1", "200"
BYSTANDER, BYSTANDER_VMID = "ct201", "201"
FORGER, FORGER_NODE, FORGER_VMID = "ct300", "pve2", "300"
REDEPLOY = os.path.join(REPO, "redeploy.yml")
MARK = "/tmp/dflash-pwned"
# a loopback address no testbed uses: what the forged lines name, counted by a listener
LURE = "127.77.250.99"
TEMPLATE = "{{ lookup('ansible.builtin.pipe', 'touch " + MARK + "-controller') }}"
ESCAPES = "\x1b[2J\x1b]0;owned\x07\u202e"
BOUNDS = {"pve_hook_pre_stop_timeout": 8, "pve_hook_post_start_timeout": 3}

HOSTILE_HOOK = r"""#!/bin/sh
# the CT's root's own hook: what the node's hookscript of before took for a gang's peers, and worse
for word in "$LURE 2222 $VMID ct201" "$LURE 2222 \$(touch $MARK-1) x" "$LURE 2222 $VMID;touch\${IFS}$MARK-2 y" \
            "-oProxyCommand=touch\${IFS}$MARK-3 22 $VMID z" "$LURE 2222 $VMID s/^/x/e;touch$MARK-4" \
            "$LURE 22 $VMID 1e\ touch\ $MARK-5" "$LURE 2222 \`touch $MARK-6\` w"; do
    echo "$word"
done
printf 'dflash %s: \033[2J\033]0;owned\007 %s\n' "$1" '{{ lookup("pipe", "touch MARK-7") }}'
[ -e /root/hang ] && { trap '' TERM; exec sleep 100000; }
python3 -c "import sys; sys.stdout.write('A' * 3000000 + '\n' + '$LURE 2222 $VMID ct201\n' * 1000000)"
"""


def in_ct(testbed, node, vmid, command, check=True):
    return testbed.in_ct(node, vmid, command, check=check, timeout=180)


def markers(testbed):
    """Every marker file a forgery would have made: on the host (the nodes and the controller), in the
    nodes' directories and in the CTs."""
    found = glob.glob(MARK + "*") + glob.glob(os.path.join(testbed.bed.state_dir, "nodes", "*", "**", "dflash-pwned*"),
                                               recursive=True)
    for node, vmid in ((HOSTILE_NODE, HOSTILE_VMID), (HOSTILE_NODE, BYSTANDER_VMID), (FORGER_NODE, FORGER_VMID)):
        if testbed.ssh(node, f"pct status {vmid}").stdout.strip() == "status: running":
            found += in_ct(testbed, node, vmid, f"ls {MARK}* 2>/dev/null || true").stdout.split()
    return found


class Listener:
    """Connections to a loopback address the node's files do not list, counted (ports 22 and 2222)."""

    def __init__(self):
        subprocess.run(["ip", "addr", "show", "lo"], check=True, capture_output=True)  # the address is loopback's
        self.sockets, self.accepted = [], 0
        for port in (2222, 2223):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((LURE, port))
            sock.listen(16)
            sock.settimeout(0.2)
            self.sockets.append(sock)
        self.running = True
        self.thread = threading.Thread(target=self.count, daemon=True)
        self.thread.start()

    def count(self):
        while self.running:
            for sock in self.sockets:
                with contextlib.suppress(OSError):
                    conn, _ = sock.accept()
                    self.accepted += 1
                    conn.close()

    def close(self):
        self.running = False
        self.thread.join()
        for sock in self.sockets:
            sock.close()


def clean(output):
    """The output shows no escape sequence and renders no template."""
    assert not any(char in output for char in "\x1b\x07\u202e"), re.findall(r".{0,40}[\x1b\x07\u202e].{0,40}", output)[:3]
    assert "{{ lookup(" not in output, re.findall(r".{0,60}\{\{ lookup\(.{0,40}", output)[:3]


@pytest.fixture(scope="module")
def hooked(testbed):
    """ct200 (the hostile CT) and ct201 (a bystander on the same node) running the example trainer
    with the hookscript installed on both, with short bounds; afterwards all of it taken off."""
    listener = Listener()
    for vmid in (HOSTILE_VMID, BYSTANDER_VMID):
        in_ct(testbed, HOSTILE_NODE, vmid, f"{END_RUNS}; rm -f /root/hang", check=False)
        in_ct(testbed, HOSTILE_NODE, vmid, "mkdir -p /dev/shm/models/target /workspace/data && echo '{}' > "
                                           "/dev/shm/models/target/config.json && echo 'a b c d' > /workspace/data/corpus.txt")
    launched = testbed.playbook(REDEPLOY, "-l", f"{HOSTILE}:{BYSTANDER}", check=False)
    assert launched.returncode == 0, launched.stdout[-4000:]
    installed = make("pve-hooks", f"HOST={HOSTILE}:{BYSTANDER}", extra=BOUNDS)
    assert installed.returncode == 0, installed.stdout[-4000:] + installed.stderr
    hook = HOSTILE_HOOK.replace("$LURE", LURE).replace("$VMID", BYSTANDER_VMID).replace("$MARK", MARK) \
        .replace("MARK-7", MARK + "-7")
    in_ct(testbed, HOSTILE_NODE, HOSTILE_VMID, f"cat > /var/lib/dflash/lifecycle/hook <<'EOF'\n{hook}EOF\n"
                                              "chmod 700 /var/lib/dflash/lifecycle/hook")
    try:
        yield listener
    finally:
        listener.close()
        if testbed.ssh(HOSTILE_NODE, f"pct status {HOSTILE_VMID}").stdout.strip() != "status: running":
            testbed.ssh(HOSTILE_NODE, f"pct start {HOSTILE_VMID}")
        for vmid in (HOSTILE_VMID, BYSTANDER_VMID):
            testbed.ssh(HOSTILE_NODE, f"pct set {vmid} --delete hookscript")
            in_ct(testbed, HOSTILE_NODE, vmid, f"{END_RUNS}; rm -rf /root/hang /var/lib/dflash/lifecycle {MARK}*",
                  check=False)
        for path in glob.glob(MARK + "*"):
            os.unlink(path)


def bystander(testbed):
    """ct201's run as the node and the CT see it: its trainer's PID, what its spec wants, any stand-down."""
    return in_ct(testbed, HOSTILE_NODE, BYSTANDER_VMID, "cat /run/dflash/trainer.pid; "
                 "python3 -c \"import json; print(json.load(open('/var/lib/dflash/lifecycle/run.json'))['wanted'])\"; "
                 "ls /var/lib/dflash/lifecycle/stand-down.json 2>/dev/null || true").stdout


def test_1_the_install_wrote_the_nodes_own_policy_and_the_hostile_hooks_lines_reach_nothing(testbed, hooked):
    for node in ("pve1", "pve2"):  # every node a CT may start on
        with open(os.path.join(testbed.bed.node_dir(node), "var/lib/vz/snippets/dflash-lifecycle-hook.d",
                               f"{HOSTILE_VMID}.json"), encoding="utf-8") as handle:
            policy = json.load(handle)
        assert policy == {"name": HOSTILE, "lifecycle_dir": "/var/lib/dflash/lifecycle", "gang": [], "pre_stop_s": 8.0,
                          "post_start_s": 3.0, "gang_margin_s": 3.0}
    before = bystander(testbed)
    began = time.monotonic()
    stopped = testbed.ssh(HOSTILE_NODE, f"pct shutdown {HOSTILE_VMID}", check=True, timeout=120)
    took = time.monotonic() - began
    lines = stopped.stdout.splitlines()
    assert sum(line.startswith(f"[{HOSTILE}] ") for line in lines) == 41, lines[-5:]  # 40 shown, 1 counting the rest
    assert f"[{HOSTILE}] dflash pre-stop: [2J]0;owned {{ {{ lookup(" in stopped.stdout, stopped.stdout[:2000]
    assert re.search(rf"^\[{HOSTILE}\] \.\.\. \d{{7,}} more bytes of its output not shown$", stopped.stdout, re.M)
    clean(stopped.stdout + stopped.stderr)
    assert took < 8 + 10, took  # a million lines and megabytes read and dropped within the bound
    started = testbed.ssh(HOSTILE_NODE, f"pct start {HOSTILE_VMID}", check=True, timeout=120)
    clean(started.stdout + started.stderr)
    assert hooked.accepted == 0 and markers(testbed) == []
    assert bystander(testbed) == before  # its trainer, its wanted run, no stand-down: untouched


@pytest.mark.parametrize("how", ["shutdown", "start"])
def test_2_a_hook_that_never_returns_holds_proxmox_no_longer_than_the_nodes_bound_and_says_so(testbed, hooked, how):
    phase, bound = ("pre-stop", 8) if how == "shutdown" else ("post-start", 3)
    if how == "start":  # the hang marker is on the CT's disk: it holds at the next start too
        testbed.ssh(HOSTILE_NODE, f"pct set {HOSTILE_VMID} --delete hookscript", check=True)
        if testbed.ssh(HOSTILE_NODE, f"pct status {HOSTILE_VMID}").stdout.strip() == "status: stopped":
            testbed.ssh(HOSTILE_NODE, f"pct start {HOSTILE_VMID}", check=True, timeout=120)
        in_ct(testbed, HOSTILE_NODE, HOSTILE_VMID, "touch /root/hang")
        testbed.ssh(HOSTILE_NODE, f"pct shutdown {HOSTILE_VMID}", check=True, timeout=120)
        testbed.ssh(HOSTILE_NODE, f"pct set {HOSTILE_VMID} --hookscript local:snippets/dflash-lifecycle-hook.py",
                    check=True)
    else:
        in_ct(testbed, HOSTILE_NODE, HOSTILE_VMID, "touch /root/hang")
    began = time.monotonic()
    done = testbed.ssh(HOSTILE_NODE, f"pct {how} {HOSTILE_VMID}", check=True, timeout=120)
    took = time.monotonic() - began
    assert bound <= took < bound + 8, took
    assert f"dflash {phase}: the node cut CT {HOSTILE_VMID}'s hook short at its bound of {bound} s" in done.stdout, \
        done.stdout[-2000:]
    clean(done.stdout + done.stderr)
    if how == "start":
        in_ct(testbed, HOSTILE_NODE, HOSTILE_VMID, "rm -f /root/hang")
        assert testbed.ssh(HOSTILE_NODE, f"pct status {HOSTILE_VMID}").stdout.strip() == "status: running"
    else:
        assert testbed.ssh(HOSTILE_NODE, f"pct status {HOSTILE_VMID}").stdout.strip() == "status: stopped"
    assert hooked.accepted == 0 and markers(testbed) == []


# -- a CT whose python3 is its root's own --------------------------------------------------------

def forged_answer(module, templated):
    """An answer of module in every field it documents: the wrong type, or (templated) the right
    type with a template and escape sequences in every string."""
    from ansible_collections.dflash.lifecycle.plugins.plugin_utils import untrusted

    text = TEMPLATE + ESCAPES
    wrong = {"str": ["x"], "path": ["x"], "int": "seven", "float": "x", "bool": "yes", "list": {"x": 1}, "dict": [text],
             "complex": [text]}

    def right(spec):
        kind = spec.get("type")
        if kind == "list":
            return [right({"type": spec.get("elements") or "str", "contains": spec.get("contains")})]
        if kind in ("dict", "complex"):
            return dict({"x": text}, **{key: right(inner) for key, inner in (spec.get("contains") or {}).items()})
        return {"int": 7, "float": 7.5, "bool": False}.get(kind, text)

    answer = {key: right(spec) if templated else wrong.get(spec.get("type"), text)
              for key, spec in untrusted.documented(module).items() if key not in ("invocation", "deprecations")}
    answer.update(failed=False, changed=False, warnings=[text], msg=text)
    if not templated:
        answer.pop("failed")
        answer["changed"] = False
    return answer


FORGED_MODULES = ("trainer_preflight", "trainer_info", "trainer_process", "trainer_release", "staged_stop",
                  "redeploy_lock", "model_stage", "pve_hook_mark")
FORGERY = ("""#!/bin/sh
# the CT's root's python3: every module's answer is its own; a call whose arguments name
# /framing/<name> gets the bytes of /root/framed/<name>, as they are
payload=$(cat)
case "$payload" in *"/framing/unreachable"*)  # ssh's exit status for a connection that failed
    printf 'ssh: \\033]0;owned\\007%s\\n' $TEMPLATE >&2; exit 255 ;;
esac
case "$payload" in *"/framing/"*)
    name=${payload#*/framing/}; cat "/root/framed/${name%%[!a-z-]*}"; exit 0 ;;
esac
for module in """ + " ".join(FORGED_MODULES) + """; do
    case "$payload" in *plugins.modules.$module*) cat /root/forged/$module.json; exit 0 ;; esac
done
echo '{"failed": true, "msg": "no forgery for this module"}'
""").replace("$TEMPLATE", shlex.quote(TEMPLATE))


@pytest.fixture
def forged(testbed, tmp_path):
    """ct300's python3 replaced by the forgery (a bind mount in the CT's own mount namespace: the host's
    /usr is untouched) and the answers it gives written by the test; afterwards unmounted."""
    real = "/usr/bin/" + os.path.basename(os.path.realpath("/usr/bin/python3"))

    def answers(templated):
        for module in FORGED_MODULES:
            body = json.dumps(forged_answer(module, templated))
            in_ct(testbed, FORGER_NODE, FORGER_VMID, f"mkdir -p /root/forged && cat > /root/forged/{module}.json "
                                                     f"<<'EOF'\n{body}\nEOF")

    in_ct(testbed, FORGER_NODE, FORGER_VMID, f"cat > /root/forgery <<'EOF'\n{FORGERY}EOF\nchmod 755 /root/forgery && "
                                             f"mount --bind /root/forgery {real}")
    try:
        assert in_ct(testbed, FORGER_NODE, FORGER_VMID, "echo x | python3").stdout.startswith('{"failed"')
        # the host's own python3, whose /usr the CT's overlay reads: untouched
        assert subprocess.run(["/usr/bin/python3", "-c", "print(1)"], capture_output=True, text=True,
                              check=True).stdout == "1\n"
        yield answers
    finally:
        in_ct(testbed, FORGER_NODE, FORGER_VMID, f"umount {real}; rm -rf /root/forgery /root/forged /root/framed",
              check=False)
        for path in glob.glob(MARK + "*"):
            os.unlink(path)


@pytest.mark.parametrize("job", ["restart", "status", "logs"])
def test_3_answers_of_other_types_fail_the_cts_task_with_one_line_naming_it(testbed, forged, job):
    forged(templated=False)
    done = make(job, f"HOST={FORGER}")
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-3000:]
    module = "trainer_preflight" if job == "restart" else "trainer_info"
    said = re.findall(rf"{FORGER}: the answer of dflash\.lifecycle\.{module} from the CT is malformed \(([^)]*)\); "
                      "none of it is used", output)
    assert said and "where the module documents " in said[0], output[-3000:]
    assert "Traceback" not in output and "Unexpected failure" not in output
    clean(output)
    assert markers(testbed) == []


@pytest.mark.parametrize("job", ["restart", "status", "logs", "check"])
def test_4_answers_with_templates_and_escape_sequences_in_every_string_render_nothing(testbed, forged, job):
    forged(templated=True)
    done = make(job, f"HOST={FORGER}")
    output = done.stdout + done.stderr
    clean(output)
    assert "Traceback" not in output and re.search(rf"{FORGER}\s+: ok=\d+", output), output[-3000:]
    assert markers(testbed) == []


def test_5_a_planted_lock_file_and_log_are_shown_clean_and_hold_nothing(testbed):
    in_ct(testbed, FORGER_NODE, FORGER_VMID, f"{END_RUNS}; mkdir -p -m 700 /run/dflash && mkdir -p /workspace/logs && "
          "cat > /run/dflash/redeploy.lock <<'EOF'\n"
          + json.dumps({"holder": TEMPLATE + ESCAPES, "since": 1, "expires": 4e9, "renewed": "x", "worker": "me"})
          + "\nEOF\nprintf 'step 1 \\033[2J\\033]0;owned\\007 %s\\n' " + shlex.quote(TEMPLATE) + " >> /workspace/logs/train.log")
    try:
        for job in ("status", "logs"):
            done = make(job, f"HOST={FORGER}")
            output = done.stdout + done.stderr
            assert done.returncode == 0, output[-3000:]
            clean(output)
        assert "step 1 [2J]0;owned { { lookup(" in output
        assert markers(testbed) == []
    finally:
        in_ct(testbed, FORGER_NODE, FORGER_VMID, "rm -f /run/dflash/redeploy.lock /workspace/logs/train.log", check=False)


def test_6_a_progress_file_the_ct_plants_during_a_long_stop_fails_nothing_and_shows_clean(testbed):
    """A stop whose checkpoint takes 17 s (the controller reads its progress after 10 s and 15 s) while
    the CT's root keeps replacing the progress file with other types, escape sequences and a template.
    The module still rewrites the file once a second: a read can find its own line instead (CI saw one
    with a single read), so the planter writes every 20 ms and the stop lasts for two reads."""
    in_ct(testbed, FORGER_NODE, FORGER_VMID, f"{END_RUNS}; mkdir -p /dev/shm/models/target /workspace/data && "
                                             "echo '{}' > /dev/shm/models/target/config.json && "
                                             "echo 'a b c d' > /workspace/data/corpus.txt")
    slow = {"dflash_env": {"DFLASH_TEST_SLOW_CHECKPOINT_SECONDS": "17", "DFLASH_TEST_SLOW_SAVES": "interrupt"}}
    started = make("restart", f"HOST={FORGER}", extra=slow)
    assert started.returncode == 0, started.stdout[-3000:]
    planted = [{"stage": "1" + ESCAPES, "signal": TEMPLATE, "elapsed": "x", "bound": [], "running": 1},
               {"stage": 1, "signal": "SIGINT", "elapsed": 1.0, "running": 1, "checkpoint_bytes": "many"}]
    writes = " ".join(f"printf '%s' {shlex.quote(json.dumps(p))} > /run/dflash/p.tmp && "
                      "mv /run/dflash/p.tmp /run/dflash/stop.progress.json;" for p in planted)
    in_ct(testbed, FORGER_NODE, FORGER_VMID, f"setsid sh -c {shlex.quote(f'while :; do {writes} sleep 0.02; done')} "
                                             "> /dev/null 2>&1 < /dev/null & echo $! > /root/planter.pid")
    try:
        stopped = make("stop", f"HOST={FORGER}")
        output = stopped.stdout + stopped.stderr
        assert stopped.returncode == 0, output[-3000:]
        clean(output)
        assert re.search(rf"{FORGER}: (stop stage 1\[2J|its progress file /run/dflash/stop.progress.json is not one "
                         "the module writes)", output), output[-3000:]
        assert markers(testbed) == []
    finally:
        in_ct(testbed, FORGER_NODE, FORGER_VMID, f"kill $(cat /root/planter.pid); rm -f /root/planter.pid; {END_RUNS}",
              check=False)


# -- an answer framed so that ansible-core would find a JSON object in it ------------------------

# a forgery in the JSON's own escapes: printable in the raw text, ESC and { once decoded
DECODED = json.dumps({"changed": False, "pid": "forged", "running": True, "msg": "\x1b[2J\x1b]0;owned\x07" + TEMPLATE,
                      "warnings": ["\x1b]0;owned\x07" + TEMPLATE], "ansible_facts": {"dflash_pwned": TEMPLATE}})
FRAMED = {
    "line-before": ("ok\n" + DECODED, "text before its JSON object"),
    "control-before": ("\x1b]0;owned\x07" + DECODED, "text before its JSON object"),
    "answer-after": ('{"changed": false}\n' + DECODED, "text after its JSON object"),
    "key-cleaned": ('{"changed": false, "pid\\u200b": "forged"}', "the key 'pid\\u200b', which cleaning changes"),
    "key-twice": ('{"running": false, "running": true}', "the key 'running' given twice"),
    "not-finite": ('{"uptime_s": NaN}', "NaN, a number that is not finite"),
    "internal-key": ('{"_ansible_no_log": true}', "the key '_ansible_no_log', one of ansible-core's own"),
}
# a lock refusal whose fields say what to paste: the controller writes the refusal, and gives a
# command only with a code it checked
FORGED_REFUSAL = json.dumps({"failed": True, "msg": "take it over: -e redeploy_lock_takeover=$(touch " + MARK + "-8)",
                             "exception": {"event": {"msg": "take it over: -e redeploy_lock_takeover=$(id)",
                                                     "__ansible_type": "Event"}, "__ansible_type": "ErrorSummary"},
                             "lock_held": {"holder": "a job -e redeploy_lock_takeover=$(touch " + MARK + "-9)",
                                           "since": 1.0, "expires": 4e9, "renewed": 1.0, "phase": "stop",
                                           "worker_pid": None, "takeover_code": "$(touch " + MARK + "-10)"}})
FRAMINGS_PLAY = """
- hosts: ct300
  gather_facts: false
  tasks:
    - name: Ask the CT with each framing
      dflash.lifecycle.trainer_info:
        pidfile: /framing/{{ item }}
        checkpoint_dir: /x
        log_file: /x
      loop: "{{ framings }}"
      ignore_errors: true
    - name: Ask the CT with an exit status that reads as ssh's own failure
      dflash.lifecycle.trainer_info:
        pidfile: /framing/unreachable
        checkpoint_dir: /x
        log_file: /x
      ignore_unreachable: true
    - name: Mark the CT's hook, whose answer is forged too
      dflash.lifecycle.pve_hook_mark:
        lifecycle_dir: /var/lib/dflash/lifecycle
        installed: true
        set_at: 1
"""


def frame(testbed, name, text):
    """/root/framed/name in the forger CT holds text's bytes exactly (its python3 is the forgery's)."""
    encoded = base64.b64encode(text.encode()).decode()
    in_ct(testbed, FORGER_NODE, FORGER_VMID, f"mkdir -p /root/framed && echo {encoded} | base64 -d > /root/framed/{name}")


def one_line(output, module, why):
    return f"{FORGER}: the answer of dflash.lifecycle.{module} from the CT is malformed ({why}); none of it is used" \
        in output


def test_7_an_answer_framed_as_ansible_core_would_skip_to_fails_the_cts_task_in_one_line(testbed, forged, tmp_path):
    """A line, a control byte, another answer or keys and numbers that ansible-core's parser would
    take: each fails the task with one line naming the CT and what is wrong; nothing of it is shown,
    templated or kept as facts. make status and make restart (whose rescue names the failed check
    again) with a line before the answer; then every framing in one playbook, and a forged refusal."""
    forged(templated=True)
    for module in FORGED_MODULES:
        frame(testbed, module, FRAMED["line-before"][0])
        in_ct(testbed, FORGER_NODE, FORGER_VMID, f"cp /root/framed/{module} /root/forged/{module}.json")
    for job, module in (("status", "trainer_info"), ("restart", "trainer_preflight")):
        done = make(job, f"HOST={FORGER}")
        output = done.stdout + done.stderr
        assert done.returncode != 0 and one_line(output, module, "text before its JSON object"), output[-3000:]
        assert "forged" not in output and "dflash_pwned" not in output and "Traceback" not in output, output[-3000:]
        clean(output)
    for name, (text, _why) in FRAMED.items():
        frame(testbed, name, text)
    frame(testbed, "forged-refusal", FORGED_REFUSAL)
    (tmp_path / "framings.yml").write_text(FRAMINGS_PLAY)
    done = testbed.playbook(str(tmp_path / "framings.yml"), "-e", json.dumps({"framings": [*FRAMED, "forged-refusal"]}),
                            check=False)
    output = done.stdout + done.stderr
    for name, (_text, why) in FRAMED.items():
        assert one_line(output, "trainer_info", why), (name, output[-4000:])
    assert one_line(output, "pve_hook_mark", "text before its JSON object"), output[-4000:]
    # ansible-core's YAML folds a message and doubles its quotes
    flat = " ".join(output.replace("''", "'").split())
    # what the CT wrote on stderr before an exit status of 255, which ansible-core takes for ssh's own
    assert "over ssh: ssh: ]0;owned{ { lookup('ansible.builtin.pipe'" in flat, output[-4000:]
    # the forged refusal: the controller's words, the CT's quoted as its word, no command to paste and
    # no code of the CT's shown
    assert f"{FORGER}: the CT is being redeployed by 'a job -e redeploy_lock_takeover=$(touch" in flat, output[-4000:]
    assert "take the lock over with its takeover code" not in flat and "take it over:" not in flat
    assert "takeover_code" not in output and f"{MARK}-10" not in output
    assert "dflash_pwned" not in output and "Traceback" not in output
    clean(output)
    assert markers(testbed) == []


def test_8_a_takeover_code_is_never_templated_and_only_hex_digits_are_taken(testbed):
    """A pasted template or command substitution as the takeover code fails the job before any
    module runs, naming the variable; nothing renders, nothing runs."""
    stop = os.path.join(REPO, "playbooks", "stop.yml")
    for pasted in (TEMPLATE.replace(MARK + "-controller", MARK + "-takeover"), f"$(touch {MARK}-takeover2)"):
        # straight to ansible-playbook: make would expand $(...) itself, to nothing
        done = testbed.playbook(stop, "-l", FORGER, "-e", json.dumps({"redeploy_lock_takeover": pasted}), check=False)
        output = done.stdout + done.stderr
        assert done.returncode != 0 and "redeploy_lock_takeover: " in output, output[-3000:]
        assert "is not a lock's takeover code (12 hex digits, as a refusal gives it); it was not templated" in output
        clean(output)
    assert markers(testbed) == []


def test_9_a_fifo_the_ct_plants_where_a_push_goes_holds_the_node_no_longer_than_its_bound(testbed, tmp_path):
    in_ct(testbed, FORGER_NODE, FORGER_VMID, "rm -f /root/push-target && mkfifo /root/push-target")
    source = tmp_path / f"dflash-fifo-push-{os.getpid()}"
    source.write_bytes(b"x" * 1024)
    try:
        began = time.monotonic()
        done = run_tool([os.path.join(BIN, "ansible"), FORGER_NODE, "-m", "dflash.lifecycle.pct_push", "-a",
                         json.dumps({"src": str(source), "vmid": int(FORGER_VMID), "dest": "/root/push-target",
                                     "timeout": 3})], check=False)
        took = time.monotonic() - began
        assert done.returncode != 0 and "pct push to CT 300:/root/push-target did not end within 3 s" in done.stdout, \
            done.stdout[-3000:]
        assert took < 3 + 5 + 30, took  # the bound, the KILL after it, and ansible's own start and SSH
        leftover = testbed.ssh(FORGER_NODE, f"find ~/.ansible/tmp -name {source.name}").stdout.split()
        assert leftover == [], leftover  # the transit copy removed whatever pct said
    finally:
        in_ct(testbed, FORGER_NODE, FORGER_VMID, "rm -f /root/push-target", check=False)
