# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checks that a CT can run the trainer, before anything is touched (Python 3.8 compatible).

Kept apart from the launch and the stop: the preflight module, the first call of every
redeploy, then carries only what it runs.
"""

from __future__ import annotations

import os
import subprocess

from ansible_collections.dflash.lifecycle.plugins.module_utils import checkpoint_formats, checkpoints, launchers


def count_gpus(nvidia_smi):
    try:
        out = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=60,
                             check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return 0, f"{nvidia_smi} -L failed: {err}"
    gpus = [line for line in out.stdout.splitlines() if line.startswith("GPU ")]
    return len(gpus), None if out.returncode == 0 else out.stderr.strip()


def preflight(params):
    """Every check with its outcome; the failures name the check and what was found."""
    checks = []

    def check(name, ok, found, hint=""):
        checks.append({"check": name, "ok": bool(ok), "found": found, "hint": hint})

    gpus, error = count_gpus(params["nvidia_smi"])
    needed = params.get("gpus_needed") or 0
    check("gpus_visible", gpus >= needed and not error,
          f"{gpus} GPUs from nvidia-smi -L" + (f" ({error})" if error else ""),
          f"the run needs GPU ids up to {needed - 1}" if needed else "")
    model = params["target_model"]
    has_config = os.path.isfile(os.path.join(model, "config.json"))
    check("target_model", has_config,
          f"{model}: " + ("config.json present" if has_config
                          else "no config.json" if os.path.isdir(model) else "missing"),
          "the model lives in /dev/shm, which is wiped when the CT restarts: copy it back"
          if model.startswith("/dev/shm") else "")
    data = params["data_dir"]
    entries = os.listdir(data) if os.path.isdir(data) else None
    check("data_dir", bool(entries),
          f"{data}: " + ("missing" if entries is None else f"{len(entries)} entries"))
    free, where = checkpoints.free_bytes(params["output_dir"])
    minimum = int(float(params.get("min_free_gb") or 0) * 1024 ** 3)
    check("output_dir_free_space", free >= minimum,
          f"{free / 1024 ** 3:.1f} GiB free at {where}",
          f"needs {params.get('min_free_gb')} GiB for checkpoints")
    script = params.get("trainer_script")
    if script:
        check("trainer_script", os.path.isfile(script),
              f"{script}: " + ("present" if os.path.isfile(script) else "missing"),
              "no release is installed: run `make push` (or `make restart`) first")
    torch = launcher_support(params["launcher"], check) if params.get("launcher") else None
    layout = checkpoint_layout(params, check)
    return {"checks": checks, "gpu_count": gpus, "checkpoint": layout, "launcher": torch,
            "checkpoint_present": bool(layout and layout["newest"]),
            "failed_checks": [c for c in checks if not c["ok"]]}


def launcher_support(wanted, check):
    """The launcher check: the interpreter has torch (and accelerate or deepspeed for those), and
    whether its torch reads a shutdown timeout (the launch renders the flag only where it does)."""
    facts = launchers.torch_support_of_python(wanted["python"])
    module = {"accelerate": "accelerate", "deepspeed": "deepspeed"}.get(wanted["name"])
    missing = facts["error"]
    if not missing and module:
        found = subprocess.run([wanted["python"], "-c", f"import importlib.util as u; print(bool(u.find_spec('{module}')))"],
                               capture_output=True, text=True, timeout=60, check=False).stdout.strip()
        missing = None if found == "True" else f"{wanted['python']} has no {module}"
    check("launcher", not missing,
          missing or (f"{wanted['name']} with torch {facts['version']} at {facts['path']}; "
                      + ("it reads a shutdown timeout" if facts["reads_shutdown_timeout"]
                         else "it hard-codes its 30 s deadline: the stop signals the workers itself")),
          f"install torch{' and ' + module if module else ''} for {wanted['python']} (trainer_run_python)")
    return facts


def checkpoint_layout(params, check):
    """The checkpoint_layout check (the layout set matches what the directory holds) and what
    the directory holds by it: the layout, the newest complete checkpoint, what the resume loads."""
    try:
        directory = checkpoints.Directory(params["output_dir"], params["checkpoint_format"],
                                          params["checkpoint_custom"])
        directory.check()
    except checkpoint_formats.InvalidLayout as err:
        check("checkpoint_layout", False, str(err).replace(" Nothing was signalled.", ""))
        return None
    infos = directory.entries()
    done = directory.complete(infos)
    chosen, reason = directory.resolve()
    check("checkpoint_layout", True, reason or f"checkpoint_format={params['checkpoint_format']}")
    return {"format": chosen.name if chosen else None, "format_reason": reason,
            "newest": done[-1][0] if done else None, "newest_step": done[-1][1]["step"] if done else None,
            "incomplete": [n for n in directory.ordered(infos) if not infos[n]["complete"]],
            "resume": directory.resume(infos),
            # what a gang's CTs compare: each sees the same checkpoints, of the same size
            "listing": {n: [infos[n]["size"], infos[n]["complete"]] for n in infos}}
