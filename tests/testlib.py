"""What the project's tests share: the repository's venv tools, the collection loader and
helpers to reach the local testbed. Not named conftest: the collection's unit tests have a
conftest of their own, and `from conftest import` could find either."""

import json
import os
import re
import shlex
import subprocess
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
BIN = os.path.dirname(sys.executable)
sys.path.insert(0, os.path.join(TESTS, "testbed"))


def _install_collection_loader():
    """Make ansible_collections.dflash.* importable for unit tests, as ansible-test does."""
    from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder
    _AnsibleCollectionFinder(paths=[os.path.join(REPO, "collections")])._install()


_install_collection_loader()

import testbed as testbed_mod  # noqa: E402
from pct import CLI_PATH as CT_PATH  # noqa: E402  (the PATH `pct exec` keeps into the CT)



def _worker_inventory():
    """The testbed inventory of this pytest-xdist worker: inventory/testbed for the first (and
    without xdist), else a copy with its own state dir and nodes on 127.77.(10+N).x, made once
    per worker. Exported as INVENTORY, TESTBED_INVENTORY and ANSIBLE_INVENTORY, so make, the
    testbed and ansible in a test reach this worker's testbed and no other. A pytest run beside
    the workers (run-all.sh's second one) names its own with DFLASH_TESTBED_WORKER."""
    worker = os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get("DFLASH_TESTBED_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    default = os.path.join(REPO, "inventory", "testbed")
    if index == 0:
        return default
    import shutil
    import tempfile
    root = os.path.join(tempfile.gettempdir(), f"dflash-testbed-inventory-{os.getppid()}-{worker}")
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(default, root)
    import atexit
    atexit.register(shutil.rmtree, root, True)
    # the state dir in both files (the mount points' sources live in it), the nodes' addresses
    for name, old, new in (("group_vars/all.yml", "/var/lib/dflash-testbed/main", f"/var/lib/dflash-testbed/main-{worker}"),
                           ("hosts.yml", "/var/lib/dflash-testbed/main/", f"/var/lib/dflash-testbed/main-{worker}/"),
                           ("hosts.yml", "ansible_host: 127.77.0.", f"ansible_host: 127.77.{10 + index}.")):
        path = os.path.join(root, name)
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        assert old in text, f"{path} no longer holds {old!r}"
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text.replace(old, new))
    os.environ.update(INVENTORY=root, TESTBED_INVENTORY=root, ANSIBLE_INVENTORY=root)
    return root


TESTBED_INVENTORY = _worker_inventory()

TRAINER = os.path.join(TESTS, "testbed", "example_trainer", "train_dflash_pipeline.py")

# Tools that look `ansible` up on PATH (testinfra, ansible-runner) find the venv's.
os.environ["PATH"] = BIN + os.pathsep + os.environ["PATH"]
os.environ["ANSIBLE_CONFIG"] = os.path.join(REPO, "ansible.cfg")


# The field's trainer as `pgrep -af train_dflash_pipeline.py` printed it, cut off after
# "--use-soft-la" (--use-soft-labels); nothing after it was recorded.
FIELD = ("python3 -u /root/train_dflash_pipeline.py --target-model /dev/shm/Qwen3.6-27B "
         "--data-dir /workspace/tokenized_completions --output-dir /workspace/checkpoints "
         "--target-gpus 0,1,2,3,4 --drafter-gpus 5,6,7 --epochs 6 --lr 6e-4 --warmup-ratio 0.04 "
         "--weight-decay 0.01 --grad-accum 4 --grad-clip 1.0 --token-budget 49152 --max-seq-len 8192 "
         "--max-batch-size 64 --block-size 32 --max-anchors 1024 --num-draft-layers 5 --gamma 10.0 "
         "--noise-start 0.05 --noise-end 0.01 --noise-type uniform --use-soft-labels")

def trainer_source(path, edit=None):
    """A copy of the example trainer's directory at path (the release a redeploy pushes), its
    train_dflash_pipeline.py changed by edit(text) -> text. Returns the path as a string."""
    import shutil
    shutil.copytree(os.path.dirname(TRAINER), path, ignore=shutil.ignore_patterns("__pycache__"))
    if edit:
        with open(os.path.join(path, "train_dflash_pipeline.py"), encoding="utf-8") as handle:
            text = edit(handle.read())
        with open(os.path.join(path, "train_dflash_pipeline.py"), "w", encoding="utf-8") as handle:
            handle.write(text)
    return str(path)


RUN_VARS = os.path.join(REPO, "inventory", "testbed", "group_vars", "dflash_trainers", "run.yml")


def example_settings():
    """The testbed's dflash_* group_vars (the seeded example run), without the prefix."""
    import yaml
    with open(RUN_VARS, encoding="utf-8") as handle:
        group_vars = yaml.safe_load(handle)
    return {k[len("dflash_"):]: v for k, v in group_vars.items() if k.startswith("dflash_")}


