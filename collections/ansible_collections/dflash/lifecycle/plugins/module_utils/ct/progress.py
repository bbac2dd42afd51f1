# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading a trainer's log: progress lines, throughput, tracebacks (Python 3.8 compatible).

A progress line holds a step number and a throughput figure. Trainers print the figure in
many ways; the patterns below are tried in order, the first that matches wins:

    step 812 loss 2.31 tok/s 14210.5      label first ("tok/s 14210.5", "tokens/s=14.2K")
    [step 812] ... | 17021.1 tok/s        figure first ("14.0K tok/s", "9800 tokens/s")

Label first is tried first: in "loss 2.31 tok/s 14210.5" the figure is the number after the
label, not the loss before it. K and M scale the figure by 1e3 and 1e6.

Per-stage telemetry (the trainer's ProfileStats, printed every --profile-interval steps) is
read from lines matching PROFILE_LINE_REGEX, each stage by PROFILE_STAGE_REGEX:

    [ProfileStats step 200] data avg 1.21ms max 3.40ms | drafter avg 40.10ms max 45.20ms

A window of a run is the median of its last N progress lines after its first W (warm-up),
and the median of each stage's average over the same span.
"""

from __future__ import annotations

import os
import re
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable

STEP_REGEX = r"\bstep[\s:=#]*(\d+)\b"
THROUGHPUT_PATTERNS = (
    r"\btok(?:en)?s?/s\s*[=:]?\s*(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>[KkMm](?![A-Za-z]))?",
    r"(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>[KkMm])?\s*tok(?:en)?s?/s\b",
)
PROFILE_LINE_REGEX = r"ProfileStats"
PROFILE_STAGE_REGEX = r"(?P<stage>[A-Za-z_][\w.-]*) avg (?P<avg>\d+(?:\.\d+)?)\s*ms max (?P<max>\d+(?:\.\d+)?)\s*ms"
TRACEBACK_HEAD = "Traceback (most recent call last):"
# the line that ends a traceback: the exception's (dotted) class name, then ": message" or nothing
# (not logging's "WARNING:name:message", which has no space after its colon)
EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(: |$)")
# the lines of a log a failure report quotes
TAIL_LINES = 20
# the line the launch writes at the head of each run's log: which release the run is
LAUNCH_LINE = re.compile(r"dflash-lifecycle: launch of release (?P<release>\S+) \(run (?P<run>\w+)\)")
# a progress line's time, when the trainer starts its lines with one (2026-11-30 10:00:01)
LINE_TIME = re.compile(r"^\[?(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)")
SCALE = {"k": 1e3, "m": 1e6}


def compile_patterns(patterns):
    """Compiled throughput patterns; each needs a group named value (unit is optional)."""
    compiled = []
    for index, pattern in enumerate(patterns):
        regex = re.compile(pattern)
        if "value" not in regex.groupindex:
            raise ValueError(f"throughput pattern {index} ({pattern!r}) has no group named value")
        compiled.append(regex)
    return compiled


def throughput(line, patterns=None):
    """The tokens per second a line reports, or None."""
    for regex in patterns or compile_patterns(THROUGHPUT_PATTERNS):
        match = regex.search(line)
        if match:
            value = float(match.group("value"))
            unit = match.groupdict().get("unit")
            return value * SCALE[unit.lower()] if unit else value
    return None


class LogReader:
    """Progress lines and per-stage telemetry of one log."""

    def __init__(self, step_regex=STEP_REGEX, patterns=THROUGHPUT_PATTERNS,
                 profile_line_regex=PROFILE_LINE_REGEX, profile_stage_regex=PROFILE_STAGE_REGEX):
        self.step = re.compile(step_regex)
        if not self.step.groups:
            raise ValueError(f"step regex {step_regex!r} must capture the step number in a group")
        self.patterns = compile_patterns(patterns)
        self.profile_line = re.compile(profile_line_regex)
        self.profile_stage = re.compile(profile_stage_regex)
        if not {"stage", "avg"} <= set(self.profile_stage.groupindex):
            raise ValueError(f"profile stage regex {profile_stage_regex!r} needs groups named stage and avg")

    def progress(self, line):
        """(step, tokens per second) of a progress line, or None for any other line."""
        step = self.step.search(line)
        figure = self.throughput(line) if step else None
        return None if figure is None else (int(step.group(1)), figure)

    def throughput(self, line):
        return throughput(line, self.patterns)

    def progress_lines(self, lines):
        """[(step, tok/s, line)] in log order."""
        found = []
        for line in lines:
            point = self.progress(line)
            if point is not None:
                found.append((point[0], point[1], line))
        return found

    def stages(self, line):
        """{stage: (avg ms, max ms or None)} of a ProfileStats line, or None for another line."""
        if not self.profile_line.search(line):
            return None
        found = {}
        for match in self.profile_stage.finditer(line):
            peak = match.groupdict().get("max")
            found[match.group("stage")] = (float(match.group("avg")), float(peak) if peak else None)
        return found or None

    def window(self, lines, count, warmup):
        """The run's throughput over its last `count` progress lines after the first `warmup`:
        median tok/s, the steps it spans, and each stage's median average and largest maximum
        from the ProfileStats lines in that span. tokens_per_s is None without such lines.
        Only the log's tail is parsed when it holds warmup + count progress lines: the window is
        then its last count (a 1 MiB log is ten thousand lines, read on a redeploy's way to its stop)."""
        start = self._window_start(lines, count, warmup)
        if start:
            lines, warmup = lines[start:], 0
        progress, profiles = [], []
        for line in lines:
            point = self.progress(line)
            if point is not None:
                progress.append(point)
                continue
            stages = self.stages(line)
            if stages:
                profiles.append((progress[-1][0] if progress else None, stages))
        usable = progress[warmup:][-count:] if count > 0 else []
        report = {"tokens_per_s": median([figure for _step, figure in usable]), "lines": len(usable),
                  "first_step": usable[0][0] if usable else None, "last_step": usable[-1][0] if usable else None,
                  "stages": {}}
        if usable:
            span = [stages for step, stages in profiles if step is not None and step >= usable[0][0]]
            for name in sorted({name for stages in span for name in stages}):
                averages = [stages[name][0] for stages in span if name in stages]
                peaks = [stages[name][1] for stages in span if name in stages and stages[name][1] is not None]
                report["stages"][name] = {"avg_ms": round(median(averages), 3),
                                          "max_ms": max(peaks) if peaks else None}
        return report

    def _window_start(self, lines, count, warmup):
        """The index of the first of the last count progress lines, when at least warmup + count
        are there (the warm-up then lies before the window); else 0, the whole log."""
        found = 0
        for index in range(len(lines) - 1, -1, -1) if count > 0 else ():
            if self.progress(lines[index]) is not None:
                found += 1
                if found == count:
                    start = index
                if found == count + warmup:
                    return start
        return 0


def launch_line(release, run_id, now=None):
    """The line the launch writes at the head of a run's log (LAUNCH_LINE reads it back)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    return f"{stamp} dflash-lifecycle: launch of release {release or 'unknown'} (run {run_id})\n"


def history(reader, lines):
    """[(step, tok/s, epoch seconds or None, release or None, run or None)] of a log's progress
    lines, each with the release and run identity of the launch line before it."""
    found, release, run = [], None, None
    for line in lines:
        launched = LAUNCH_LINE.search(line)
        if launched:
            release, run = launched.group("release"), launched.group("run")
            continue
        point = reader.progress(line)
        if point is None:
            continue
        stamp = LINE_TIME.search(line)
        when = None
        if stamp:
            try:
                when = time.mktime(time.strptime(stamp.group(1).replace("T", " "), "%Y-%m-%d %H:%M:%S"))
            except ValueError:
                when = None
        found.append((point[0], point[1], when, release, run))
    return found


def traceback_in(lines):
    """The first whole Python traceback among lines (from its head to the exception line), or
    None. A traceback still being written (no exception line yet) is not returned: the next
    read has it whole, and the exception is what names the failure. The ranks of a launcher write
    into one log at once: a second head before the first's exception line is part of the block,
    and another rank's line printed in between (not indented, not an exception line: "rank 3 of
    4 joined", the launcher's own log) is left out of it."""
    for index, line in enumerate(lines):
        if TRACEBACK_HEAD in line:
            block = [line]
            for follow in lines[index + 1:]:
                if not follow or follow.startswith((" ", "\t")) or TRACEBACK_HEAD in follow:
                    block.append(follow)
                elif EXCEPTION_LINE.match(follow):
                    block.append(follow)
                    return block
            return None
    return None


def median(values):
    ordered = sorted(values)
    if not ordered:
        return None
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def read_lines(path, offset=0, max_bytes=1 << 20):
    """The log's lines from offset on (at most its last max_bytes); [] when unreadable or when no
    log is known (path None)."""
    if not path:
        return []
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(offset, size - max_bytes))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return []
    return text.splitlines()


# a log last written this long before the trainer started is another run's (the launch writes its
# head line just before it starts the trainer)
OTHER_RUN_MARGIN_SECONDS = 2.0
# the tail of a log in which its progress lines are looked for (the stop counts its steps there too)
STEP_TAIL_BYTES = 65536


def _tail(path, size=STEP_TAIL_BYTES):
    """The file's last size bytes as text; None when it cannot be read or holds NUL bytes (a
    checkpoint or another binary file a trainer holds open, never a log)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.path.getsize(path) - size))
            raw = handle.read()
    except OSError:
        return None
    return None if b"\0" in raw else raw.decode("utf-8", "replace")


def logged_steps(path, step_regex):
    """The steps the log's last STEP_TAIL_BYTES name, in their order."""
    text = _tail(path) if path else None
    return [int(step) for step in re.findall(step_regex, text)] if text else []


def _mtime(path):
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def _candidates(processes, proc_root):
    """([{path, source}] the regular files the run's processes hold open for writing, newest
    written first; the why of the fds that could not be read)."""
    found, unreadable, main = {}, [], processes[0]
    for proc in processes:
        files, error = proctable.written_files(proc.pid, proc_root)
        if files is None:
            unreadable.append(f"PID {proc.pid}'s fds cannot be read ({error})")
            continue
        for fd, path in files:
            if proc is main and fd in (1, 2):
                source = "stdout" if fd == 1 else "stderr"
            else:
                source = f"held open by PID {proc.pid}"
            found.setdefault(path, source)
    ordered = sorted(found.items(), key=lambda item: -_mtime(item[0]))
    return [{"path": path, "source": source} for path, source in ordered], unreadable


def running_log(main, configured, proc_root="/proc", step_regex=STEP_REGEX, table=None):
    """The log the running trainer (a proctable.Process) writes its progress to: of the regular
    files a process of its run holds open for writing (stdout, stderr, a logging FileHandler's,
    tee's), newest written first, the first whose tail has a step (step_regex). log_file
    (configured) is one of them when they hold it; when none has a step, it is taken only when
    written since the trainer started (a log last written before belongs to another run, and is
    never read as this one's). Returns {path (None when no log of this run is known), source
    ("stdout", "stderr", "held open by PID N", "configured"), configured, why, looked_at: the
    files looked at, newest first}."""
    if table is None:
        table = proctable.snapshot(proc_root)
    candidates, unreadable = _candidates(proctable.run_processes(main, table, proc_root), proc_root)
    found = {"path": None, "source": None, "configured": configured, "why": None, "looked_at": candidates}
    for candidate in candidates:
        if logged_steps(candidate["path"], step_regex):
            found.update(path=candidate["path"], source=candidate["source"])
            return found
    if candidates:
        reasons = ["no step in " + ", ".join(f"{c['path']} ({c['source']})" for c in candidates)]
    else:
        streams = ", ".join(f"its {name} is {proctable.read_fd(main.pid, fd, proc_root)[0] or 'not readable'}"
                            for fd, name in ((1, "stdout"), (2, "stderr")))
        reasons = [f"PID {main.pid} holds no regular file open for writing ({streams})"]
    why = "; ".join(reasons + unreadable)
    if not configured or any(c["path"] == configured for c in candidates):
        found["why"] = why + ("" if configured else ", and no log_file is set")
        return found
    try:
        written = os.stat(configured).st_mtime
    except OSError as err:
        found["why"] = f"{why}; {configured}: {err.strerror}"
        return found
    started = proctable.start_wall_time(main, proc_root)
    if not unreadable and written < started - OTHER_RUN_MARGIN_SECONDS:
        found["why"] = (f"{why}; {configured} was last written before the trainer started "
                        "(another run's log: not read)")
        return found
    found.update(path=configured, source="configured", why=why)
    return found


def written_logs(log):
    """The files a running_log result says the run writes: the log read first (when one was), then
    the others it looked at, newest written first, each once."""
    paths = [log["path"]] + [candidate["path"] for candidate in log["looked_at"]]
    return list(dict.fromkeys(path for path in paths if path))


def log_words(log):
    """How a report names the log it read, when that is not simply log_file; '' otherwise."""
    if not log or (log["path"] is not None and log["path"] == log["configured"] and log["source"] != "configured"):
        return ""
    if log["path"] is None:
        # files written, none with a step: the why names them; nothing written: no log at all
        return log["why"] if log.get("looked_at") else f"no log of this run: {log['why']}"
    if log["source"] == "configured":
        return f"read log_file {log['path']} ({log['why']})"
    return f"read {log['path']} ({log['source']})" + (f", not log_file {log['configured']}" if log["configured"] else "")
