#!/usr/bin/env bash
# Debian packages the testbed and the tests need on the host (root, no GPU, no Proxmox):
# real LXC containers, tini as their init, OpenSSH for the "nodes", the system python3
# that the nodes' pct stand-in and the CTs run, and Prometheus (prometheus, promtool) for the
# monitoring's tests. Installs only what is missing; starts no service. With arguments, only those
# of them (make test installs python3 and python3-venv first: its venvs are built beside the rest).
# Usage: install-host-packages.sh [PACKAGE...]
set -euo pipefail
packages=(lxc tini openssh-server openssh-client python3 python3-venv procps util-linux iproute2 prometheus)
if [ $# -gt 0 ]; then
  for pkg in "$@"; do
    [[ " ${packages[*]} " == *" $pkg "* ]] || { echo "install-host-packages: $pkg is not one of: ${packages[*]}" >&2; exit 2; }
  done
  packages=("$@")
fi
missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-host-packages: need root to install: ${missing[*]}" >&2
  exit 1
fi
echo "install-host-packages: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# the tests start their own Prometheus in a network namespace of theirs: the package's service is
# not wanted, so a policy of ours (only where the machine has none) keeps its postinst from starting it
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy"
  chmod 755 "$policy"
  trap 'rm -f "$policy"' EXIT
fi
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
