"""Unit tests of the collection: run by ``ansible-test units`` (which puts the collection on
the import path itself) and by the project's ``make test`` through plain pytest."""

import os

try:
    import ansible_collections.dflash.lifecycle  # noqa: F401  (under ansible-test)
except ImportError:
    from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder

    COLLECTIONS = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 5))
    _AnsibleCollectionFinder(paths=[COLLECTIONS])._install()
