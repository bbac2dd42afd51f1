"""Trainers that do not cooperate with the stop, as real processes on the host, and the stop
(module_utils/stop/staged_stop.py, in this process, on the real /proc) run against them.

The trainer is the example trainer with a framework's checkpoint layout
(tests/testbed/example_trainer/checkpoint_layouts.py: each framework's real file formats in
its source's order of writes), saving on no signal unless told, its stdout a file of its own.
The harness starts the stop while one of its periodic saves is under way, and reads what the
framework itself finds on disk afterwards (the imitation's own resume rule and loader), so a
test or a bench compares the stop's verdict with the files. tests/unit/test_own_checkpoint_stop.py
and bench/own_checkpoint_stop.py use it.
"""

import os
import re
import signal
import subprocess
import sys
import time

from testlib import TESTS, TRAINER

sys.path.insert(0, os.path.join(TESTS, "testbed", "example_trainer"))
import checkpoint_layouts as layouts  # noqa: E402

from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoint_formats
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import staged_stop  # noqa: E402

LAYOUTS = ("step_dirs",) + tuple(sorted(layouts.LAYOUTS))
ARGS = ["--target-gpus", "0", "--drafter-gpus", "1", "--epochs", "1", "--steps-per-epoch", "100000",
        "--token-budget", "256", "--max-seq-len", "64", "--max-batch-size", "2"]
LADDER = [{"signal": "SIGINT", "scope": "main", "wait": 15}, {"signal": "SIGTERM", "scope": "tree", "wait": 10},
          {"signal": "SIGKILL", "scope": "tree", "wait": 5}]
PROGRESS = re.compile(r"\bstep (\d+) epoch")


