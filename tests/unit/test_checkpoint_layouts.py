"""Checkpoint truth for every layout: the project's reading of a checkpoint directory
(module_utils/checkpoint/checkpoints.py, checkpoint_formats.py, with the defaults: auto) against what the
framework itself would find there.

The directories are written by the example trainer's imitations
(tests/testbed/example_trainer/checkpoint_layouts.py): each framework's real file formats
(torch.save zips that the real torch loads, safetensors, JSON) in the order its source writes
them, the source named on each imitation. A save is killed with SIGKILL at every write it
makes, in a forked child, so what is left is exactly what a kill leaves. The oracle is the
imitation's own resume rule and loader: what the framework's resume would pick, and whether
it loads.
"""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from testlib import TESTS, agrees_with_the_framework

sys.path.insert(0, os.path.join(TESTS, "testbed", "example_trainer"))
import checkpoint_layouts as layouts  # noqa: E402

from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoints  # noqa: E402

FRAMEWORKS = sorted(layouts.LAYOUTS)
WEIGHTS = [[float(r * 32 + c) for c in range(32)] for r in range(32)]
KIB = 8


class StopAt(layouts.CountWrites):
    """Freezes its own process (SIGSTOP) after the save's first file: a quiet gap in a save."""

    def file_done(self):
        super().file_done()
        if self.writes and not getattr(self, "stopped", False):
            self.stopped = True
            os.kill(os.getpid(), signal.SIGSTOP)


def state(step):
    return {"step": step, "epoch": 0, "tokens": step * 100}


def in_child(layout, step, pace, wait=True):
    """Run a save in a forked child (its own writes, its own death)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            layout.save(state(step), WEIGHTS, pace)
        finally:
            os._exit(0)
    if wait:
        os.waitpid(pid, 0)
    return pid


def oracle(name, out):
    """(picked name, loaded step or None) by the framework's own resume rule and loader."""
    found = layouts.judge(name, str(out), [])
    return found["pick"], found["pick_loads"]


def loads(name, path):
    return layouts.judge(name, os.path.dirname(path), [path])["loads"][path]


def reads(name):
    return layouts.LAYOUTS[name].resume_reads


def directory(path, log=None):
    return checkpoints.Directory(str(path), log_file=log, step_regex=r"\bstep[\s:=#]*(\d+)\b")


def back_date(path, seconds):
    """Every file under path made seconds older, as if written that long ago."""
    for root, _dirs, names in os.walk(path):
        for name in names:
            st = os.stat(os.path.join(root, name))
            os.utime(os.path.join(root, name), (st.st_atime - seconds, st.st_mtime - seconds))