def agrees_with_the_framework(name, info, loaded, reads):
    """Whether the project's verdict on checkpoint name (info: its step, complete, problems)
    agrees with the framework's loader (loaded: the step it loads, or None; reads: the files its
    resume reads): complete exactly when it loads at that step, or incomplete for damage only in
    files that resume never opens (the project wants every file whole: stricter than the loader,
    never looser). No reads: the checkpoint is one file, which the loader reads whole."""
    loads = loaded is not None and loaded == info["step"]
    if bool(info["complete"]) == loads:
        return True
    named = {problem.split(": ", 1)[0] for problem in info["problems"]}
    return loads and bool(reads) and bool(info["problems"]) and not named & {*reads, name}


def make_testbed_inventory(root, state_dir, nodes, cts, settings=None, groups=None):
    """A testbed of its own: inventory/testbed copied to root with its state in state_dir, the
    nodes {name: loopback address} and the CTs {host: host vars (pve_node, ansible_pct_vmid,
    ...)}; settings are added to the CTs' group_vars (a file of their own, read last); groups
    {name: {vars, hosts}} are gangs: groups of CTs under dflash_trainers > dflash_gangs."""
    import shutil
    import yaml
    shutil.copytree(os.path.join(REPO, "inventory", "testbed"), root, symlinks=False)
    all_vars = os.path.join(root, "group_vars", "all.yml")
    with open(all_vars, encoding="utf-8") as handle:
        text = handle.read().replace("testbed_state_dir: /var/lib/dflash-testbed/main",
                                     f"testbed_state_dir: {state_dir}")
    with open(all_vars, "w", encoding="utf-8") as handle:
        handle.write(text)
    hosts = {"all": {"children": {
        "proxmox_nodes": {"hosts": {name: {"ansible_host": address} for name, address in nodes.items()}},
        "dflash_trainers": {"hosts": cts, "children": {"dflash_gangs": {"children": {
            name: {"hosts": {h: None for h in group["hosts"]}} for name, group in (groups or {}).items()}}}}}}}
    with open(os.path.join(root, "hosts.yml"), "w", encoding="utf-8") as handle:
        handle.write("---\n" + yaml.safe_dump(hosts, sort_keys=False))
    if settings:
        with open(os.path.join(root, "group_vars", "dflash_trainers", "zz_test.yml"), "w", encoding="utf-8") as handle:
            handle.write("---\n" + yaml.safe_dump(settings, sort_keys=False))
    for name, group in (groups or {}).items():  # a file: inline group vars would lose to group_vars/
        with open(os.path.join(root, "group_vars", f"{name}.yml"), "w", encoding="utf-8") as handle:
            handle.write("---\n" + yaml.safe_dump(group.get("vars", {}), sort_keys=False))
    return root


def make(*args, extra=None, inventory=None):
    """`make <args>` as a user types it, with extra (a mapping) as EXTRA='-e <json>' and another
    INVENTORY when given; its CompletedProcess."""
    env = tool_env()
    if inventory:
        env.update(INVENTORY=inventory, ANSIBLE_INVENTORY=inventory)
    command = ["make", *args] + ([f"EXTRA=-e {shlex.quote(json.dumps(extra))}"] if extra else [])
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL, timeout=600)


def task_ran(output, name):
    """Whether the task called name ran on some host in an ansible-playbook output (a task that
    was skipped everywhere still prints its header)."""
    for block in output.split("\nTASK [")[1:]:
        header, _, body = block.partition("\n")
        if name in header and re.search(r"^(ok|changed|fatal): \[", body, re.M):
            return True
    return False


def tool_env():
    return dict(os.environ, ANSIBLE_NOCOLOR="1")


def run_tool(args, check=True, **kwargs):
    # stdin: ansible-core refuses a non-blocking one, which the test runner's may be
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    res = subprocess.run(args, cwd=REPO, env=tool_env(), capture_output=True, text=True,
                         check=False, **kwargs)
    if check and res.returncode != 0:
        raise AssertionError(f"{args} exited {res.returncode}\n{res.stdout}\n{res.stderr}")
    return res


