#!/usr/bin/env python3
"""The stop request against the SIGINT path on the same trainer, the helper's cost per step, and
the step at which the ranks of a two-process run stop.

1. The example trainer (step_dirs, saves on SIGINT, a progress line every 10 steps, 20 ms steps)
   runs on the host as a real process (tests/uncooperative.py), once as the field's trainer does
   (its main thread free) and once as in the field's failed stop (a 1 s C call every step, in
   which a signal waits). Each is stopped side by side in one run, alternating, by the module's
   own code: through the stop request (DFLASH_TEST_STOP_REQUEST=take, saves_on auto) and through
   SIGINT (saves_on SIGINT, no request). Printed: the time from the request, or the signal, to
   the run's exit, and the stop's whole wall time; a checkpoint must be written either way.
2. The helper's should_stop() per step, without a process group (one stat() every 10 steps or
   2 s) and in a two-rank gloo process group (one all-reduce every 10 steps), against the
   field's step time (49152 tokens at 14.0K-14.5K tok/s: about 3.4 s); the goal is under 0.1%.
3. Two gloo ranks, each watching its own request file as two CTs do; the requests are written
   0.3 s apart, and each rank's step at the acknowledgement is printed (all equal).

Usage: .venv/bin/python bench/stop_request.py [--rounds N]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import timeit

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
import testlib  # noqa: E402,F401  (installs the collection loader)
import uncooperative  # noqa: E402

sys.path.insert(0, os.path.join(REPO, "tests", "testbed", "example_trainer"))
import dflash_stop_request  # noqa: E402

TORCH_PYTHON = os.path.join(REPO, ".venv-torch", "bin", "python")
FIELD_STEP_S = 49152 / 14250


def one_stop(root, how, block):
    env = {"DFLASH_TEST_SAVES_ON": "SIGINT", "DFLASH_TEST_BLOCK_IN_C_SECONDS": str(block)}
    if how == "request":
        env.update(DFLASH_TEST_STOP_REQUEST="take", DFLASH_STOP_REQUEST=os.path.join(root, "stop-request"))
    trainer = uncooperative.Trainer(root, "step_dirs", save_every=100000, log_every=10, env=env)
    try:
        deadline = time.monotonic() + 60
        while "step 20 " not in trainer.text():
            assert trainer.proc.poll() is None and time.monotonic() < deadline, trainer.text()[-2000:]
            time.sleep(0.05)
        began = time.monotonic()
        result, _ = uncooperative.stop(trainer, "auto" if how == "request" else "SIGINT",
                                       checkpoint_format="step_dirs")
        wall = time.monotonic() - began
    finally:
        trainer.end()
    assert result["checkpoint"]["written"], result["msg"]
    if how == "request":
        assert result["stopped_by"]["scope"] == "request", result["msg"]
        to_exit = result["request"]["exit_after_s"]
    else:
        sent = uncooperative.first_signal(result)
        gone = [e for e in result["timeline"] if e["event"] == "stopped"][-1]
        to_exit = gone["at"] - sent["at"]
    return to_exit, wall


def stops(rounds):
    print(f"# 1. the stop request against SIGINT, {rounds} rounds each, side by side (20 ms steps, "
          "a progress line every 10 steps)")
    print(f"{'trainer':<34} {'path':<8} {'to exit, median':>16} {'worst':>7} {'stop wall, median':>18}")
    for label, block in (("main thread free", 0.0), ("1 s C call every step (the field)", 1.0)):
        figures = {"request": [], "SIGINT": []}
        for index in range(rounds):
            for how in ("request", "SIGINT"):
                root = tempfile.mkdtemp(prefix="dflash-request-bench-")
                try:
                    figures[how].append(one_stop(root, how, block))
                finally:
                    shutil.rmtree(root, ignore_errors=True)
        for how, runs in figures.items():
            exits = [r[0] for r in runs]
            print(f"{label:<34} {how:<8} {statistics.median(exits):>15.2f}s {max(exits):>6.2f}s "
                  f"{statistics.median(r[1] for r in runs):>17.2f}s")


def helper_cost():
    root = tempfile.mkdtemp(prefix="dflash-request-cost-")
    try:
        helper = dflash_stop_request.StopRequest(os.path.join(root, "req"), log=lambda line: None)
        step = [0]

        def call():
            step[0] += 1
            helper.should_stop(step[0])

        calls = 200000
        alone = min(timeit.repeat(call, number=calls, repeat=3)) / calls
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ranks = gloo_run(COST, "cost")
    print("# 2. the helper's should_stop() per training step")
    print(f"no process group:       {alone * 1e6:8.2f} us per step, {100 * alone / FIELD_STEP_S:.5f}% of the field's "
          f"{FIELD_STEP_S:.2f} s step (goal: under 0.1%)")
    per_step = max(float(r) for r in ranks)
    print(f"2 gloo ranks (CPU):     {per_step * 1e6:8.2f} us per step (the slower rank), "
          f"{100 * per_step / FIELD_STEP_S:.5f}% of the field's step")


COST = textwrap.dedent("""
    def body(index, tmp, helper, dist, time):
        steps = 2000
        began = time.perf_counter()
        for step in range(1, steps + 1):
            helper.should_stop(step)
        return (time.perf_counter() - began) / steps