@pytest.fixture
def out(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # Lightning's temporary files
    (tmp_path / "tmp").mkdir()
    (tmp_path / "out").mkdir()
    return tmp_path / "out"


def prior(layout, step=100):
    """A complete checkpoint the run wrote before, and a second one a save interval later."""
    layout.save(state(step), WEIGHTS, layouts.Pace())


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_a_save_during_the_stop_is_the_new_complete_checkpoint(out, name):
    layout = layouts.named(name, str(out), KIB)
    prior(layout)
    log = out.parent / "train.log"
    log.write_text("step 150 loss 1.0 tok/s 10\n")
    ck = directory(out, str(log))
    before = ck.entries()
    layout.save(state(150), WEIGHTS, layouts.Pace())
    report, loss = ck.report(before), ck.loss()
    assert report["format"] == name, report["format_reason"]
    assert report["written"] and report["new_step"] == 150 and report["newest_step"] == 150
    assert (loss["checkpoint_step"], loss["steps_lost"]) == (150, 0)
    picked, loaded = oracle(name, out)
    assert report["resume"]["name"] == picked and report["resume"]["complete"] and loaded == 150


@pytest.mark.parametrize("resave", (False, True), ids=("new_step", "resave_of_a_saved_step"))
@pytest.mark.parametrize("name", FRAMEWORKS)
def test_a_save_killed_at_any_write_is_judged_as_the_framework_would(out, name, resave):
    """Complete exactly when the framework's loader loads it (DeepSpeed's also once latest names
    it), or incomplete for damage only in files its resume never reads; the newest complete
    checkpoint, the steps lost and what the resume loads follow. resave: the killed save is of
    the step a save just wrote whole (an interrupt save at the step of a periodic one), and
    rewrites it where the layout writes in place - the whole checkpoint of before is damaged."""
    total = layouts.writes_of_a_save(name, str(out.parent / "count"))
    log = out.parent / "train.log"
    log.write_text("step 150 loss 1.0 tok/s 10\n")
    for at in range(1, total + 1):
        for entry in os.scandir(out):  # in this process: an `rm` for each write was 1600 processes a run
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        layout = layouts.named(name, str(out), KIB)
        prior(layout)
        if resave:  # a step or more before: mtimes tick coarsely (a jiffy), a real save is seconds
            prior(layout, 150)
            back_date(out, 1.0)
        ck = directory(out, str(log))
        before = ck.entries()
        in_child(layout, 150, layouts.KillAt(at))
        infos = ck.entries()
        cut = [n for n in infos if infos[n]["step"] == 150]
        for entry in cut:
            loaded = loads(name, str(out / entry))
            if name == "deepspeed":  # and no older tag named by latest: it is written last
                named = layout.resume_path()
                loaded = None if named and os.path.isdir(named) and named != str(out / entry) else loaded
            assert agrees_with_the_framework(entry, infos[entry], loaded, reads(name)), (
                at, entry, loaded, infos[entry]["problems"])
        report, loss = ck.report(before), ck.loss()
        done = bool(cut) and all(infos[n]["complete"] for n in cut)
        assert report["newest_step"] == (150 if done else 100), at
        assert loss["steps_lost"] == (0 if done else 50), at
        assert not report["written"] or done, at
        picked, loaded = oracle(name, out)
        assert report["resume"]["name"] == picked, at
        assert agrees_with_the_framework(picked, report["resume"], loaded, reads(name)), (at, report["resume"])
        try:
            prepared = ck.prepare_resume()
        except checkpoints.ResumeRefused:
            assert name in ("lightning", "deepspeed", "specforge") and not report["resume"]["complete"], at
            continue
        picked, loaded = oracle(name, out)
        assert prepared["resume"]["name"] == picked and loaded == prepared["resume"]["step"], at
        assert loaded in (100, 150), at


def test_lightning_across_file_systems_copies_into_the_final_name(out, monkeypatch):
    """fsspec moves the temporary file with shutil.move: a copy when $TMPDIR is elsewhere. A
    copy cut short is in the directory, under its final name, and never complete."""
    monkeypatch.setenv("DFLASH_TEST_LIGHTNING_CROSS_FS", "1")
    layout = layouts.named("lightning", str(out), KIB)
    prior(layout)
    ck = directory(out)
    before = ck.entries()
    in_child(layout, 150, layouts.KillAt(3))
    report = ck.report(before)
    assert [(a["name"], a["complete"]) for a in report["appeared"]] == [("epoch=0-step=150.ckpt", False)]
    assert "end-of-central-directory" in report["appeared"][0]["problems"][0]
    assert report["newest_step"] == 100 and report["written"] is False


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_a_half_written_newer_checkpoint_already_there(out, name):
    """An earlier crash left a higher step half-written; the run resumed from step 100 and the
    stop's save is step 150. The half one is not the newest complete, the new one is written, and
    where the framework's resume would pick the half one (HF, SpecForge's scripts: the highest,
    unchecked), the launch moves it aside first."""
    layout = layouts.named(name, str(out), KIB)
    prior(layout)
    in_child(layout, 300, layouts.KillAt(layouts.writes_of_a_save(name, str(out.parent / "count")) // 2))
    layout = layouts.named(name, str(out), KIB)
    log = out.parent / "train.log"
    log.write_text("step 150 loss 1.0 tok/s 10\n")
    ck = directory(out, str(log))
    before = ck.entries()
    layout.save(state(150), WEIGHTS, layouts.Pace())
    report = ck.report(before)
    assert report["written"] and report["new_step"] == 150 and report["newest_step"] == 150
    assert ck.loss()["steps_lost"] == 0
    picked, loaded = oracle(name, out)
    assert report["resume"]["name"] == picked
    if name in ("hf_trainer", "specforge_scripts"):
        assert report["resume"]["step"] == 300 and not report["resume"]["complete"] and loaded is None
    else:
        assert report["resume"]["step"] == 150 and report["resume"]["complete"] and loaded == 150
    prepared = ck.prepare_resume()
    assert prepared["resume"]["step"] == 150 and oracle(name, out) == (prepared["resume"]["name"], 150)
    assert len(prepared["moved"]) == (1 if name in ("hf_trainer", "specforge_scripts") else 0)


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_a_quiet_gap_inside_a_save_is_not_its_end(out, name):
    """The save stops after its first file (a real process, frozen) for longer than the stable
    window: the checkpoint-aligned stop does not take it as landed, and the first signal is held
    while the save is in progress; once it finishes, it lands."""
    layout = layouts.named(name, str(out), KIB)
    prior(layout)
    ck = checkpoints.Directory(str(out), stable_window=0.3, activity_window=30)
    before = ck.entries()
    child = in_child(layout, 150, StopAt(), wait=False)
    try:
        deadline = time.monotonic() + 10
        while not os.waitpid(child, os.WUNTRACED | os.WNOHANG)[0]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.5)  # the gap outlasts the stable window
        assert ck.landed(before) is None
        if name != "lightning":  # Lightning writes its temporary file outside the directory
            assert ck.save_in_progress()
    finally:
        os.kill(child, signal.SIGCONT)
        os.waitpid(child, 0)
    time.sleep(0.4)
    landed = ck.landed(before)
    assert landed is not None and ck.entries()[landed]["step"] == 150


def test_step_dirs_a_cut_rename_or_an_in_place_cut(tmp_path):
    """The example trainer's own layout: step_N/ renamed into place, then latest."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "example_trainer", os.path.join(TESTS, "testbed", "example_trainer", "train_dflash_pipeline.py"))
    trainer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(trainer)
    model = trainer.Model()
    trainer.save_checkpoint(str(tmp_path), model, state(100), "interval")
    ck = directory(tmp_path)
    before = ck.entries()
    os.makedirs(tmp_path / ".tmp-step_150-7")  # killed before its rename
    (tmp_path / ".tmp-step_150-7" / "model.json").write_text('{"weights": [[0.1')
    report = ck.report(before)
    assert report["format"] == "step_dirs" and report["new"] is None and report["newest_step"] == 100
    assert report["temp_files_left"][0]["name"] == ".tmp-step_150-7"
    assert report["resume"]["name"] == os.path.basename(trainer.latest_checkpoint(str(tmp_path)))
    os.makedirs(tmp_path / "step_150")  # in place (DFLASH_TEST_CHECKPOINT_IN_PLACE), cut mid-file
    (tmp_path / "step_150" / "model.json").write_text('{"weights": [[0.1')
    report = ck.report(before)
    assert [(a["name"], a["complete"]) for a in report["appeared"]] == [("step_150", False)]
    trainer.save_checkpoint(str(tmp_path), model, state(200), "interrupt")
    report = ck.report(before)
    assert report["new_step"] == 200 and report["written"] and report["resume"]["name"] == "step_200"
    (tmp_path / "latest").write_text("step_100\n")  # renamed, killed before latest moved
    report = ck.report(before)
    assert report["written"] is False and report["resume"]["name"] == "step_100"
    assert report["doubts"] == ["the trainer's resume would not load it: latest names step_100 "
                                "(the save did not finish)"]


def test_zero_to_fp32_and_latest_are_never_checkpoints(out):
    layout = layouts.named("deepspeed", str(out), KIB)
    layout.save(state(32), WEIGHTS, layouts.Pace())
    ck = checkpoints.Directory(str(out), checkpoint_format="auto")
    assert sorted(ck.entries()) == ["global_step32"] and ck.complete()[-1][1]["step"] == 32


def test_the_imitations_are_the_real_formats():
    """torch.load (weights_only, as torch 2.6+ does by default) and safetensors' own reader load
    what the imitations write; the project's checks accept the real torch.save's output and
    refuse every cut of it. Runs the torch venv's Python (make venv-torch)."""
    python = os.environ.get("DFLASH_TORCH_PYTHON") or os.path.join(
        os.path.dirname(TESTS), ".venv-torch", "bin", "python")
    if not os.path.exists(python):
        pytest.skip("no PyTorch venv (make venv-torch)")
    script = os.path.join(TESTS, "unit", "real_formats_check.py")
    res = subprocess.run([python, script], capture_output=True, text=True, timeout=300, check=False,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                             [os.path.join(TESTS, "testbed", "example_trainer"),
                              os.path.join(os.path.dirname(TESTS), "collections")])))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "loaded" in res.stdout and "refused" in res.stdout, res.stdout