class LiveTestbed:
    """The default testbed (inventory/testbed) plus helpers to reach its nodes."""

    def __init__(self, bed):
        self.bed = bed

    def ssh(self, node, command, input=None, check=False, timeout=60):
        """command on node. The calls share one connection per node (a ControlMaster of the
        tests' own, its socket in the testbed's state directory, gone after 30 s idle): a
        handshake costs both CPUs about 0.1 s and the wall 0.3 s, and the tests make over a
        thousand calls."""
        spec = self.bed.nodes[node]
        args = ["ssh", "-T", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={self.bed.known_hosts}",
                "-o", "IdentitiesOnly=yes", "-i", self.bed.key, "-o", "ControlMaster=auto",
                "-o", f"ControlPath={self.control_path_prefix()}%C", "-o", "ControlPersist=30",
                "-p", str(spec["port"]), f"root@{spec['address']}", command]
        res = subprocess.run(args, input=input, capture_output=True, check=False, timeout=timeout,
                             text=isinstance(input, str) or input is None)
        if check and res.returncode != 0:
            raise AssertionError(f"{command!r} on {node}: rc={res.returncode}\n{res.stderr}")
        return res

    def in_ct(self, node, vmid, command, input=None, check=False, timeout=60):
        """The shell command in CT vmid on node, as `pct exec <vmid> -- sh -c <command>` through the
        node's ssh runs it there (tests/testbed/pct.py Node.attach_argv: lxc-attach on the node's LXC path,
        pve-common's PATH, the session's environment kept; the login's directory): the tests' own
        look into a CT, without the ssh round trip and pct's start-up - about 8 ms of CPU against 38,
        and the tests look some 1600 times. What they claim of ssh and pct goes through them (the
        jobs, test_pct_conformance.py, test_staged_stop.py's trainers started by hand).
        SIGINT and SIGQUIT reach the command at their defaults, as sshd's session hands them to
        `pct exec`: a make test started as a background job ignores them, and a trainer a test
        starts by hand would inherit that (Python keeps an ignored SIGINT ignored)."""
        env = {"PATH": CT_PATH, "HOME": "/root", "USER": "root", "LOGNAME": "root", "SHELL": "/bin/bash",
               "LANG": "C.UTF-8", "MAIL": "/var/mail/root", "PVE_TESTBED_NODE": node}
        attach = ["env", "--default-signal=INT,QUIT"] + self.bed.pct_node(node).attach_argv(vmid, ["sh", "-c", command])
        res = subprocess.run(attach, input=input, capture_output=True, check=False, timeout=timeout, env=env,
                             cwd="/root", text=isinstance(input, str) or input is None)
        if check and res.returncode != 0:
            raise AssertionError(f"{command!r} in CT {vmid} on {node}: rc={res.returncode}\n{res.stderr}")
        return res

    def wait_in_ct(self, node, vmid, condition, timeout, what, detail=None):
        """Until the shell condition holds in CT vmid on node, polled inside the CT every 0.1 s:
        one call, where a poll per call costs the CPUs that the tests share. Fails naming what it
        waited for, and detail() when given."""
        script = f"until {condition}; do sleep 0.1; done"
        res = self.in_ct(node, vmid, f"timeout {timeout} sh -c {shlex.quote(script)}", timeout=timeout + 60)
        assert res.returncode == 0, (f"{what}: not within {timeout}s in CT {vmid} on {node} "
                                     f"(rc {res.returncode} {res.stderr[-1000:]})\n{detail() if detail else ''}")

    def control_path_prefix(self):
        """Where the tests' own ControlMasters keep their sockets (ansible's are elsewhere)."""
        return os.path.join(self.bed.state_dir, "cm-")

    def pct_invocations(self, node):
        path = os.path.join(self.bed.node_dir(node), "pct-invocations.log")
        if not os.path.exists(path):
            return []
        with open(path, encoding="utf-8") as handle:
            return [json.loads(line) for line in handle]

    def ansible(self, *args, check=True):
        return run_tool([os.path.join(BIN, "ansible"), *args], check=check)

    def playbook(self, *args, check=True):
        return run_tool([os.path.join(BIN, "ansible-playbook"), *args], check=check)


class OwnTestbed:
    """A testbed of a test module's own (make_testbed_inventory's), its CTs {host: (node, vmid)}."""

    def __init__(self, inventory, cts):
        self.inventory, self.cts = inventory, cts
        self.bed = testbed_mod.Testbed(inventory)
        self.live = LiveTestbed(self.bed)

    def sh(self, host, command, check=True):
        """What command prints in host's CT; an AssertionError when it fails, unless check is False."""
        node, vmid = self.cts[host]
        res = self.live.in_ct(node, vmid, command)
        assert res.returncode == 0 or not check, f"{host}: {command}: {res.stderr}"
        return res.stdout


GANG = "dflash_big"
TORCH_PYTHON = os.path.join(REPO, ".venv-torch", "bin", "python")


GANG_MODEL = "/workspace/models/target"