""")
AGREE = textwrap.dedent("""
    def body(index, tmp, helper, dist, time):
        dist.barrier()
        due = time.time() + 1.0 + 0.3 * index  # the second CT's request 0.3 s after the first's
        path = f"{tmp}/request{index}"
        step = 0
        while True:
            step += 1
            time.sleep(0.005)  # a 5 ms step
            if time.time() >= due and not os.path.exists(path):
                open(path + ".tmp", "w").write('{"id": "r%d", "requested_at": %f}' % (index, time.time()))
                os.rename(path + ".tmp", path)
            if helper.should_stop(step):
                return step
""")
RUNNER = textwrap.dedent("""
    import os, sys, time
    import torch.distributed as dist
    import torch.multiprocessing as mp
    sys.path.insert(0, sys.argv[1])
    from dflash_stop_request import StopRequest
    exec(open(sys.argv[3]).read())

    def rank(index, tmp):
        os.environ.update(RANK=str(index), LOCAL_RANK="0")
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=index, world_size=2)
        helper = StopRequest(f"{tmp}/request{index}", every_steps=10, log=lambda line: None)
        figure = body(index, tmp, helper, dist, time)
        open(f"{tmp}/rank{index}.out", "w").write(str(figure))
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(rank, args=(sys.argv[2],), nprocs=2)
""")


def gloo_run(body, name):
    tmp = tempfile.mkdtemp(prefix=f"dflash-request-{name}-")
    try:
        for file_name, text in (("runner.py", RUNNER), ("body.py", body)):
            with open(os.path.join(tmp, file_name), "w", encoding="utf-8") as handle:
                handle.write(text)
        out = subprocess.run([TORCH_PYTHON, os.path.join(tmp, "runner.py"),
                              os.path.join(REPO, "tests", "testbed", "example_trainer"), tmp,
                              os.path.join(tmp, "body.py")], capture_output=True, text=True, timeout=300, check=False)
        if out.returncode != 0:
            raise SystemExit(f"the gloo run failed:\n{out.stderr[-3000:]}")
        results = []
        for index in (0, 1):
            with open(os.path.join(tmp, f"rank{index}.out"), encoding="utf-8") as handle:
                results.append(handle.read())
        return results
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def agreement():
    steps = gloo_run(AGREE, "agree")
    print("# 3. two gloo ranks, each watching its own request, the requests written 0.3 s apart")
    print(f"steps at which the ranks stopped: {', '.join(steps)} "
          f"({'all equal' if len(set(steps)) == 1 else 'NOT equal'})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not os.path.exists(TORCH_PYTHON):
        raise SystemExit(f"{TORCH_PYTHON} is missing: make venv-torch")
    stops(args.rounds)
    helper_cost()
    agreement()


if __name__ == "__main__":
    main()
