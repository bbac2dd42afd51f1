#!/usr/bin/env python3
"""What the controller's check of a CT's answer costs (plugin_utils/untrusted.py AnswerCheck.answer:
the output parsed as exactly one JSON object, bounded, its keys checked, checked against its
module's RETURN, every string cleaned, then written again as JSON for ansible-core), against the JSON
parse that
ansible-core does of every answer anyway, side by side in one run, on answers of the shape and size
of a redeploy's launch call: trainer_process's, with the stop it held (its timeline, targets,
checkpoints), the throughput window and 100 log lines - once plain text, once with a character in
every string that the cleaning must remove. Also the parse of the RETURN docs, once per task (each
task runs in a worker process of its own). Medians of 7 runs of 200 checks.
Usage: .venv/bin/python bench/answer_check.py
"""

import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
import testlib  # noqa: E402,F401  (the collection on the import path)

from ansible_collections.dflash.lifecycle.plugins.plugin_utils import untrusted  # noqa: E402

ROUNDS, CHECKS = 7, 200


def answer(mark=""):
    """A launch's answer as trainer_process returns it after a stop, mark in every string."""
    line = "stopped PID 29 at stage 1 (SIGINT) in 0.3s; new checkpoint /workspace/checkpoints/step_225; 0 steps lost"
    return {"changed": True, "pid": 4242, "msg": line + mark, "first_progress_s": 1.2,
            "argv": ["python3", "-u", "/root/train_dflash_pipeline.py"] + [f"--flag{i}{mark}" for i in range(60)],
            "stop": {"msg": line + mark, "cpu_s": 0.4,
                     "timeline": [{"event": "signal" + mark, "at": 1.0 + i, "signal": "SIGINT", "pids": [1, 2, 3]}
                                  for i in range(40)],
                     "targets": [{"pid": i, "cmdline": "python3 -u /root/train_dflash_pipeline.py" + mark, "role": "main"}
                                 for i in range(30)],
                     "checkpoint": {"appeared": [{"name": f"step_{i}{mark}", "step": i, "complete": True, "problems": []}
                                                 for i in range(20)]}},
            "throughput": {"tokens_per_s": 14200.0, "stages": [{"stage": f"s{i}{mark}", "ms": 1.5} for i in range(20)]},
            "log_tail": [f"step {i} loss 2.3 | 14200 tok/s{mark}" for i in range(100)]}


def median_ms(work):
    times = []
    for _ in range(ROUNDS):
        began = time.perf_counter()
        for _ in range(CHECKS):
            work()
        times.append((time.perf_counter() - began) / CHECKS * 1000)
    return statistics.median(times)


def main():
    print(f"the check of one launch answer, medians of {ROUNDS} runs of {CHECKS} (ms)")
    print(f"{'answer':<34}{'bytes':>8}{'json.loads':>12}{'check':>14}{'ratio':>8}")
    for name, text in (("plain text", json.dumps(answer())), ("an escape in every string", json.dumps(answer("\x1b[2J")))):
        parse = median_ms(lambda text=text: json.loads(text))
        answer_check = untrusted.AnswerCheck("trainer_process", "ct200")
        check = median_ms(lambda text=text: json.dumps(answer_check.answer(text, "", 0)))
        print(f"{name:<34}{len(text):>8}{parse:>12.2f}{check:>14.2f}{check / parse:>7.1f}x")
    docs = []
    for _ in range(ROUNDS):
        untrusted.documented.cache_clear()
        began = time.perf_counter()
        untrusted.documented("trainer_process")
        untrusted.documented("staged_stop")
        docs.append((time.perf_counter() - began) * 1000)
    print(f"RETURN docs of trainer_process and staged_stop, parsed once per task: {statistics.median(docs):.1f} ms")


if __name__ == "__main__":
    main()
