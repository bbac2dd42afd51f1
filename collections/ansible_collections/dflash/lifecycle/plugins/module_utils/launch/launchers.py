# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What each launcher is (Python 3.8 compatible): torchrun (and ``python -m
torch.distributed.run``), ``accelerate launch`` and the DeepSpeed launcher.

Each answers the same questions, for the launch and for the stop; the ladder and the launch
hold no launcher names of their own:

* which process is the agent and which are its workers (one per rank);
* what deadline applies: how long the agent lets its workers run after it got a signal before
  it SIGKILLs them, read from its command line, its environment and the torch it runs;
* what a signal to the agent becomes for the workers (the one it forwards, or none);
* its options, as the launcher spells them, and the line that makes it safe for a graceful
  stop (no elastic restart, a deadline at least the stop's graceful cap).

Facts from the launchers' source: torch ``distributed/run.py`` (the options, ``PET_<NAME>``
environment defaults), ``launcher/api.py`` (``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, 30 s by
default), ``elastic/multiprocessing/api.py`` (``PContext.start`` installs the handlers of
``TORCHELASTIC_SIGNALS_TO_HANDLE`` once the workers start; ``_close`` sends the signal to every
worker's group, waits the timeout, then SIGKILLs), ``subprocess_handler.py`` (each worker
``start_new_session=True``), ``agent/server/local_elastic_agent.py`` (``TORCHELASTIC_RUN_ID``,
``TORCHELASTIC_RESTART_COUNT``, ``TORCHELASTIC_MAX_RESTARTS``); accelerate
``commands/launch.py`` (``multi_gpu_launcher`` runs ``torch.distributed.run`` in its own
process; ``simple_launcher`` a child it only waits for); DeepSpeed ``launcher/launch.py``
(``sigkill_handler``: SIGTERM to each worker's tree, 30 s for each, one after the other, then
SIGKILL; a worker that fails ends the others the same way).
"""

from __future__ import annotations

import os
import re
import signal

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable
from ansible_collections.dflash.lifecycle.plugins.module_utils.launch import torch_probe

DEFAULT_DEADLINE = 30
TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"


class LauncherError(ValueError):
    """A launcher setting is wrong; the message names the variable."""


def gpus_per_rank(option, ranks, gpus):
    """The GPUs each of ranks drives, an equal share of the gpus the run is given (DFlash's own
    trainer is one rank over 8 GPUs); LauncherError naming option when ranks do not divide them."""
    if ranks < 1 or gpus % ranks:
        raise LauncherError(f"trainer_run_launcher_options.{option}: {ranks} ranks do not divide the {gpus} GPUs the "
                            "run is given (dflash_target_gpus, dflash_drafter_gpus): each rank drives an equal "
                            "share of them (one rank over all of them is valid)")
    return gpus // ranks


def _opt(argv, *names):
    """The value of the last --name VALUE or --name=VALUE in argv, or None."""
    found = None
    for index, arg in enumerate(argv):
        for name in names:
            if arg == name and index + 1 < len(argv):
                found = argv[index + 1]
            elif arg.startswith(name + "="):
                found = arg[len(name) + 1:]
    return found


def _int(text):
    try:
        return int(str(text).strip())
    except (TypeError, ValueError):
        return None


def _script_args(argv, starts):
    """argv from the first element whose basename or module is one of starts."""
    for index, arg in enumerate(argv[:4]):
        if os.path.basename(arg) in starts:
            return argv[index:]
        if arg == "-m" and index + 1 < len(argv) and argv[index + 1] in starts:
            return argv[index + 1:]
    return None


class Launcher:
    """A launcher: subclasses set the class attributes and override the questions that differ."""

    name = ""
    title = ""
    entries = ()   # basenames or modules that start it
    module = ""    # the module the launch runs it as (python -m ...)
    options = {}   # option name (underscores) -> kind: int, str, float, flag
    dashes = True  # the command line spells options with dashes (else underscores)
    restarts_option = None
    forced = {}    # the options a launch sets unless given

    def args(self, argv):
        """The launcher's own part of argv (from its entry on), or None when argv is not it."""
        return _script_args(argv, self.entries)

    # -- the launch ----------------------------------------------------------------------------

    def render(self, python, script, flags, options, cap, shutdown_flag=True):
        """[python, -m, module, --option, value, ..., script, flags...] with the forced options."""
        chosen = dict(self.forced_options(cap, shutdown_flag), **(options or {}))
        self.check(chosen, cap)
        line = [python, "-u", "-m", self.module]
        for name in self.options:
            if name not in chosen or chosen[name] is None:
                continue
            flag = "--" + (name.replace("_", "-") if self.dashes else name)
            if self.options[name] == "flag":
                if chosen[name]:
                    line.append(flag)
            else:
                line += [flag, str(chosen[name])]
        return line + [script] + list(flags)

    def forced_options(self, cap, shutdown_flag):
        return dict(self.forced)

    def environment(self, cap):
        return {}

    def check(self, options, cap):
        for name, value in options.items():
            if name not in self.options:
                near = [o for o in self.options if o.startswith(name[:4])]
                raise LauncherError(
                    f"trainer_run_launcher_options.{name}: {self.title} has no such option"
                    + (f"; did you mean {near[0]}?" if near else f" (it has {', '.join(sorted(self.options))})"))
            kind = self.options[name]
            if kind == "flag" and not isinstance(value, bool):
                raise LauncherError(f"trainer_run_launcher_options.{name}: true or false, got {value!r}")
            if kind == "int" and (isinstance(value, bool) or _int(value) is None):
                raise LauncherError(f"trainer_run_launcher_options.{name}: an integer, got {value!r}")
            if kind in ("str", "float") and (isinstance(value, (dict, list)) or "\n" in str(value)):
                raise LauncherError(f"trainer_run_launcher_options.{name}: a single value, got {value!r}")

    rank_options = ()  # the option that says how many workers a node starts

    def ranks(self, options):
        """Worker processes one launch starts on this node (None: the launcher decides)."""
        value = next((options[o] for o in self.rank_options if o in (options or {})), 1)
        return _int(value)

    def ranks_of(self, argv):
        """The same, from the agent's own command line."""
        args = self.args(argv) or []
        value = _opt(args, *("--" + o for o in self.rank_options),
                     *("--" + o.replace("_", "-") for o in self.rank_options))
        return 1 if value is None else _int(value)

    # -- the stop ------------------------------------------------------------------------------

    def workers(self, agent, table, proc_root):
        """The agent's workers (their main processes), oldest first."""
        return []

    def deadline(self, agent, proc_root):
        """(seconds the agent lets its workers run after a signal before SIGKILL, in words)."""
        return DEFAULT_DEADLINE, f"{DEFAULT_DEADLINE} s"

    def delivers(self, agent, sig, proc_root):
        """The signal the workers get when the agent gets sig, or None."""
        return None

    def restarts(self, agent, workers, proc_root):
        """(max restarts, restart count) as the workers carry them, or (0, 0)."""
        return 0, 0

    def holders(self, agent, table, proc_root):
        """The processes that would end the workers on their own (a deadline, a rank's exit)."""
        return [agent]


