"""The hand procedure this project replaces, as the field's operators ran it against a testbed
CT: scp the edited trainer to the node, `pct push` it into the CT, `py_compile` it there,
`pgrep -af` the trainer, `kill -INT` it, poll `kill -0` every 2 s (the field's loop), then
relaunch the same command line on the pushed copy in its own session (`setsid -f`, as the seed
playbook starts it: a `nohup ... &` start would leave SIGINT ignored), its output appended to
the log. Each step is its own ssh to the node, as typed by hand. Used by the benches only."""

import subprocess
import time

HAND_COPY = "/tmp/train_dflash_pipeline.py"
LOG = "/workspace/logs/train.log"


def redeploy_by_hand(bed, address, vmid, src_file, port=2222):
    """Run the procedure on CT vmid of the testbed bed (testbed.Testbed) behind the node at
    address; returns when the relaunch command has returned."""
    ssh = ["ssh", "-T", "-o", f"UserKnownHostsFile={bed.known_hosts}", "-i", bed.key,
           "-o", "IdentitiesOnly=yes", "-o", "ControlMaster=no", "-p", str(port), f"root@{address}"]

    def remote(command):
        return subprocess.run(ssh + [command], capture_output=True, text=True, check=True).stdout

    subprocess.run(["scp", "-q", "-o", f"UserKnownHostsFile={bed.known_hosts}", "-i", bed.key,
                    "-P", str(port), src_file, f"root@{address}:/root/train_dflash_pipeline.py"], check=True)
    remote(f"pct push {vmid} /root/train_dflash_pipeline.py {HAND_COPY}")
    remote(f"pct exec {vmid} -- python3 -m py_compile {HAND_COPY}")
    line = remote(f"pct exec {vmid} -- pgrep -af 'train_dflash_pipeline[.]py'")
    pid = line.split()[0]
    cmdline = line.split(None, 1)[1].strip().replace("/opt/dflash/current/train_dflash_pipeline.py", HAND_COPY)
    remote(f"pct exec {vmid} -- kill -INT {pid}")
    while subprocess.run(ssh + [f"pct exec {vmid} -- kill -0 {pid}"], capture_output=True,
                         check=False).returncode == 0:
        time.sleep(2)
    remote(f"pct exec {vmid} -- sh -c 'cd /workspace && setsid -f {cmdline} >> {LOG} 2>&1 < /dev/null'")
