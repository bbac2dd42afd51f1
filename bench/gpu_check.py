#!/usr/bin/env python3
"""GPU truth: the staged stop and the launch on a real CUDA training process.

Runs the collection's own modules (dflash.lifecycle.trainer_process, dflash.lifecycle.staged_stop)
through ansible-core (``python -m ansible adhoc``, connection local) against bench/gpu_trainer.py,
a bf16 model with its optimizer on the GPU, DataLoader workers and two spawn children holding
GPU memory, and checks four scenarios:

1. launched by the project, stopped by the staged stop: stopped at SIGINT, the checkpoint
   loads with torch.load, every process is gone, GPU memory is back to its baseline (and how
   long after the stop's end nvidia-smi showed that);
2. relaunched at once with resume: it resumes from that checkpoint, and the launch's wait for
   the freed memory is measured;
3. the field's launch (``nohup bash run.sh > log 2>&1 &``: SIGINT ignored) with a ``setsid -f``
   helper holding GPU memory: SIGINT reported as ignored, the wrapper, the tree and the helper
   stopped, a GPU process of another session left running;
4. SIGINT while the main thread is blocked in a 12 s CUDA kernel: the SIGINT stage waits it
   out and the checkpoint is still written.

Writes a JSON file and prints a table; exits 1 when a check failed. ``--cpu`` runs the same
scenarios on CPU tensors (``make test`` does, so the check cannot rot): nvidia-smi is not read
then, and files under the work directory stand for /dev/nvidiaN.

On the GPU machine (Python with PyTorch and CUDA, no network): ``make gpu-check-wheels`` here
puts ansible-core and its dependencies as wheels in .whl; then, there, with .whl carried:

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl &&
      PYTHONPATH=/tmp/site python3 bench/gpu_check.py --out $OUT/gpu_check.json
"""

import argparse
import glob
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TRAINER = os.path.join(HERE, "gpu_trainer.py")
sys.path.insert(0, os.path.join(REPO, "collections"))
from ansible_collections.dflash.lifecycle.plugins.module_utils.launch import gpu_memory  # noqa: E402
TRAINER_PATTERN = r"gpu_trainer[.]py --output-dir"
# gpu_trainer.py's checkpoints: step_NNNNNN.pt (torch.save to a temporary name, renamed); its
# resume loads the highest step, and its KeyboardInterrupt handler saves
CHECKPOINT_LAYOUT = {"checkpoint_format": "custom",
                     "checkpoint_custom": {"pattern": "step_*.pt", "step_regex": r"^step_(\d+)\.pt$"}}
LADDER = [{"signal": "SIGINT", "scope": "main", "wait": 180},
          {"signal": "SIGTERM", "scope": "tree", "wait": 30},
          {"signal": "SIGKILL", "scope": "tree", "wait": 10}]
FREED_TOLERANCE_MIB = 256  # above the baseline still counts as back to it
SIZES = {  # the model and the memory the processes hold
    "gpu": {"hidden": 4096, "layers": 8, "vocab": 32000, "seq_len": 512, "batch": 8,
            "child_mib": 4096, "step_sleep": 0.0, "long_kernel_seconds": 12.0},
    "cpu": {"hidden": 64, "layers": 2, "vocab": 512, "seq_len": 64, "batch": 4,
            "child_mib": 16, "step_sleep": 0.05, "long_kernel_seconds": 4.0},
}


class CheckFailed(Exception):
    pass


# -- processes ---------------------------------------------------------------------------------

def stat_of(pid):
    """(ppid, starttime) of a live process, None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in "ZX" else (int(fields[1]), int(fields[19]))


def cmdline_of(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


def process_tree(root):
    """{pid: (starttime, cmdline)} of root and its descendants."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found = stat_of(int(entry))
            if found:
                children.setdefault(found[0], []).append(int(entry))
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        found = stat_of(pid)
        if found:
            tree[pid] = (found[1], cmdline_of(pid))
            todo.extend(children.get(pid, []))
    return tree