class Torchrun(Launcher):
    name = "torchrun"
    title = "torchrun"
    entries = ("torchrun", "torch.distributed.run", "torch.distributed.launch")
    module = "torch.distributed.run"
    options = {"nnodes": "str", "nproc_per_node": "str", "node_rank": "int", "rdzv_backend": "str",
               "rdzv_endpoint": "str", "rdzv_id": "str", "rdzv_conf": "str", "standalone": "flag",
               "max_restarts": "int", "monitor_interval": "float", "start_method": "str", "role": "str",
               "log_dir": "str", "redirects": "str", "tee": "str", "local_ranks_filter": "str",
               "master_addr": "str", "master_port": "int", "local_addr": "str",
               "signals_to_handle": "str", "shutdown_timeout": "int"}
    forced = {"max_restarts": 0}

    def forced_options(self, cap, shutdown_flag):
        forced = dict(self.forced)
        if shutdown_flag:
            forced["shutdown_timeout"] = int(cap)
        return forced

    def environment(self, cap):
        return {torch_probe.SHUTDOWN_ENV: str(int(cap))}

    def check(self, options, cap):
        super().check(options, cap)
        timeout = options.get("shutdown_timeout")
        if timeout is not None and _int(timeout) < cap:
            raise LauncherError(
                f"trainer_run_launcher_options.shutdown_timeout: {timeout} s is shorter than the stop's "
                f"graceful wait cap (trainer_stop_graceful_wait_cap, {int(cap)} s): the agent would "
                "SIGKILL the workers in the middle of their save")
        if _int(options.get("max_restarts", 0)) is None or _int(options.get("max_restarts", 0)) < 0:
            raise LauncherError("trainer_run_launcher_options.max_restarts: an integer >= 0")

    rank_options = ("nproc_per_node",)

    def workers(self, agent, table, proc_root):
        return sorted((p for p in table.values() if p.ppid == agent.pid
                       and "TORCHELASTIC_RUN_ID" in proctable.read_environ(p.pid, proc_root)),
                      key=lambda p: (p.starttime, p.pid))

    def deadline(self, agent, proc_root):
        argv = proctable.read_argv(agent.pid, proc_root) or []
        env = proctable.read_environ(agent.pid, proc_root)
        torch = torch_probe.torch_support(agent.pid, proc_root)
        given = _opt(self.args(argv) or [], "--shutdown-timeout", "--shutdown_timeout")
        source = "--shutdown-timeout"
        if given is None and env.get("PET_SHUTDOWN_TIMEOUT"):
            given, source = env["PET_SHUTDOWN_TIMEOUT"], "PET_SHUTDOWN_TIMEOUT"
        if given is None and env.get(torch_probe.SHUTDOWN_ENV):
            given, source = env[torch_probe.SHUTDOWN_ENV], torch_probe.SHUTDOWN_ENV
        version = torch["version"] or "of unknown version"
        if given is not None and torch["reads_shutdown_timeout"] is False:
            return DEFAULT_DEADLINE, (f"{DEFAULT_DEADLINE} s: torch {version} hard-codes it ({source}={given} "
                                      "is not read)")
        if given is not None and _int(given) is not None:
            return _int(given), f"{_int(given)} s ({source}, torch {version})"
        return DEFAULT_DEADLINE, f"{DEFAULT_DEADLINE} s (torch {version}'s default)"

    def handled(self, agent, proc_root):
        argv = self.args(proctable.read_argv(agent.pid, proc_root) or []) or []
        env = proctable.read_environ(agent.pid, proc_root)
        text = (_opt(argv, "--signals-to-handle", "--signals_to_handle") or env.get("PET_SIGNALS_TO_HANDLE")
                or env.get("TORCHELASTIC_SIGNALS_TO_HANDLE") or TORCHRUN_SIGNALS)
        return {s.strip() for s in text.split(",")}

    def delivers(self, agent, sig, proc_root):
        # handlers exist once the workers run (PContext.start); before, there are no workers
        return sig if sig.name in self.handled(agent, proc_root) else None

    def restarts(self, agent, workers, proc_root):
        if not workers:
            return 0, 0
        env = proctable.read_environ(workers[0].pid, proc_root)
        return _int(env.get("TORCHELASTIC_MAX_RESTARTS")) or 0, _int(env.get("TORCHELASTIC_RESTART_COUNT")) or 0


