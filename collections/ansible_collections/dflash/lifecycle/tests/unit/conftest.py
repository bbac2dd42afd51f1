"""Unit tests of the collection: run by ``ansible-test units`` (which puts the collection on
the import path itself) and by the project's ``make test`` through plain pytest."""

import importlib.util
import os

if importlib.util.find_spec("ansible_collections") is None or \
        importlib.util.find_spec("ansible_collections.dflash.lifecycle") is None:
    from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder

    COLLECTIONS = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 5))
    _AnsibleCollectionFinder(paths=[COLLECTIONS])._install()
