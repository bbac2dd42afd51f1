# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a stop wrote and lost, judged on a checkpoint directory (Python 3.8 compatible).

``StopVerdict`` is part of ``checkpoints.Directory``: it asks the directory's reading
(entries, layout, temporary names) and answers one verdict.

* A checkpoint is the stop's (``new``) when it became complete during the stop, by its
  layout's rule and its files, whether its directory or files existed before or not: a save
  under way when the stop began counts once it completes, and so does an in-place save of a
  step saved before.
* It is ``written`` unless its layout's pointer names another entry: the trainer's resume
  would not load it. A checkpoint complete by its layout's rule is never doubted as "still
  being written", whatever the trainer was doing when it was ended: completeness is the
  layout's mark and every file whole (a layout that marks nothing, such as a ``custom``
  pattern without a marker, is complete by its files alone).
* A later save left unfinished does not make it less written: it is listed apart
  (``unfinished``), since the resume of a layout that picks the highest entry would load it
  (the launch moves such an entry aside).
"""

from __future__ import annotations

import collections
import os
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import progress


def log_every(steps):
    """How many steps apart the log's progress lines are: the commonest gap between its last
    distinct steps, the larger on a tie (a trainer that logs every 10 steps: 10, whatever
    checkpoint or interrupt lines come between); None until one gap has shown twice."""
    distinct = sorted(set(steps[-12:]))
    gaps = collections.Counter(b - a for a, b in zip(distinct, distinct[1:]))
    gap, seen = max(gaps.items(), key=lambda item: (item[1], item[0])) if gaps else (None, 0)
    return gap if seen >= 2 else None


def lost_words(loss):
    """The steps lost in words: "7", or "7 to 16" where the log shows only every 10th step (the
    trainer may have made up to 9 more steps after its last line, lost with the rest)."""
    low, high = loss["steps_lost"], loss.get("steps_lost_up_to")
    return f"{low}" if high in (None, low) else f"{low} to {high}"


class StopVerdict:
    """The stop's judgements of a checkpoints.Directory."""

    def snapshot(self):
        """The entries when the stop begins (the before of completed), and which one the layout's
        pointer names then and the pointer file itself: a save whose last write is the pointer
        completes when it is written."""
        infos = self.entries()
        self.pointed_at_start = self.layout.pointed(self.path) if self.layout is not None else None
        self.pointer_at_start = self._pointer_stamp()
        return infos

    def _pointer_stamp(self):
        """The pointer file's inode, change time and size (lstat: a link is the pointer), or None:
        it differs once the trainer has written the pointer again, even with the same name."""
        if self.layout is None or not self.layout.pointer:
            return None
        try:
            st = os.lstat(os.path.join(self.path, self.layout.pointer))
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def completed(self, before, infos):
        """Names complete now that were not complete and unchanged in before, oldest first; and
        one the pointer was written to name since the snapshot: renamed into place before the
        stop began, its pointer moved during it, or written again naming the same entry (an
        interrupt at the step a periodic save had just written: the trainer's handler found that
        step saved and only wrote its pointer, its answer to the stop)."""
        found = [n for n in self.fresh(before, infos) if infos[n]["complete"]]
        start = self.pointed_at_start
        if start is not None and self.layout is not None and self.layout.pointer:
            named = self.layout.pointed(self.path)
            rewritten = named != start or self._pointer_stamp() != self.pointer_at_start
            if named is not None and rewritten and named not in found and infos.get(named, {}).get("complete"):
                found = [n for n in self.ordered(infos) if n in found or n == named]
        return found

    def landed(self, before):
        """The newest checkpoint completed since before once its save is over (the layout's
        mark, Layout.save_over; where it marks none, a later save begun or nothing written for
        the stable window), else None."""
        infos = self.entries()
        done = self.completed(before, infos)
        if not done:
            return None
        name = done[-1]
        over = self.layout.save_over(self.path, name, infos[name])
        if over is None:
            appeared = self.fresh(before, infos)
            over = (appeared[-1] != name
                    or time.time() - infos[name]["mtime"] >= self.stable_window)
        return name if over else None

    def saves_under_way(self, before):
        """Saves under way: checkpoints that appeared or changed since before and are not complete
        yet, however quiet (a save may gather its shards for minutes before it writes them), and
        what save_in_progress sees (written within the activity window)."""
        infos = self.entries()
        found = [n for n in self.fresh(before, infos) if not infos[n]["complete"]]
        return found + [n for n in self.save_in_progress() if n not in found]

    def doubts(self, name, info):
        """Why the complete checkpoint name is not what the resume loads; empty when it is."""
        if self.layout.save_over(self.path, name, info) is False:
            return [f"the trainer's resume would not load it: {self.layout.pointer or 'its pointer'} names "
                    f"{self.layout.pointed(self.path) or 'no checkpoint'} (the save did not finish)"]
        return []

    def report(self, before):
        """The layout, the newest complete checkpoint and its age, what appeared or changed since
        before (each judged), the newest one completed since (new: its step and when it
        completed) and whether it is sound (written), later saves left unfinished, what the
        resume will load, and the temporary files left."""
        infos = self.entries()
        done = self.complete(infos)
        appeared = self.fresh(before, infos)
        temps = self.temp_entries()
        chosen, reason = self.resolve()
        report = {"dir": self.path, "format": chosen.name if chosen else None, "format_reason": reason,
                  "newest": None, "newest_step": None, "newest_age_s": None, "new": None, "new_step": None,
                  "new_completed_at": None, "written": False, "doubts": [], "unfinished": [],
                  "appeared": [self.describe(n, infos[n]) for n in appeared],
                  "resume": self.resume(infos),
                  "temp_files_left": [{"name": t["name"], "bytes": t["bytes"]} for t in temps]}
        if done:
            name, info = done[-1]
            report.update(newest=os.path.join(self.path, name), newest_step=info["step"],
                          newest_age_s=round(time.time() - info["mtime"], 3))
        completed = self.completed(before, infos)
        if completed:
            name = completed[-1]
            key = self.layout.sort_key(name, infos[name])
            later = [n for n in appeared if n != name and self.layout.sort_key(n, infos[n]) > key]
            later += [t["name"] for t in temps if t["mtime"] > infos[name]["mtime"]]
            report.update(new=os.path.join(self.path, name), new_step=infos[name]["step"],
                          new_completed_at=self.completed_at(name, infos[name]), unfinished=later,
                          doubts=self.doubts(name, infos[name]))
            report["written"] = not report["doubts"]
        return report

    def completed_at(self, name, info):
        """When the save of name was over: its last write, or its pointer's when that names it."""
        pointer = os.path.join(self.path, self.layout.pointer) if self.layout.pointer else None
        if pointer and self.layout.pointed(self.path) == name:
            try:
                return max(info["mtime"], os.lstat(pointer).st_mtime)
            except OSError:
                pass
        return info["mtime"]

    def loss(self, answered_at=None):
        """What a stop now loses: the newest complete checkpoint against the last step the
        trainer logged (a checkpoint ahead of the log is said to be, not counted as 0).
        answered_at: when the stop's first signal went, given once the trainer has exited after
        it. A checkpoint completed since then is the trainer's answer and holds every step it
        made: 0 lost, however old the log's last progress line (a trainer that logs every 10
        steps stops between two of them)."""
        steps = progress.logged_steps(self.log_file, self.step_regex)
        report = {"checkpoint": None, "checkpoint_step": None, "checkpoint_age_s": None,
                  "last_logged_step": steps[-1] if steps else None, "log_every": log_every(steps),
                  "steps_lost": None, "steps_lost_up_to": None, "ahead_of_log": None, "saved_on_stop": False,
                  "checkpoint_interval_s": None, "free_bytes": None}
        if not self.path:
            return report
        done = self.complete()
        report["checkpoint_interval_s"] = self.periodic_interval()
        report["free_bytes"] = self.free_space()
        logged = report["last_logged_step"]
        if done:
            name, info = done[-1]
            report.update(checkpoint=os.path.join(self.path, name), checkpoint_step=info["step"],
                          checkpoint_age_s=round(time.time() - info["mtime"], 1))
            # the file system's clock is coarse (a few ms behind time.time()); completed_at is the
            # pointer's write where that names it (a step saved before, its pointer written on the signal)
            answered = answered_at is not None and self.completed_at(name, info) >= answered_at - 0.01
            if answered and (info["step"] is None or logged is None or info["step"] >= logged):
                report.update(steps_lost=0, saved_on_stop=True)
            elif info["step"] is not None and logged is not None:
                if info["step"] > logged:
                    report["ahead_of_log"] = info["step"] - logged
                else:
                    report["steps_lost"] = logged - info["step"]
        elif logged is not None:
            report["steps_lost"] = logged  # no checkpoint at all: every step
        if report["steps_lost"] is not None:
            # counted from the log's last line, the steps made after it are lost too (none where
            # the trainer saved on the stop)
            unlogged = 0 if report["saved_on_stop"] else (report["log_every"] or 1) - 1
            report["steps_lost_up_to"] = report["steps_lost"] + unlogged
        return report


