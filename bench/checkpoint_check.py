#!/usr/bin/env python3
"""What judging a checkpoint complete costs at real sizes: a 20 GB HF Trainer checkpoint-N/
(three 4 GB safetensors shards and their index, an 8 GB zip64 optimizer.pt of 1000 storages,
the small torch.save and JSON files), as sparse files, judged by the stop's own code
(module_utils/checkpoint/checkpoints.py Directory.entries: every file's structure, the layout's marker).

Prints, side by side in one run: the judgement's time (median of 7, page cache warm, each with
the file-check cache emptied), the same after dropping the page cache where the kernel allows
it, the bytes it read, and a full read of the same files (what checking by reading every
byte, as a checksum or torch.load does, costs here; holes read as zeros, without the disk).
Goal: under 1 s for 20 GB. Usage: .venv/bin/python bench/checkpoint_check.py [GB]
"""

import json
import os
import resource
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, os.path.join(REPO, "tests", "testbed", "example_trainer"))
import testlib  # noqa: E402,F401  (the collection on the import path)
import checkpoint_layouts as layouts  # noqa: E402

from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoints  # noqa: E402

GIB = 1 << 30


def build(root, total_gb):
    """checkpoint-1000/ of about total_gb GiB: 60 % model shards, 40 % optimizer state."""
    ckpt = os.path.join(root, "checkpoint-1000")
    os.makedirs(ckpt)
    shard_bytes = int(total_gb * 0.6 * GIB / 3)
    weight_map = {}
    for index in range(3):
        name = f"model-{index + 1:05d}-of-00003.safetensors"
        tensors = [shard_bytes // 100] * 100
        layouts.sparse_safetensors(os.path.join(ckpt, name), tensors)
        weight_map.update({f"model.layers.{index}.{t}.weight": name for t in range(100)})
    with open(os.path.join(ckpt, "model.safetensors.index.json"), "w", encoding="utf-8") as handle:
        json.dump({"metadata": {"total_size": 3 * shard_bytes}, "weight_map": weight_map}, handle)
    layouts.sparse_torch_save(os.path.join(ckpt, "optimizer.pt"), [int(total_gb * 0.4 * GIB / 1000)] * 1000)
    pace = layouts.Pace()
    for name, obj in (("scheduler.pt", {"last_epoch": 1000}), ("rng_state.pth", {"python": 1}),
                      ("training_args.bin", {"output_dir": root})):
        layouts.torch_save(os.path.join(ckpt, name), obj, pace)
    for name, obj in (("config.json", {"model_type": "qwen3"}), ("generation_config.json", {}),
                      ("trainer_state.json", {"global_step": 1000, "log_history": [{"loss": 1.0}] * 1000})):
        layouts.json_save(os.path.join(ckpt, name), obj, pace)
    return ckpt


def judge(root):
    checkpoints._CHECKED.clear()  # no cached verdicts: every file read again
    read_before = io_read_bytes()
    began = time.perf_counter()
    infos = checkpoints.Directory(root).entries()
    took = time.perf_counter() - began
    return took, infos, io_read_bytes() - read_before


def io_read_bytes():
    with open("/proc/self/io", encoding="utf-8") as handle:
        return int(next(line for line in handle if line.startswith("rchar:")).split()[1])


def drop_caches():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w", encoding="utf-8") as handle:
            handle.write("3\n")
        return True
    except OSError:
        return False


def full_read(ckpt):
    began, total = time.perf_counter(), 0
    for name in sorted(os.listdir(ckpt)):
        with open(os.path.join(ckpt, name), "rb", buffering=0) as handle:
            while True:
                chunk = handle.read(16 << 20)
                if not chunk:
                    break
                total += len(chunk)
    return time.perf_counter() - began, total


def main():
    total_gb = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as root:
        ckpt = build(root, total_gb)
        files = len(os.listdir(ckpt))
        size = sum(os.path.getsize(os.path.join(ckpt, n)) for n in os.listdir(ckpt))
        on_disk = sum(os.stat(os.path.join(ckpt, n)).st_blocks * 512 for n in os.listdir(ckpt))
        runs = [judge(root) for _ in range(7)]
        took, infos, read = statistics.median(r[0] for r in runs), runs[-1][1], runs[-1][2]
        assert infos["checkpoint-1000"]["complete"], infos
        cold = judge(root)[0] if drop_caches() else None
        cpu_before = resource.getrusage(resource.RUSAGE_SELF)
        whole, whole_bytes = full_read(ckpt)
        cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    print(f"checkpoint: HF checkpoint-1000/, {files} files, "
          f"{size / GIB:.1f} GiB ({on_disk / (1 << 20):.1f} MiB on disk: sparse)")
    print("| check | time | bytes read | vs goal (1 s) |")
    print("|---|---|---|---|")
    print(f"| completeness (structure of every file, the layout's marker), page cache warm, median of 7 "
          f"| {took * 1000:.1f} ms | {read / 1024:.0f} KiB | {took:.4f}x |")
    if cold is not None:
        print(f"| the same after dropping the page cache | {cold * 1000:.1f} ms | | {cold:.4f}x |")
    else:
        print("| the same after dropping the page cache | not measured: /proc/sys/vm/drop_caches refused | | |")
    print(f"| a full read of the same {whole_bytes / GIB:.1f} GiB (holes read as zeros) | {whole:.2f} s | "
          f"{whole_bytes / GIB:.1f} GiB | {whole:.2f}x (CPU {cpu_after.ru_utime + cpu_after.ru_stime - cpu_before.ru_utime - cpu_before.ru_stime:.2f} s) |")
    print(f"full read / completeness check: {whole / took:.0f}x")
    return 0 if took < 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
