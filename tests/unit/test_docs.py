"""The documents hold together: every relative link leads to a file of the repository (and to a
heading of it, where it names one), and every `make TARGET` they name is a target of the
Makefile. The README stays a front door: about 150 lines, the two commands in its first screen."""

import glob
import os
import re

import pytest

from testlib import REPO

DOCUMENTS = sorted({os.path.relpath(p, REPO) for p in
                    glob.glob(os.path.join(REPO, "*.md")) + glob.glob(os.path.join(REPO, "docs", "*.md"))
                    + glob.glob(os.path.join(REPO, "*", "README.md")) + glob.glob(os.path.join(REPO, "roles", "*", "README.md"))
                    + glob.glob(os.path.join(REPO, "collections", "ansible_collections", "dflash", "lifecycle", "*.md"))})
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
MAKE = re.compile(r"(?:^|[\s;&(|])make ([a-z][\w-]*)")
TARGET = re.compile(r"^([a-z][\w-]*)\s*:(?!=)", re.M)


def slug(heading):
    """The anchor GitHub gives a heading: lower case, punctuation but - and _ dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    with open(path, encoding="utf-8") as handle:
        text = re.sub(r"^```.*?^```", "", handle.read(), flags=re.M | re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def broken_links(document, text):
    """The links of text (document's, a path from the repository's root) that lead nowhere."""
    base = os.path.dirname(os.path.join(REPO, document))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _sep, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(base, path)) if path else os.path.join(REPO, document)
        if not full.startswith(REPO + os.sep) or not os.path.exists(full):
            broken.append(target)
        elif anchor and full.endswith(".md") and anchor not in anchors(full):
            broken.append(target)
    return broken


def make_targets_named(text):
    """The targets of every `make TARGET` in text's code: its code spans and code blocks."""
    code = CODE_SPAN.findall(text)
    code += re.findall(r"^```.*?^```", text, re.M | re.S)
    code += [line for line in text.splitlines() if line.startswith("    ")]
    return {target for piece in code for target in MAKE.findall(piece)}


def makefile_targets():
    with open(os.path.join(REPO, "Makefile"), encoding="utf-8") as handle:
        return set(TARGET.findall(handle.read()))


def read(document):
    with open(os.path.join(REPO, document), encoding="utf-8") as handle:
        return handle.read()


def test_the_checks_find_what_is_wrong():
    assert broken_links("docs/stop.md", "[a](launch.md) [b](nope.md) [c](../README.md#nowhere) [d](https://x.org)") == [
        "nope.md", "../README.md#nowhere"]
    assert broken_links("docs/stop.md", "[a](../README.md#working-on-it) [b](#the-stop-request)") == []
    assert make_targets_named("make sure `make restart HOST=x` and\n\n    make no-such-target\n") == {
        "restart", "no-such-target"}


def test_the_documents_are_found():
    assert {"README.md", "docs/architecture.md", "docs/stop.md", "roles/trainer_stop/README.md"} <= set(DOCUMENTS)


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_link_leads_somewhere(document):
    assert broken_links(document, read(document)) == []


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_make_target_named_exists(document):
    assert make_targets_named(read(document)) - makefile_targets() == set()


def test_the_readme_is_a_front_door():
    lines = read("README.md").splitlines()
    assert len(lines) <= 200, len(lines)
    first_screen = "\n".join(lines[:40])
    assert "make demo" in first_screen and "make test" in first_screen
