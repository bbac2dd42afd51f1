# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a checkpoint directory holds (Python 3.8 compatible).

The preflight (is there one to resume from?), the staged stop, the launch (what will the
resume load? free space) and the status read it alike. What a checkpoint is comes from its
layout (module_utils/checkpoint/checkpoint_formats.py): the entries it claims, their steps, whether each
is complete, and which one the trainer's own resume picks. ``auto`` recognises the layout from
what the directory holds, and says which one it chose. What a stop wrote and lost is judged
in module_utils/checkpoint/checkpoint_verdict.py.
"""

from __future__ import annotations

import fnmatch
import os
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoint_files, checkpoint_verdict
from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoint_formats as formats

# names of a checkpoint still being written: the trainer's own temporary names (.tmp-step_N,
# .latest.tmp-PID), torch.save's and common tools'
DEFAULT_TEMP_PATTERNS = (".tmp*", "*.tmp", "*.tmp-*", "*.partial", "*.incomplete")
# results of the file checks, by (path, size, mtime, inode): a checkpoint's files do not change
# once written, and the stop reads the directory twice a second
_CHECKED = {}
_CHECKED_MAX = 8192


def is_temp(name, temp_patterns):
    return name != formats.MOVED_ASIDE and any(fnmatch.fnmatch(name, pat) for pat in temp_patterns)


def _checked_problem(path, st):
    key = (path, st.st_size, st.st_mtime_ns, st.st_ino)
    if key not in _CHECKED:
        if len(_CHECKED) >= _CHECKED_MAX:
            _CHECKED.clear()
        try:
            _CHECKED[key] = checkpoint_files.file_problem(path, st.st_size)
        except OSError as err:
            _CHECKED[key] = f"unreadable ({err.strerror})"
    return _CHECKED[key]


def _tree(path, temp_patterns):
    """(files relative to path with their stat, temporary names inside) of a directory tree."""
    files, temps = {}, []
    for root, dirs, names in os.walk(path):
        for item in dirs + names:
            if is_temp(item, temp_patterns):
                temps.append(os.path.relpath(os.path.join(root, item), path))
        for item in names:
            full = os.path.join(root, item)
            try:
                files[os.path.relpath(full, path)] = os.stat(full)
            except OSError:
                continue
    return files, temps


def free_bytes(path):
    """Free space where path is (or would be created), and the existing path measured."""
    probe = path
    while not os.path.exists(probe):
        probe = os.path.dirname(probe) or "/"
    st = os.statvfs(probe)
    return st.f_bavail * st.f_frsize, probe


class Directory(checkpoint_verdict.StopVerdict):
    """A checkpoint directory read by its layout: ``checkpoint_format`` (a layout's name,
    ``custom`` with ``checkpoint_custom``, or ``auto``)."""

    def __init__(self, path, checkpoint_format="auto", custom=None, temp_patterns=DEFAULT_TEMP_PATTERNS,
                 stable_window=0.5, activity_window=5.0, log_file=None, step_regex=r"\bstep (\d+)\b"):
        self.path = path
        self.setting = checkpoint_format
        self.layout = formats.layout(checkpoint_format, custom)  # InvalidLayout names the setting
        self.layout_reason = "checkpoint_format=" + checkpoint_format if self.layout else None
        self.temp_patterns = tuple(temp_patterns)
        self.stable_window = float(stable_window)
        self.activity_window = float(activity_window)
        self.log_file = log_file
        self.step_regex = step_regex
        self.since = None  # the running trainer's start (epoch seconds): its own saves' interval
        self.pointed_at_start = None  # what the layout's pointer named at the stop's snapshot
        self.pointer_at_start = None  # and the pointer file's stamp then

    @classmethod
    def of(cls, options):
        """The directory of a stop's options (module_utils/stop/stop_options.py)."""
        return cls(options.checkpoint_dir, options.checkpoint_format, options.checkpoint_custom,
                   options.checkpoint_temp_patterns, options.checkpoint_stable_window,
                   options.checkpoint_activity_window, options.log_file, options.step_regex)

    # -- the layout ------------------------------------------------------------------------------

    def resolve(self, held=None):
        """The layout: the one set, or (auto) the one the directory shows once it shows one."""
        if self.layout is None and self.path:
            chosen, reason = formats.recognise(self.path, held)
            if chosen is not None:
                self.layout, self.layout_reason = chosen, reason
            return chosen, reason
        return self.layout, self.layout_reason

    def check(self):
        """Raise InvalidLayout when the layout set claims nothing in a directory that holds
        checkpoints of another layout (or, for custom, anything at all): the message names what
        the directory holds and the layout that would match it."""
        if not self.path or self.setting == "auto":
            return
        held = formats.listing(self.path)
        mine = [n for n, d in held.items() if self.layout.claims(n, os.path.join(self.path, n), d)
                and not is_temp(n, self.temp_patterns)]
        if mine or not held:
            return
        other, reason = formats.recognise(self.path, held)
        if other is None and self.setting != "custom":
            return
        shown = ", ".join(sorted(held)[:8]) + (" ..." if len(held) > 8 else "")
        hint = (f"; checkpoint_format={other.name} matches it ({reason[len('auto: '):]})" if other
                else "; no known layout matches it either: fix checkpoint_custom.pattern")
        raise formats.InvalidLayout(
            f"checkpoint_format={self.setting}"
            + (f" (pattern {self.layout.pattern})" if self.setting == "custom" else "")
            + f" matches nothing in {self.path}, which holds {shown}{hint}. Nothing was signalled.")

    def saving(self, saves_on_setting):
        """(signals the trainer saves on, signals a save survives, words); None, None when unknown."""
        chosen, _reason = self.resolve()
        return formats.saves_on(saves_on_setting, chosen)

    # -- what the directory holds ----------------------------------------------------------------

    def entries(self):
        """{name: info} of the checkpoints the layout claims: step, mtime (the newest change
        inside), size, complete and the problems that make it incomplete."""
        if not self.path:
            return {}
        held = formats.listing(self.path)
        chosen, _reason = self.resolve(held)
        if chosen is None:
            return {}
        found = {}
        for name, is_dir in held.items():
            path = os.path.join(self.path, name)
            if is_temp(name, self.temp_patterns) or not chosen.claims(name, path, is_dir):
                continue
            try:
                info = self._inspect(chosen, name, path, is_dir)
            except OSError:
                continue  # removed while read (a rotation)
            found[name] = info
        return found

    def _inspect(self, chosen, name, path, is_dir):
        if is_dir:
            files, temps = _tree(path, self.temp_patterns)
            mtime = max([os.stat(path).st_mtime] + [st.st_mtime for st in files.values()])
            size = sum(st.st_size for st in files.values())
        else:
            st = os.stat(path)
            files, temps, mtime, size = {"": st}, [], st.st_mtime, st.st_size
        problems = [] if files else ["holds no file"]
        problems += [f"a temporary file {t} inside" for t in sorted(temps)]
        for rel, st in sorted(files.items()):
            problem = _checked_problem(os.path.join(path, rel) if rel else path, st)
            if problem:
                problems.append(f"{rel or name}: {problem}")
        if is_dir:
            problems += chosen.marker_problems(self.path, name, path, set(files))
        return {"step": chosen.step(name, path), "mtime": mtime, "size": size,
                "complete": not problems, "problems": problems}

    def ordered(self, infos):
        """Names oldest to newest: by step, or by mtime where a step is unknown."""
        if self.layout is None:
            return []
        return sorted(infos, key=lambda n: self.layout.sort_key(n, infos[n]))

    def complete(self, infos=None):
        """Complete entries, oldest first."""
        infos = self.entries() if infos is None else infos
        return [(n, infos[n]) for n in self.ordered(infos) if infos[n]["complete"]]

    def temp_entries(self):
        """Temporary entries left in the directory, with their size and mtime: reported, never
        deleted."""
        left = []
        for name in sorted(formats.listing(self.path)) if self.path else []:
            if not is_temp(name, self.temp_patterns):
                continue
            path = os.path.join(self.path, name)
            try:
                if os.path.isdir(path):
                    files, _temps = _tree(path, ())
                    size = sum(st.st_size for st in files.values())
                    mtime = max([os.stat(path).st_mtime] + [st.st_mtime for st in files.values()])
                else:
                    st = os.stat(path)
                    size, mtime = st.st_size, st.st_mtime
            except OSError:
                continue
            left.append({"name": name, "bytes": size, "mtime": mtime})
        return left

    def fresh(self, before, infos=None):
        """Names new or changed since the before snapshot, oldest first."""
        infos = self.entries() if infos is None else infos
        return [n for n in self.ordered(infos)
                if n not in before or (before[n]["mtime"], before[n]["size"]) != (infos[n]["mtime"], infos[n]["size"])]

    def fingerprint(self):
        """Changes whenever a checkpoint, a temporary entry or a pointer of the layout is
        written, created or renamed (the whole directory while the layout is not known yet:
        the first checkpoint may be appearing)."""
        total, newest, count = 0, 0, 0
        if not self.path:
            return (0, 0, 0)
        held = formats.listing(self.path)
        chosen, _reason = self.resolve(held)
        for name, is_dir in held.items():
            path = os.path.join(self.path, name)
            if chosen is not None and not (is_temp(name, self.temp_patterns) or chosen.is_alias(name)
                                           or chosen.claims(name, path, is_dir)):
                continue
            for item in [path] + ([os.path.join(r, f) for r, ds, fs in os.walk(path) for f in ds + fs]
                                  if is_dir else []):
                try:
                    st = os.lstat(item)
                except OSError:
                    continue
                count += 1
                total += st.st_size
                newest = max(newest, st.st_mtime_ns)
        return (count, total, newest)

    def save_in_progress(self, now=None):
        """What shows a save being written right now: the temporary entries and incomplete
        checkpoints changed within the activity window, sorted (empty when none)."""
        now = time.time() if now is None else now
        recent = [t["name"] for t in self.temp_entries() if now - t["mtime"] < self.activity_window]
        infos = self.entries()
        recent += [n for n in self.ordered(infos)
                   if not infos[n]["complete"] and now - infos[n]["mtime"] < self.activity_window]
        if self.layout is None and self.path:
            for name in formats.listing(self.path):
                try:
                    if now - os.stat(os.path.join(self.path, name)).st_mtime < self.activity_window:
                        recent.append(name)
                except OSError:
                    continue
        return sorted(set(recent))

    # -- judgements ------------------------------------------------------------------------------

    def describe(self, name, info):
        return {"name": name, "path": os.path.join(self.path, name), "step": info["step"],
                "complete": info["complete"], "problems": info["problems"]}

    def resume(self, infos=None):
        """What the trainer's own resume rule loads: {name, path, step, complete, problems,
        rule}, name None when it loads nothing."""
        infos = self.entries() if infos is None else infos
        if self.layout is None:
            return {"name": None, "path": None, "step": None, "complete": None, "problems": [],
                    "rule": "the layout is not known yet"}
        name, rule = self.layout.resume_pick(self.path, infos)
        if name is None:
            return {"name": None, "path": None, "step": None, "complete": None, "problems": [], "rule": rule}
        info = infos.get(name)
        if info is None:  # an alias (Lightning's last.ckpt copy) or a dangling pointer
            path = os.path.join(self.path, name)
            if os.path.isfile(path):
                st = os.stat(path)
                problem = _checked_problem(path, st)
                info = {"step": self.layout.step(name, path), "complete": not problem,
                        "problems": [problem] if problem else []}
            else:
                info = {"step": None, "complete": False, "problems": [f"{name} does not exist"]}
        return dict(self.describe(name, info), rule=rule)

    def periodic_interval(self):
        """Seconds between the trainer's periodic checkpoints: those the running trainer wrote,
        counted from its start (since), else the directory's history; None without either."""
        times = sorted(info["mtime"] for _n, info in self.complete())
        if self.since is not None and any(t >= self.since for t in times):
            times = [self.since] + [t for t in times if t >= self.since]
        last = times[-3:]
        gaps = [b - a for a, b in zip(last, last[1:])]
        return round(max(gaps), 3) if gaps else None

    def free_space(self):
        return free_bytes(self.path)[0]

    # -- the launch --------------------------------------------------------------------------

    def move_aside(self, name, now=None):
        """Move checkpoint name to <dir>/.incomplete/<name>-<time> (never deleted). Returns the
        new path, or None when it is gone already: another CT sharing the directory (a gang's)
        moved it first."""
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now))
        aside = os.path.join(self.path, formats.MOVED_ASIDE)
        os.makedirs(aside, mode=0o755, exist_ok=True)
        target = os.path.join(aside, f"{name}-{stamp}")
        suffix = 1
        while os.path.lexists(target):
            suffix += 1
            target = os.path.join(aside, f"{name}-{stamp}.{suffix}")
        try:
            os.rename(os.path.join(self.path, name), target)
        except FileNotFoundError:
            return None
        return target

    def prepare_resume(self, policy="move_aside", check_mode=False):
        """Make sure the resume loads a complete checkpoint: an incomplete one its rule picks is
        moved aside (policy move_aside; the rule then picks the next) or refused (fail, or a
        pick named by a pointer: moving it would leave the pointer dangling). Returns
        {resume, moved}; ResumeRefused when it cannot."""
        moved, skipped = [], set()
        while True:
            infos = {n: i for n, i in self.entries().items() if n not in skipped}
            pick = self.resume(infos)
            if pick["name"] is None or pick["complete"]:
                return {"resume": pick, "moved": moved}
            named = pick["name"] not in infos or self.layout.pointer_names(
                self.path, pick["name"], infos[pick["name"]])
            if policy == "fail" or named:
                raise ResumeRefused(
                    f"the trainer's resume ({pick['rule']}) would load {pick['path']}, which is "
                    f"incomplete: {'; '.join(pick['problems'])}; "
                    + ("a pointer names it, so moving it aside would not help: " if named
                       else "incomplete_checkpoint=fail: ")
                    + "nothing was started", resume=pick, moved=moved)
            if check_mode:
                moved.append({"name": pick["name"], "to": None, "problems": pick["problems"]})
                skipped.add(pick["name"])
                continue
            to = self.move_aside(pick["name"])
            if to is not None:
                moved.append({"name": pick["name"], "to": to, "problems": pick["problems"]})


class ResumeRefused(Exception):
    def __init__(self, msg, **details):
        super().__init__(msg)
        self.details = details


def move_words(moved):
    return "; ".join(f"moved the incomplete {m['name']} aside to {m['to'] or '.incomplete/ (check mode)'} "
                     f"({'; '.join(m['problems'])})" for m in moved)


def newest_complete_entry(params):
    """(path, step) of the newest complete checkpoint of a run's launch options (checkpoint_dir,
    checkpoint_format, checkpoint_custom), as this CT sees it now, or None."""
    done = Directory(params["checkpoint_dir"], params["checkpoint_format"], params.get("checkpoint_custom")).complete()
    return (os.path.join(params["checkpoint_dir"], done[-1][0]), done[-1][1]["step"]) if done else None


def newest_complete(params):
    """The path of the newest complete checkpoint of a run's launch options, or None."""
    entry = newest_complete_entry(params)
    return entry[0] if entry else None
