"""plugin_utils/canary.py: the run a redeploy replaced against the run it started."""

import pytest

from ansible_collections.dflash.lifecycle.plugins.filter.throughput import FilterModule
from ansible_collections.dflash.lifecycle.plugins.plugin_utils import canary

FILTERS = FilterModule().filters()
BEFORE = {"tokens_per_s": 14200.0, "stages": {"target": {"avg_ms": 30.0}, "drafter": {"avg_ms": 40.0},
                                              "data": {"avg_ms": 1.0}, "optim": {"avg_ms": 2.0}}}


def after(figure, drafter=40.0, target=30.0):
    return {"tokens_per_s": figure, "stages": {"target": {"avg_ms": target}, "drafter": {"avg_ms": drafter},
                                               "data": {"avg_ms": 1.0}, "optim": {"avg_ms": 2.5}}}


def test_a_slower_run_is_a_regression_and_names_the_stage():
    verdict = FILTERS["throughput_canary"](BEFORE, after(12000.0, drafter=48.1), -5, "rollback")
    assert (verdict["change_pct"], verdict["verdict"], verdict["action"]) == (-15.5, "regression", "rollback")
    assert verdict["stages"][0] == {"stage": "drafter", "before_ms": 40.0, "after_ms": 48.1, "change_ms": 8.1}
    from ansible_collections.dflash.lifecycle.plugins.plugin_utils.canary import words
    assert words(verdict) == ("tok/s 14200.0 -> 12000.0 (-15.5%, threshold -5.0%): REGRESSION, rollback; "
                              "drafter +8.10 ms, optim +0.50 ms, data +0.00 ms")


@pytest.mark.parametrize("figure,policy,verdict,action", [
    (14100.0, "fail", "ok", None),          # -0.7%: inside the threshold
    (13000.0, "report", "regression", None),  # reported, nothing done
    (13000.0, "fail", "regression", "fail"),
    (15000.0, "rollback", "ok", None),
])
def test_policies(figure, policy, verdict, action):
    result = FILTERS["throughput_canary"](BEFORE, after(figure), -5, policy)
    assert (result["verdict"], result["action"]) == (verdict, action)


def test_a_missing_figure_is_unknown_never_a_failure():
    result = FILTERS["throughput_canary"]({"tokens_per_s": None, "stages": {}}, after(12000.0), -5, "fail")
    assert (result["verdict"], result["action"], result["why"]) == ("unknown", None, "the log of the old run had no progress line")
    assert FILTERS["throughput_canary"](None, None)["verdict"] == "unknown"
    with pytest.raises(Exception, match="policy must be one of"):
        FILTERS["throughput_canary"](BEFORE, after(1.0), -5, "panic")


def test_the_chart_is_a_sparkline_with_its_range():
    points = [[step, 100.0 + (step % 40)] for step in range(0, 2000, 10)]
    lines = FILTERS["throughput_chart"](points, 50)
    assert lines[0] == "tok/s, steps 0-1990 (200 progress lines)"
    assert len(lines[1]) == 50 and set(lines[1]) <= set("▁▂▃▄▅▆▇█")
    assert lines[2].startswith("min 100.0  median ") and lines[2].endswith("last 130.0")
    assert FILTERS["throughput_chart"]([]) == ["no progress line in the log yet"]


@pytest.mark.parametrize("count", [0, 1, 2, 14, 60, 600])
def test_one_column_per_progress_line_up_to_the_width_then_even_buckets(count):
    points = [[step * 10, 1000.0 + step % 7, 1000.0 + step * 2.5, "r1"] for step in range(count)]
    lines = FILTERS["throughput_chart"](points, 60)
    if count == 0:
        assert lines == ["no progress line in the log yet"]
        return
    if count == 1:
        assert lines == ["1 progress line so far: 1000.0 tok/s (step 0, release r1)"]
        return
    assert len(lines[1]) == min(count, 60) and set(lines[1]) <= set("▁▂▃▄▅▆▇█")
    seconds = int(round((count - 1) * 2.5))
    assert lines[0] == (f"tok/s, steps 0-{(count - 1) * 10} ({count} progress lines, over "
                        f"{seconds // 60}m{seconds % 60:02d}s)")
    assert lines[2].startswith(f"release r1: steps 0-{(count - 1) * 10}")


def test_a_log_that_spans_a_redeploy_marks_where_the_new_run_began():
    old = [[s, 5000.0, 100.0 + s, "3f2a9c0d", "run1"] for s in range(0, 10)]
    new = [[s, 4000.0, 200.0 + s, "0388a82f", "run2"] for s in range(5, 9)]
    lines = FILTERS["throughput_chart"](old + new, 60)
    assert lines[1] == "█" * 10 + "▁" * 4
    assert lines[2] == " " * 10 + "^  ^ a redeploy"
    assert lines[3] == "release 3f2a9c0d: steps 0-9, over 0m09s, median 5000.0 tok/s"
    assert lines[4] == "release 0388a82f: steps 5-8, over 0m03s, median 4000.0 tok/s"


def test_check_mode_gives_the_old_runs_figure_and_no_new_run():
    verdict = FILTERS["throughput_canary"](BEFORE, None, check_mode=True)
    assert verdict["after"] is None and verdict["action"] is None and verdict["check_mode"]
    words = canary.words(verdict)
    assert words == "tok/s 14200.0 now, of the running trainer; compared after a real launch"
    assert "new run" not in words


def test_a_redeploy_of_the_same_release_is_marked_too():
    points = [[s, 10.0, None, "r1", "a" if s < 3 else "b"] for s in range(6)]
    lines = FILTERS["throughput_chart"](points, 60)
    assert lines[2] == "   ^  ^ a redeploy" and lines[3].startswith("release r1: steps 0-2")