def still_alive(processes):
    """The processes of {pid: (starttime, cmdline)} that still run (same PID, same start)."""
    return {pid: info for pid, info in processes.items() if (stat_of(pid) or (0, None))[1] == info[0]}


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise CheckFailed(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


# -- the check ---------------------------------------------------------------------------------

class GpuCheck:
    def __init__(self, args):
        self.cpu = args.cpu
        self.sizes = SIZES["cpu" if args.cpu else "gpu"]
        self.python = os.path.abspath(args.trainer_python or sys.executable)
        self.work = args.work_dir or tempfile.mkdtemp(prefix="dflash-gpu-check-")
        self.run_dir = os.path.join(self.work, "run")
        self.ckpt = os.path.join(self.work, "checkpoints")
        self.logs = os.path.join(self.work, "logs")
        self.devices = os.path.join(self.work, "dev")
        for path in (self.run_dir, self.ckpt, self.logs, self.devices):
            os.makedirs(path, mode=0o700, exist_ok=True)
        if self.cpu:
            with open(os.path.join(self.devices, "nvidia0"), "w"):
                pass  # the file that stands for GPU 0
        self.device_glob = os.path.join(self.devices, "nvidia*") if self.cpu else "/dev/nvidia*"
        self.device_paths = [os.path.join(self.devices, "nvidia0") if self.cpu else "/dev/nvidia0"]
        # a machine's own holder of the device file (nvidia-persistenced, say) would make every
        # launch refuse: the launch then checks the GPU's memory only, and the report says so
        self.foreign_holders = gpu_memory.device_holders(self.device_paths)
        if self.foreign_holders:
            self.device_paths = []
        self.nvidia_smi = None if self.cpu else (shutil.which("nvidia-smi") or "/usr/bin/nvidia-smi")
        self.ansible_cfg = os.path.join(self.work, "ansible.cfg")
        with open(self.ansible_cfg, "w") as handle:
            handle.write("[defaults]\nstdout_callback = ansible.builtin.minimal\n")
        self.started = {}  # processes this check started itself (not through a module): ended at the end
        self.runs = {}  # {pid: (starttime, cmdline)} of every run's processes: any left are ended at the end
        self.baseline_mib = None
        self.log_file = os.path.join(self.logs, "train.log")

    # -- ansible --------------------------------------------------------------------------------
    def module(self, name, args):
        """Run dflash.lifecycle.<name> through ansible-core; its result (failed or not)."""
        env = dict(os.environ, ANSIBLE_CONFIG=self.ansible_cfg, ANSIBLE_COLLECTIONS_PATH=os.path.join(REPO, "collections"),
                   ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_INVENTORY_UNPARSED_WARNING="False",
                   ANSIBLE_HOME=os.path.join(self.work, "ansible-home"), ANSIBLE_NOCOLOR="1",
                   ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
        argv = [sys.executable, "-m", "ansible", "adhoc", "localhost", "-i", "localhost,", "-c", "local",
                "-e", json.dumps({"ansible_python_interpreter": sys.executable}),
                "-m", f"dflash.lifecycle.{name}", "-a", json.dumps(args)]
        done = subprocess.run(argv, env=env, cwd=self.work, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, check=False)
        header = re.search(r"^localhost \| [A-Z!]+ => ", done.stdout, re.MULTILINE)
        if header:
            for line in done.stdout[:header.start()].splitlines():
                print(f"    {line}")  # warnings
            return json.JSONDecoder().raw_decode(done.stdout, header.end())[0]
        raise CheckFailed(f"ansible {name}: no result (status {done.returncode}):\n{done.stdout[-3000:]}")

    def trainer_argv(self, *extra):
        size = self.sizes
        argv = [self.python, "-u", TRAINER, "--output-dir", self.ckpt, "--device", "cpu" if self.cpu else "cuda",
                "--hidden", str(size["hidden"]), "--layers", str(size["layers"]), "--vocab", str(size["vocab"]),
                "--seq-len", str(size["seq_len"]), "--batch", str(size["batch"]),
                "--child-mib", str(size["child_mib"]), "--step-sleep", str(size["step_sleep"])]
        return argv + (["--fake-devices", self.devices] if self.cpu else []) + list(extra)

    def launch(self, *extra):
        result = self.module("trainer_process", {
            "command": self.trainer_argv(*extra), "cwd": self.work, "run_dir": self.run_dir,
            "pidfile": os.path.join(self.run_dir, "trainer.pid"), "pattern": TRAINER_PATTERN,
            "log_file": self.log_file, "log_keep": 20, "checkpoint_dir": self.ckpt,
            **CHECKPOINT_LAYOUT, "resume_auto": True, "device_paths": self.device_paths,
            "gpus": [] if self.cpu else [0], "nvidia_smi": self.nvidia_smi or "/usr/bin/nvidia-smi",
            "health_seconds": 2, "health_timeout": 600, "throughput_lines": 3, "throughput_warmup_lines": 1,
            "throughput_timeout": 120})
        if result.get("pid"):
            self.runs.update(process_tree(result["pid"]))
        if result.get("failed"):
            raise CheckFailed(f"launch failed: {result.get('msg')}")
        return result

    def stop(self, **extra):
        args = {"pidfile": os.path.join(self.run_dir, "trainer.pid"), "pattern": TRAINER_PATTERN,
                "checkpoint_dir": self.ckpt, **CHECKPOINT_LAYOUT, "saves_on": "SIGINT", "device_glob": self.device_glob,
                "log_file": self.log_file, "ladder": LADDER}
        args.update(extra)
        began = time.time()
        result = self.module("staged_stop", args)
        result["ended_at"] = time.time()
        result["began_at"] = began
        if result.get("failed"):
            raise CheckFailed(f"stop failed: {result.get('msg')}")
        return result

    # -- GPU memory -----------------------------------------------------------------------------
    def used_mib(self):
        if self.cpu:
            return None
        out = subprocess.run([self.nvidia_smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                             stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout
        return int(out.strip())

    def watch_freed(self, since, limit_mib, timeout=120):
        """Thread: the seconds after since (wall clock) when GPU 0 first used at most limit_mib."""
        seen = {}

        def poll():
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                used = self.used_mib()
                if used <= limit_mib:
                    seen.update(freed_after_s=round(time.time() - since, 2), used_mib=used)
                    return
                time.sleep(0.05)
            seen.update(freed_after_s=None, used_mib=self.used_mib())

        if self.cpu:
            return None, {"freed_after_s": None, "used_mib": None}
        watcher = threading.Thread(target=poll, daemon=True)
        watcher.start()
        return watcher, seen

    def gpu_machine(self):
        facts = {"python": platform.python_version(), "node_cpus": os.cpu_count(), "mode": "cpu" if self.cpu else "cuda"}
        probe = subprocess.run([self.python, "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
                               stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout.split()
        facts.update(torch=probe[0], cuda=probe[1])
        facts["ansible_core"] = subprocess.run(
            [sys.executable, "-c", "import ansible.release; print(ansible.release.__version__)"],
            stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout.strip()
        if not self.cpu:
            facts["gpu"] = subprocess.run([self.nvidia_smi, "--query-gpu=name,driver_version,memory.total",
                                           "--format=csv,noheader", "-i", "0"],
                                          stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout.strip()
        return facts

    # -- what a scenario shows ---------------------------------------------------------------------
    def checkpoint_facts(self, stop):
        checkpoint = stop.get("checkpoint") or {}
        path = checkpoint.get("new") if checkpoint.get("written") else None
        facts = {"checkpoint": path, "checkpoint_bytes": os.path.getsize(path) if path else None,
                 "checkpoint_write_s": None, "checkpoint_loads": None}
        if path:
            match = []
            for log in glob.glob(self.log_file + "*"):  # the stop's run may be in a rotated log by now
                with open(log) as handle:
                    match += re.findall(rf"checkpoint {re.escape(path)}: \d+ bytes written in ([0-9.]+)s", handle.read())
            facts["checkpoint_write_s"] = float(match[-1]) if match else None
            loaded = subprocess.run(
                [self.python, "-c", "import sys, torch; s = torch.load(sys.argv[1], map_location='cpu', "
                 "weights_only=True); print(s['step'], len(s['model']), len(s['optimizer']['state']))", path],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, check=False)
            facts["checkpoint_loads"] = loaded.returncode == 0
            facts["checkpoint_step"] = int(loaded.stdout.split()[0]) if loaded.returncode == 0 else None
            if loaded.returncode:
                facts["checkpoint_load_error"] = loaded.stderr.strip().splitlines()[-1:]
        return facts

    @staticmethod
    def stop_facts(stop):
        stopped = [e for e in stop.get("timeline", []) if e.get("event") == "stopped"]
        return {"signal": (stop.get("stopped_by") or {}).get("signal"),
                "stop_s": stopped[-1]["elapsed"] if stopped else None,
                "targets": {t["pid"]: t["role"] for t in stop.get("targets", [])},
                "sigint": (stop.get("signal_dispositions") or {}).get("SIGINT"),
                "steps_lost": (stop.get("loss") or {}).get("steps_lost"),
                "last_logged_step": (stop.get("loss") or {}).get("last_logged_step"), "msg": stop.get("msg")}

    def baseline(self):
        if not self.cpu:
            self.baseline_mib = self.used_mib()
        return self.baseline_mib

    def limit(self, extra_mib=0):
        return None if self.cpu else self.baseline_mib + extra_mib + FREED_TOLERANCE_MIB

    # -- the scenarios --------------------------------------------------------------------------
    def scenario_stop(self):
        """1: launched by the project, stopped by the staged stop; 2: relaunched at once with
        resume, the launch waiting for the freed memory."""
        self.baseline()
        first = self.launch()
        tree = process_tree(first["pid"])
        stop = self.stop(require_checkpoint=True)
        watcher, freed = self.watch_freed(stop["ended_at"], self.limit())
        second = self.launch()  # at once: the launch itself waits for the GPUs
        left = still_alive(tree)
        if watcher:
            watcher.join()
        one = dict(self.stop_facts(stop), **self.checkpoint_facts(stop), processes=len(tree),
                   left_running=sorted(left), freed_after_s=freed["freed_after_s"], used_mib_after=freed["used_mib"])
        checks = {"stopped at SIGINT": one["signal"] == "SIGINT", "checkpoint loads": one["checkpoint_loads"] is True,
                  "every process gone": not left}
        if not self.cpu:
            checks["GPU memory back to baseline"] = one["freed_after_s"] is not None
        one["checks"] = checks
        with open(self.log_file) as handle:
            resumed = re.search(r"resumed from (\S+) at step (\d+)", handle.read())
        tree = process_tree(second["pid"])
        stop2 = self.stop(require_checkpoint=True)
        watcher, freed = self.watch_freed(stop2["ended_at"], self.limit())
        if watcher:
            watcher.join()
        left = still_alive(tree)
        two = dict(self.stop_facts(stop2), **self.checkpoint_facts(stop2), processes=len(tree),
                   left_running=sorted(left), launch_gpu_wait_s=second["gpu_wait"]["waited_s"],
                   launch_gpu_held_at_start=second["gpu_wait"]["held_at_start"], resumed=second.get("resumed"),
                   resumed_from=resumed.group(1) if resumed else None,
                   freed_after_s=freed["freed_after_s"], used_mib_after=freed["used_mib"])
        two["checks"] = {"resumed from that checkpoint": two["resumed_from"] == one["checkpoint"] and bool(second.get("resumed")),
                         "stopped at SIGINT": two["signal"] == "SIGINT", "checkpoint loads": two["checkpoint_loads"] is True,
                         "every process gone": not left}
        return {"1 launched, staged stop": one, "2 relaunched with resume": two}

    def scenario_field_launch(self):
        """3: nohup bash run.sh &, a setsid -f helper, a GPU process of another session."""
        self.baseline()
        run_sh = os.path.join(self.work, "run.sh")
        field_ckpt = os.path.join(self.work, "checkpoints-field")  # its loss is its own run's
        os.makedirs(field_ckpt, exist_ok=True)
        argv = self.trainer_argv("--spawn-helper")
        argv[argv.index(self.ckpt)] = field_ckpt
        with open(run_sh, "w") as handle:
            handle.write("#!/bin/bash\n# as the field's /root/run.sh: python is its child, not exec'd\n"
                         + " ".join(argv) + "\n")
        with open(self.log_file, "w"):
            pass
        # the field's line as one simple command: `cd X && nohup ... &` would put the whole list
        # in a background subshell, whose foreground child gets SIGINT back at its default
        subprocess.run(["bash", "-c", f"nohup bash {run_sh} > {self.log_file} 2>&1 &"], cwd=self.work,
                       stdin=subprocess.DEVNULL, check=True)
        wait_for(lambda: re.search(r"holder \d+ holding", open(self.log_file).read()) and
                 re.search(r"tok/s", open(self.log_file).read()), 300, "the field launch's first step and helper")
        bystander = subprocess.Popen(
            [self.python, "-c", f"import sys; sys.path.insert(0, {HERE!r}); import gpu_trainer; "
             f"gpu_trainer.hold_memory({'cpu' if self.cpu else 'cuda'!r}, {self.sizes['child_mib']}, "
             f"{os.path.join(self.devices, 'nvidia0') if self.cpu else None!r})"],
            start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, universal_newlines=True)
        self.started[bystander.pid] = bystander
        wait_for(lambda: "holding" in bystander.stdout.readline(), 300, "the bystander's memory")
        matches = wait_for(lambda: [int(p) for p in os.listdir("/proc") if p.isdigit()
                                    and re.search(TRAINER_PATTERN, cmdline_of(int(p)))
                                    and "multiprocessing" not in cmdline_of(int(p))], 30, "the trainer")
        # the topmost match: its forked children share its command line, and PIDs wrap, so the
        # lowest matching PID may be a child's
        trainer = min(p for p in matches if (stat_of(p) or (None,))[0] not in matches)
        wrapper = stat_of(trainer)[0]
        helper = [int(p) for p in os.listdir("/proc") if p.isdigit() and "--hold-mib" in cmdline_of(int(p))]
        run = process_tree(wrapper)
        run.update({pid: (stat_of(pid)[1], cmdline_of(pid)) for pid in helper})
        self.runs.update(run)
        stop = self.stop(pidfile=os.path.join(self.run_dir, "none.pid"), include_wrapper=True, no_graceful="proceed",
                         checkpoint_dir=field_ckpt)
        left = still_alive(run)
        facts = dict(self.stop_facts(stop), **self.checkpoint_facts(stop), processes=len(run),
                     left_running=sorted(left), helper=helper, bystander=bystander.pid,
                     bystander_running=bystander.poll() is None,
                     bystander_reported=[o["pid"] for o in stop.get("other_gpu_holders", [])])
        watcher, freed = self.watch_freed(stop["ended_at"], self.limit(self.sizes["child_mib"]))
        if watcher:
            watcher.join()
        facts.update(freed_after_s=freed["freed_after_s"], used_mib_after=freed["used_mib"])
        roles = facts["targets"]
        facts["checks"] = {
            "SIGINT reported as ignored": facts["sigint"] == "ignored",
            "wrapper, tree and helper stopped": not left and roles.get(wrapper) == "wrapper"
            and all(roles.get(pid) == "leftover" for pid in helper) and bool(helper),
            "another session's GPU process left running": facts["bystander_running"]
            and bystander.pid in facts["bystander_reported"],
            "the loss stated (no checkpoint was possible)": facts["checkpoint"] is None
            and (facts["last_logged_step"] or 0) > 0 and facts["steps_lost"] == facts["last_logged_step"]
            and f"all {facts['steps_lost']} steps of the run lost" in (facts["msg"] or "")}
        if not self.cpu:
            facts["checks"]["GPU memory back to baseline (the bystander's aside)"] = freed["freed_after_s"] is not None
        self.end(bystander.pid)
        return {"3 field launch, helper, bystander": facts}

    def scenario_long_kernel(self):
        """4: SIGINT while the main thread is blocked in a long CUDA kernel."""
        self.baseline()
        seconds = self.sizes["long_kernel_seconds"]
        launched = self.launch("--long-kernel-at", "6", "--long-kernel-seconds", str(seconds))
        tree = process_tree(launched["pid"])
        kernel = wait_for(lambda: re.search(r"long kernel: .* at ([0-9.]+)", open(self.log_file).read()), 120,
                          "the long kernel")
        kernel_began = float(kernel.group(1))
        time.sleep(1.0)  # SIGINT lands well inside the kernel
        stop = self.stop(require_checkpoint=True)
        with open(self.log_file) as handle:
            handled = re.search(r"SIGINT at step \d+ .t=([0-9.]+)", handle.read())
        left = still_alive(tree)
        watcher, freed = self.watch_freed(stop["ended_at"], self.limit())
        if watcher:
            watcher.join()
        facts = dict(self.stop_facts(stop), **self.checkpoint_facts(stop), processes=len(tree),
                     left_running=sorted(left), kernel_s=seconds,
                     sigint_sent_after_kernel_began_s=round(stop["began_at"] - kernel_began, 2),
                     handler_ran_after_kernel_began_s=round(float(handled.group(1)) - kernel_began, 2) if handled else None,
                     freed_after_s=freed["freed_after_s"], used_mib_after=freed["used_mib"])
        facts["checks"] = {"stopped at SIGINT": facts["signal"] == "SIGINT",
                           "handler ran after the kernel": (facts["handler_ran_after_kernel_began_s"] or 0) >= seconds * 0.9,
                           "checkpoint loads": facts["checkpoint_loads"] is True, "every process gone": not left}
        if not self.cpu:
            facts["checks"]["GPU memory back to baseline"] = freed["freed_after_s"] is not None
        return {"4 SIGINT in a long kernel": facts}

    def end(self, pid):
        """End a process this check started, by its PID."""
        proc = self.started.pop(pid, None)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()

    def run(self):
        report = {"machine": self.gpu_machine(), "work_dir": self.work,
                  "device_file_holders_before": self.foreign_holders,
                  "how": "modules run through ansible-core (python -m ansible adhoc, connection local)",
                  "scenarios": {}}
        try:
            for scenario in (self.scenario_stop, self.scenario_field_launch, self.scenario_long_kernel):
                began = time.monotonic()
                try:
                    for name, facts in scenario().items():
                        facts["scenario_s"] = round(time.monotonic() - began, 1)
                        report["scenarios"][name] = facts
                except CheckFailed as err:
                    report["scenarios"][scenario.__name__] = {"checks": {"ran": False}, "error": str(err)}
        finally:
            for pid in list(self.started):
                self.end(pid)
            left = still_alive(self.runs)
            for pid in left:  # a failed scenario's run: by PID, each checked to be the same process
                os.kill(pid, signal.SIGKILL)
            report["ended_after_the_check"] = sorted(left)
        report["passed"] = (all(all(s["checks"].values()) for s in report["scenarios"].values())
                            and not report["ended_after_the_check"])
        return report


COLUMNS = (("stop_s", "stop s"), ("signal", "signal"), ("checkpoint_bytes", "ckpt MB"),
           ("checkpoint_write_s", "ckpt write s"), ("freed_after_s", "freed after s"),
           ("left_running", "left running"))


def table(report):
    lines = [f"{'scenario':36} " + " ".join(f"{title:>13}" for _, title in COLUMNS)]
    for name, facts in report["scenarios"].items():
        cells = []
        for key, _ in COLUMNS:
            value = facts.get(key)
            if key == "checkpoint_bytes" and value is not None:
                value = f"{value / 1e6:.1f}"
            elif key == "left_running":
                value = len(value) if value is not None else None
            cells.append(f"{'-' if value is None else value!s:>13}")
        lines.append(f"{name:36} " + " ".join(cells))
        for check, ok in facts["checks"].items():
            lines.append(f"    {'ok  ' if ok else 'FAIL'} {check}")
        for key in ("launch_gpu_wait_s", "resumed_from", "sigint", "steps_lost", "last_logged_step",
                    "handler_ran_after_kernel_began_s",
                    "used_mib_after", "error"):
            if facts.get(key) is not None:
                lines.append(f"    {key}: {facts[key]}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="the same scenarios without CUDA")
    parser.add_argument("--trainer-python", help="the Python with PyTorch (default: this one)")
    parser.add_argument("--work-dir", help="default: a new directory under /tmp")
    parser.add_argument("--out", help="the JSON file (default: gpu_check.json in the work directory)")
    args = parser.parse_args()
    check = GpuCheck(args)
    report = check.run()
    out = args.out or os.path.join(check.work, "gpu_check.json")
    with open(out, "w") as handle:
        json.dump(report, handle, indent=2, default=str)
    print(json.dumps(report["machine"]))
    print(table(report))
    print(f"{'PASSED' if report['passed'] else 'FAILED'}; JSON: {out}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
