# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the throughput canary (plugin_utils/canary.py holds the logic)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.dflash.lifecycle.plugins.plugin_utils import canary
from ansible_collections.dflash.lifecycle.plugins.plugin_utils.untrusted import reading_answers


def throughput_canary(before, after, threshold=-5.0, policy="report", check_mode=False):
    try:
        return canary.compare(before, after, threshold, policy, check_mode=check_mode)
    except ValueError as err:
        raise AnsibleFilterError(str(err)) from None


class FilterModule:
    """throughput_canary, throughput_chart."""

    def filters(self):
        return {"throughput_canary": reading_answers(throughput_canary), "throughput_chart": reading_answers(canary.chart)}