class Accelerate(Torchrun):
    """accelerate launch: with several processes it runs torch.distributed.run in its own
    process, so it is the agent; with one, its child is the trainer and nothing is forwarded."""

    name = "accelerate"
    title = "accelerate launch"
    entries = ("accelerate", "accelerate.commands.launch")
    module = "accelerate.commands.launch"
    options = {"num_processes": "int", "num_machines": "int", "machine_rank": "int",
               "main_process_ip": "str", "main_process_port": "int", "multi_gpu": "flag", "cpu": "flag",
               "mixed_precision": "str", "max_restarts": "int", "monitor_interval": "float",
               "rdzv_backend": "str", "same_network": "flag", "gpu_ids": "str", "config_file": "str",
               "num_cpu_threads_per_process": "int", "dynamo_backend": "str"}
    dashes = False

    def args(self, argv):
        found = _script_args(argv, self.entries)
        if found and os.path.basename(found[0]) == "accelerate":
            return found if len(found) > 1 and found[1] == "launch" else None
        return found

    def forced_options(self, cap, shutdown_flag):
        return dict(self.forced)  # no option for the deadline: TORCH_ELASTIC_SHUTDOWN_TIMEOUT

    def check(self, options, cap):
        Launcher.check(self, options, cap)

    rank_options = ("num_processes",)

    def workers(self, agent, table, proc_root):
        elastic = super().workers(agent, table, proc_root)
        if elastic:
            return elastic
        return sorted((p for p in table.values() if p.ppid == agent.pid), key=lambda p: (p.starttime, p.pid))

    def delivers(self, agent, sig, proc_root):
        table = proctable.snapshot(proc_root)
        if not super().workers(agent, table, proc_root):
            return None  # simple_launcher: the child is only waited for
        return super().delivers(agent, sig, proc_root)

    def deadline(self, agent, proc_root):
        if not super().workers(agent, proctable.snapshot(proc_root), proc_root):
            return None, "none: one process, a child accelerate only waits for"
        return super().deadline(agent, proc_root)


