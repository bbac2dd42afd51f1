"""The example trainer: checkpoint on SIGINT, resume, and each misbehaviour switch.

The trainer runs as a real process on the host (it is plain Python); the demo and
the integration tests run the same file inside CTs.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from uncooperative import default_signals

from testlib import TRAINER

SEED_ARGS = ["--target-gpus", "0,1,2,3,4", "--drafter-gpus", "5,6,7", "--epochs", "6",
             "--lr", "6e-4", "--warmup-ratio", "0.03", "--weight-decay", "0.01",
             "--grad-accum", "4", "--grad-clip", "1.0", "--token-budget", "16384",
             "--max-seq-len", "2048", "--max-batch-size", "16", "--block-size", "16",
             "--max-anchors", "8", "--num-draft-layers", "1", "--gamma", "7",
             "--noise-start", "0.3", "--noise-end", "0.05", "--noise-type", "uniform",
             "--use-soft-labels", "--profile-interval", "5"]


class Trainer:
    def __init__(self, tmp_path, env=None, extra=()):
        self.out = tmp_path / "out"
        self.log = tmp_path / "train.log"
        (tmp_path / "data").mkdir(exist_ok=True)
        args = [sys.executable, "-u", TRAINER, "--target-model", str(tmp_path / "model"),
                "--data-dir", str(tmp_path / "data"), "--output-dir", str(self.out),
                *SEED_ARGS, *extra]
        full_env = {**os.environ, "DFLASH_STEP_SECONDS": "0.01", **(env or {})}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=full_env,
                                         preexec_fn=default_signals)

    def text(self):
        return self.log.read_text()

    def wait_for(self, needle, timeout=30):
        deadline = time.monotonic() + timeout
        while needle not in self.text():
            assert self.proc.poll() is None or needle in self.text(), self.text()
            assert time.monotonic() < deadline, f"{needle!r} not logged:\n{self.text()}"
            time.sleep(0.02)

    def status_field(self, field):
        with open(f"/proc/{self.proc.pid}/status", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1], 16)
        raise AssertionError(field)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def trainers():
    started = []
    yield lambda *a, **k: started.append(Trainer(*a, **k)) or started[-1]
    for trainer in started:
        trainer.stop()


def latest(out):
    return (out / "latest").read_text().strip()


def test_trains_logs_throughput_and_checkpoints_on_sigint(trainers, tmp_path):
    trainer = trainers(tmp_path, extra=["--warmup-ratio", "0", "--lr", "0.02"])
    trainer.wait_for("step 30 ")
    assert "tok/s" in trainer.text() and "drafter" in trainer.text()
    trainer.proc.send_signal(signal.SIGINT)
    assert trainer.proc.wait(timeout=30) == 130
    name = latest(trainer.out)
    assert (trainer.out / name / "COMPLETE").exists()
    assert not list(trainer.out.glob(".tmp-*"))
    assert "KeyboardInterrupt" in trainer.text()
    losses = [float(line.split(" loss ")[1].split()[0]) for line in trainer.text().splitlines()
              if " loss " in line]
    assert losses[-1] < losses[0]  # it really learns


def test_resume_from_latest(trainers, tmp_path):
    first = trainers(tmp_path)
    first.wait_for("step 10 ")
    first.proc.send_signal(signal.SIGINT)
    first.proc.wait(timeout=30)
    saved_step = int(latest(first.out).split("_")[1])
    second = trainers(tmp_path, extra=["--resume"])
    second.wait_for(f"resumed from {first.out / latest(first.out)} at step {saved_step}")
    second.wait_for(f"step {saved_step + 5 - saved_step % 5} ")


def test_periodic_checkpoints(trainers, tmp_path):
    trainer = trainers(tmp_path, extra=["--save-interval", "10"])
    trainer.wait_for("checkpoint saved")
    trainer.wait_for("(step 20, interval)")
    assert (trainer.out / "step_10" / "COMPLETE").exists()


def test_ignore_sigint(trainers, tmp_path):
    trainer = trainers(tmp_path, env={"DFLASH_TEST_IGNORE_SIGINT": "1"})
    trainer.wait_for("step 5 ")
    assert trainer.status_field("SigIgn") & (1 << (signal.SIGINT - 1))
    trainer.proc.send_signal(signal.SIGINT)
    time.sleep(1)
    assert trainer.proc.poll() is None
    trainer.proc.send_signal(signal.SIGTERM)
    assert trainer.proc.wait(timeout=30) == -signal.SIGTERM
    assert not (trainer.out / "latest").exists()


def test_ignore_sigterm(trainers, tmp_path):
    trainer = trainers(tmp_path, env={"DFLASH_TEST_IGNORE_SIGTERM": "1"})
    trainer.wait_for("step 5 ")
    assert trainer.status_field("SigIgn") & (1 << (signal.SIGTERM - 1))
    trainer.proc.send_signal(signal.SIGTERM)
    time.sleep(1)
    assert trainer.proc.poll() is None
    trainer.proc.send_signal(signal.SIGINT)  # the graceful path still works
    assert trainer.proc.wait(timeout=30) == 130


def test_block_in_c_call_delays_the_handler(trainers, tmp_path):
    trainer = trainers(tmp_path, env={"DFLASH_TEST_BLOCK_IN_C_SECONDS": "2"},
                       extra=["--profile-interval", "1"])
    trainer.wait_for("step 1 ")
    trainer.proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    assert trainer.proc.poll() is None, "the handler ran inside the C call"
    assert trainer.proc.wait(timeout=30) == 130
    assert (trainer.out / "latest").exists()


def test_slow_checkpoint_grows_a_temp_dir_then_renames(trainers, tmp_path):
    trainer = trainers(tmp_path, env={"DFLASH_TEST_SLOW_CHECKPOINT_SECONDS": "2"})
    trainer.wait_for("step 5 ")
    trainer.proc.send_signal(signal.SIGINT)
    trainer.wait_for("saving checkpoint")
    sizes = []
    for _ in range(2):
        time.sleep(0.4)
        sizes.append(sum(f.stat().st_size for f in trainer.out.glob(".tmp-*/*")))
    assert 0 < sizes[0] < sizes[1]
    assert not (trainer.out / "latest").exists()  # not visible before it is complete
    assert trainer.proc.wait(timeout=30) == 130
    assert (trainer.out / latest(trainer.out) / "optimizer.bin").stat().st_size >= sizes[1]


def children(pid):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as handle:
                    if int(handle.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, ValueError):
                continue
    return found


def test_workers_start_and_follow_the_trainer(trainers, tmp_path):
    trainer = trainers(tmp_path, env={"DFLASH_TEST_WORKERS": "3"})
    trainer.wait_for("step 5 ")
    workers = children(trainer.proc.pid)
    assert len(workers) == 3
    trainer.proc.send_signal(signal.SIGINT)
    assert trainer.proc.wait(timeout=30) == 130
    assert all(not os.path.exists(f"/proc/{w}") for w in workers)


def test_orphan_workers_outlive_a_killed_trainer(trainers, tmp_path):
    trainer = trainers(tmp_path, env={"DFLASH_TEST_WORKERS": "2",
                                      "DFLASH_TEST_ORPHAN_WORKERS": "1"})
    trainer.wait_for("step 5 ")
    workers = children(trainer.proc.pid)
    assert len(workers) == 2
    try:
        trainer.proc.kill()
        trainer.proc.wait()
        time.sleep(0.5)
        assert all(os.path.exists(f"/proc/{w}") for w in workers)
    finally:
        for worker in workers:  # started by this test: ended by PID
            try:
                os.kill(worker, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_crash_at_start(trainers, tmp_path):
    trainer = trainers(tmp_path, env={"DFLASH_TEST_CRASH_AT_START": "1"})
    assert trainer.proc.wait(timeout=30) == 1
    assert "crash at start requested" in trainer.text()


def test_rejects_overlapping_gpu_sets(tmp_path):
    res = subprocess.run([sys.executable, TRAINER, "--target-model", "m", "--data-dir", "d",
                          "--output-dir", str(tmp_path), "--target-gpus", "0,1",
                          "--drafter-gpus", "1,2"], capture_output=True, text=True, check=False)
    assert res.returncode == 2
    assert "overlap" in res.stderr
