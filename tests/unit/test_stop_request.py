"""The stop request (docs/stop.md, "The stop request"): the staged stop's stage 0 against the example
trainer, a real process on the host that takes requests through the one-file helper
(tests/testbed/example_trainer/dflash_stop_request.py), logs every 10 steps to a log of its own,
and whose main thread may sit in a long C call; and the helper's own rules, the ranks'
agreement over a real gloo process group included."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

import uncooperative
from testlib import TESTS
from uncooperative import Trainer, framework_finds, stop

sys.path.insert(0, os.path.join(TESTS, "testbed", "example_trainer"))
import dflash_stop_request  # noqa: E402


@pytest.fixture
def trainers(tmp_path):
    started = []

    def start(layout="step_dirs", request=True, held_log=False, **env):
        tmp = str(tmp_path / f"run{len(started)}")
        os.makedirs(tmp)
        if request:
            env.setdefault("DFLASH_TEST_STOP_REQUEST", "take")
            env["DFLASH_STOP_REQUEST"] = os.path.join(tmp, "stop-request")
        trainer = Trainer(tmp, layout, save_every=1000, log_every=10, env=env, held_log=held_log)
        trainer.request = os.path.join(tmp, "stop-request")
        started.append(trainer)
        wait_for(trainer, "step 20 ")
        return trainer

    yield start
    for trainer in started:
        trainer.end()


def wait_for(trainer, text, timeout=60):
    deadline = time.monotonic() + timeout
    while text not in trainer.text():
        assert trainer.proc.poll() is None and time.monotonic() < deadline, trainer.text()[-2000:]
        time.sleep(0.05)


def signals(result):
    return [e for e in result["timeline"] if e["event"] == "signal"]


def test_a_trainer_in_a_long_c_call_stops_at_its_next_step_on_the_request_with_no_signal(trainers):
    """The field's case: the main thread sits in a C call (a SIGINT would wait for it to return);
    the request is taken at the next step boundary, saved, and the trainer exits 0."""
    trainer = trainers(DFLASH_TEST_BLOCK_IN_C_SECONDS="0.3", DFLASH_TEST_SAVES_ON="SIGINT")
    result, began = stop(trainer)
    assert trainer.proc.returncode == 0, trainer.text()[-2000:]
    assert signals(result) == [], result["timeline"]
    assert result["stopped_by"] == {"stage": -1, "signal": None, "scope": "request"}
    request = result["request"]
    assert request["taken"] and request["announced"] and request["path_from"].endswith("DFLASH_STOP_REQUEST")
    step = request["acknowledged"]["step"]
    assert request["acknowledged"]["id"] == request["body"]["id"]
    assert request["saved"] == {"id": request["body"]["id"], "step": step,
                                "checkpoint": os.path.join(trainer.out, f"step_{step}")}
    ckpt = result["checkpoint"]
    assert ckpt["written"] and ckpt["new"] == request["saved"]["checkpoint"] and ckpt["new_step"] == step
    assert ckpt["new_by"] == "completed after the stop request"
    assert result["loss"]["steps_lost"] == 0
    msg = result["msg"]
    assert "by the stop request in " in msg and "no signal sent" in msg and f"acknowledged at step {step}" in msg, msg
    assert "0 steps lost (the trainer saved on the stop request and exited)" in msg, msg
    assert framework_finds(trainer, [ckpt["new"]])["loads"][ckpt["new"]] == step


def test_an_hf_trainer_takes_the_request_through_its_callback(trainers):
    """HF's Trainer saves on no signal (saves_on=auto would wait for its next periodic save): the
    request's callback sets should_save and should_training_stop, and the save is HF's
    checkpoint-N/ that its own resume loads."""
    trainer = trainers("hf_trainer")
    result, _ = stop(trainer)
    assert trainer.proc.returncode == 0 and signals(result) == [], result["msg"]
    ckpt = result["checkpoint"]
    assert ckpt["written"] and os.path.basename(ckpt["new"]) == f"checkpoint-{result['request']['acknowledged']['step']}"
    found = framework_finds(trainer, [ckpt["new"]])
    assert found["pick_loads"] == ckpt["new_step"], found
    assert "0 steps lost (the trainer saved on the stop request and exited)" in result["msg"], result["msg"]


def test_a_stop_the_request_ended_warns_of_no_signal_and_finds_its_lines_beside_the_log(trainers):
    """saves_on=auto on an HF Trainer with no checkpoint yet (what it does on a signal is not
    known): the request ends it, no signal is sent, so no note warns of signals; their facts stay
    in the result as the fallback's. Its progress goes to a log file its FileHandler holds open,
    while the helper prints the request's lines to stdout: both are read."""
    trainer = trainers("hf_trainer", held_log=True)
    result, _ = stop(trainer)
    assert trainer.proc.returncode == 0 and signals(result) == [], result["msg"]
    assert result["request"]["taken"] and trainer.stdout in result["request"]["words"], result["request"]
    assert result["notes"] == [], result["notes"]
    assert "not known" in result["graceful_reason"] and result["signal_dispositions"]["SIGINT"] == "caught"
    assert result["log"]["path"] == trainer.log and result["log"]["source"] == f"held open by PID {trainer.proc.pid}"
    assert result["loss"]["steps_lost"] == 0 and result["loss"]["last_logged_step"] is not None, result["loss"]
    assert "0 steps lost (the trainer saved on the stop request and exited)" in result["msg"], result["msg"]


