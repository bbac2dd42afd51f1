"""module_utils/progress.py on realistic log lines."""

import pytest

from ansible_collections.dflash.lifecycle.plugins.module_utils import progress


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
