#!/usr/bin/env python3
"""The stop of a torchrun run against its save: the stop's own overhead.

Starts the example trainer under the real torchrun (2 ranks over gloo, the torch venv of `make
venv-torch`) in a directory of its own, lets it train, then stops it with the project's staged
stop (module_utils/stop/staged_stop.py, as the module runs it in a CT) and reads, side by side:

* the save: from the signal that reached the ranks to rank 0's checkpoint renamed into place
  (its `latest` pointer's mtime), the trainer's own time;
* the stop: from its start to every process of the run gone;
* the overhead: the stop minus the save.

Three runs: the agent's deadline covers the graceful cap (the launch's own line, the agent alone
signalled), and torchrun's default 30 s deadline with a short and with a 35 s save (the workers
signalled, the agent held). Usage: .venv/bin/python bench/launcher_stop.py
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
import testlib  # noqa: E402,F401  (the collection on the import path)

from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import staged_stop  # noqa: E402

TORCH_PYTHON = os.path.join(REPO, ".venv-torch", "bin", "python")
TRAINER = testlib.TRAINER
CASES = (("launch's line: --shutdown-timeout 900", ["--shutdown-timeout", "900"], 5),
         ("torchrun's default deadline (30 s)", [], 5),
         ("torchrun's default deadline, a 35 s save", [], 35))


def run_case(root, extra, save_seconds):
    out, data = os.path.join(root, "out"), os.path.join(root, "data")
    os.makedirs(out)
    os.makedirs(data)
    log = open(os.path.join(root, "train.log"), "w", encoding="utf-8")
    # DFLASH_TORCH_FULL_EXIT: the processes end as the field's do, the interpreter's final collections
    # included (docs/testbed.md, "Fast exits"), for the stop's own time
    env = dict(os.environ, PYTHONUNBUFFERED="1", DFLASH_STEP_SECONDS="0.02", DFLASH_TEST_SLOW_SAVES="interrupt",
               DFLASH_TEST_SLOW_CHECKPOINT_SECONDS=str(save_seconds), DFLASH_TORCH_FULL_EXIT="1")
    agent = subprocess.Popen([TORCH_PYTHON, "-u", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                              "--max-restarts", "0", *extra, TRAINER, "--target-model", "/x", "--data-dir", data,
                              "--output-dir", out, "--target-gpus", "0", "--drafter-gpus", "1",
                              "--profile-interval", "20", "--save-interval", "100000"],
                             stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while "tok/s" not in open(log.name, encoding="utf-8").read():
            if time.monotonic() > deadline or agent.poll() is not None:
                raise SystemExit(open(log.name, encoding="utf-8").read()[-3000:])
            time.sleep(0.2)
        began = time.time()
        result = staged_stop.run({"pid": agent.pid, "pattern": "train_dflash_pipeline[.]py", "checkpoint_dir": out,
                                  "saves_on": "SIGINT", "device_glob": "", "log_file": log.name})
        ended = time.time()
        agent.wait(timeout=30)
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, 9)
    signalled = next(e for e in result["timeline"] if e["event"] == "signal")["elapsed"] + began
    saved = os.stat(os.path.join(out, "latest")).st_mtime
    assert result["checkpoint"]["written"], result["msg"]
    return {"plan": result["launcher"]["plan"]["to"], "deadline": result["launcher"]["deadline"],
            "save": saved - signalled, "stop": ended - began, "overhead": (ended - began) - (saved - signalled)}


def main():
    if not os.path.exists(TORCH_PYTHON):
        raise SystemExit("no torch venv: make venv-torch")
    print("| run | graceful signal to | deadline found | save | stop | the stop's own overhead |")
    print("|---|---|---|---|---|---|")
    for name, extra, save in CASES:
        root = tempfile.mkdtemp(prefix="dflash-launcher-bench-")
        try:
            row = run_case(root, extra, save)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print(f"| {name} | {row['plan']} | {row['deadline']} | {row['save']:.2f} s | {row['stop']:.2f} s | "
              f"{row['overhead']:.2f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
