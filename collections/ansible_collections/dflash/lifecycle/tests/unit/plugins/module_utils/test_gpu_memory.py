"""The launch's wait for free GPUs: nvidia-smi's answers parsed, the wait's bound and words."""

import subprocess

import pytest

from ansible_collections.dflash.lifecycle.plugins.module_utils.launch import gpu_memory

GPUS_CSV = ("0, GPU-aaaa, 3, 81559\n"
            "5, GPU-ffff, 30000, 81559\n"
            "6, GPU-gggg, [N/A], 81559\n")
APPS_CSV = "GPU-ffff, 4242, 29500\nGPU-zzzz, 1, 5\n"


def fake_run(answers):
    calls = []

    def run(argv, **kwargs):
        calls.append(argv)
        code, out = answers[argv[1].split("=")[0]]
        return subprocess.CompletedProcess(argv, code, out, "driver not loaded" if code else "")
    run.calls = calls
    return run


def test_read_gpus_joins_the_apps_to_their_gpu_by_uuid():
    run = fake_run({"--query-gpu": (0, GPUS_CSV), "--query-compute-apps": (0, APPS_CSV)})
    gpus = gpu_memory.read_gpus("/usr/bin/nvidia-smi", run=run)
    assert gpus[0] == {"index": 0, "uuid": "GPU-aaaa", "used_mib": 3, "total_mib": 81559, "apps": []}
    assert gpus[5]["apps"] == [{"pid": 4242, "used_mib": 29500}]
    assert gpus[6]["used_mib"] is None  # [N/A]: unknown, never taken for free
    assert run.calls[0] == ["/usr/bin/nvidia-smi", "--query-gpu=index,uuid,memory.used,memory.total",
                            "--format=csv,noheader,nounits"]


def test_no_running_processes_is_no_app():
    run = fake_run({"--query-gpu": (0, GPUS_CSV), "--query-compute-apps": (0, "No running processes found\n")})
    assert all(not gpu["apps"] for gpu in gpu_memory.read_gpus("nvidia-smi", run=run).values())


@pytest.mark.parametrize("answers, words", [
    ({"--query-gpu": (9, ""), "--query-compute-apps": (0, "")}, "exited with status 9: driver not loaded"),
    ({"--query-gpu": (0, "0, GPU-a\n"), "--query-compute-apps": (0, "")}, "unexpected nvidia-smi line"),
])
def test_an_unreadable_answer_is_an_error(answers, words):
    with pytest.raises(gpu_memory.GpuQueryError, match=words):
        gpu_memory.read_gpus("nvidia-smi", run=fake_run(answers))


def test_a_missing_nvidia_smi_is_an_error():
    with pytest.raises(gpu_memory.GpuQueryError, match="No such file"):
        gpu_memory.read_gpus("/nonexistent/nvidia-smi")


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def gpu(index, used, apps=()):
    return {"index": index, "uuid": f"GPU-{index}", "used_mib": used, "total_mib": 81559, "apps": list(apps)}


def test_waits_until_the_memory_is_freed_then_goes_on():
    clock = Clock()
    reports = []

    def read():  # the driver frees GPU 5 two seconds in
        return {5: gpu(5, 30000 if clock.now < 102 else 3), 6: gpu(6, 3)}
    done = gpu_memory.wait_free([5, 6], 1024, 60, read=read, report=lambda **f: reports.append(f),
                                clock=clock, sleep=clock.sleep)
    assert done["waited_s"] == 2.0
    assert done["gpus"] == {5: 3, 6: 3}
    assert done["held_at_start"].startswith("GPU 5: 30000 of 81559 MiB used (threshold 1024 MiB), "
                                            "no process listed by nvidia-smi")
    assert reports[0]["phase"] == "gpus" and "GPU 5" in reports[0]["held"]


def test_free_gpus_do_not_wait():
    clock = Clock()
    done = gpu_memory.wait_free([0], 1024, 60, read=lambda: {0: gpu(0, 3)}, clock=clock, sleep=clock.sleep)
    assert done == {"waited_s": 0.0, "held_at_start": None, "gpus": {0: 3}, "uuids": {0: "GPU-0"}}


def test_memory_never_freed_fails_at_the_bound_naming_gpu_memory_and_holders():
    clock = Clock()
    with pytest.raises(gpu_memory.GpusBusy) as err:
        gpu_memory.wait_free([5], 1024, 60, read=lambda: {5: gpu(5, 30000, [{"pid": 4242, "used_mib": 29500}])},
                             clock=clock, sleep=clock.sleep)
    assert str(err.value) == ("GPUs not free after 60.0s (bound 60s), nothing was started: GPU 5: 30000 of "
                              "81559 MiB used (threshold 1024 MiB), nvidia-smi lists PID 4242 (29500 MiB)")
    assert err.value.details["waited_s"] == 60.0


def test_a_live_device_file_holder_is_refused_at_once_whatever_its_memory():
    clock = Clock()
    holders = {"/dev/nvidia6": [{"pid": 77, "cmdline": "sleep 600"}]}
    with pytest.raises(gpu_memory.GpusBusy) as err:
        gpu_memory.wait_free([6], 1024, 60, read=lambda: {6: gpu(6, 3)}, holders=lambda: holders,
                             clock=clock, sleep=clock.sleep)
    assert str(err.value) == ("GPUs in use by other processes, nothing was started: "
                              "/dev/nvidia6 held by PID 77 (sleep 600)")
    assert clock.now == 100.0  # no wait: a live process does not free its memory by being waited for


def test_unknown_memory_is_not_free():
    clock = Clock()
    with pytest.raises(gpu_memory.GpusBusy, match="GPU 6: unknown of 81559 MiB"):
        gpu_memory.wait_free([6], 1024, 0, read=lambda: {6: gpu(6, None)}, clock=clock, sleep=clock.sleep)


def test_a_gpu_nvidia_smi_does_not_list_fails_at_once():
    clock = Clock()
    with pytest.raises(gpu_memory.GpusBusy, match="nvidia-smi does not list GPU 7 .it lists 0, 5."):
        gpu_memory.wait_free([5, 7], 1024, 60, read=lambda: {0: gpu(0, 3), 5: gpu(5, 3)},
                             clock=clock, sleep=clock.sleep)
    assert clock.now == 100.0
