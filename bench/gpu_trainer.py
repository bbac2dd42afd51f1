#!/usr/bin/env python3
"""A real CUDA trainer shaped like the DFlash pipeline, for bench/gpu_check.py.

What the staged stop and the launch meet in the field, small enough for one GPU:

* a bf16 model and an AdamW optimizer on the GPU, trained on random tokens;
* a DataLoader with worker processes (forked: they share the trainer's command line);
* two torch.multiprocessing spawn children holding GPU memory (the pipeline's drafter side);
* progress lines the launch reads (``step N | loss L | tok/s T``);
* on SIGINT (KeyboardInterrupt) it tells the children to stop, joins them, stops the
  workers and writes its checkpoint atomically: a temporary name, fsync, rename, then the
  directory fsynced. ``--resume`` loads the newest checkpoint and goes on from its step.

For the scenarios: ``--spawn-helper`` double-forks a helper with ``setsid -f`` that holds
GPU memory and runs this same program (a leftover the stop must find); ``--long-kernel-at``
blocks the main thread in one long CUDA kernel (torch.cuda._sleep) so SIGINT arrives while
Python cannot run its handler. ``--device cpu`` runs all of it on CPU tensors; every process
that would hold a GPU then holds a file under ``--fake-devices`` instead, which the check
points the launch's and the stop's device checks at.
"""

import argparse
import glob
import hashlib
import os
import re
import subprocess
import sys
import time

import torch
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, Dataset

CHECKPOINT_NAME = re.compile(r"step_(\d+)\.pt$")


class RandomTokens(Dataset):
    def __init__(self, vocab, seq_len, size=1 << 20):
        self.vocab, self.seq_len, self.size = vocab, seq_len, size

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(index)
        return torch.randint(self.vocab, (self.seq_len,), generator=generator)


def hold_memory(device, mib, fake_device=None, ready=None, stop=None):
    """Hold mib MiB on device until stop is set (for ever without one): what a process of the
    run (or a bystander) keeps on a GPU. In CPU mode it also holds fake_device open."""
    keep = open(fake_device, "rb") if fake_device else None  # noqa: SIM115 (held for life)
    block = torch.ones(mib << 20, dtype=torch.uint8, device=device)
    if device == "cuda":
        torch.cuda.synchronize()
    if ready is not None:
        ready.set()
    print(f"holder {os.getpid()} holding {mib} MiB", flush=True)
    while stop is None or not stop.is_set():
        time.sleep(0.2)
    del block, keep


def spawn_child(device, mib, fake_device, ready, stop):
    """Entry of a spawn child (a new interpreter, CUDA initialised in it)."""
    hold_memory(device, mib, fake_device, ready, stop)


def build(args, device):
    torch.manual_seed(0)
    layers = [torch.nn.Embedding(args.vocab, args.hidden)]
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.hidden, args.hidden), torch.nn.GELU()]
    layers.append(torch.nn.Linear(args.hidden, args.vocab))
    model = torch.nn.Sequential(*layers).to(device=device, dtype=torch.bfloat16)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def newest_checkpoint(directory):
    found = [(int(m.group(1)), path) for path in glob.glob(os.path.join(directory, "step_*.pt"))
             for m in [CHECKPOINT_NAME.search(path)] if m]
    return max(found)[1] if found else None


