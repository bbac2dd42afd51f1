"""module_utils/launch/launchers.py: the agent and its workers, the deadline, whom the graceful signal
goes to - on a fake /proc (the real launchers: the project's tests/integration/test_launchers.py)."""

import signal

import pytest

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable
from ansible_collections.dflash.lifecycle.plugins.module_utils.launch import launchers

TORCHRUN = "/opt/venv/bin/python3 /opt/venv/bin/torchrun --standalone --nproc-per-node 2 train.py --lr 1"


def elastic(fake, agent_argv, env=None, torch_api=None, tmp=None):
    """An agent (PID 10) and two workers carrying torchelastic's environment; torch_api: the
    text of its torch's distributed/launcher/api.py (written under tmp, mapped by the agent)."""
    base = fake.add(10, "python3", 1, cmdline=agent_argv, environ=env or {"PATH": "/usr/bin"})
    if torch_api is not None:
        torch = tmp / "site-packages" / "torch"
        (torch / "distributed" / "launcher").mkdir(parents=True)
        (torch / "version.py").write_text("__version__ = '2.13.0+cpu'\n")
        (torch / "distributed" / "launcher" / "api.py").write_text(torch_api)
        (base / "maps").write_text(f"7f00-7f01 r-xp 0 08:01 1 {torch}/lib/libtorch_python.so\n")
    for pid, rank in ((11, 0), (12, 1)):
        fake.add(pid, "python3", 10, pgid=pid, sid=pid, start=1001 + rank, cmdline="python3 -u train.py --lr 1",
                 environ={"TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_MAX_RESTARTS": "3",
                          "TORCHELASTIC_RESTART_COUNT": "0", "RANK": str(rank), "LOCAL_RANK": str(rank)})
    return launchers.of(proctable.read_process(10, fake.path), fake.path)


@pytest.mark.parametrize("argv,name", [
    (TORCHRUN, "torchrun"),
    ("python3 -m torch.distributed.run --nproc_per_node=2 t.py", "torchrun"),
    ("/usr/local/bin/accelerate launch --multi_gpu --num_processes 2 t.py", "accelerate"),
    ("python -m accelerate.commands.launch t.py", "accelerate"),
    ("/v/bin/python3 /v/bin/deepspeed --num_gpus 2 t.py", "deepspeed"),
    ("python3 -u -m deepspeed.launcher.launch --world_info=e30= t.py", "deepspeed"),
    ("python3 -u train.py --lr 1", None),
    ("python3 -u /opt/accelerate_utils.py launch", None),
])
def test_which_launcher_a_command_line_is(argv, name):
    found = launchers.recognise(argv.split())
    assert (found.name if found else None) == name


def test_the_agent_its_workers_and_their_restarts(fake, tmp_path):
    run = elastic(fake, TORCHRUN, tmp=tmp_path)
    assert [p.pid for p in run.workers] == [11, 12] and run.trainer().pid == 11
    assert (run.max_restarts, run.restart_count) == (3, 0)
    assert run.launcher.ranks_of(TORCHRUN.split()) == 2