def older_resume_words(checkpoint):
    """When the trainer's own resume rule would load a complete checkpoint older than the newest
    complete one (a pointer that was not moved): both named with the steps between them; '' when
    it loads the newest, an alias of it (same step), or the steps are not known. checkpoint: a
    report with resume, newest and newest_step (Directory.report's, trainer_info's)."""
    resume, newest, newest_step = checkpoint.get("resume") or {}, checkpoint.get("newest"), checkpoint.get("newest_step")
    if not (resume.get("complete") and newest and resume.get("step") is not None and newest_step is not None):
        return ""
    if resume["step"] >= newest_step:
        return ""
    return (f"the trainer's resume would load {resume['path']} (step {resume['step']}, {resume['rule']}), "
            f"not the newest complete {newest} (step {newest_step}): {newest_step - resume['step']} steps between them")


def describe_loss(loss):
    if loss["checkpoint"] is None:
        steps = f" ({lost_words(loss)} steps)" if loss["steps_lost"] is not None else ""
        return f"there is no complete checkpoint: a stop loses the whole run{steps}"
    text = f"newest complete checkpoint {loss['checkpoint']} is {loss['checkpoint_age_s']}s old"
    if loss["ahead_of_log"] is not None:
        text += (f" (step {loss['checkpoint_step']}, {loss['ahead_of_log']} steps ahead of the log's "
                 f"last step {loss['last_logged_step']}: the steps lost cannot be read from the log)")
    elif loss["steps_lost"] is not None:
        text += (f" (step {loss['checkpoint_step']}, the log is at step {loss['last_logged_step']}:"
                 f" {lost_words(loss)} steps not in a checkpoint)")
    elif loss["checkpoint_step"] is None:
        text += " (its step is not known: the steps lost cannot be counted)"
    return text


class Activity:
    """Whether a directory is being written: its fingerprint (a callable), sampled at most
    every SAMPLE_SECONDS (walking a directory a trainer writes a checkpoint into costs CPU)."""

    SAMPLE_SECONDS = 0.5

    def __init__(self, fingerprint, window):
        self.fingerprint = fingerprint
        self.window = float(window)
        self.print = fingerprint()
        self.sampled_at = time.monotonic()
        self.changed_at = None

    def sample(self, now, force=False):
        if not force and now - self.sampled_at < self.SAMPLE_SECONDS:
            return
        self.sampled_at = now
        current = self.fingerprint()
        if current != self.print:
            self.print, self.changed_at = current, now

    def recent(self, now):
        """Written within the window."""
        return self.changed_at is not None and now - self.changed_at < self.window
