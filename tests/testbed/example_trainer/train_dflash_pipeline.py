#!/usr/bin/env python3
"""Example DFlash drafter trainer for the testbed and the demo (the real one is the user's).

It takes the real trainer's full command line and behaves like it where the
lifecycle tooling can see: a real (small, pure-Python) training loop that logs
``tok/s`` and per-stage timings, atomic checkpoints (``step_N/`` written under a
temporary name and renamed, then a ``latest`` pointer) at ``--save-interval``
steps and in its KeyboardInterrupt handler, resume from the latest checkpoint,
and open handles on the GPUs' device nodes (``/dev/nvidiaN``) while it runs.

The model is a bigram softmax over a small vocabulary, trained by SGD on token
sequences read from ``--data-dir`` (bytes of its files) or, when it holds none,
on a fixed synthetic corpus.  It learns: the loss goes down.

Test-only misbehaviour switches (environment variables; never set in production):

  DFLASH_TEST_IGNORE_SIGINT=1         SIGINT ignored (as after a nohup/& launch)
  DFLASH_TEST_IGNORE_SIGTERM=1        SIGTERM ignored
  DFLASH_TEST_BLOCK_IN_C_SECONDS=N    every step makes one C-level call lasting N s; a
                                      signal is handled only when it returns
  DFLASH_TEST_SLOW_CHECKPOINT_SECONDS=N  a checkpoint takes N s to write, growing a file
  DFLASH_TEST_WORKERS=N               start N worker child processes (like DataLoader
                                      workers: SIGINT ignored, they hold the GPUs too)
  DFLASH_TEST_ORPHAN_WORKERS=1        workers outlive the trainer (reparented orphans)
  DFLASH_TEST_DATALOADER_WORKERS=N    take each step's batch from a real torch.utils.data.DataLoader
                                      with N worker processes (needs torch: the testbed's torch
                                      venv as trainer_run_python); a SIGKILLed trainer leaves them
                                      running until their next check of their parent (5 s)
  DFLASH_TEST_CRASH_AT_START=1        fail right after start-up, exit status 1
  DFLASH_TEST_FAULT_FILE=PATH         a fault written into PATH while it runs: "raise" (an
                                      exception at the next tenth step, once), "hang" (a
                                      sleep in the loop, once), "hang-in-c" (the main thread blocked
                                      forever in a C call no signal ends, once: a hung NCCL
                                      collective), "crash-at-start" (every start fails while PATH
                                      says so)
  DFLASH_TEST_CRASH_IN_PROGRESS_LINE=1  raise while formatting the first progress line (the
                                      traceback then shows that source line, "tok/s" in it)
  DFLASH_TEST_TEARDOWN_SECONDS=N      after an uncaught exception, stay alive N s before
                                      exiting (as CUDA/NCCL tear down)
  DFLASH_TEST_CHECKPOINT_IN_PLACE=1   write step_N/ in place (no temporary name, no rename),
                                      as an in-place torch.save or an HF checkpoint-N/ does
  DFLASH_TEST_SAVE_PAUSE_SECONDS=N    a save pauses N s after its first file (a quiet gap)
  DFLASH_TEST_SLOW_SAVES=WHICH        the saves the two switches above slow: all (default),
                                      interval (the periodic ones) or interrupt (the handler's)
  DFLASH_TEST_SAVE_HELD_BY=PATH       a slowed step_dirs save goes on writing until PATH exists
                                      (at most 300 s more): the test decides when it lands
  DFLASH_TEST_CHECKPOINT_LAYOUT=NAME  save, resume and meet signals as that framework does
                                      (checkpoint_layouts.py: hf_trainer, lightning,
                                      deepspeed, dcp, specforge_scripts, specforge), writing
                                      its real file formats; default step_dirs (this file's)
  DFLASH_TEST_SAVES_ON=SIGS           the signals whose handler saves (SIGINT, SIGTERM, both
                                      comma-separated, or none); default: the layout's own
                                      (SIGINT for step_dirs, none for the frameworks')
  DFLASH_TEST_CHECKPOINT_KB=N         the frameworks' optimizer state per save (default 64)
  DFLASH_TEST_INTERVAL_SAVES=N        only the first N periodic saves of the run: a later stop
                                      never lands on the step of one (an interrupt save of
                                      that step would rewrite it in place)
  DFLASH_TEST_SETSID_HELPER=1         start a helper with `setsid -f` (its own session,
                                      reparented to PID 1) that holds GPU 0 until killed
  DFLASH_TEST_STOP_REQUEST=take      take the stop request (below); =ignore: announce it, never take it
  DFLASH_TEST_RANK0_SAVES_ALONE=1     under a launcher, rank 0 saves on an interrupt and the
                                      other ranks exit at once, as `if dist.get_rank() == 0:
                                      save(...)` trainers do (no barrier for its save)
  DFLASH_TEST_ABORT_AT_EXIT=1         a rank other than 0 that ends by the stop request aborts on
                                      its way out (SIGABRT), as one whose C++ threads outlive it
                                      does ("terminate called without an active exception")
  DFLASH_TEST_LOG_FILE=PATH           log through a logging.FileHandler on PATH, held open for the
                                      whole run (HF Trainer's and Lightning's file loggers), not
                                      stdout: stdout then gets only what print()s there (the
                                      stop request helper's lines, a traceback on stderr)

Under a launcher (torchrun, accelerate: RANK and WORLD_SIZE in its environment) every rank
trains; rank 0 logs and saves, as a DDP trainer's does, and on an interrupt the other ranks wait
for its save in a torch.distributed (gloo) barrier, so a rank that exits early is what a launcher
sees of a real run. The ranks agree every step, in one all_reduce, on the tokens of the step (the
logged tok/s is the whole run's) and on whether a rank got its stop signal (accelerate's
set_trigger/check_trigger): all of them, on every node, end at the same step, and a rank that
died ends the others at their next step with gloo's error.

The stop request (docs/stop.md, "The stop request"): like the field's trainer, this one knows only
signals, unless DFLASH_TEST_STOP_REQUEST says otherwise; then, with DFLASH_STOP_REQUEST set (the
launch sets it), it takes a request through dflash_stop_request.py beside it (every 10 steps, or
DFLASH_STOP_REQUEST_EVERY; the ranks of a distributed run agree on the step), saves, and exits 0. With the hf_trainer layout
the request goes through a TrainerCallback's control flags (should_save, should_training_stop) in
the order HF's Trainer acts on them.

Other environment: DFLASH_PROFILE_INTERVAL (default for --profile-interval),
DFLASH_STEP_SECONDS (minimum wall time of a step, default 0.05, keeps the CPU cool).

Every --profile-interval steps it logs a progress line and its ProfileStats, per-stage
averages and maxima over the interval, as the real trainer does:

  2026-11-30 10:00:01 step 200 epoch 0 loss 2.3100 tok/s 2550.1 | data 0.21ms ...
  2026-11-30 10:00:01 [ProfileStats step 200] data avg 0.21ms max 0.40ms | target avg ...

RELEASE_SLOWDOWN below stretches every step of this release (tests make a slower release by
changing it in a copy of this file).
"""

