# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What every layout answers, and how by default (Python 3.8 compatible): each layout under
module_utils/checkpoint/layouts/ is a Layout, and checkpoint_formats.py lists them."""

from __future__ import annotations

import fnmatch
import os
import re

from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoint_files


class Layout:
    """One framework's way of saving. Subclasses set the class attributes and override the
    questions that differ."""

    name = ""
    title = ""
    source = ""
    entry = None            # regex of a checkpoint's name; group 1 its step
    dirs = True             # checkpoints are directories (else files)
    marker = None           # file a checkpoint directory holds once its save finished
    required = ()           # files (or alternatives, as tuples) a complete checkpoint holds
    aliases = ()            # names beside the checkpoints that are not checkpoints (globs)
    pointer = None          # a file or link naming the checkpoint the resume loads
    saves_on = frozenset()  # signals whose handler writes a checkpoint
    save_survives = frozenset()  # signals during which a save in progress still finishes
    resume_rule = ""
    # whether complete means the save is over: its last write is the marker, a rename into place
    # or DCP's .metadata; where it is not, the pointer is the mark, or only a quiet directory tells
    marks_completion = True

    def claims(self, name, path, is_dir):
        if is_dir != self.dirs or self.is_alias(name):
            return False
        return bool(self.entry and re.match(self.entry, name))

    def is_alias(self, name):
        return any(fnmatch.fnmatch(name, pat) for pat in self.aliases)

    def step(self, name, path):
        match = re.match(self.entry, name) if self.entry else None
        return int(match.group(1)) if match and match.group(1) else None

    def sort_key(self, name, info):
        return (info["step"] if info["step"] is not None else -1, info["mtime"])

    def marker_problems(self, directory, name, path, files):
        """Problems beyond the files themselves: the layout's own marker, and (whatever the
        layout) torch.distributed.checkpoint data without the .metadata DCP renames into place last."""
        found = checkpoint_files.dcp_problems(path, files)
        if self.marker and self.marker not in files:
            found.append(f"no {self.marker} ({self.title} writes it last: the save did not finish)")
        for need in self.required:
            options = need if isinstance(need, tuple) else (need,)
            if not any(_present(files, option) for option in options):
                found.append(f"no {' or '.join(options)}")
        return found

    def pointed(self, directory):
        """The entry the layout's pointer names, or None."""
        return checkpoint_files.read_pointer(directory, self.pointer) if self.pointer else None

    def pointer_names(self, directory, name, info):
        """Whether the layout's pointer designates checkpoint name: True or False, None when the
        layout keeps no pointer or none is there yet."""
        if not self.pointer or not os.path.lexists(os.path.join(directory, self.pointer)):
            return None
        return self.pointed(directory) == name

    def save_over(self, directory, name, info):
        """Whether the save of the complete checkpoint name is over: the pointer names it (True)
        or another (False); without a pointer, True where the layout marks completion, None where
        only a quiet directory can tell."""
        named = self.pointer_names(directory, name, info)
        if named is not None:
            return named
        return True if self.marks_completion else None

    def resume_pick(self, directory, infos):
        """(name, words): the checkpoint the trainer's own resume loads, or (None, words)."""
        pointed = self.pointed(directory)
        if pointed is not None:
            return pointed, f"the one {self.pointer} names"
        ranked = sorted(infos, key=lambda n: self.sort_key(n, infos[n]))
        return (ranked[-1] if ranked else None), self.resume_rule

    def evidence(self, directory, listing):
        """Why directory looks like this layout (its checkpoints by name), or None."""
        claimed = [n for n, is_dir in listing.items() if self.claims(n, os.path.join(directory, n), is_dir)]
        if not claimed:
            return None
        return f"{len(claimed)} entr{'y' if len(claimed) == 1 else 'ies'} like {claimed[0]}"

    def describe(self):
        return {"name": self.name, "title": self.title, "saves_on": sorted(s.name for s in self.saves_on),
                "save_survives": sorted(s.name for s in self.save_survives)}


def _present(files, pattern):
    return any(fnmatch.fnmatch(f, pattern) for f in files)


class InvalidLayout(ValueError):
    """A checkpoint format setting is wrong; the message names the setting."""