def default_signals():
    """SIGINT and SIGTERM at their defaults, as the launch starts a trainer: a test run started as
    a background job of a non-interactive shell would pass SIGINT on ignored (as nohup ... & does)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class Trainer:
    """The example trainer in tmp: saves every save_every steps, each save taking slow s (and
    a quiet pause after its first file), a progress line every log_every steps, stdout to
    tmp/own.log (not the log file any setting names). held_log: its progress goes to tmp/train.log
    instead, through a logging.FileHandler it holds open, and that is the log file the stop is
    told of (configured_log); stdout, tmp/own.log, then has no progress line."""

    def __init__(self, tmp, layout, save_every=40, slow=1.0, pause=0.0, log_every=1, env=None, held_log=False):
        self.layout = layout
        self.out = os.path.join(tmp, "checkpoints")
        self.stdout = os.path.join(tmp, "own.log")
        self.log = os.path.join(tmp, "train.log") if held_log else self.stdout
        self.configured_log = self.log if held_log else "/nonexistent/configured.log"
        self.tmpdir = os.path.join(tmp, "tmp")  # Lightning's temporary files: a save is visible there
        for path in (self.out, self.tmpdir, os.path.join(tmp, "data")):
            os.makedirs(path, exist_ok=True)
        full_env = {**os.environ, "TMPDIR": self.tmpdir, "DFLASH_STEP_SECONDS": "0.02",
                    "DFLASH_TEST_SLOW_CHECKPOINT_SECONDS": str(slow), "DFLASH_TEST_SAVE_PAUSE_SECONDS": str(pause),
                    "DFLASH_TEST_SLOW_SAVES": "interval", "DFLASH_TEST_CHECKPOINT_KB": "16",
                    "DFLASH_TEST_SAVES_ON": "none", **(env or {})}
        if layout != "step_dirs":
            full_env["DFLASH_TEST_CHECKPOINT_LAYOUT"] = layout
        if held_log:
            full_env["DFLASH_TEST_LOG_FILE"] = self.log
        argv = [sys.executable, "-u", TRAINER, "--target-model", os.path.join(tmp, "model"),
                "--data-dir", os.path.join(tmp, "data"), "--output-dir", self.out, *ARGS,
                "--save-interval", str(save_every), "--profile-interval", str(log_every)]
        with open(self.stdout, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=full_env,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=default_signals)

    def text(self):
        try:
            with open(self.log, encoding="utf-8", errors="replace") as handle:
                return handle.read()
        except FileNotFoundError:  # a held log not opened yet
            return ""

    def last_logged_step(self):
        steps = PROGRESS.findall(self.text())
        return int(steps[-1]) if steps else None

    def saves_done(self):
        return len(os.listdir(self.out)) and self.text().count("checkpoint saved") if self.layout != "step_dirs" \
            else len([n for n in os.listdir(self.out) if re.match(r"^step_\d+$", n)])

    def newest_write(self):
        """The newest mtime of anything in the checkpoint directory or the temporary directory."""
        newest = 0.0
        for top in (self.out, self.tmpdir):
            for root, dirs, files in os.walk(top):
                for item in dirs + files:
                    try:
                        newest = max(newest, os.lstat(os.path.join(root, item)).st_mtime)
                    except OSError:
                        continue
        return newest

    def wait_for_saves(self, count, timeout=60):
        """Until count saves are done (so the stop sees their interval)."""
        deadline = time.monotonic() + timeout
        while self.saves_done() < count:
            self._alive_before(deadline)

    def wait_for_save_under_way(self, saves_before=2, timeout=60):
        """Once saves_before saves are done, wait for a quiet moment between saves, then for the
        next save's first write: it is under way."""
        deadline = time.monotonic() + timeout
        self.wait_for_saves(saves_before, timeout)
        while time.time() - self.newest_write() < 0.25:  # between two saves
            self._alive_before(deadline)
        quiet_since = self.newest_write()
        while self.newest_write() <= quiet_since:
            self._alive_before(deadline, 0.005)

    def _alive_before(self, deadline, pause=0.02):
        assert self.proc.poll() is None, self.text()[-2000:]
        assert time.monotonic() < deadline, "the trainer did not save in time:\n" + self.text()[-2000:]
        time.sleep(pause)

    def end(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def stop(trainer, saves_on="auto", **options):
    """The staged stop of trainer, as the module runs it in a CT: its result (or StopFailed's),
    and the wall time it began."""
    params = {"pid": trainer.proc.pid, "pattern": re.escape(trainer.out), "saves_on": saves_on, "ladder": LADDER, "graceful_wait_cap": 30,
              "next_checkpoint_timeout": 60, "log_file": trainer.configured_log,
              "step_regex": r"\bstep (\d+) epoch", **options}
    began = time.time()
    try:
        result = staged_stop.run(params)
    except staged_stop.StopFailed as err:
        result = err.result
    try:
        trainer.proc.wait(timeout=5)  # reaped: the stop saw it as a zombie, gone
    except subprocess.TimeoutExpired:
        pass  # the test reports what still runs; its fixture ends it
    return result, began


def completion_mark(trainer, name):
    """When the save of checkpoint name was over by its layout's last write: the newest write
    inside it, or its pointer's when the pointer (written after it) names it."""
    layout = checkpoint_formats.layout(trainer.layout)
    path = os.path.join(trainer.out, name)
    mark = max([os.lstat(path).st_mtime] + [os.lstat(os.path.join(r, f)).st_mtime
                                             for r, _d, fs in os.walk(path) for f in fs])
    pointers = [layout.pointer] if layout.pointer else [n for n in os.listdir(trainer.out) if n.endswith("-latest")]
    for pointer in pointers:
        pointer_path = os.path.join(trainer.out, pointer)
        if os.path.lexists(pointer_path) and layout.pointer_names(trainer.out, name, {"step": step_of(trainer, name)}):
            mark = max(mark, os.lstat(pointer_path).st_mtime)
    return mark


def step_of(trainer, name):
    return checkpoint_formats.layout(trainer.layout).step(name, os.path.join(trainer.out, name))


def framework_finds(trainer, paths=()):
    """What the framework's own resume picks and loads, and the step each path loads (None: it
    does not load)."""
    return layouts.judge(trainer.layout, trainer.out, list(paths))


def first_signal(result):
    sent = [e for e in result["timeline"] if e["event"] == "signal"]
    return sent[0] if sent else None