import argparse
import glob
import subprocess
import traceback
import ctypes
import json
import logging
import math
import os
import random
import shutil
import signal
import sys
import time

VOCAB = 32
DEFAULT_STEP_SECONDS = 0.05
RELEASE_SLOWDOWN = 1.0
EXIT_INTERRUPTED = 130


def gpu_list(text):
    try:
        ids = [int(x) for x in text.split(",") if x.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of GPU ids: {text!r}")
    if not ids or any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise argparse.ArgumentTypeError(f"GPU ids must be distinct and >= 0: {text!r}")
    return ids


def bool_flag(text):
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text!r}")


def parse_args(argv):
    p = argparse.ArgumentParser(description="DFlash drafter training (example)")
    p.add_argument("--target-model", required=True)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--output-dir", required=True)
    p.add_argument("--target-gpus", type=gpu_list, required=True)
    p.add_argument("--drafter-gpus", type=gpu_list, required=True)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--warmup-ratio", type=float, default=0.0)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--token-budget", type=int, default=4096)
    p.add_argument("--max-seq-len", type=int, default=512)
    p.add_argument("--max-batch-size", type=int, default=8)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-anchors", type=int, default=8)
    p.add_argument("--num-draft-layers", type=int, default=1)
    p.add_argument("--gamma", type=float, default=7.0)
    p.add_argument("--noise-start", type=float, default=0.0)
    p.add_argument("--noise-end", type=float, default=0.0)
    p.add_argument("--noise-type", choices=("uniform", "gaussian", "none"), default="none")
    p.add_argument("--use-soft-labels", type=bool_flag, nargs="?", const=True, default=False)
    p.add_argument("--profile-interval", type=int,
                   default=int(os.environ.get("DFLASH_PROFILE_INTERVAL", "50")))
    p.add_argument("--resume", nargs="?", const="latest", default=None,
                   help="resume from a checkpoint dir, or the latest one in --output-dir")
    p.add_argument("--save-interval", type=int, default=1000, help="steps between checkpoints")
    p.add_argument("--steps-per-epoch", type=int, default=100000)
    p.add_argument("--tag", default="", help="free-form run label, logged as given")
    # the DeepSpeed launcher passes each worker its --local_rank (torchrun sets LOCAL_RANK)
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if set(args.target_gpus) & set(args.drafter_gpus):
        p.error("--target-gpus and --drafter-gpus overlap")
    if args.max_seq_len % args.block_size:
        p.error("--max-seq-len must be a multiple of --block-size")
    return args