def test_a_request_not_taken_is_withdrawn_and_the_signal_ladder_follows_saying_so(trainers):
    trainer = trainers(DFLASH_TEST_STOP_REQUEST="ignore", DFLASH_TEST_SAVES_ON="SIGINT")
    result, _ = stop(trainer, request_ack_timeout=1, checkpoint_format="step_dirs")  # it saves on SIGINT
    assert result["request"]["taken"] is False and result["request"]["announced"]
    assert [e["event"] for e in result["timeline"]][:2] == ["request", "request_not_taken"], result["timeline"]
    assert [e["signal"] for e in signals(result)] == ["SIGINT"], (result["timeline"], result["msg"])
    assert not os.path.exists(trainer.request)  # withdrawn: no later run takes it
    assert result["checkpoint"]["written"], result["msg"]
    assert "the stop request was not taken: no acknowledgement in" in result["msg"], result["msg"]
    assert "within 1s (request_ack_timeout), and the signal ladder followed" in result["msg"], result["msg"]


def test_saves_on_auto_makes_no_request_to_a_trainer_that_never_announced_it(trainers):
    trainer = trainers(request=False, DFLASH_TEST_SAVES_ON="SIGINT")
    result, _ = stop(trainer, request_path=trainer.request, checkpoint_format="step_dirs")
    assert "request" not in result and not os.path.exists(trainer.request)
    assert [e["signal"] for e in signals(result)] == ["SIGINT"] and result["checkpoint"]["written"]


def test_saves_on_request_to_a_trainer_that_never_announced_it_says_so_and_falls_back(trainers):
    trainer = trainers(request=False, DFLASH_TEST_SAVES_ON="SIGINT")
    result, _ = stop(trainer, saves_on="request", request_path=trainer.request, request_ack_timeout=1,
                     checkpoint_format="step_dirs")
    assert result["request"]["announced"] is False and result["request"]["taken"] is False
    assert any("saves_on=request, but no process of this run announced" in n for n in result["notes"]), result["notes"]
    assert [e["signal"] for e in signals(result)] == ["SIGINT"] and result["checkpoint"]["written"]
    assert "the stop request was not taken" in result["msg"], result["msg"]


def test_check_mode_says_the_request_comes_first(trainers):
    trainer = trainers()
    result = uncooperative.staged_stop.run({"pid": trainer.proc.pid, "pattern": "x", "log_file": "/nonexistent.log"},
                                           check_mode=True)
    assert result["msg"].startswith(f"would stop PID {trainer.proc.pid} and 0 more with the stop request at "
                                    f"{trainer.request}"), result["msg"]
    assert not os.path.exists(trainer.request) and trainer.proc.poll() is None


# -- the helper ---------------------------------------------------------------------------------

