# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Show a long wait's progress on the controller while a module waits in the CT.

A stop can wait minutes (SIGINT while a 27B-model checkpoint is written, or the next periodic
checkpoint), a launch too (health, then the progress lines the canary needs); a terminal or an
AWX job that shows nothing for ten minutes looks hung. The module writes its progress to a
file in the CT about once a second (module_utils/ct/rundir.py ProgressFile); while it runs, this
reads that file through the task's own connection and prints a line through Ansible's display,
which reaches ansible-playbook's output and AWX's job events alike. A wait that ends within
FIRST_AFTER seconds prints nothing: the quiet case stays quiet, and costs no extra round trip.

The file is the CT's to write (docs/security.md): at most PROGRESS_BYTES of it are read, a file
that is not a mapping of the module's fields is said once and not shown, and the line shown is
cleaned as every CT text is (untrusted.printable). Showing progress never fails the task.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shlex
import threading

from ansible.utils.display import Display

from ansible_collections.dflash.lifecycle.plugins.module_utils.node.installed_hookscript import printable

display = Display()

FIRST_AFTER = 10.0
EVERY = 5.0
PROGRESS_BYTES = 16384
LINE_CHARS = 400


def stop_progress_file(stop_args):
    """Where a stop with these module options writes its progress: its progress_file, else the
    file its detach_dir holds for it."""
    return stop_args.get("progress_file") or os.path.join(stop_args.get("detach_dir") or "/run/dflash",
                                                          "stop.progress.json")


def stop_words(progress):
    """A stop's progress line."""
    words = f"stop stage {progress.get('stage')} ({progress.get('signal')}): {progress.get('elapsed')}s"
    if progress.get("bound") is not None:
        words += f" of {progress['bound']}s"
    words += f", {progress.get('running')} process(es) of the run still running"
    if progress.get("checkpoint_bytes") is not None:
        words += f", checkpoint +{progress['checkpoint_bytes'] / 1e6:.1f} MB written"
    if progress.get("steps_since_checkpoint") is not None:
        words += f", {progress['steps_since_checkpoint']} steps not in a checkpoint yet"
    return words


def launch_words(progress):
    """A launch's progress line: the wait for free GPUs, the health wait, then the canary's
    wait for progress lines."""
    if progress.get("phase") == "gpus":
        return (f"waiting for the GPUs to be free: {progress.get('elapsed')}s of "
                f"{progress.get('bound')}s; {progress.get('held')}")
    if progress.get("phase") == "gang":
        return (f"its ranks run; waiting for the gang's ranks to meet (the CT whose ranks log to say healthy): "
                f"{progress.get('elapsed')}s of {progress.get('bound')}s")
    if progress.get("phase") == "throughput":
        figure = progress.get("tokens_per_s")
        return (f"throughput: {progress.get('lines')} of {progress.get('of')} progress lines, "
                f"{'no figure yet' if figure is None else f'{figure:.1f} tok/s so far'}, "
                f"{progress.get('elapsed')}s of {progress.get('bound')}s")
    return (f"waiting for health: {progress.get('elapsed')}s of {progress.get('bound')}s, "
            f"{'a progress line seen' if progress.get('progress_line') else 'no progress line yet'}")


def stage_words(progress):
    """A model copy's progress line."""
    eta = progress.get("eta")
    return (f"staging {progress.get('target')}: {progress.get('bytes_done', 0) / 1e9:.1f} of "
            f"{progress.get('bytes', 0) / 1e9:.1f} GB, {progress.get('rate', 0) / 1e6:.0f} MB/s, "
            + ("ETA unknown" if eta is None else f"ETA {eta:.0f}s"))


def progress_line(render, text):
    """render's line of a progress file's text, cleaned; None when the text is not a mapping of the
    fields render reads (the module writes it whole, by rename: another wrote this one)."""
    try:
        progress = json.loads(text)
        if not isinstance(progress, dict):
            return None
        return printable(render(progress), LINE_CHARS)
    except (ValueError, TypeError, KeyError, AttributeError, ArithmeticError, RecursionError):
        return None


