# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the redeploy's summary (plugin_utils/redeploy_summary.py holds the logic). It is
imported when a filter runs, as filter/monitoring.py says why."""

from __future__ import annotations

from ansible_collections.dflash.lifecycle.plugins.plugin_utils.untrusted import reading_answers


def redeploy_summary(*args, **kwargs):
    """plugin_utils/redeploy_summary.py summary."""
    from ansible_collections.dflash.lifecycle.plugins.plugin_utils import redeploy_summary as summaries

    return summaries.summary(*args, **kwargs)


def redeploy_report(*args, **kwargs):
    """plugin_utils/redeploy_summary.py report."""
    from ansible_collections.dflash.lifecycle.plugins.plugin_utils import redeploy_summary as summaries

    return summaries.report(*args, **kwargs)


class FilterModule:
    """redeploy_summary, redeploy_report."""

    def filters(self):
        return {"redeploy_summary": reading_answers(redeploy_summary),
                "redeploy_report": reading_answers(redeploy_report)}
