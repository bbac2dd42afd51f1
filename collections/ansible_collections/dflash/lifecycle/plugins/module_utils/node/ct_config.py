# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A CT's configuration as the node's ``pct config <vmid>`` prints it (Python 3.8 compatible):
pve-container's ``PVE::LXC::Config``, one ``key: value`` per line, the keys a CT may set left out
when unset. The node's word on the CT, never the CT's: whether it is privileged (``unprivileged``,
0 unless set) and the addresses Proxmox gives its NICs (``netN``'s ``ip=``, ``ip6=``).
"""

from __future__ import annotations

import ipaddress
import re

NET_KEY = re.compile(r"^net(\d+)$")


def entries(config_text):
    """The CT's configuration as a dict of key to value, the first line of a key winning (``pct config``
    prints each key once)."""
    found = {}
    for line in config_text.splitlines():
        name, _colon, setting = line.partition(":")
        found.setdefault(name.strip(), setting.strip())
    return found


def value(config_text, key):
    """The value of key in the CT's configuration, or None when it is not set."""
    return entries(config_text).get(key) or None


def unprivileged(config_text):
    """Whether the CT is unprivileged (its root is an ordinary uid on the node), as Proxmox runs it."""
    return value(config_text, "unprivileged") in ("1", "yes", "on", "true")


def static_addresses(config_text):
    """The static addresses of the CT's NICs, net0 first, IPv4 before IPv6 on each (``ip=10.1.2.30/24``
    gives 10.1.2.30; ``dhcp``, ``auto`` and ``manual`` give none)."""
    nets = []
    for name, options in entries(config_text).items():
        number = NET_KEY.match(name)
        if number:
            nets.append((int(number.group(1)), options))
    found = []
    for _number, options in sorted(nets):
        fields = dict(part.partition("=")[::2] for part in options.split(","))
        for key in ("ip", "ip6"):
            try:
                found.append(str(ipaddress.ip_interface(fields.get(key, "")).ip))
            except ValueError:
                continue
    return found