@pytest.mark.parametrize("argv,env,api,deadline,words", [
    (TORCHRUN, None, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", 30, "30 s (torch 2.13.0+cpu's default)"),
    (TORCHRUN + " --shutdown-timeout 900", None, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", 900,
     "900 s (--shutdown-timeout, torch 2.13.0+cpu)"),
    (TORCHRUN, {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "600"}, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", 600,
     "600 s (TORCH_ELASTIC_SHUTDOWN_TIMEOUT, torch 2.13.0+cpu)"),
    (TORCHRUN, {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "600"}, "# an older torch", 30,
     "30 s: torch 2.13.0+cpu hard-codes it (TORCH_ELASTIC_SHUTDOWN_TIMEOUT=600 is not read)"),
])
def test_the_deadline_from_the_command_line_the_environment_and_the_torch_it_runs(
        fake, tmp_path, argv, env, api, deadline, words):
    run = elastic(fake, argv, env=env, torch_api=api, tmp=tmp_path)
    assert (run.deadline, run.deadline_words) == (deadline, words)


def test_the_graceful_signal_goes_to_the_agent_only_when_its_deadline_covers_the_cap(fake, tmp_path):
    covered = elastic(fake, TORCHRUN + " --shutdown-timeout 900", torch_api="TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
                      tmp=tmp_path)
    how, why = covered.plan(signal.SIGINT, 900)
    assert how == "agent" and "forwards SIGINT" in why
    how, why = covered.plan(signal.SIGINT, 1200)
    assert how == "workers" and "shorter than the graceful cap 1200 s" in why


def test_a_signal_the_agent_does_not_handle_goes_to_the_workers(fake, tmp_path):
    run = elastic(fake, TORCHRUN + " --shutdown-timeout 900 --signals-to-handle SIGTERM",
                  torch_api="TORCH_ELASTIC_SHUTDOWN_TIMEOUT", tmp=tmp_path)
    how, why = run.plan(signal.SIGINT, 60)
    assert how == "workers" and "it does not forward it" in why


def test_deepspeeds_launcher_sends_sigterm_and_is_held_with_its_runner(fake):
    fake.add(20, "python3", 1, cmdline="/v/bin/python3 /v/bin/deepspeed --num_gpus 2 t.py")
    fake.add(21, "python3", 20, cmdline="/v/bin/python3 -u -m deepspeed.launcher.launch --world_info=e30= t.py")
    for pid in (22, 23):
        fake.add(pid, "python3", 21, cmdline=f"python3 -u t.py --local_rank={pid - 22}",
                 environ={"LOCAL_RANK": str(pid - 22), "RANK": str(pid - 22)})
    run = launchers.of(proctable.read_process(20, fake.path), fake.path)
    assert [p.pid for p in run.workers] == [22, 23] and [p.pid for p in run.holders] == [20, 21]
    assert run.plan(signal.SIGINT, 60)[0] == "workers"  # the runner has no handler: launch.py orphaned
    launch = launchers.of(proctable.read_process(21, fake.path), fake.path)
    assert launch.launcher.delivers(launch.agent, signal.SIGINT, fake.path) == signal.SIGTERM
    how, why = launch.plan(signal.SIGINT, 60)
    assert how == "workers" and "it would send SIGTERM" in why
    assert "hard-coded" in launch.deadline_words


def test_one_process_under_accelerate_is_a_child_nothing_is_forwarded_to(fake):
    fake.add(30, "python", 1, cmdline="/v/bin/python /v/bin/accelerate launch --cpu t.py")
    fake.add(31, "python", 30, cmdline="/v/bin/python t.py")
    run = launchers.of(proctable.read_process(30, fake.path), fake.path)
    assert [p.pid for p in run.workers] == [31]
    how, why = run.plan(signal.SIGINT, 60)
    assert how == "workers" and "does not forward it" in why


@pytest.mark.parametrize("name,options,message", [
    ("torchrun", {"nproc_per_node": 2, "nprocs": 2}, "trainer_run_launcher_options.nprocs: torchrun has no such option"),
    ("torchrun", {"shutdown_timeout": 60}, "shutdown_timeout: 60 s is shorter than the stop's graceful wait cap"),
    ("torchrun", {"standalone": "yes"}, "trainer_run_launcher_options.standalone: true or false"),
    ("deepspeed", {"elastic_training": True}, "restarts workers up to 100 times"),
])
def test_bad_launcher_options_name_the_variable(name, options, message):
    with pytest.raises(launchers.LauncherError, match=message):
        launchers.named(name).render("python3", "t.py", [], options, 900)


def test_the_rendered_line_is_safe_for_a_graceful_stop():
    line = launchers.named("torchrun").render("/v/bin/python", "/opt/t.py", ["--lr", "1"],
                                              {"nproc_per_node": 2, "standalone": True}, 900)
    assert line == ["/v/bin/python", "-u", "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                    "--max-restarts", "0", "--shutdown-timeout", "900", "/opt/t.py", "--lr", "1"]
    old_torch = launchers.named("torchrun").render("p", "t.py", [], {}, 900, shutdown_flag=False)
    assert "--shutdown-timeout" not in old_torch
    assert launchers.named("torchrun").environment(900) == {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "900"}
    accelerate = launchers.named("accelerate").render("p", "t.py", [], {"num_processes": 2, "multi_gpu": True}, 900)
    assert accelerate == ["p", "-u", "-m", "accelerate.commands.launch", "--num_processes", "2", "--multi_gpu",
                          "--max_restarts", "0", "t.py"]


# a run's log as torch 2.13's torchrun writes it when a rank of its own is SIGKILLed (measured:
# elastic/multiprocessing/api.py logs the first failure at once, the summary only as the agent ends)
KILLED_RANK_LOG = [
    "2026-12-07 16:47:55 step 40 epoch 0 loss 2.3000 tok/s 1200.0 | data 1.00ms target 1.00ms",
    "E1207 16:47:57.957000 21720 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) "
    "local_rank: 0 (pid: 21725) of binary: /opt/venv/bin/python3",
]


def test_a_rank_its_agent_saw_killed_by_a_signal_is_named_and_only_for_that_agent():
    words = launchers.worker_signalled(KILLED_RANK_LOG, 21720)
    assert words == "its worker local_rank 0 (PID 21725) was killed by SIGKILL, as its agent PID 21720 logged"
    # another run's agent (a log appended across runs), and a rank that raised (a consequence: a peer's end)
    assert launchers.worker_signalled(KILLED_RANK_LOG, 999) is None
    raised = [KILLED_RANK_LOG[1].replace("exitcode: -9", "exitcode: 1")]
    assert launchers.worker_signalled(raised, 21720) is None
    assert launchers.worker_signalled([], 21720) is None