def make_gang_inventory(root, state_dir, loopback, cluster_net, solo=False, ranks_per_ct=2):
    """A testbed of its own for a gang: two nodes on loopback (<loopback>.1, .2), a CT on each -
    ct400 (rank 0) and ct401 (rank 1) of gang dflash_big, on the testbed's cluster network
    (<cluster_net>.1, .2 in a network namespace of the testbed's own) and sharing one checkpoint
    directory (a bind mount point, as shared storage is) - each running a torchrun agent with
    ranks_per_ct CPU ranks over gloo (1: DFlash's own shape, one process over the CT's 2 GPUs). Both CTs are unprivileged, as Proxmox creates them, and the shared directory is
    handed to their root as the nodes see it (uid 100000, the same map on both). With solo, ct402 on the
    first node runs the same alone (torchrun --standalone), privileged."""
    shared = f"{state_dir}/shared/checkpoints,mp=/workspace/checkpoints"
    cts = {}
    for rank, (node, vmid) in enumerate((("gn1", 400), ("gn2", 401))):
        address = f"{cluster_net}.{rank + 1}"
        cts[f"ct{vmid}"] = {"pve_node": node, "ansible_pct_vmid": vmid, "testbed_gpu_count": 2,
                            "trainer_run_gang_rank": rank, "trainer_run_gang_address": address,
                            "testbed_net0": f"name=eth0,bridge=vmbr0,ip={address}/24", "testbed_mp0": shared,
                            "testbed_unprivileged": True, "testbed_mapped_mounts": ["mp0"]}
    if solo:
        cts["ct402"] = {"pve_node": "gn1", "ansible_pct_vmid": 402, "testbed_gpu_count": 2,
                        "trainer_run_launcher_options": {"nproc_per_node": 2, "standalone": True}}
    settings = {"trainer_run_launcher": "torchrun", "trainer_run_launcher_options": {"nproc_per_node": ranks_per_ct},
                "trainer_run_python": TORCH_PYTHON, "dflash_target_gpus": [0], "dflash_drafter_gpus": [1],
                "dflash_profile_interval": 20,
                # on the CT's disk: a CT restart (test_gang.py tests 11, 12) keeps it, and no launch starts without it
                "dflash_target_model": GANG_MODEL,
                # a gang's crash relaunched after a short back-off (test_gang.py test 13)
                "trainer_launch_supervise_backoff_s": 2}
    return make_testbed_inventory(root, state_dir, {"gn1": f"{loopback}.1", "gn2": f"{loopback}.2"}, cts,
                                  settings, groups={GANG: {"vars": {"trainer_run_gang": GANG}, "hosts": ["ct400", "ct401"]}})


# ends every run of a CT as a person would before a test's own: the runs' supervisors first (they
# would restart a trainer ended under them), then the trainers; all of them processes of the testbed
END_SUPERVISORS = "for p in $(pgrep -f 'agent[.]zip supervise'); do kill -KILL $p; done"
END_RUNS = f"{END_SUPERVISORS}; for p in $(pgrep -f 'train_dflash_pipeline[.]py'); do kill -KILL $p; done"


def supervised_run(testbed, node, vmid, host, settings, wipe):
    """A module's CT running the example trainer under its supervisor: the CT's runs ended and the
    paths wipe removed, the CT seeded, then launched by redeploy.yml with settings; yields the testbed,
    and ends the CT's runs afterwards."""
    def in_ct(command):
        return testbed.in_ct(node, vmid, command, check=False, timeout=120)

    in_ct(END_RUNS)
    in_ct(f"rm -rf {' '.join(wipe)}")
    testbed.playbook(os.path.join(REPO, "playbooks", "testbed_seed.yml"), "-e", f"seed_hosts={host}")
    launched = testbed.playbook(os.path.join(REPO, "redeploy.yml"), "-l", host, "-e", json.dumps(settings), check=False)
    assert launched.returncode == 0, launched.stdout[-4000:]
    try:
        yield testbed
    finally:
        in_ct(f"{END_RUNS}; rm -rf {' '.join(wipe)}")


def wait_for(what, condition, timeout=120, said=lambda: ""):
    """condition()'s first true value, asked every second (a condition is mostly a look into a CT,
    LiveTestbed.in_ct's, or a `make status`, whose CPU the tests share); AssertionError naming what
    (and what said() tells then) when none came within timeout seconds."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(1.0)
    raise AssertionError(f"{what}: not within {timeout} s\n{said()}")


def interrupt_save_lines(log, path, step):
    """The lines of a trainer's log saying that checkpoint path (of step) was saved, when the log
    has the example trainer's KeyboardInterrupt at that step: the handler's own save, or, for an
    interrupt at a periodic save's step, that periodic save, which the handler finds complete and
    does not write again (train_dflash_pipeline.save_checkpoint). Empty without that interrupt."""
    if f"KeyboardInterrupt at step {step}: saving checkpoint" not in log:
        return []
    return re.findall(rf"^.*checkpoint saved: {re.escape(path)} \(step {step}, (?:interrupt|interval)\)$", log, re.M)
