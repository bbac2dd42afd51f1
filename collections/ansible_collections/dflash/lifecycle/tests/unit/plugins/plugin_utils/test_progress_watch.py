"""plugin_utils/progress_watch.py: a long wait shows its progress, a short one stays quiet."""

import json
import time

from ansible_collections.dflash.lifecycle.plugins.plugin_utils import progress_watch


class Connection:
    def __init__(self):
        self.reads = 0
        self.content = b""

    def exec_command(self, command):
        self.reads += 1
        return 0, self.content, b""


def test_a_short_wait_prints_nothing_and_reads_nothing(monkeypatch):
    shown = []
    monkeypatch.setattr(progress_watch.display, "display", shown.append)
    connection = Connection()
    watch = progress_watch.ProgressWatch(connection, "/run/dflash/stop.progress.json", progress_watch.stop_words, "ct1")
    assert watch.run(lambda: {"changed": True}) == {"changed": True}
    assert shown == [] and connection.reads == 0


def test_a_long_wait_shows_each_change(monkeypatch):
    shown = []
    monkeypatch.setattr(progress_watch.display, "display", shown.append)
    monkeypatch.setattr(progress_watch, "FIRST_AFTER", 0.1)
    monkeypatch.setattr(progress_watch, "EVERY", 0.1)
    connection = Connection()
    connection.content = json.dumps({"stage": 1, "signal": "SIGINT", "elapsed": 12.0, "bound": 120, "running": 2,
                                     "checkpoint_bytes": 5e6, "steps_since_checkpoint": 40}).encode()
    watch = progress_watch.ProgressWatch(connection, "/p", progress_watch.stop_words, "ct1")
    assert watch.run(lambda: time.sleep(0.5) or {"ok": 1}) == {"ok": 1}
    assert shown == ["ct1: stop stage 1 (SIGINT): 12.0s of 120s, 2 process(es) of the run still running, "
                     "checkpoint +5.0 MB written, 40 steps not in a checkpoint yet"]  # shown once: unchanged after


def test_the_launch_words():
    assert progress_watch.launch_words({"phase": "throughput", "lines": 2, "of": 5, "tokens_per_s": 14000.0,
                                        "elapsed": 11.0, "bound": 300}) == \
        "throughput: 2 of 5 progress lines, 14000.0 tok/s so far, 11.0s of 300s"
    assert progress_watch.launch_words({"phase": "health", "elapsed": 12.5, "bound": 300}) == \
        "waiting for health: 12.5s of 300s, no progress line yet"


def test_a_launch_with_its_stop_first_shows_the_stop_then_the_launch(monkeypatch):
    """trainer_process with stop_first: the stop's progress file, then the launch's, in one watch."""
    shown = []
    monkeypatch.setattr(progress_watch.display, "display", shown.append)
    monkeypatch.setattr(progress_watch, "FIRST_AFTER", 0.1)
    monkeypatch.setattr(progress_watch, "EVERY", 0.1)
    files = {"/run/dflash/stop.progress.json": {"stage": 1, "signal": "SIGINT", "elapsed": 12.0, "bound": 120,
                                                "running": 1},
             "/run/dflash/launch.progress.json": {"phase": "health", "elapsed": 12.5, "bound": 300}}

    class Files:
        def exec_command(self, command):
            path = command.split()[-2]  # head -c N <path> 2>/dev/null
            return (0, json.dumps(files[path]).encode(), b"") if path in files else (1, b"", b"")

    assert progress_watch.stop_progress_file({"detach_dir": "/run/dflash"}) == "/run/dflash/stop.progress.json"
    watch = progress_watch.ProgressWatch(Files(), "/run/dflash/launch.progress.json", progress_watch.launch_words,
                                         "ct1", [(progress_watch.stop_progress_file({}), progress_watch.stop_words)])
    assert watch.run(lambda: time.sleep(0.35) or {"ok": 1}) == {"ok": 1}
    assert shown == ["ct1: waiting for health: 12.5s of 300s, no progress line yet",
                     "ct1: stop stage 1 (SIGINT): 12.0s of 120s, 1 process(es) of the run still running"]


