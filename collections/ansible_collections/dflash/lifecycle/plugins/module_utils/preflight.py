# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checks that a CT can run the trainer, before anything is touched (Python 3.8 compatible).

Kept apart from the launch and the stop: the preflight module, the first call of every
redeploy, then carries only what it runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoint_formats, checkpoints
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import model_stage, releases, writable
from ansible_collections.dflash.lifecycle.plugins.module_utils.launch import torch_probe


def count_gpus(nvidia_smi):
    try:
        out = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=60,
                             check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return 0, f"{nvidia_smi} -L failed: {err}"
    gpus = [line for line in out.stdout.splitlines() if line.startswith("GPU ")]
    return len(gpus), None if out.returncode == 0 else out.stderr.strip()


def node_uid_of_root(uid_map="/proc/self/uid_map"):
    """The node's uid that this CT's root is, by the CT's user namespace's map: 0 in a privileged
    CT (it shares the node's own map, ``0 0 4294967295``), 100000 in Proxmox's default unprivileged
    one; None when the map cannot be read."""
    try:
        with open(uid_map, encoding="ascii") as handle:
            for line in handle:
                inside, outside, count = (int(word) for word in line.split())
                if inside <= 0 < inside + count:
                    return outside - inside
    except (OSError, ValueError):
        return None
    return None


def privileged_check(refuse, check):
    """Whether the CT is privileged (its root is the node's root: docs/security.md's threat model does
    not hold there), as a check that fails when refuse."""
    root = node_uid_of_root()
    privileged = root == 0
    check("unprivileged", not (privileged and refuse),
          "a privileged CT: its root is the node's root" if privileged else
          f"unprivileged: its root is uid {root} on the node" if root is not None else "its uid map cannot be read",
          "trainer_preflight_privileged=refuse: run it in an unprivileged CT (docs/unprivileged.md)" if privileged else "")
    return privileged


def preflight(params, check_mode=False):
    """Every check with its outcome; the failures name the check and what was found."""
    checks = []

    def check(name, ok, found, hint=""):
        checks.append({"check": name, "ok": bool(ok), "found": found, "hint": hint})

    privileged = privileged_check(params.get("privileged") == "refuse", check)
    gpus, error = count_gpus(params["nvidia_smi"])
    needed = params.get("gpus_needed") or 0
    check("gpus_visible", gpus >= needed and not error,
          f"{gpus} GPUs from nvidia-smi -L" + (f" ({error})" if error else ""),
          f"the run needs GPU ids up to {needed - 1}" if needed else "")
    model = params["target_model"]
    staged = staging_plans(params.get("model_stage"), check)
    has_config = os.path.isfile(os.path.join(model, "config.json"))
    plan = next((p for p in staged or () if p["target"].rstrip("/") == model.rstrip("/")), None)
    # a model to stage: the model_stage check says whether it can be
    check("target_model", has_config or plan is not None,
          f"{model}: " + ("config.json present" if has_config
                          else "no config.json" if os.path.isdir(model) else "missing")
          + (f", to be staged from {plan['source']}" if plan and plan["needed"] else ""),
          shm_hint(model))
    data = params["data_dir"]
    entries = os.listdir(data) if os.path.isdir(data) else None
    check("data_dir", bool(entries),
          f"{data}: " + ("missing" if entries is None else f"{len(entries)} entries"))
    wanted = dict(params.get("writable") or {})
    wanted.update({f"trainer_model_stage {target}": os.path.dirname(target.rstrip("/"))
                   for target in ((params.get("model_stage") or {}).get("models") or {})})
    refused = writable.refusals(wanted, probe=not check_mode)
    for words in refused:
        check("writable", False, words)
    if wanted and not refused:
        check("writable", True, f"{', '.join(sorted(wanted))}: writable by root in the CT")
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
    if params.get("stop_request"):
        stop_request_place(params["stop_request"]["path"], params["stop_request"]["run_dir"], check)
    torch = launcher_support(params["launcher"], check) if params.get("launcher") else None
    layout = checkpoint_layout(params, check)
    return {"checks": checks, "privileged": privileged, "gpu_count": gpus, "checkpoint": layout, "launcher": torch, "model_stage": staged,
            "model_stage_needed": any(p["needed"] for p in staged or ()),
            "checkpoint_present": bool(layout and layout["newest"]),
            "failed_checks": [c for c in checks if not c["ok"]]}


def model_refusal(label, model, staged_to=()):
    """Why the run cannot read model (a model directory: its config.json), or None; a model the
    launch stages first (a target in staged_to) is there by then."""
    if os.path.isfile(os.path.join(model, "config.json")) or model.rstrip("/") in staged_to:
        return None
    hint = shm_hint(model)
    return f"{label} {model}: " + ("no config.json" if os.path.isdir(model) else "missing") + (f": {hint}" if hint else "")


def shm_hint(model):
    """What to do about a model missing from /dev/shm, or "" for a model elsewhere."""
    if not model.startswith("/dev/shm"):
        return ""
    return "the model lives in /dev/shm, which is wiped when the CT restarts; copy it back, or set " \
        "trainer_model_stage to its persistent copy"


