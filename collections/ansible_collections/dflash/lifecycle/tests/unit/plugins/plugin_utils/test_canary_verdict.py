"""plugin_utils/canary.py: the run a redeploy replaced against the run it started."""

import pytest

from ansible_collections.dflash.lifecycle.plugins.filter.throughput import FilterModule

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
    assert FILTERS["throughput_chart"]([]) == ["no progress line in the log"]