RANK = int(os.environ.get("RANK", "0"))


def _file_logger():
    """The logger of DFLASH_TEST_LOG_FILE: the standard library's FileHandler, which opens its file
    once (append mode) and holds it open, as a trainer's `logging.basicConfig(filename=...)` does."""
    path = os.environ.get("DFLASH_TEST_LOG_FILE")
    if not path:
        return None
    logger = logging.getLogger("dflash.trainer")
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


FILE_LOGGER = _file_logger() if RANK == 0 else None


def log(message):
    if FILE_LOGGER is not None:
        FILE_LOGGER.info(message)  # the handler flushes each record
    elif RANK == 0:  # the rank that logs, as under torchrun
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}", flush=True)


class Ranks:
    """The ranks of a launcher's run: with WORLD_SIZE > 1, a gloo process group (rendezvous
    through the launcher's own store) whose barrier holds the other ranks while rank 0 saves."""

    def __init__(self):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.dist = None
        if self.world > 1:
            import torch.distributed as dist  # the launcher's torch

            dist.init_process_group("gloo")
            self.dist = dist
            print(f"rank {RANK} of {self.world} pid={os.getpid()} joined", flush=True)

    @property
    def saves(self):
        return RANK == 0

    def barrier(self):
        """The other ranks wait for rank 0's save, unless rank 0 saves alone (then no rank waits)."""
        if self.dist is not None and os.environ.get("DFLASH_TEST_RANK0_SAVES_ALONE") != "1":
            self.dist.barrier()

    def agree(self, stop, tokens):
        """(whether some rank was asked to stop, the step's tokens over every rank)."""
        if self.dist is None:
            return stop, tokens
        import torch

        both = torch.tensor([1.0 if stop else 0.0, float(tokens)], dtype=torch.float64)
        self.dist.all_reduce(both)
        return both[0].item() > 0, int(both[1].item())


def load_corpus(data_dir):
    data = bytearray()
    for path in sorted(glob.glob(os.path.join(data_dir, "**", "*"), recursive=True)):
        if os.path.isfile(path):
            with open(path, "rb") as handle:
                data += handle.read(1 << 20)
    if len(data) < 64:
        rng = random.Random(7)  # a learnable synthetic language: mostly +1 successors
        tok, data = 0, bytearray()
        for _ in range(20000):
            tok = (tok + 1) % VOCAB if rng.random() < 0.8 else rng.randrange(VOCAB)
            data.append(tok)
    return [b % VOCAB for b in data]


class Model:
    def __init__(self):
        self.weights = [[0.0] * VOCAB for _ in range(VOCAB)]

    def step(self, batch, lr, weight_decay, grad_clip):
        grads = {}
        loss = 0.0
        count = 0
        for seq in batch:
            for prev, nxt in zip(seq, seq[1:]):
                row = self.weights[prev]
                peak = max(row)
                exps = [math.exp(v - peak) for v in row]
                total = sum(exps)
                loss -= math.log(exps[nxt] / total)
                grad = grads.setdefault(prev, [0.0] * VOCAB)
                for j in range(VOCAB):
                    grad[j] += exps[j] / total - (1.0 if j == nxt else 0.0)
                count += 1
        norm = math.sqrt(sum(g * g for grad in grads.values() for g in grad)) / max(count, 1)
        scale = min(1.0, grad_clip / norm) if norm > 0 else 1.0
        for prev, grad in grads.items():
            row = self.weights[prev]
            for j in range(VOCAB):
                row[j] -= lr * (scale * grad[j] / max(count, 1) + weight_decay * row[j])
        return loss / max(count, 1), count