def test_a_progress_file_the_ct_planted_never_fails_the_task_nor_reaches_the_terminal_raw(monkeypatch):
    """The CT's root writes the progress file: nesting deeper than Python parses, wrong types, a
    list, a huge file, escape sequences and a template. The task goes on; no escape sequence and no template opener is shown; a file that
    is not the module's is said once; at most PROGRESS_BYTES are read."""
    shown, commands = [], []
    monkeypatch.setattr(progress_watch.display, "display", shown.append)
    monkeypatch.setattr(progress_watch, "FIRST_AFTER", 0.05)
    monkeypatch.setattr(progress_watch, "EVERY", 0.05)
    planted = iter([
        "[" * progress_watch.PROGRESS_BYTES,  # nested deeper than the parser goes: a RecursionError
        {"stage": "1\x1b[2J", "signal": "{{ lookup('pipe', 'id') }}\x1b]0;owned\x07", "elapsed": 1.0, "running": 1},
        {"stage": 1, "signal": "SIGINT", "elapsed": "x", "bound": [], "running": 1, "checkpoint_bytes": "many"},
        ["not", "a", "mapping"],
        {"stage": 1, "signal": "SIGINT", "elapsed": 1.0, "running": 1, "steps_since_checkpoint": {"a": 1}},
    ])

    class Planted:
        def exec_command(self, command):
            commands.append(command)
            text = next(planted, {"stage": 2})
            return 0, (text if isinstance(text, str) else json.dumps(text)).encode(), b""

    watch = progress_watch.ProgressWatch(Planted(), "/run/dflash/stop.progress.json", progress_watch.stop_words, "ct1")
    assert watch.run(lambda: time.sleep(0.5) or {"ok": 1}) == {"ok": 1}
    assert all(command.startswith(f"head -c {progress_watch.PROGRESS_BYTES} ") for command in commands)
    text = "\n".join(shown)
    assert "\x1b" not in text and "\x07" not in text and "{{" not in text, shown
    assert "ct1: stop stage 1[2J ({ { lookup('pipe', 'id') }}]0;owned)" in text, shown
    assert shown.count("ct1: its progress file /run/dflash/stop.progress.json is not one the module writes: "
                       "its progress is not shown") == 1, shown


def test_a_launchs_progress_files_are_set_for_it_and_for_its_stop_first():
    """The launch's options as trainer_process's action and the preflight's (its launch) send them."""
    args, watch = progress_watch.launch_watch(None, {"run_dir": "/run/dflash", "pidfile": "/run/dflash/trainer.pid",
                                                     "stop_first": {"detach_dir": "/run/dflash"}}, "ct200")
    assert args["progress_file"] == "/run/dflash/launch.progress.json"
    assert args["stop_first"]["progress_file"] == "/run/dflash/stop.progress.json"
    assert [path for path, _render in watch.files] == ["/run/dflash/launch.progress.json", "/run/dflash/stop.progress.json"]
    args, watch = progress_watch.launch_watch(None, {"pidfile": "/var/run/t/trainer.pid"}, "ct200")
    assert args["progress_file"] == "/var/run/t/launch.progress.json" and len(watch.files) == 1
    # with stage_models, the model copy's progress too, beside the launch's
    args, watch = progress_watch.launch_watch(None, {"run_dir": "/run/dflash", "pidfile": "/run/dflash/trainer.pid",
                                                     "stage_models": {"models": {}}}, "ct200")
    assert args["stage_models"]["progress_file"] == "/run/dflash/stage.progress.json"
    assert [render for _path, render in watch.files] == [progress_watch.launch_words, progress_watch.stage_words]


def test_the_ct_is_told_only_when_ansible_playbook_died_while_the_module_ran(monkeypatch):
    """The fork that ran the task outlives a SIGKILL of the job's process group (a session of its
    own): its parent then changes, and only then does it mark the CT's record, give the lock back
    and end, its answer having no reader."""
    calls, ended = [], []
    monkeypatch.setattr(progress_watch.os, "_exit", ended.append)

    class Action:
        def _execute_module(self, **kwargs):
            calls.append(kwargs)

    args = {"lock_holder": "root@vm ansible-playbook pid 7", "lock_path": "/run/dflash/redeploy.lock",
            "change_record": "/var/lib/dflash/last-change.json"}
    parent = [100]
    monkeypatch.setattr(progress_watch.os, "getppid", lambda: parent[0])
    watch = progress_watch.ControllerWatch()
    watch.tell_if_gone(Action(), args, {})
    assert calls == [] and ended == []  # ansible-playbook is there: it reports the result itself
    parent[0] = 1  # reparented: ansible-playbook is gone
    watch.tell_if_gone(Action(), args, {})
    assert calls == [{"module_name": "dflash.lifecycle.redeploy_lock", "task_vars": {}, "module_args": {
        "holder": "root@vm ansible-playbook pid 7", "path": "/run/dflash/redeploy.lock", "state": "released",
        "controller_gone": True, "change_record": "/var/lib/dflash/last-change.json"}}]
    assert ended == [0]
    watch.tell_if_gone(Action(), {}, {})  # a call that holds no lock: nothing to tell, the fork ends all the same
    assert len(calls) == 1 and ended == [0, 0]
