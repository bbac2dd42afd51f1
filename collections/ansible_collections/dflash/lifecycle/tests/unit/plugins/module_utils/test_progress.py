"""module_utils/ct/progress.py on realistic log lines."""

import os

import pytest

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import progress


@pytest.mark.parametrize("line,figure", [
    ("2026-11-30 10:00:01 step 812 epoch 0 loss 2.3100 tok/s 14210.5 | data 1.2ms", 14210.5),
    ("[step 812] loss=2.31 | 17021.1 tok/s", 17021.1),
    ("step: 812, throughput 14.0K tok/s", 14000.0),
    ("step=812 tokens/s=14.2K lr=6e-4", 14200.0),
    ("it 812 | 9800 tokens/s", 9800.0),
    ("step 9 tok/s: 1.5M", 1.5e6),
    ("step 9 loss 2.31 tok/s 1234", 1234.0),
])
def test_throughput_formats(line, figure):
    assert progress.throughput(line) == pytest.approx(figure)


@pytest.mark.parametrize("line", [
    "step 812 loss 2.31",                                    # no figure
    "    f\"tok/s {window_tokens / max(elapsed, 1e-9):.1f} | {stages}\")",  # a traceback's source line
    "DFlash trainer pid=41 reports tok/s once running",      # a banner
    "    log(f\"step {state['step']} epoch {state['epoch']} tok/s 0\")",
])
def test_lines_that_are_not_progress(line):
    assert progress.LogReader().progress(line) is None


def test_progress_lines_and_median():
    reader = progress.LogReader()
    lines = ["banner", "step 50 loss 3 tok/s 100.0", "step 100 loss 2 | 140.0 tok/s", "noise"]
    assert [(s, f) for s, f, _line in reader.progress_lines(lines)] == [(50, 100.0), (100, 140.0)]
    assert progress.median([3, 1, 2]) == 2 and progress.median([1, 2, 3, 4]) == 2.5
    assert progress.median([]) is None


def test_a_step_regex_needs_a_group_and_a_pattern_needs_value():
    with pytest.raises(ValueError):
        progress.LogReader(step_regex="tok/s")
    with pytest.raises(ValueError):
        progress.LogReader(patterns=[r"tok/s (\d+)"])


def test_traceback_is_found_with_its_exception_line():
    lines = ["step 1 tok/s 3", "Traceback (most recent call last):", '  File "t.py", line 3, in <module>',
             "    log(f\"tok/s {x / 0}\")", "ZeroDivisionError: division by zero", "after"]
    assert progress.traceback_in(lines) == lines[1:5]
    assert progress.traceback_in(lines[:1]) is None
    assert progress.traceback_in(lines[:4]) is None  # still being written: no exception line yet


def test_two_ranks_writing_their_tracebacks_at_once_give_one_block_with_the_exception():
    """Two ranks of a torchrun run print into one log together (as seen in a gang's CT)."""
    lines = ["rank 2 of 4 pid=249 joined", "Traceback (most recent call last):", "Traceback (most recent call last):",
             '  File "t.py", line 479, in train', '    raise RuntimeError("fails on node rank 1")',
             "RuntimeError: fails on node rank 1", '  File "t.py", line 479, in train']
    assert progress.traceback_in(lines) == lines[1:6]


def test_another_ranks_line_inside_a_traceback_does_not_end_it():
    """A rank still printing its start-up line while another prints its traceback (a gang's CT
    under load): the block ends at the exception, without the foreign lines."""
    lines = ["Traceback (most recent call last):", '  File "t.py", line 479, in train',
             "rank 3 of 4 pid=250 joined", "W1203 16:58:01.123000 77 torch/distributed/elastic/api.py:702] Sending",
             "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 250 closing signal SIGTERM",
             '    raise RuntimeError("fails on node rank 1")', "RuntimeError: fails on node rank 1"]
    assert progress.traceback_in(lines) == [lines[0], lines[1], lines[5], lines[6]]
    assert progress.traceback_in(lines[:5]) is None
    chained = ["Traceback (most recent call last):", '  File "t.py", line 3, in f', "KeyError: 'x'", "",
               "During handling of the above exception, another exception occurred:"]
    assert progress.traceback_in(chained) == chained[:3]
    assert progress.traceback_in(["Traceback (most recent call last):", '  File "t.py"', "KeyboardInterrupt"])[-1] \
        == "KeyboardInterrupt"


