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


def compare(before, after, threshold=-5.0, policy="report", top=3, check_mode=False):
    """The canary's verdict (module docstring): before and after figures, the change in per
    cent, the stages whose average changed most, the verdict (ok, regression, unknown) and
    what the policy does about it (action: null unless a regression meets fail or rollback).
    In check mode nothing was launched: only the old run's figure, never a new one."""
    if policy not in POLICIES:
        raise ValueError(f"the canary policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    old, new = _figure(before), None if check_mode else _figure(after)
    result = {"before": old, "after": new, "change_pct": None, "threshold_pct": float(threshold),
              "policy": policy, "verdict": "unknown", "action": None, "stages": [], "why": None,
              "check_mode": bool(check_mode)}
    if check_mode:
        result["why"] = "compared after a real launch"
        return result
    # which log the old run's figure came from, when it is not simply log_file
    result["before_log"] = (before or {}).get("log_words") or None
    if old is None:
        result["why"] = "the log of the old run had no progress line" + (
            f" ({result['before_log']})" if result["before_log"] else "")
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
    if canary.get("check_mode"):
        now = "unknown" if canary["before"] is None else f"{canary['before']:.1f}"
        return f"tok/s {now} now, of the running trainer; {canary['why']}"
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
    if canary.get("before_log"):
        text += f"; before: {canary['before_log']}"
    return text


def chart(points, width=60):
    """A sparkline of tok/s over a run's progress lines, readable in a terminal and in AWX
    output. points are [step, tok/s] or [step, tok/s, time, release, run], oldest first: one
    column per point up to width, evenly merged buckets beyond; the time the lines span; and,
    where a redeploy falls inside them (a new launch), a mark under the first column of each run
    and each run's release and stretch."""
    points = [list(p) + [None] * (5 - len(p)) for p in points or []]
    if not points:
        return ["no progress line in the log yet"]
    if len(points) == 1:
        step, figure, _when, release, _run = points[0]
        return [f"1 progress line so far: {figure:.1f} tok/s (step {step}"
                + (f", release {release}" if release else "") + ")"]
    columns = min(width, len(points))
    buckets = [points[i * len(points) // columns:(i + 1) * len(points) // columns] for i in range(columns)]
    means = [sum(p[1] for p in bucket) / len(bucket) for bucket in buckets]
    low, high = min(means), max(means)
    span = (high - low) or 1.0
    line = "".join(SPARK[min(len(SPARK) - 1, int((m - low) / span * len(SPARK)))] for m in means)
    figures = sorted(p[1] for p in points)
    lines = [f"tok/s, steps {points[0][0]}-{points[-1][0]} ({len(points)} progress lines"
             + _over(points[0][2], points[-1][2]) + ")", line]
    stretches = _stretches(points)
    if len(stretches) > 1:
        marks = [" "] * columns
        for first, _last in stretches[1:]:
            column = next(i for i, bucket in enumerate(buckets) if any(p is points[first] for p in bucket))
            marks[column] = "^"
        lines.append("".join(marks).rstrip() + "  ^ a redeploy")
    for first, last in stretches if any(p[3] for p in points) else ():
        lines.append(f"release {points[first][3] or 'unknown (not launched by this project)'}: steps {points[first][0]}-{points[last][0]}"
                     + _over(points[first][2], points[last][2]) + ", median "
                     + f"{sorted(p[1] for p in points[first:last + 1])[(last - first) // 2]:.1f} tok/s")
    lines.append(f"min {figures[0]:.1f}  median {figures[len(figures) // 2]:.1f}  max {figures[-1]:.1f}  "
                 f"last {points[-1][1]:.1f}")
    return lines


def _stretches(points):
    """[(first index, last index)] of the runs of points of one launch (release and run)."""
    found, start = [], 0
    for index in range(1, len(points) + 1):
        if index == len(points) or points[index][3:5] != points[start][3:5]:
            found.append((start, index - 1))
            start = index
    return found


def _over(first, last):
    if first is None or last is None:
        return ""
    seconds = int(round(last - first))
    return f", over {seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else \
        f", over {seconds // 60}m{seconds % 60:02d}s"