def launch_watch(connection, args, host):
    """(args, watch): a launch's module options (trainer_process's) with the file its progress goes
    to set - in its run_dir, or beside its pidfile - and, with stop_first and stage_models, the
    stop's and the model copy's; and the ProgressWatch that shows them while the module runs."""
    args = dict(args)
    if not args.get("progress_file"):
        run_dir = args.get("run_dir") or os.path.dirname(args.get("pidfile") or "/run/dflash/trainer.pid")
        args["progress_file"] = os.path.join(run_dir, "launch.progress.json")
    more = []
    if isinstance(args.get("stop_first"), dict):  # the stop before the launch writes its own
        stop = args["stop_first"] = dict(args["stop_first"], progress_file=stop_progress_file(args["stop_first"]))
        more.append((stop["progress_file"], stop_words))
    if isinstance(args.get("stage_models"), dict):  # and the model's copy after it
        stage = args["stage_models"] = dict(args["stage_models"], progress_file=args["stage_models"].get(
            "progress_file") or os.path.join(os.path.dirname(args["progress_file"]), "stage.progress.json"))
        more.append((stage["progress_file"], stage_words))
    return args, ProgressWatch(connection, args["progress_file"], launch_words, host, more)


class ProgressWatch:
    """Runs call() (the module) in a thread; while it runs past FIRST_AFTER seconds, shows
    the progress file's content, rendered by render, every EVERY seconds when it changed. more:
    further (path, render) pairs, for a module that waits in more than one way (the launch's
    stop_first writes the stop's progress, then the launch's)."""

    def __init__(self, connection, path, render, host, more=()):
        self.connection = connection
        self.files = [(path, render), *more]
        self.host = host

    def run(self, call):
        outcome = {}

        def target():
            try:
                outcome["result"] = call()
            except BaseException as err:  # noqa: BLE001  (raised again in the caller's thread)
                outcome["error"] = err

        worker = threading.Thread(target=target, name="module", daemon=True)
        worker.start()
        worker.join(FIRST_AFTER)
        shown, said = {}, set()
        while worker.is_alive():
            for path, render in self.files:
                text = self._read(path)
                if text and text != shown.get(path):
                    shown[path] = text
                    line = progress_line(render, text)
                    if line is not None:
                        display.display(f"{self.host}: {line}")
                    elif path not in said:  # the module writes it whole, by rename: another wrote this
                        said.add(path)
                        display.display(f"{self.host}: its progress file {printable(path)} is not one the module "
                                        "writes: its progress is not shown")
            worker.join(EVERY)
        if "error" in outcome:
            raise outcome["error"]
        return outcome["result"]

    def _read(self, path):
        try:
            code, out, _err = self.connection.exec_command(f"head -c {PROGRESS_BYTES} {shlex.quote(path)} 2>/dev/null")
        except Exception:  # noqa: BLE001  (showing progress must never fail the task)
            return None
        return out.decode("utf-8", "replace").strip() if code == 0 else None


class ControllerWatch:
    """Whether this job's ansible-playbook outlived a module call. A fork that runs a task lives in
    a session of its own, so a SIGKILL of the job's process group ends ansible-playbook and leaves
    the fork, its ssh client and the module in the CT running: the module's answer then reaches a
    fork whose parent is gone, and nobody reports it. The CT's worker cannot see that from its side;
    this fork can (its parent changed), and tells the CT (module_utils/ct/change_record.py)."""

    def __init__(self):
        # ansible-playbook's PID as multiprocessing recorded it at the fork (ansible-core forks its
        # workers with it): right even when it died before this line ran, where getppid() is 1 already.
        # Not its sentinel: the forks that run beside this one hold the sentinel's pipe open too.
        parent = multiprocessing.parent_process()
        self.parent_pid = parent.pid if parent is not None else os.getppid()

    def gone(self):
        """Whether ansible-playbook has died since this fork began (the fork is reparented)."""
        return os.getppid() != self.parent_pid

    def tell_if_gone(self, action, args, task_vars):
        """After the module returned: when ansible-playbook is gone, mark the CT's record of the
        change and give the job's lock back (args: the module's, with its lock_* options), then end
        this fork. Its answer has no reader: the results pipe stays open in the forks beside it,
        so a large answer would fill it and leave this fork asleep for ever (seen: the forks of a
        killed job, asleep long after it)."""
        if not self.gone():
            return
        if args.get("lock_holder"):
            try:
                action._execute_module(module_name="dflash.lifecycle.redeploy_lock", task_vars=task_vars, module_args={
                    "holder": args["lock_holder"], "path": args.get("lock_path") or "/run/dflash/redeploy.lock",
                    "state": "released", "controller_gone": True,
                    "change_record": args.get("change_record") or "/var/lib/dflash/last-change.json"})
            except Exception:  # noqa: BLE001  (nobody is there to tell: the lease ends on its own)
                pass
        os._exit(0)  # nobody waits for this status either
