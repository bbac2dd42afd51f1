#!/usr/bin/env python3
"""Code push cost on the testbed: the trainer_code role against the hand-written loop.

A 200-file trainer tree goes into CT 301 three times (first push, no change, one file
changed), once with `playbooks/push.yml` and once the way it is done by hand (copy the
tree to the node, one `pct push` per file after `mkdir -p`, then `py_compile` in the CT).
Counts come from the pct stand-in's own invocation log; bytes are what crosses to the node.
Needs root; brings the default testbed up (and leaves it as it found it).
Usage: .venv/bin/python bench/push_cost.py
"""

import json
import os
import shlex
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
from testlib import LiveTestbed, testbed_mod  # noqa: E402
from ansible_collections.dflash.lifecycle.plugins.plugin_utils import release_archive  # noqa: E402

NODE, VMID, CT = "pve2", "301", "ct301"
FILES = 200


def make_tree(root):
    for index in range(FILES):
        sub = os.path.join(root, f"pkg{index % 10}")
        os.makedirs(sub, exist_ok=True)
        with open(os.path.join(sub, f"mod_{index}.py"), "w", encoding="utf-8") as handle:
            handle.write(f"# module {index}\n" + "".join(
                f"def f{j}(x):\n    return x * {j} + {index}\n" for j in range(40)))


def counted(bed, action):
    before = len(bed.pct_invocations(NODE))
    action()
    calls = bed.pct_invocations(NODE)[before:]
    return {"pct": len(calls), "push": sum(c["argv"][0] == "push" for c in calls),
            "exec": sum(c["argv"][0] == "exec" for c in calls)}


def role_push(bed, src, base):
    def action():
        bed.playbook(os.path.join(REPO, "playbooks", "push.yml"), "-l", CT, "-e",
                     json.dumps({"trainer_code_src": src, "trainer_run_release_base": base}))
    counts = counted(bed, action)
    store = release_archive.default_archive_dir()
    archives = sorted((os.path.join(store, n) for n in os.listdir(store)), key=os.path.getmtime)
    counts["bytes"] = os.path.getsize(archives[-1]) if counts["push"] else 0
    return counts


def hand_push(bed, src, dest, changed=None):
    files = [changed] if changed else sorted(
        os.path.relpath(os.path.join(r, n), src) for r, _, ns in os.walk(src) for n in ns)
    node_dir = f"/var/tmp/hand-{VMID}"
    sent = sum(os.path.getsize(os.path.join(src, f)) for f in files)

    def action():
        spec = bed.bed.nodes[NODE]
        ssh = ["-o", f"UserKnownHostsFile={bed.bed.known_hosts}", "-i", bed.bed.key,
               "-o", "IdentitiesOnly=yes"]
        bed.ssh(NODE, f"mkdir -p {node_dir}", check=True)
        subprocess.run(["tar", "-C", src, "-cf", "-", *files], check=True,
                       stdout=open(f"{src}.tar", "wb"))
        subprocess.run(["scp", "-q", *ssh, "-P", str(spec["port"]), f"{src}.tar",
                        f"root@{spec['address']}:{node_dir}/t.tar"], check=True)
        dirs = sorted({os.path.dirname(f) for f in files})
        script = [f"cd {node_dir} && tar -xf t.tar",
                  f"pct exec {VMID} -- mkdir -p " + " ".join(shlex.quote(f"{dest}/{d}") for d in dirs)]
        script += [f"pct push {VMID} {shlex.quote(f)} {shlex.quote(f'{dest}/{f}')}" for f in files]
        script.append(f"pct exec {VMID} -- python3 -m py_compile "
                      + " ".join(shlex.quote(f"{dest}/{f}") for f in files if f.endswith(".py")))
        bed.ssh(NODE, " && ".join(script), check=True, timeout=600)
    counts = counted(bed, action)
    counts["bytes"] = sent
    return counts


def main():
    bed_obj = testbed_mod.Testbed()
    was_up = bed_obj.running()
    bed_obj.up_fresh(keep_running=True)  # a testbed that is up (make demo's) stays as it is
    bed = LiveTestbed(bed_obj)
    base, dest = "/opt/dflash-bench", "/root/hand-bench"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "tree")
            make_tree(src)
            bed.ssh(NODE, f"pct exec {VMID} -- rm -rf {base} {dest}", check=True)
            rows = [("first push", role_push(bed, src, base), hand_push(bed, src, dest)),
                    ("no change", role_push(bed, src, base), hand_push(bed, src, dest))]
            with open(os.path.join(src, "pkg3", "mod_3.py"), "a", encoding="utf-8") as handle:
                handle.write("# one line changed\n")
            rows.append(("one file changed", role_push(bed, src, base),
                         hand_push(bed, src, dest, changed="pkg3/mod_3.py")))
            bed.ssh(NODE, f"pct exec {VMID} -- rm -rf {base} {dest}", check=True)
    finally:
        if not was_up:
            bed_obj.down()
    print(f"code push into CT {VMID}, {FILES}-file tree: trainer_code role vs hand loop "
          "(hand: pushes every file it is given; no-change = the same 200 files again)")
    print(f"{'scenario':<18} {'role pct':>9} {'role push':>10} {'role bytes':>11} "
          f"{'hand pct':>9} {'hand push':>10} {'hand bytes':>11}")
    for name, role, hand in rows:
        print(f"{name:<18} {role['pct']:>9} {role['push']:>10} {role['bytes']:>11} "
              f"{hand['pct']:>9} {hand['push']:>10} {hand['bytes']:>11}")


if __name__ == "__main__":
    main()