class DeepSpeed(Launcher):
    """The DeepSpeed launcher: the `deepspeed` runner starts deepspeed.launcher.launch, whose
    children are the workers; launch.py's handler SIGTERMs each worker's tree in turn."""

    name = "deepspeed"
    title = "deepspeed"
    entries = ("deepspeed", "deepspeed.launcher.runner", "deepspeed.launcher.launch")
    module = "deepspeed.launcher.runner"
    options = {"num_gpus": "int", "num_nodes": "int", "master_addr": "str", "master_port": "int",
               "include": "str", "exclude": "str", "hostfile": "str", "launcher": "str",
               "force_multi": "flag", "autotuning": "str", "elastic_training": "flag"}
    dashes = False

    rank_options = ("num_gpus",)

    def check(self, options, cap):
        super().check(options, cap)
        if options.get("elastic_training"):
            raise LauncherError("trainer_run_launcher_options.elastic_training: DeepSpeed's elastic mode "
                                "restarts workers up to 100 times (hard-coded): a stop could never end the run")

    def launch_process(self, agent, table, proc_root):
        """deepspeed.launcher.launch: the agent itself, or the runner's child."""
        if "deepspeed.launcher.launch" in (proctable.read_argv(agent.pid, proc_root) or []):
            return agent
        return next((p for p in table.values() if p.ppid == agent.pid
                     and "deepspeed.launcher.launch" in (proctable.read_argv(p.pid, proc_root) or [])), None)

    def workers(self, agent, table, proc_root):
        launch = self.launch_process(agent, table, proc_root)
        if launch is None:
            return []
        return sorted((p for p in table.values() if p.ppid == launch.pid
                       and "LOCAL_RANK" in proctable.read_environ(p.pid, proc_root)),
                      key=lambda p: (p.starttime, p.pid))

    def holders(self, agent, table, proc_root):
        launch = self.launch_process(agent, table, proc_root)
        return [agent] + ([launch] if launch is not None and launch.pid != agent.pid else [])

    def deadline(self, agent, proc_root):
        return DEFAULT_DEADLINE, (f"{DEFAULT_DEADLINE} s for each rank, one after the other "
                                  "(hard-coded in deepspeed/launcher/launch.py)")

    def delivers(self, agent, sig, proc_root):
        launch = self.launch_process(agent, proctable.snapshot(proc_root), proc_root)
        if launch is None or launch.pid != agent.pid:
            return None  # the runner installs no handler: launch.py would be orphaned
        return signal.SIGTERM if sig in (signal.SIGINT, signal.SIGTERM) else None


LAUNCHERS = (Torchrun(), Accelerate(), DeepSpeed())
NAMES = ("python",) + tuple(launcher.name for launcher in LAUNCHERS)


def named(name):
    """The launcher called name (None for python: no launcher)."""
    if name == "python":
        return None
    for launcher in LAUNCHERS:
        if launcher.name == name:
            return launcher
    raise LauncherError(f"trainer_run_launcher: {name!r} is not one of {', '.join(NAMES)}")


