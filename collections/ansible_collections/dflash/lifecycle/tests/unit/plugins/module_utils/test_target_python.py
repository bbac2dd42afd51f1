"""Code that runs in the CT keeps to the oldest Python a CT may have (3.8)."""

import ast
import glob
import os

import pytest

COLLECTION = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 4))
TARGET_CODE = sorted(glob.glob(os.path.join(COLLECTION, "plugins", "module_utils", "**", "*.py"), recursive=True)
                     + glob.glob(os.path.join(COLLECTION, "plugins", "modules", "*.py")))


def test_the_target_code_is_found():
    assert len(TARGET_CODE) > 10


@pytest.mark.parametrize("path", TARGET_CODE, ids=lambda path: os.path.relpath(path, COLLECTION))
def test_target_code_parses_as_python_3_8(path):
    with open(path, encoding="utf-8") as handle:
        ast.parse(handle.read(), filename=path, feature_version=(3, 8))
