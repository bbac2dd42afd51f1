# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the redeploy's summary (plugin_utils/redeploy_summary.py holds the logic)."""

from __future__ import annotations

from ansible_collections.dflash.lifecycle.plugins.plugin_utils import redeploy_summary
from ansible_collections.dflash.lifecycle.plugins.plugin_utils.untrusted import reading_answers


class FilterModule:
    """redeploy_summary, redeploy_report."""

    def filters(self):
        return {"redeploy_summary": reading_answers(redeploy_summary.summary),
                "redeploy_report": reading_answers(redeploy_summary.report)}