def recognise(argv):
    """The launcher argv runs, or None for a plain process."""
    for launcher in LAUNCHERS:
        if launcher.args(argv or []):
            return launcher
    return None


class Run:
    """A run a launcher started, as the stop sees it."""

    def __init__(self, launcher, agent, proc_root="/proc"):
        self.launcher = launcher
        self.agent = agent
        self.proc_root = proc_root
        table = proctable.snapshot(proc_root)
        self.workers = launcher.workers(agent, table, proc_root)
        self.holders = launcher.holders(agent, table, proc_root)
        self.deadline, self.deadline_words = launcher.deadline(agent, proc_root)
        self.max_restarts, self.restart_count = launcher.restarts(agent, self.workers, proc_root)

    def trainer(self):
        """The process whose signal handling is the trainer's: rank 0 (the first worker)."""
        return self.workers[0] if self.workers else self.agent

    def plan(self, sig, cap):
        """Whom the graceful signal sig goes to: ("agent", sig) when the agent forwards it and its
        deadline covers the graceful wait; else ("workers", sig) - every worker's group at once,
        the agent held (SIGSTOP) so that neither its deadline nor a rank's exit ends the others."""
        forwarded = self.launcher.delivers(self.agent, sig, self.proc_root)
        if forwarded == sig and self.deadline is not None and self.deadline >= cap:
            return "agent", (f"the agent forwards {sig.name} to its workers and waits {self.deadline_words} "
                             f">= the graceful cap {cap:.0f} s")
        why = ("it does not forward it" if forwarded is None else
               f"it would send {forwarded.name}" if forwarded != sig else
               f"its deadline ({self.deadline_words}) is shorter than the graceful cap {cap:.0f} s")
        return "workers", f"{sig.name} to every worker's group at once, the agent held: {why}"

    def report(self):
        return {"launcher": self.launcher.name, "agent": self.agent.pid,
                "holders": [p.pid for p in self.holders], "workers": [p.pid for p in self.workers],
                "ranks": [{"pid": p.pid, "rank": _int(proctable.read_environ(p.pid, self.proc_root).get("RANK")),
                           "ended_by": None} for p in self.workers], "deadline_s": self.deadline,
                "deadline": self.deadline_words, "max_restarts": self.max_restarts,
                "restart_count": self.restart_count}

    def restarted(self):
        """Workers that the agent started since (an elastic restart), or []."""
        table = proctable.snapshot(self.proc_root)
        known = {p.pid for p in self.workers}
        return [p.pid for p in self.launcher.workers(self.agent, table, self.proc_root) if p.pid not in known]


# torchrun's agent, on first sight of a worker that failed (elastic/multiprocessing/api.py,
# SubprocessContext._poll, logged at ERROR in torch's glog-like format: level, date, time, the
# agent's PID): "E1207 16:47:57.957000 21720 .../api.py:1002] failed (exitcode: -9) local_rank: 0
# (pid: 21725) of binary: ..."; a negative exitcode is the signal that ended the worker
WORKER_FAILED = re.compile(r"^[EWI]\d{4} [0-9:.]+ (\d+) \S+\] failed \(exitcode: (-?\d+)\) "
                           r"local_rank: (\d+) \(pid: (\d+)\)")


def worker_signalled(lines, agent_pid):
    """Words naming a worker of the agent agent_pid that a signal ended (an OOM kill, a segfault),
    from the lines torchrun's agent wrote (its stderr), or None. It is the agent's first
    word on its failure, written before the agent ends the rest: a gang member whose rank was killed
    can still be winding down when a peer's end, caused by its own, reaches its supervisor."""
    for line in lines:
        found = WORKER_FAILED.match(line.strip())
        if not found or int(found.group(1)) != agent_pid or int(found.group(2)) >= 0:
            continue
        signum = -int(found.group(2))
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        return (f"its worker local_rank {found.group(3)} (PID {found.group(4)}) was killed by {name}, "
                f"as its agent PID {agent_pid} logged")
    return None


def of(main, proc_root="/proc"):
    """The launcher run whose agent is main, or None for a plain trainer."""
    launcher = recognise(proctable.read_argv(main.pid, proc_root) or [])
    return Run(launcher, main, proc_root) if launcher else None
