# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The throughput canary: the run a redeploy replaced against the run it started (controller
side; the throughput_canary and throughput_chart filters).

The people who run a redeploy changed the trainer to make it faster. Its preflight reads the old
run's recent throughput (the median of its last progress lines, after its warm-up, and its
per-stage timings), its launch waits until the new run has logged as many and reads the same;
this compares them. A figure that is missing (no progress line in the old run's log, the new
run too slow to log enough in time) is unknown, never a failure. Below the threshold (a change
in per cent, -5 by default) is a regression; the policy says what follows: report it, fail the
CT (the new run stays), or roll back to the release that ran before.
"""

from __future__ import annotations

POLICIES = ("report", "fail", "rollback")
SPARK = "▁▂▃▄▅▆▇█"


def _figure(window):
    return (window or {}).get("tokens_per_s")


def compare(before, after, threshold=-5.0, policy="report", top=3):
    """The canary's verdict (module docstring): before and after figures, the change in per
    cent, the stages whose average changed most, the verdict (ok, regression, unknown) and
    what the policy does about it (action: null unless a regression meets fail or rollback)."""
    if policy not in POLICIES:
        raise ValueError(f"the canary policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    old, new = _figure(before), _figure(after)
    result = {"before": old, "after": new, "change_pct": None, "threshold_pct": float(threshold),
              "policy": policy, "verdict": "unknown", "action": None, "stages": [], "why": None}
    if old is None:
        result["why"] = "the log of the old run had no progress line"
    elif new is None:
        result["why"] = "the new run logged no progress line in time"
    elif old <= 0:
        result["why"] = "the old run's figure was 0"
    else:
        result["change_pct"] = round(100.0 * (new - old) / old, 1)
        result["verdict"] = "regression" if result["change_pct"] < float(threshold) else "ok"
    old_stages, new_stages = (before or {}).get("stages") or {}, (after or {}).get("stages") or {}
    changed = [{"stage": name, "before_ms": old_stages[name]["avg_ms"], "after_ms": new_stages[name]["avg_ms"],
                "change_ms": round(new_stages[name]["avg_ms"] - old_stages[name]["avg_ms"], 3)}
               for name in sorted(set(old_stages) & set(new_stages))]
    result["stages"] = sorted(changed, key=lambda s: -abs(s["change_ms"]))[:top]
    if result["verdict"] == "regression" and policy != "report":
        result["action"] = policy
    return result


def words(canary):
    """One line: the figures, the change against the threshold, the stages that moved."""
    if not canary:
        return "throughput not compared"
    before = "unknown" if canary["before"] is None else f"{canary['before']:.1f}"
    after = "unknown" if canary["after"] is None else f"{canary['after']:.1f}"
    text = f"tok/s {before} -> {after}"
    if canary["verdict"] == "unknown":
        return f"{text} (not compared: {canary['why']})"
    text += f" ({canary['change_pct']:+.1f}%, threshold {canary['threshold_pct']:+.1f}%)"
    if canary["verdict"] == "regression":
        text += ": REGRESSION" + (f", {canary['action']}" if canary["action"] else ", reported")
    if canary["stages"]:
        text += "; " + ", ".join(f"{s['stage']} {s['change_ms']:+.2f} ms" for s in canary["stages"])
    return text


def chart(points, width=60):
    """A sparkline of tok/s over the steps of a log, with its range, readable in a terminal and
    in AWX output: points are (step, tok/s), oldest first."""
    if not points:
        return ["no progress line in the log"]
    buckets = [points[i * len(points) // width:(i + 1) * len(points) // width] for i in range(min(width, len(points)))]
    means = [sum(p[1] for p in bucket) / len(bucket) for bucket in buckets if bucket]
    low, high = min(means), max(means)
    span = (high - low) or 1.0
    line = "".join(SPARK[min(len(SPARK) - 1, int((m - low) / span * len(SPARK)))] for m in means)
    figures = sorted(p[1] for p in points)
    return [f"tok/s, steps {points[0][0]}-{points[-1][0]} ({len(points)} progress lines)",
            line,
            f"min {figures[0]:.1f}  median {figures[len(figures) // 2]:.1f}  max {figures[-1]:.1f}  "
            f"last {points[-1][1]:.1f}"]