def test_the_helper_ignores_a_request_older_than_the_process_and_looks_at_most_every_k_steps(tmp_path):
    path = str(tmp_path / "req")
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"id": "old", "requested_at": time.time() - 60}, handle)
    lines = []
    helper = dflash_stop_request.StopRequest(path, every_steps=5, every_seconds=3600, log=lines.append)
    assert lines == [f"dflash-stop-request: honoured path={path} pid={os.getpid()}"]
    assert not helper.should_stop(0)  # stale: another run's
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"id": "new", "requested_at": time.time()}, handle)
    assert [helper.should_stop(step) for step in range(1, 6)] == [False] * 4 + [True]
    assert lines[-1] == "dflash-stop-request: acknowledged id=new step=5"
    helper.saved("/c/step_5", 5)
    assert lines[-1] == "dflash-stop-request: saved id=new step=5 checkpoint=/c/step_5"
    assert dflash_stop_request.StopRequest(None, log=lines.append).should_stop(10) is False


AGREEMENT = textwrap.dedent("""
    import os, sys, time
    import torch.distributed as dist
    import torch.multiprocessing as mp
    sys.path.insert(0, sys.argv[1])
    from dflash_stop_request import StopRequest

    def rank(index, tmp):
        os.environ.update(RANK=str(index), LOCAL_RANK="0")  # one rank per CT, each logs
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=index, world_size=2)
        lines = []
        helper = StopRequest(os.path.join(tmp, f"request{index}"), every_steps=10, log=lines.append)
        for step in range(1, 10000):
            if index == 1 and step == 23:  # only the second CT's stop has written its request yet
                open(os.path.join(tmp, "request1"), "w").write('{"id": "r1", "requested_at": %f}' % time.time())
            if helper.should_stop(step):
                break
        with open(os.path.join(tmp, f"rank{index}.out"), "w") as out:  # one file each: no interleaving
            out.write(f"{step} {lines[-1]}")
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(rank, args=(sys.argv[2],), nprocs=2)
""")


def two_ranks(tmp_path, script_text):
    """Run script_text's two gloo ranks (the helper beside them); what each wrote to rankN.out."""
    torch_python = os.environ.get("DFLASH_TORCH_PYTHON")
    if not torch_python:
        pytest.skip("DFLASH_TORCH_PYTHON (make test sets it) names the venv with torch")
    script = tmp_path / "ranks.py"
    script.write_text(script_text)
    out = subprocess.run([torch_python, str(script), os.path.join(TESTS, "testbed", "example_trainer"), str(tmp_path)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return [(tmp_path / f"rank{index}.out").read_text() for index in (0, 1)]


SLOW_STEPS = textwrap.dedent("""
    import os, sys, time
    import torch.distributed as dist
    import torch.multiprocessing as mp
    sys.path.insert(0, sys.argv[1])
    from dflash_stop_request import StopRequest

    def rank(index, tmp):
        os.environ.update(RANK=str(index), LOCAL_RANK="0")
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=index, world_size=2)
        helper = StopRequest(os.path.join(tmp, f"request{index}"), every_steps=10, every_seconds=0.25,
                             log=lambda line: None)
        looks = []
        for step in range(1, 60):
            time.sleep(0.1 if index == 0 else 0.01)  # rank 0's steps are long: everyone waits for it
            before = helper._next_check
            helper.should_stop(step)
            if helper._next_check != before:
                looks.append(step)
        with open(os.path.join(tmp, f"rank{index}.out"), "w") as out:
            out.write(" ".join(map(str, looks)))
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(rank, args=(sys.argv[2],), nprocs=2)
""")


def test_the_ranks_look_together_every_step_once_the_slowest_rank_steps_slower_than_every_seconds(tmp_path):
    """every_seconds 0.25 s and a rank whose steps take 0.1 s: after the first quick looks every
    rank looks every step or two, not every 10, at the same steps on every rank (the interval is
    agreed through the all-reduce)."""
    looks = [said.split() for said in two_ranks(tmp_path, SLOW_STEPS)]
    assert looks[0] == looks[1], looks
    steps = [int(s) for s in looks[0]]
    assert steps[:2] == [1, 11] and all(1 <= b - a <= 2 for a, b in zip(steps[1:], steps[2:])), steps


def test_the_ranks_agree_on_one_step_although_one_ct_saw_the_request(tmp_path):
    said = two_ranks(tmp_path, AGREEMENT)
    # looks at steps 1, 11, 21, 31 (every 10: the steps are quick); rank 1's request came at step 23
    assert said == ["31 dflash-stop-request: acknowledged id=peer step=31",
                    "31 dflash-stop-request: acknowledged id=r1 step=31"], said