def launch_refusals(params, probe=True):
    """The preflight's rules that every launch applies, the job's and the CT's own (the Proxmox
    hook's relaunch, the supervisor's): the models there or staged by this launch, and the run able
    to write its checkpoints, its log, its run and lifecycle directories and where it stages a
    model. Each refusal is one line naming the launch option (the GPUs being free is the launch's
    wait for them)."""
    stage = params.get("stage_models") or {}
    staged_to = {target.rstrip("/") for target in stage.get("models") or {}}
    found = [model_refusal("model_dirs", model, staged_to) for model in params.get("model_dirs") or []]
    paths = {"checkpoint_dir": params.get("checkpoint_dir"), "log_file": os.path.dirname(params["log_file"]),
             "run_dir": params.get("run_dir") or os.path.dirname(params["pidfile"]),
             "lifecycle.dir": (params.get("lifecycle") or {}).get("dir")}
    paths.update({f"stage_models {target}": os.path.dirname(target.rstrip("/")) for target in staged_to})
    return [words for words in found if words] + writable.refusals(paths, probe)


def missing_tools(tools, check_mode):
    """The paths of tools (each {path, sha256, size}: a binary the job pushes, py-spy) that the CT
    lacks or holds in another version; the parent directory of each made (root's, 0755) outside
    check mode, so that the push can land. The digest is read only when the size matches."""
    missing = []
    for tool in tools:
        path = tool["path"]
        try:
            same = os.stat(path).st_size == tool["size"] and releases.sha256_file(path) == tool["sha256"]
        except OSError:
            same = False
        if not same:
            missing.append(path)
            if not check_mode:
                os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    return missing


def stop_request_place(path, run_dir, check):
    """The stop request's file: a place the stop can write a file into by a rename, before any
    stop needs it (a missing run directory is created by the launch)."""
    parent = os.path.dirname(path)
    if os.path.islink(path) or os.path.isdir(path):
        ok, found = False, f"{path} is a {'symlink' if os.path.islink(path) else 'directory'}"
    elif os.path.isdir(parent):
        ok = os.access(parent, os.W_OK)
        found = f"{parent} is {'writable' if ok else 'not writable'}"
    else:
        ok = parent == run_dir.rstrip("/")
        found = f"{parent} is missing" + (" (the launch creates it)" if ok else "")
    check("stop_request_path", ok, found,
          "" if ok else "trainer_run_stop_request_path: the stop could not write its request there")


def staging_plans(wanted, check):
    """The model_stage check: each model to stage from its persistent copy can be (a model
    directory, a target in a tmpfs) and fits in what the CT's memory can take; None without
    wanted ({models, reserve_gb})."""
    if not wanted:
        return None
    plans = []
    for target, source in sorted(wanted["models"].items()):
        try:
            plans.append(model_stage.plan(target, str(source), int(wanted["reserve_gb"] * model_stage.GB)))
        except model_stage.StageError as err:
            check("model_stage", False, str(err))
    for p in plans:
        check("model_stage", p["fits"], model_stage.words(p) if p["fits"] else model_stage.refusal(p))
    return plans


def launcher_support(wanted, check):
    """The launcher check: the interpreter has torch (and accelerate or deepspeed for those), and
    whether its torch reads a shutdown timeout (the launch renders the flag only where it does);
    asked as the launch starts the run (the secrets file, the run's environment, a login shell)."""
    run_env = {key: wanted.get(key) for key in ("env", "secrets_file", "login_shell")}
    facts = torch_probe.torch_support_of_python(wanted["python"], run_env)
    module = {"accelerate": "accelerate", "deepspeed": "deepspeed"}.get(wanted["name"])
    missing = facts["error"]
    if not missing and module and not torch_probe.has_module(wanted["python"], module, run_env):
        missing = f"{wanted['python']} has no {module} in the run's environment"
    check("launcher", not missing,
          missing or (f"{wanted['name']} with torch {facts['version']} at {facts['path']}; "
                      + ("it reads a shutdown timeout" if facts["reads_shutdown_timeout"]
                         else "it hard-codes its 30 s deadline: the stop signals the workers itself")),
          f"install torch{' and ' + module if module else ''} for {wanted['python']} (trainer_run_python), "
          "where the run's environment (dflash_env) finds it")
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


def gang_marks(output_dir, wanted, check_mode=False, poll=0.1):
    """Whether the CTs of a gang see one checkpoint directory: this CT writes its mark,
    <output_dir>/<GANG_MARKS>/<job>/<me>, and waits up to wanted["wait"] s for every member's
    (they run their preflights at the same time). Listings of a live run's directory taken on
    two CTs at two moments differ by a save or a rotation in between; a mark does not. Returns
    {dir, seen, missing, waited_s}; in check mode nothing is written and nothing proven."""
    marks = os.path.join(output_dir, checkpoint_formats.GANG_MARKS)
    job_dir = os.path.join(marks, wanted["job"])
    found = {"dir": job_dir, "seen": [], "missing": [], "waited_s": 0.0, "checked": not check_mode}
    if check_mode:
        return found
    os.makedirs(job_dir, mode=0o755, exist_ok=True)
    with open(os.path.join(job_dir, wanted["me"]), "w", encoding="utf-8") as handle:
        handle.write(f"{wanted['me']} {time.time()}\n")
    _forget_old_jobs(marks, wanted["job"])
    began = time.monotonic()
    while True:
        present = set(os.listdir(job_dir))
        found["missing"] = [m for m in wanted["members"] if m not in present]
        if not found["missing"] or time.monotonic() - began >= float(wanted["wait"]):
            break
        time.sleep(poll)
    found["seen"] = [m for m in wanted["members"] if m in present]
    found["waited_s"] = round(time.monotonic() - began, 3)
    return found


def _forget_old_jobs(marks, job, age=86400):
    """The marks of jobs older than a day (a mark is read while the job's preflights run)."""
    for name in os.listdir(marks):
        path = os.path.join(marks, name)
        try:
            if name != job and time.time() - os.stat(path).st_mtime > age:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            continue
