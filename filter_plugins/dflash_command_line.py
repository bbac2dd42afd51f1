# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The project's short filter names (dflash_argv, dflash_gpus_needed, dflash_env_pairs) for the
collection's documented filters: ansible-doc -t filter dflash.lifecycle.dflash_argv."""

from __future__ import annotations

from ansible_collections.dflash.lifecycle.plugins.filter.run_settings import FilterModule  # noqa: F401
