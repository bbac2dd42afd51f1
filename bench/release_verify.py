#!/usr/bin/env python3
"""What checking an installed release against its manifest costs, at 200 and 2,000 files.

Every call that reads the installed releases (the preflight of each redeploy, the push,
`make status`, `make check`) verifies the current and the previous release by checksum
(module_utils/ct/releases.py: verify), so a hand edit through the legacy link is found. This
bench runs that same function on release trees of 200 and 2,000 files (1.4 KB each, as
bench/push_cost.py's tree; and 2,000 files of 16 KB), side by side with what the check did
before, a walk that only lists the files, and with status(), which verifies two releases.
Times are the median of REPEAT runs in this process, page cache warm (a CT reads its release
from the same page cache). Usage: .venv/bin/python bench/release_verify.py
"""

import os
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "collections"))
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import releases  # noqa: E402
from ansible_collections.dflash.lifecycle.plugins.plugin_utils import release_archive  # noqa: E402

REPEAT = 7
TREES = ((200, 1400), (2000, 1400), (2000, 16384))


def make_tree(root, files, size):
    for index in range(files):
        sub = os.path.join(root, f"pkg{index % 20}")
        os.makedirs(sub, exist_ok=True)
        header = f"# module {index}\n"
        body = header + "x = 1\n" * ((size - len(header)) // 6)
        with open(os.path.join(sub, f"mod_{index}.py"), "w", encoding="utf-8") as handle:
            handle.write(body)


def listing(path):
    return sum(len(names) for _, _, names in os.walk(path))


def median_ms(action):
    times = []
    for _ in range(REPEAT):
        began = time.perf_counter()
        action()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000


def installed(base, files, size):
    """A base with two releases of the tree installed the way install() lays them out."""
    src = os.path.join(base, "src")
    make_tree(src, files, size)
    manifest = release_archive.build_manifest(src)
    release = release_archive.release_id(manifest)
    archive, digest, _ = release_archive.write_archive(src, manifest, base, release)
    releases.install(os.path.join(base, "opt"), release, archive, digest, manifest)
    releases.activate(os.path.join(base, "opt"), release)
    return os.path.join(base, "opt"), release, manifest


def main():
    print(f"{'files':>6} {'bytes each':>10} {'list only ms':>13} {'verify ms':>10} {'per file us':>12} "
          f"{'status() ms':>12} {'ratio verify/list':>18}")
    for files, size in TREES:
        with tempfile.TemporaryDirectory() as base:
            opt, release, manifest = installed(base, files, size)
            path = os.path.join(releases.releases_dir(opt), release)
            assert not releases.drifted(releases.verify(path, manifest))
            listed = median_ms(lambda: listing(path))
            verified = median_ms(lambda: releases.verify(path, manifest))
            state = median_ms(lambda: releases.status(opt, release))
            print(f"{files:>6} {size:>10} {listed:>13.1f} {verified:>10.1f} {verified * 1000 / files:>12.1f} "
                  f"{state:>12.1f} {verified / listed:>18.1f}")


if __name__ == "__main__":
    main()
