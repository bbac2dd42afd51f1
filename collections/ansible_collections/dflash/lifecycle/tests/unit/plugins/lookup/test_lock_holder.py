"""lookup/lock_holder.py: one name per run of a playbook."""

import os

from ansible_collections.dflash.lifecycle.plugins.lookup.lock_holder import holder


def test_awx_jobs_are_named_by_job_and_user():
    assert holder({"awx_job_id": 42, "awx_user_name": "admin"}) == "awx job 42 (admin)"
    assert holder({"tower_job_id": 7}) == "awx job 7 (?)"


def test_a_playbook_run_is_named_by_user_host_and_its_pid():
    name = holder({})
    assert name.endswith(f" ansible-playbook pid {os.getpid()}") and "@" in name
    assert holder({}) == name  # the same in every task of the run