def checkpoint_dirs(output_dir):
    found = []
    for path in glob.glob(os.path.join(output_dir, "step_*")):
        suffix = os.path.basename(path)[5:]
        if suffix.isdigit() and os.path.exists(os.path.join(path, "COMPLETE")):
            found.append((int(suffix), path))
    return sorted(found)


def latest_checkpoint(output_dir):
    pointer = os.path.join(output_dir, "latest")
    if os.path.exists(pointer):
        with open(pointer, encoding="utf-8") as handle:
            path = os.path.join(output_dir, handle.read().strip())
        if os.path.exists(os.path.join(path, "COMPLETE")):
            return path
    found = checkpoint_dirs(output_dir)
    return found[-1][1] if found else None


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(output_dir, model, state, reason):
    """step_N/ appears complete or not at all: written as .tmp-..., then renamed (or, with
    DFLASH_TEST_CHECKPOINT_IN_PLACE, written where it lands)."""
    step = state["step"]
    final = os.path.join(output_dir, f"step_{step}")
    if os.path.exists(os.path.join(final, "COMPLETE")):
        # saved already (an interrupt at a periodic save's step), maybe cut before its pointer moved
        write_latest(output_dir, step)
        return final
    in_place = os.environ.get("DFLASH_TEST_CHECKPOINT_IN_PLACE") == "1"
    tmp = final if in_place else os.path.join(output_dir, f".tmp-step_{step}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    paced = os.environ.get("DFLASH_TEST_SLOW_SAVES", "all") in ("all", reason)
    slow = float(os.environ.get("DFLASH_TEST_SLOW_CHECKPOINT_SECONDS", "0")) if paced else 0.0
    if slow > 0:  # test switch: a big optimizer state written slowly
        deadline = time.monotonic() + slow
        held_by = os.environ.get("DFLASH_TEST_SAVE_HELD_BY")
        held_until = deadline + 300

        def writing():
            now = time.monotonic()
            return now < deadline or (held_by and not os.path.exists(held_by) and now < held_until)

        with open(os.path.join(tmp, "optimizer.bin"), "wb") as handle:
            while writing():
                handle.write(b"\0" * 65536)
                handle.flush()
                time.sleep(0.05)
    with open(os.path.join(tmp, "model.json"), "w", encoding="utf-8") as handle:
        json.dump({"weights": model.weights}, handle)
    time.sleep(float(os.environ.get("DFLASH_TEST_SAVE_PAUSE_SECONDS", "0")) if paced else 0.0)
    with open(os.path.join(tmp, "trainer_state.json"), "w", encoding="utf-8") as handle:
        json.dump({**state, "reason": reason, "saved_at": time.time()}, handle)
    with open(os.path.join(tmp, "COMPLETE"), "w", encoding="utf-8") as handle:
        handle.write(f"{step}\n")
        handle.flush()
        os.fsync(handle.fileno())
    fsync_dir(tmp)
    if not in_place:
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
    write_latest(output_dir, step)
    log(f"checkpoint saved: {final} (step {step}, {reason})")
    return final


def write_latest(output_dir, step):
    """latest names step_N: written to a temporary name, then renamed over it."""
    pointer_tmp = os.path.join(output_dir, f".latest.tmp-{os.getpid()}")
    with open(pointer_tmp, "w", encoding="utf-8") as handle:
        handle.write(f"step_{step}\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.rename(pointer_tmp, os.path.join(output_dir, "latest"))
    fsync_dir(output_dir)


def load_checkpoint(path, model):
    with open(os.path.join(path, "model.json"), encoding="utf-8") as handle:
        model.weights = json.load(handle)["weights"]
    with open(os.path.join(path, "trainer_state.json"), encoding="utf-8") as handle:
        state = json.load(handle)
    return {"step": state["step"], "epoch": state["epoch"], "tokens": state["tokens"]}


def open_gpus(gpus):
    """Hold the device nodes open as a CUDA process does (present in testbed CTs)."""
    handles = []
    for gpu in gpus:
        path = f"/dev/nvidia{gpu}"
        if os.path.exists(path):
            handles.append(open(path, "rb"))  # noqa: SIM115 - held for the process lifetime
    return handles


def start_workers(count, orphan):
    pids = []
    for index in range(count):
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process handles ^C
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            parent = os.getppid()
            held = open_gpus([index])  # noqa: F841 - kept open until exit
            while orphan or os.getppid() == parent:
                time.sleep(0.2)
            os._exit(0)
        pids.append(pid)
    return pids


def stop_workers(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def start_setsid_helper():
    """A helper in a session of its own (setsid -f: double-forked, reparented to PID 1) that
    holds GPU 0, as a launcher's watchdog or a profiler might; it inherits the environment."""
    code = ("import os, time\n"
            "held = open('/dev/nvidia0', 'rb') if os.path.exists('/dev/nvidia0') else None\n"
            "time.sleep(3600)\n")
    subprocess.run(["setsid", "-f", sys.executable, "-c", code, "dflash-helper"],
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True)


class Signals:
    """What the trainer does on SIGINT and SIGTERM: save (saves_on), let the step and a save in
    it finish then exit (finishes_save_on, Lightning's SIGTERM), or end where it is."""

    def __init__(self, saves_on, finishes_save_on):
        self.saves_on = saves_on
        self.received = None
        self.requested = False  # a stop signal noted, under defer()
        self.stop_after_step = False
        if os.environ.get("DFLASH_TEST_IGNORE_SIGINT") == "1":
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        if os.environ.get("DFLASH_TEST_IGNORE_SIGTERM") == "1":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        elif signal.SIGTERM in saves_on:
            signal.signal(signal.SIGTERM, self.interrupt)
        elif signal.SIGTERM in finishes_save_on:
            signal.signal(signal.SIGTERM, self.finish_step)

    def interrupt(self, signum, frame):
        self.received = signal.Signals(signum)
        raise KeyboardInterrupt

    def defer(self):
        """Ranks of a distributed run: a stop signal is noted (requested), and the ranks raise
        the KeyboardInterrupt together at the step they agree on. A signal the process ignores
        (a `nohup ... &` launch) stays ignored."""
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, self.request)
        if signal.getsignal(signal.SIGTERM) == self.interrupt:
            signal.signal(signal.SIGTERM, self.request)

    def request(self, signum, frame):
        self.received = signal.Signals(signum)
        self.requested = True

    def finish_step(self, signum, frame):
        self.received = signal.Signals(signum)
        self.stop_after_step = True

    def saves(self):
        """Whether the KeyboardInterrupt being handled makes a checkpoint."""
        return (self.received or signal.SIGINT) in self.saves_on


class Checkpointer:
    """This file's step_dirs, or a framework's layout (checkpoint_layouts.py)."""

    def __init__(self, output_dir):
        name = os.environ.get("DFLASH_TEST_CHECKPOINT_LAYOUT", "step_dirs")
        self.output_dir = output_dir
        self.layout = None
        saves_on, finishes = {signal.SIGINT}, set()
        if name != "step_dirs":
            import checkpoint_layouts  # beside this file in the release

            self.layouts = checkpoint_layouts
            self.layout = checkpoint_layouts.named(name, output_dir,
                                                   int(os.environ.get("DFLASH_TEST_CHECKPOINT_KB", "64")))
            saves_on = set()
            finishes = {getattr(signal, s) for s in self.layout.finishes_save_on}
        if "DFLASH_TEST_SAVES_ON" in os.environ:
            saves_on = {getattr(signal, s.strip()) for s in os.environ["DFLASH_TEST_SAVES_ON"].split(",")
                        if s.strip() and s.strip() != "none"}
        self.signals = Signals(saves_on, finishes)
        self.ranks = Ranks()
        if self.ranks.dist is not None:
            self.signals.defer()

    def save(self, model, state, reason):
        if not self.ranks.saves:
            return None
        if self.layout is None:
            return save_checkpoint(self.output_dir, model, state, reason)
        path = self.layout.save(state, model.weights, self.layouts.Pace.from_env(self.layout.files, reason))
        log(f"checkpoint saved: {path} (step {state['step']}, {reason})")
        return path

    def resume(self, model, wanted):
        if self.layout is None:
            path = latest_checkpoint(self.output_dir) if wanted == "latest" else wanted
            return (path, load_checkpoint(path, model)) if path else (None, None)
        path = self.layout.resume_path() if wanted == "latest" else wanted
        if not path:
            return None, None
        state, values = self.layout.load(path)
        model.weights = self.layouts.unmatrix(values, VOCAB)
        return path, state


class HFControl:
    """transformers' TrainerControl: the flags a callback sets and the Trainer acts on."""

    def __init__(self):
        self.should_save = False
        self.should_training_stop = False


class StopRequestCallback:
    """The TrainerCallback example of docs/stop.md (its base class is transformers.TrainerCallback)."""

    def __init__(self, requests):
        self.requests = requests

    def on_step_end(self, args, state, control, **kwargs):
        if self.requests.should_stop(state["step"]):
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_save(self, args, state, control, **kwargs):
        if self.requests.request is not None:
            self.requests.saved(kwargs["checkpoint"], state["step"])
        return control


def asked_to_stop(requests, state, checkpointer, model, saved_now):
    """The stop request at this step boundary: True once its checkpoint is saved (rank 0) and
    every rank may exit. A checkpoint saved at this step already is the request's. With the
    hf_trainer layout, through StopRequestCallback in the order of HF's Trainer (on_step_end,
    then the save when should_save, then on_save, then the stop when should_training_stop)."""
    if checkpointer.layout is not None and checkpointer.layout.name == "hf_trainer":
        control, callback = HFControl(), StopRequestCallback(requests)
        callback.on_step_end(None, state, control)
        if control.should_save:
            path = saved_now or checkpointer.save(model, state, "request")
            if path:
                callback.on_save(None, state, control, checkpoint=path)
        return control.should_training_stop
    if not requests.should_stop(state["step"]):
        return False
    path = saved_now or checkpointer.save(model, state, "request")
    if path:
        requests.saved(path, state["step"])
    return True


class Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def held_mutex():
    """(libc, a default pthread mutex this thread holds): locked a second time by its holder, it
    waits on its futex (40 bytes on x86-64, all zeros: PTHREAD_MUTEX_INITIALIZER)."""
    libc = ctypes.CDLL(None)
    mutex = ctypes.create_string_buffer(64)
    libc.pthread_mutex_lock(mutex)
    return libc, mutex


def block_in_c(seconds, held):
    """One long C-level call (think NCCL all-reduce): Python signal handlers wait. The held mutex
    (held_mutex's), asked for again with pthread_mutex_timedlock, waits on its futex until the
    deadline and stays held; glibc resumes that wait after a signal's C handler, so the Python
    handlers run only once the call returns, as after a collective. It burns no CPU, where a
    busy C call cost the machine the tests share, and it lasts the same on a loaded machine."""
    if seconds <= 0:
        return
    libc, mutex = held
    deadline = time.time() + seconds  # the deadline is CLOCK_REALTIME's
    until = Timespec(int(deadline), int(deadline % 1 * 1e9))
    libc.pthread_mutex_timedlock(mutex, ctypes.byref(until))  # ETIMEDOUT at the deadline


def block_forever_in_c():
    """A C call that never returns and that no signal interrupts, as a hung NCCL collective or CUDA
    synchronize: a held mutex locked again by its holder waits on its futex for ever. ctypes lets
    go of the GIL, so the other threads go on; the main thread's Python signal handlers never run
    (SIGINT is noted, never handled), and a signal's default action (SIGTERM, SIGKILL) still ends
    the process."""
    libc, mutex = held_mutex()
    libc.pthread_mutex_lock(mutex)


def dataloader_batches(corpus, seq_len, seed, workers):
    """An endless iterator of batches from a real torch.utils.data.DataLoader with workers worker
    processes (forked, as a DFlash trainer's are: the trainer's command line and environment), or
    None when workers is 0."""
    if workers <= 0:
        return None
    import torch
    from torch.utils import data

    class Slices(data.Dataset):
        def __len__(self):
            return 1 << 30

        def __getitem__(self, index):
            start = random.Random(seed + index).randrange(0, max(1, len(corpus) - seq_len))
            return torch.tensor(corpus[start:start + seq_len])

    return iter(data.DataLoader(Slices(), batch_size=None, num_workers=workers, persistent_workers=True))


def fault(path):
    """The fault the test asks for in the file at path (DFLASH_TEST_FAULT_FILE): raise (once, at
    the next tenth step), hang (once: a sleep in the loop), crash-at-start (every start); None."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return None


def train(args):
    env = os.environ
    os.makedirs(args.output_dir, exist_ok=True)
    checkpointer = Checkpointer(args.output_dir)
    log(f"DFlash trainer pid={os.getpid()} target_gpus={args.target_gpus} "
        f"drafter_gpus={args.drafter_gpus} output_dir={args.output_dir} tag={args.tag!r} "
        f"secrets_in_env={sorted(k for k in ('WANDB_API_KEY', 'HF_TOKEN') if k in env)}")
    if env.get("DFLASH_TEST_CRASH_AT_START") == "1":
        raise RuntimeError("crash at start requested by DFLASH_TEST_CRASH_AT_START")
    fault_file = env.get("DFLASH_TEST_FAULT_FILE")
    if fault(fault_file) == "crash-at-start":  # every start while the file says so
        raise RuntimeError(f"crash at start requested by {fault_file}")
    gpu_handles = open_gpus(args.target_gpus + args.drafter_gpus)  # noqa: F841
    model = Model()
    state = {"step": 0, "epoch": 0, "tokens": 0}
    if args.resume:
        path, resumed = checkpointer.resume(model, args.resume)
        if path:
            state = resumed
            log(f"resumed from {path} at step {state['step']}")
        else:
            log("resume requested, no checkpoint yet: starting from scratch")
    corpus = load_corpus(args.data_dir)
    rng = random.Random(state["step"])
    # one short sequence a step: a toy step's pure-Python work is what the testbed's many trainers
    # cost the CPUs that their stops and redeploys share (0.4 ms a step, against 0.9 ms for four)
    seq_len = min(args.max_seq_len, 16)
    step_seconds = float(env.get("DFLASH_STEP_SECONDS", DEFAULT_STEP_SECONDS)) * RELEASE_SLOWDOWN
    block_seconds = float(env.get("DFLASH_TEST_BLOCK_IN_C_SECONDS", "0"))
    c_call_mutex = held_mutex() if block_seconds > 0 else None
    workers = start_workers(int(env.get("DFLASH_TEST_WORKERS", "0")),
                            env.get("DFLASH_TEST_ORPHAN_WORKERS") == "1")
    loader = dataloader_batches(corpus, seq_len, state["step"], int(env.get("DFLASH_TEST_DATALOADER_WORKERS", "0")))
    if env.get("DFLASH_TEST_SETSID_HELPER") == "1":
        start_setsid_helper()
    crash_in_progress = env.get("DFLASH_TEST_CRASH_IN_PROGRESS_LINE") == "1"
    requests = None
    if env.get("DFLASH_TEST_STOP_REQUEST") in ("take", "ignore"):
        from dflash_stop_request import StopRequest  # beside this file in the release

        requests = StopRequest(every_steps=int(env.get("DFLASH_STOP_REQUEST_EVERY", "10")))
    takes_requests = env.get("DFLASH_TEST_STOP_REQUEST") == "take"
    interval_saves_left = int(env.get("DFLASH_TEST_INTERVAL_SAVES", "-1"))  # -1: no end
    total_steps = args.epochs * args.steps_per_epoch
    warmup = max(1, int(total_steps * args.warmup_ratio))
    window_tokens, window_steps, window_start = 0, 0, time.perf_counter()
    timings = {"data": 0.0, "target": 0.0, "drafter": 0.0, "optim": 0.0}
    peaks = dict.fromkeys(timings, 0.0)
    try:
        while state["step"] < total_steps:
            began = time.perf_counter()
            if loader is not None:
                batch = [next(loader).tolist()]
            else:
                start = rng.randrange(0, max(1, len(corpus) - seq_len))
                batch = [corpus[start:start + seq_len]]
            t_data = time.perf_counter()
            block_in_c(block_seconds, c_call_mutex)
            t_target = time.perf_counter()
            lr = args.lr * min(1.0, (state["step"] + 1) / warmup) * 50  # scaled for the toy model
            loss, tokens = model.step(batch, lr, args.weight_decay, args.grad_clip)
            stop_agreed, run_tokens = checkpointer.ranks.agree(checkpointer.signals.requested, tokens)
            t_drafter = time.perf_counter()
            state["step"] += 1
            state["epoch"] = state["step"] // args.steps_per_epoch
            state["tokens"] += tokens
            window_tokens += run_tokens
            window_steps += 1
            saved_now = None
            if args.save_interval and state["step"] % args.save_interval == 0 and interval_saves_left:
                saved_now = checkpointer.save(model, state, "interval")
                interval_saves_left -= 1
            if takes_requests and asked_to_stop(requests, state, checkpointer, model, saved_now):
                checkpointer.ranks.barrier()  # the other ranks wait for rank 0's save
                stop_workers(workers)
                log(f"stop request at step {state['step']}: checkpoint saved, exiting")
                if os.environ.get("DFLASH_TEST_ABORT_AT_EXIT") == "1" and os.environ.get("RANK", "0") != "0":
                    os.abort()
                return 0
            t_optim = time.perf_counter()
            spare = step_seconds - (time.perf_counter() - began)
            if spare > 0:  # the wait of a step is the target model's forward here
                time.sleep(spare)
            t_target += max(0.0, spare)
            for key, (a, b) in {"data": (began, t_data), "target": (t_data, t_target),
                                "drafter": (t_target - max(0.0, spare), t_drafter),
                                "optim": (t_drafter, t_optim)}.items():
                timings[key] += b - a
                peaks[key] = max(peaks[key], b - a)
            if state["step"] % max(1, args.profile_interval) == 0:
                elapsed = time.perf_counter() - window_start
                # averages over the steps of this window: the first one after a resume is shorter
                stages = " ".join(f"{k} {1000 * v / window_steps:.2f}ms" for k, v in timings.items())
                log(f"step {state['step']} epoch {state['epoch']} loss {loss:.4f} "
                    f"tok/s {window_tokens / (0 if crash_in_progress else max(elapsed, 1e-9)):.1f} | {stages}")
                log(f"[ProfileStats step {state['step']}] " + " | ".join(
                    f"{k} avg {1000 * v / window_steps:.2f}ms max {1000 * peaks[k]:.2f}ms"
                    for k, v in timings.items()))
                window_tokens, window_steps, window_start = 0, 0, time.perf_counter()
                timings = dict.fromkeys(timings, 0.0)
                peaks = dict.fromkeys(timings, 0.0)
            wanted_fault = fault(fault_file) if state["step"] % 10 == 0 else None
            if wanted_fault == "raise":  # once: the file goes with it
                os.unlink(fault_file)
                raise RuntimeError(f"a bad batch at step {state['step']} (raise requested by {fault_file})")
            if wanted_fault == "hang":  # a sleep in the loop: alive, silent
                os.unlink(fault_file)
                while True:
                    time.sleep(3600)
            if wanted_fault == "hang-in-c":
                os.unlink(fault_file)
                block_forever_in_c()
            if stop_agreed:  # every rank raises it at this step
                raise KeyboardInterrupt
            if checkpointer.signals.stop_after_step:
                stop_workers(workers)
                log(f"{checkpointer.signals.received.name} at step {state['step']}: the step is done, "
                    "exiting without a checkpoint")
                return EXIT_INTERRUPTED
    except KeyboardInterrupt:
        # workers first, as a DataLoader's are shut down while the exception unwinds
        stop_workers(workers)
        if not checkpointer.signals.saves():
            log(f"KeyboardInterrupt at step {state['step']}: exiting without a checkpoint")
            return EXIT_INTERRUPTED
        log(f"KeyboardInterrupt at step {state['step']}: saving checkpoint")
        checkpointer.save(model, state, "interrupt")
        checkpointer.ranks.barrier()  # the other ranks wait for rank 0's save
        return EXIT_INTERRUPTED
    checkpointer.save(model, state, "final")
    stop_workers(workers)
    log("training complete")
    return 0


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return train(args)
    except Exception:  # noqa: BLE001 - the traceback is printed, then the teardown is waited out
        traceback.print_exc()
        sys.stderr.flush()
        time.sleep(float(os.environ.get("DFLASH_TEST_TEARDOWN_SECONDS", "0")))
        return 1


if __name__ == "__main__":
    sys.exit(main())
