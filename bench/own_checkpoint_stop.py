#!/usr/bin/env python3
"""The stop that waits for the trainer's own checkpoint, per layout: how soon after the
checkpoint's completion mark the signal that ends the trainer goes, and how many steps are
lost after that checkpoint.

For each of the seven layouts, the example trainer with that framework's imitation (real file
formats, the framework's order of writes; saves on no signal; a progress line every step) runs
on the host as a real process, its periodic save taking 0.6 s every 25 steps of 20 ms. The stop
(module_utils/stop/staged_stop.py, no_graceful=wait_for_checkpoint) begins while a save is under way,
so that save is the one it waits for (tests/uncooperative.py). Measured per run:

  mark -> signal  the stop's first signal (its timeline's wall clock) minus the save's last
                  write (the newest file in the checkpoint, or its pointer when the pointer is
                  written after it); the goal is under 1 s
  steps lost      the trainer's last logged step minus the checkpoint's step (steps it made
                  between its save and the signal)
  verdict         written, and what the framework's own loader loads is that step

Prints the median and the worst of each per layout. Usage:
  .venv/bin/python bench/own_checkpoint_stop.py [--runs N]
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
import testlib  # noqa: E402,F401  (installs the collection loader)
import uncooperative  # noqa: E402


def one_run(layout, root):
    trainer = uncooperative.Trainer(root, layout, save_every=25, slow=0.6)
    try:
        trainer.wait_for_save_under_way()
        result, _began = uncooperative.stop(trainer, "none" if layout == "step_dirs" else "auto")
    finally:
        trainer.end()
    ckpt = result["checkpoint"] or {}
    sent = uncooperative.first_signal(result)
    if not ckpt.get("written") or sent is None:
        return {"ok": False, "msg": result.get("msg")}
    name = os.path.basename(ckpt["new"])
    loads = uncooperative.framework_finds(trainer, [ckpt["new"]])["loads"][ckpt["new"]]
    return {"ok": loads == ckpt["new_step"], "msg": result["msg"],
            "latency": sent["at"] - uncooperative.completion_mark(trainer, name),
            "lost": trainer.last_logged_step() - ckpt["new_step"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"# the trainer's own checkpoint, then the stop: {args.runs} runs per layout "
          "(save 0.6 s every 25 steps of 20 ms, stop begun while a save is under way)")
    print(f"{'layout':<18} {'mark -> signal median':>22} {'worst':>7} {'steps lost median':>18} {'worst':>6}"
          f" {'verdicts right':>15}")
    worst_overall = 0.0
    for layout in uncooperative.LAYOUTS:
        runs = []
        for _ in range(args.runs):
            root = tempfile.mkdtemp(prefix="own-ckpt-")
            try:
                runs.append(one_run(layout, root))
            finally:
                shutil.rmtree(root, ignore_errors=True)
        good = [r for r in runs if r["ok"]]
        for bad in (r for r in runs if not r["ok"]):
            print(f"  {layout}: verdict wrong: {bad['msg']}")
        if not good:
            print(f"{layout:<18} {'-':>22} {'-':>7} {'-':>18} {'-':>6} {0:>9}/{len(runs)}")
            continue
        latency = [r["latency"] for r in good]
        lost = [r["lost"] for r in good]
        worst_overall = max(worst_overall, max(latency))
        print(f"{layout:<18} {statistics.median(latency):>21.3f}s {max(latency):>6.3f}s "
              f"{statistics.median(lost):>18} {max(lost):>6} {len(good):>9}/{len(runs)}")
    print(f"worst mark -> signal over every layout: {worst_overall:.3f}s (goal: under 1 s)")


if __name__ == "__main__":
    main()