def save_atomically(state, directory, step):
    """torch.save to a temporary name, fsync, rename, fsync the directory: a checkpoint is
    either whole under its name or not there."""
    path = os.path.join(directory, f"step_{step:06d}.pt")
    tmp = os.path.join(directory, f".tmp-step_{step:06d}.pt")
    with open(tmp, "wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def long_kernel(device, seconds):
    """Block the main thread in native code for about seconds: one CUDA kernel spinning on
    the GPU and a synchronize (SIGINT's Python handler runs only once it returns); on CPU a
    single pbkdf2 call of that length."""
    if device == "cuda":
        torch.cuda.synchronize()
        began = time.monotonic()
        torch.cuda._sleep(100_000_000)
        torch.cuda.synchronize()
        cycles_per_s = 100_000_000 / (time.monotonic() - began)
        torch.cuda._sleep(int(cycles_per_s * seconds))
        torch.cuda.synchronize()
    else:
        began = time.monotonic()
        hashlib.pbkdf2_hmac("sha256", b"k", b"s", 200_000)
        rounds = int(200_000 * seconds / (time.monotonic() - began))
        hashlib.pbkdf2_hmac("sha256", b"k", b"s", rounds)


def fake_device(args, index):
    return os.path.join(args.fake_devices, f"nvidia{index}") if args.fake_devices else None


def train(args):
    device = "cuda" if args.device == "cuda" else "cpu"
    if args.device == "cuda":
        torch.cuda.set_device(0)
    else:
        # the CPU mode's tensors are tiny: torch's other intra-op threads would only spin beside
        # each op (a 30 s run on 2 cores: 17.2 CPU seconds with them, 10.4 with one thread)
        torch.set_num_threads(1)
    own_device = open(fake_device(args, 0), "rb") if args.fake_devices else None  # noqa: SIM115
    model, optimizer = build(args, device)
    step = 0
    if args.resume:
        path = newest_checkpoint(args.output_dir)
        if path:
            state = torch.load(path, map_location=device)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            step = state["step"]
            print(f"resumed from {path} at step {step}", flush=True)
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    children = []
    for index in range(args.children):
        ready = ctx.Event()
        child = ctx.Process(target=spawn_child, name=f"drafter-{index}",
                            args=(device, args.child_mib, fake_device(args, 0), ready, stop))
        child.start()
        children.append((child, ready))
    for child, ready in children:
        if not ready.wait(300):
            raise RuntimeError(f"spawn child {child.pid} did not allocate its memory")
    print(f"children ready: {[child.pid for child, _ in children]}, {args.child_mib} MiB each", flush=True)
    if args.spawn_helper:
        subprocess.run(["setsid", "-f", sys.executable, "-u", os.path.abspath(sys.argv[0]), "--hold-mib",
                        str(args.child_mib), "--device", args.device]
                       + (["--fake-devices", args.fake_devices] if args.fake_devices else []),
                       stdin=subprocess.DEVNULL, check=True)
    loader = DataLoader(RandomTokens(args.vocab, args.seq_len), batch_size=args.batch, num_workers=2,
                        persistent_workers=True)
    batches = iter(loader)
    resumed_at = step
    try:
        while True:
            began = time.monotonic()
            tokens = next(batches).to(device)
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, args.vocab),
                                                     tokens[:, 1:].reshape(-1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            value = loss.item()  # synchronizes: the step's time is the GPU's
            step += 1
            seconds = time.monotonic() - began + args.step_sleep
            time.sleep(args.step_sleep)
            print(f"step {step} | loss {value:.4f} | tok/s {tokens.numel() / seconds:.1f}", flush=True)
            if args.long_kernel_at == step - resumed_at:
                print(f"long kernel: {args.long_kernel_seconds}s in native code at {time.time():.3f}", flush=True)
                long_kernel(device, args.long_kernel_seconds)
                print("long kernel done", flush=True)
    except KeyboardInterrupt:
        began = time.monotonic()
        print(f"SIGINT at step {step} (t={time.time():.3f}): stopping the children, saving", flush=True)
        stop.set()
        for child, _ in children:
            child.join(60)
        del batches, loader  # the workers exit
        if args.device == "cuda":
            torch.cuda.synchronize()
        path = save_atomically({"step": step, "model": model.state_dict(),
                                "optimizer": optimizer.state_dict()}, args.output_dir, step)
        print(f"checkpoint {path}: {os.path.getsize(path)} bytes written in "
              f"{time.monotonic() - began:.2f}s", flush=True)
    del own_device


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--fake-devices", help="CPU mode: the directory of the files standing for /dev/nvidiaN")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--children", type=int, default=2)
    parser.add_argument("--child-mib", type=int, default=4096)
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds added to each step (CPU mode)")
    parser.add_argument("--spawn-helper", action="store_true", help="start a setsid -f helper holding memory")
    parser.add_argument("--long-kernel-at", type=int, help="the step of this process after which the long kernel runs")
    parser.add_argument("--long-kernel-seconds", type=float, default=12.0)
    parser.add_argument("--hold-mib", type=int, help="be a helper holding this many MiB, nothing else")
    args = parser.parse_args()
    if args.hold_mib:
        hold_memory("cuda" if args.device == "cuda" else "cpu", args.hold_mib, fake_device(args, 0))
        return
    if not args.output_dir:
        parser.error("--output-dir is required")
    train(args)


if __name__ == "__main__":
    main()