def test_profile_stats_and_the_window_after_the_warm_up():
    reader = progress.LogReader()
    lines = ["step 5 loss 3 tok/s 50.0", "[ProfileStats step 5] data avg 9.00ms max 9.50ms | drafter avg 50.00ms max 60.00ms",
             "step 10 loss 2 tok/s 100.0", "[ProfileStats step 10] data avg 1.00ms max 1.50ms | drafter avg 40.00ms max 41.00ms",
             "step 15 loss 2 | 120.0 tok/s", "[ProfileStats step 15] data avg 3.00ms max 7.00ms | drafter avg 42.00ms max 44.00ms",
             "noise"]
    assert reader.stages(lines[1]) == {"data": (9.0, 9.5), "drafter": (50.0, 60.0)}
    assert reader.stages(lines[0]) is None
    window = reader.window(lines, count=5, warmup=1)
    assert (window["tokens_per_s"], window["lines"], window["first_step"], window["last_step"]) == (110.0, 2, 10, 15)
    assert window["stages"] == {"data": {"avg_ms": 2.0, "max_ms": 7.0}, "drafter": {"avg_ms": 41.0, "max_ms": 44.0}}
    assert reader.window(lines[:1], count=5, warmup=1) == {"tokens_per_s": None, "lines": 0, "first_step": None,
                                                           "last_step": None, "stages": {}}


def test_the_window_of_a_long_log_is_read_from_its_tail_alone(monkeypatch):
    """A trainer that logs every 10 steps, with ProfileStats lines and other lines in between:
    the window read from the tail is the one the whole log gives, lines' spans and stages alike."""
    reader = progress.LogReader()
    lines = []
    for step in range(10, 3010, 10):
        lines += [f"step {step} loss 2.1 tok/s {1000 + step % 70}.0",
                  f"[ProfileStats step {step}] data avg {step % 7}.00ms max 9.00ms | drafter avg 40.00ms max {step % 50}.00ms",
                  "saving nothing yet", ""]
    whole = progress.LogReader()
    whole._window_start = lambda _lines, _count, _warmup: 0  # every line parsed, as before
    expected = whole.window(lines, count=5, warmup=1)
    assert (expected["lines"], expected["first_step"], expected["last_step"]) == (5, 2960, 3000)
    calls = []
    counted = progress.LogReader.progress

    def counting(self, line):
        calls.append(line)
        return counted(self, line)

    monkeypatch.setattr(progress.LogReader, "progress", counting)
    assert reader.window(lines, count=5, warmup=1) == expected
    assert len(calls) < 60  # the tail (6 progress lines back), then the window: not 1200 lines
    # fewer lines than warm-up + window: the whole log, the warm-up left out, as before
    assert reader.window(lines[:16], count=5, warmup=1)["first_step"] == 20
    assert reader.window(lines, count=0, warmup=1)["lines"] == 0


def test_a_stage_regex_needs_stage_and_avg():
    with pytest.raises(ValueError):
        progress.LogReader(profile_stage_regex=r"(\w+) (\d+)ms")


def test_the_history_carries_each_lines_time_and_the_launch_it_belongs_to(tmp_path):
    from ansible_collections.dflash.lifecycle.plugins.module_utils import trainer_state
    log = tmp_path / "train.log"
    (tmp_path / "train.log.1").write_text(
        progress.launch_line("3f2a9c0d", "aaa111", now=1000)
        + "2026-11-30 10:00:01 step 100 loss 2.0 tok/s 5000.0\n")
    log.write_text(progress.launch_line("0388a82f", "bbb222", now=2000)
                   + "2026-11-30 10:05:01 step 100 loss 2.0 tok/s 4000.0\nstep 150 tok/s 4100\n")
    report = trainer_state.throughput(str(log), progress.STEP_REGEX, progress.THROUGHPUT_PATTERNS, 5, history=10)
    assert [(p[0], p[1], p[3], p[4]) for p in report["history"]] == [
        (100, 5000.0, "3f2a9c0d", "aaa111"), (100, 4000.0, "0388a82f", "bbb222"), (150, 4100.0, "0388a82f", "bbb222")]
    assert report["history"][1][2] - report["history"][0][2] == 300 and report["history"][2][2] is None
    assert report["lines"] == 2  # the figures of now are this run's own


