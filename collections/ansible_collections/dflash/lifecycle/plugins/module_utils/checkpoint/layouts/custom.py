# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A layout the user describes in checkpoint_custom.

Python 3.8 compatible; the rules come from the framework's source, named on the class.
"""

from __future__ import annotations

import fnmatch
import re

from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint.layouts.base import InvalidLayout, Layout


class Custom(Layout):
    """A layout described by the user: pattern (glob), marker, step_regex and pointer."""

    name = "custom"
    title = "custom"
    source = "the checkpoint_custom settings"
    resume_rule = "the pointer's entry, else the highest step, unchecked"

    def __init__(self, settings):
        settings = settings or {}
        self.pattern = settings.get("pattern")
        if not self.pattern:
            raise InvalidLayout("checkpoint_custom.pattern: required with checkpoint_format=custom")
        self.marker = settings.get("marker") or None
        self.marks_completion = self.marker is not None
        self.pointer = settings.get("pointer") or None
        self.aliases = (self.pointer,) if self.pointer else ()
        self.step_regex = settings.get("step_regex") or None
        try:
            if self.step_regex and re.compile(self.step_regex).groups < 1:
                raise InvalidLayout(f"checkpoint_custom.step_regex: {self.step_regex!r} has no group for the step")
        except re.error as err:
            raise InvalidLayout(f"checkpoint_custom.step_regex: {err}") from None
        self.title = f"custom ({self.pattern})"

    def claims(self, name, path, is_dir):
        return not self.is_alias(name) and fnmatch.fnmatch(name, self.pattern)

    def step(self, name, path):
        match = re.search(self.step_regex, name) if self.step_regex else None
        return int(match.group(1)) if match else None
