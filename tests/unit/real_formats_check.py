"""Run by tests/unit/test_checkpoint_layouts.py with the torch venv's Python: the example
trainer's imitations load with the real torch and safetensors, and the project's file checks
accept what the real torch.save and safetensors write and refuse every cut of it. Prints what it
loaded and refused; exits non-zero on the first disagreement."""

import os
import sys
import tempfile

import safetensors
import safetensors.torch
import torch

import checkpoint_layouts as layouts
from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoint_files

TORCH_FILES = (".pt", ".pth", ".ckpt", ".bin", ".distcp")
WEIGHTS = [[float(r + c) for c in range(32)] for r in range(32)]


def imitations_load(root):
    loaded = 0
    for name in sorted(layouts.LAYOUTS):
        out = os.path.join(root, name)
        os.makedirs(out)
        layouts.named(name, out, 4).save({"step": 7, "epoch": 0, "tokens": 70}, WEIGHTS, layouts.Pace())
        for base, _dirs, files in os.walk(out):
            for item in files:
                path = os.path.join(base, item)
                if item.endswith(TORCH_FILES):
                    torch.load(path, weights_only=True)
                elif item.endswith(".safetensors"):
                    with safetensors.safe_open(path, "pt") as handle:
                        assert list(handle.keys()) == ["weights"], path
                        assert handle.get_tensor("weights").shape == (32, 32), path
                else:
                    continue
                loaded += 1
                assert checkpoint_files.file_problem(path) is None, path
    print(f"loaded {loaded} imitation files with torch.load and safetensors")


def real_files_checked(root):
    real = {
        "optimizer.pt": lambda p: torch.save({"exp_avg": torch.randn(4096), "step": 9}, p),
        "model.safetensors": lambda p: safetensors.torch.save_file({"w": torch.randn(64, 64),
                                                                    "b": torch.randn(64)}, p),
    }
    for name, write in real.items():
        path = os.path.join(root, name)
        write(path)
        problem = checkpoint_files.file_problem(path)
        assert problem is None, f"{name} by the real writer: {problem}"
        data = open(path, "rb").read()
        cut = os.path.join(root, "cut-" + name)
        for length in range(0, len(data), max(1, len(data) // 300)):
            with open(cut, "wb") as handle:
                handle.write(data[:length])
            assert checkpoint_files.file_problem(cut) is not None, f"{name} cut at {length} passed"
        print(f"refused every cut of a real {name} ({len(data)} bytes, {torch.__version__})")


def main():
    with tempfile.TemporaryDirectory() as root:
        imitations_load(root)
        real_files_checked(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