def test_the_log_read_is_the_one_the_running_trainer_writes(fake, tmp_path):
    """A trainer started by hand as `nohup bash run.sh > /root/train.log`: its stdout names the
    file it writes, whatever log_file says; a pipe or a terminal leaves log_file, taken only when
    written since the trainer started (an older run's log is never read as this one's); a
    /proc/PID/fd that cannot be read leaves log_file, and says so."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable
    own, configured = tmp_path / "train.log", tmp_path / "configured.log"
    own.write_text("step 10 tok/s 5.0\n")
    configured.write_text("step 900 tok/s 1.0\n")
    base = fake.add(40, "python3", 1, start=1000)  # started at btime + 10 s
    fake.hold(40, 1, own)
    fake.hold(40, 2, own)
    trainer = proctable.read_process(40, fake.path)
    log = progress.running_log(trainer, str(configured), fake.path)
    assert (log["path"], log["source"]) == (str(own), "stdout")
    assert progress.log_words(log) == f"read {own} (stdout), not log_file {configured}"

    os.unlink(base / "fd" / "1")
    os.unlink(base / "fd" / "2")
    os.symlink("pipe:[4711]", base / "fd" / "1")
    os.symlink("/dev/pts/0", base / "fd" / "2")
    log = progress.running_log(trainer, str(configured), fake.path)
    assert (log["path"], log["source"]) == (str(configured), "configured")  # written after the start
    assert "its stdout is pipe:[4711], its stderr is /dev/pts/0" in progress.log_words(log)
    os.utime(configured, (1700000000, 1700000000))  # last written before the trainer started
    log = progress.running_log(trainer, str(configured), fake.path)
    assert log["path"] is None and progress.log_words(log).startswith("no log of this run: PID 40 holds no")
    assert "another run's log: not read" in log["why"]

    fake.remove(40)
    fake.add(40, "python3", 1, start=1000)
    os.rmdir(tmp_path / "proc" / "40" / "fd")  # its fds cannot be read
    log = progress.running_log(proctable.read_process(40, fake.path), str(configured), fake.path)
    assert log["path"] == str(configured) and "PID 40's fds cannot be read" in log["why"]
    own_log = dict(log, path=str(own), source="stdout", configured=str(own))
    assert progress.log_words(own_log) == ""  # the trainer writes log_file itself: nothing to say


def test_the_log_is_the_file_the_progress_goes_to_of_every_file_the_run_holds_open(fake, tmp_path):
    """A trainer whose logging FileHandler writes its progress to log_file while its stdout, a file
    of its own, has none (HF Trainer's and Lightning's loggers, a FileHandler): the log is the file
    held open for writing whose tail has a step, newest written first. A read-only file, a
    checkpoint being written (binary) and a newer file without a step are not it; a worker's file
    is, named by its PID; with no step anywhere, the files looked at are named."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable
    out, log_file, config = tmp_path / "trainer.out", tmp_path / "train.log", tmp_path / "config.json"
    shard, events = tmp_path / "model.safetensors", tmp_path / "events.csv"
    out.write_text("DFlash trainer pid=40\n")
    log_file.write_text("2026-12-04 10:00:00 step 812 epoch 0 loss 2.31 tok/s 14210.5\n")
    config.write_text("step 5 tok/s 1.0\n")
    os.utime(log_file, (1700000100, 1700000100))
    fake.add(40, "python3", 1, start=1000)
    fake.add(41, "python3", 40, start=1100)  # a worker
    fake.hold(40, 1, out)
    fake.hold(40, 2, out)
    fake.hold(40, 4, config, flags=0o100000)  # O_RDONLY: read, not written
    fake.hold(40, 7, log_file)
    trainer = proctable.read_process(40, fake.path)
    log = progress.running_log(trainer, str(log_file), fake.path)
    assert (log["path"], log["source"]) == (str(log_file), "held open by PID 40"), log
    assert [c["path"] for c in log["looked_at"]] == [str(out), str(log_file)]  # out is the newer
    assert progress.log_words(log) == ""  # log_file itself
    assert progress.log_words(progress.running_log(trainer, "/elsewhere.log", fake.path)) == (
        f"read {log_file} (held open by PID 40), not log_file /elsewhere.log")

    shard.write_bytes(b"\x08\x00\x00\x00step 9 \x00")  # a save under way: newest, binary
    fake.hold(40, 9, shard, flags=0o100002)  # O_RDWR
    assert progress.running_log(trainer, str(log_file), fake.path)["path"] == str(log_file)

    os.unlink(tmp_path / "proc" / "40" / "fd" / "7")
    fake.hold(41, 3, log_file)  # the worker writes it, as a launcher's rank does
    log = progress.running_log(trainer, None, fake.path)
    assert (log["path"], log["source"]) == (str(log_file), "held open by PID 41")
    assert progress.log_words(log) == f"read {log_file} (held open by PID 41)"

    log_file.write_text("no progress yet\n")
    events.write_text("loss,lr\n2.3,1e-4\n")
    fake.hold(41, 4, events)
    log = progress.running_log(trainer, str(log_file), fake.path)
    assert log["path"] is None and log["source"] is None
    assert log["why"].startswith("no step in ") and f"{log_file} (held open by PID 41)" in log["why"] \
        and f"{out} (stdout)" in log["why"] and f"{events} (held open by PID 41)" in log["why"], log["why"]
    assert progress.log_words(log) == log["why"]  # the files it looked at, each with why
