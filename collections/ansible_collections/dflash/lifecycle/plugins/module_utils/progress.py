# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading a trainer's log: progress lines, throughput, tracebacks (Python 3.8 compatible).

A progress line holds a step number and a throughput figure. Trainers print the figure in
many ways; the patterns below are tried in order, the first that matches wins:

    step 812 loss 2.31 tok/s 14210.5      label first ("tok/s 14210.5", "tokens/s=14.2K")
    [step 812] ... | 17021.1 tok/s        figure first ("14.0K tok/s", "9800 tokens/s")

Label first is tried first: in "loss 2.31 tok/s 14210.5" the figure is the number after the
label, not the loss before it. K and M scale the figure by 1e3 and 1e6.
"""

from __future__ import annotations

import re

STEP_REGEX = r"\bstep[\s:=#]*(\d+)\b"
THROUGHPUT_PATTERNS = (
    r"\btok(?:en)?s?/s\s*[=:]?\s*(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>[KkMm](?![A-Za-z]))?",
    r"(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>[KkMm])?\s*tok(?:en)?s?/s\b",
)
TRACEBACK_HEAD = "Traceback (most recent call last):"
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
    """Progress lines of one log, from a byte offset on."""

    def __init__(self, step_regex=STEP_REGEX, patterns=THROUGHPUT_PATTERNS):
        self.step = re.compile(step_regex)
        if not self.step.groups:
            raise ValueError(f"step regex {step_regex!r} must capture the step number in a group")
        self.patterns = compile_patterns(patterns)

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


def traceback_in(lines):
    """The first Python traceback among lines (from its head to the exception line), or None."""
    for index, line in enumerate(lines):
        if TRACEBACK_HEAD in line:
            block = [line]
            for follow in lines[index + 1:]:
                block.append(follow)
                if follow and not follow.startswith((" ", "\t")):
                    break
            return block
    return None


def median(values):
    ordered = sorted(values)
    if not ordered:
        return None
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def read_lines(path, offset=0, max_bytes=1 << 20):
    """The log's lines from offset on (at most its last max_bytes); [] when unreadable."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(offset, size - max_bytes))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return []
    return text.splitlines()
