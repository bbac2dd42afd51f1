"""module_utils/checkpoint/checkpoint_files.py and checkpoint_formats.py: the file checks and what each
layout claims. (Each framework's imitation, its real file formats and a save killed at every point:
tests/unit/test_checkpoint_layouts.py of the project.)"""

import json
import os
import pickle
import struct
import sys
import zipfile

import pytest

from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import (
    checkpoint_files, checkpoint_formats as formats)


def torch_like_zip(path, payload=b"\0" * 4096):
    """The records torch.save writes (torch/serialization.py _save), stored, under one prefix."""
    prefix = os.path.splitext(os.path.basename(path))[0]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr(f"{prefix}/data.pkl", pickle.dumps({"global_step": 321, "epoch": 2}, protocol=2))
        archive.writestr(f"{prefix}/.format_version", "1")
        archive.writestr(f"{prefix}/byteorder", "little")
        archive.writestr(f"{prefix}/data/0", payload)
        archive.writestr(f"{prefix}/version", "3\n")
    return path


def safetensors_file(path, lengths=(64, 32), cut=0):
    header, offset = {}, 0
    for index, length in enumerate(lengths):
        header[f"t{index}"] = {"dtype": "F32", "shape": [length // 4], "data_offsets": [offset, offset + length]}
        offset += length
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    data = struct.pack("<Q", len(text)) + text + b"\1" * offset
    path.write_bytes(data[:len(data) - cut])
    return path


def test_a_whole_torch_zip_passes_and_every_cut_of_it_fails(tmp_path):
    whole = torch_like_zip(str(tmp_path / "optimizer.pt"))
    assert checkpoint_files.file_problem(whole) is None
    data = open(whole, "rb").read()
    cut = tmp_path / "cut.pt"
    for length in range(0, len(data), 97):
        cut.write_bytes(data[:length])
        assert checkpoint_files.file_problem(str(cut)) is not None, length
    cut.write_bytes(data + b"trailing")
    assert "end-of-central-directory" in checkpoint_files.file_problem(str(cut))


def test_a_zip_that_is_not_torch_save_and_a_legacy_file_are_named(tmp_path):
    plain = tmp_path / "a.pt"
    with zipfile.ZipFile(plain, "w") as archive:
        archive.writestr("readme", "x")
    assert checkpoint_files.file_problem(str(plain)) == "a zip without data.pkl: not a torch.save file"
    legacy = tmp_path / "b.pth"
    legacy.write_bytes(pickle.dumps({"a": 1}, protocol=2))
    assert "legacy (non-zip) torch.save" in checkpoint_files.file_problem(str(legacy))
    opaque = tmp_path / "optimizer.bin"  # a .bin of another kind counts when it exists
    opaque.write_bytes(b"\0" * 64)
    assert checkpoint_files.file_problem(str(opaque)) is None


def test_a_damaged_central_directory_is_found(tmp_path):
    whole = torch_like_zip(str(tmp_path / "m.pt"))
    data = bytearray(open(whole, "rb").read())
    cd_offset = struct.unpack_from("<I", data, len(data) - 6)[0]
    data[cd_offset + 42:cd_offset + 46] = struct.pack("<I", len(data) * 2)  # an entry past the end
    (tmp_path / "bad.pt").write_bytes(bytes(data))
    assert "has no local header" in checkpoint_files.file_problem(str(tmp_path / "bad.pt"))


def test_safetensors_must_end_where_its_header_says(tmp_path):
    assert checkpoint_files.file_problem(str(safetensors_file(tmp_path / "model.safetensors"))) is None
    problem = checkpoint_files.file_problem(str(safetensors_file(tmp_path / "cut.safetensors", cut=5)))
    assert "end at 96 bytes of data, the file holds 91 (cut short)" in problem
    (tmp_path / "h.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    assert "does not fit" in checkpoint_files.file_problem(str(tmp_path / "h.safetensors"))


def test_json_must_parse(tmp_path):
    (tmp_path / "trainer_state.json").write_text('{"global_step": 3')
    assert checkpoint_files.file_problem(str(tmp_path / "trainer_state.json")).startswith("does not parse as JSON")


def test_the_step_in_a_torch_files_pickle_is_read_without_unpickling(tmp_path):
    path = torch_like_zip(str(tmp_path / "last.ckpt"))
    assert checkpoint_files.pickled_int(path, "global_step") == 321
    assert checkpoint_files.pickled_int(path, "missing") is None


@pytest.mark.parametrize("layout,names,claimed,steps", [
    ("deepspeed", {"global_step32": True, "zero_to_fp32.py": False, "latest": False}, ["global_step32"], [32]),
    ("lightning", {"epoch=1-step=70.ckpt": False, "last.ckpt": False, "last-v1.ckpt": False},
     ["epoch=1-step=70.ckpt"], [70]),
    ("hf_trainer", {"checkpoint-32": True, "runs": True, "checkpoint-32.json": False}, ["checkpoint-32"], [32]),
    ("dcp", {"step-400": True, "step-400.json": False}, ["step-400"], [400]),
    ("specforge_scripts", {"epoch_2_step_900": True, "epoch_3": True}, ["epoch_2_step_900", "epoch_3"], [900, None]),
    ("specforge", {"run7-step50": True, "run7-latest": True, "run7-best": True, "run7.best_meta.json": False},
     ["run7-step50"], [50]),
    ("step_dirs", {"step_12": True, "latest": False, "step_12.tmp": True}, ["step_12"], [12]),
])
def test_what_each_layout_takes_for_a_checkpoint_and_its_step(tmp_path, layout, names, claimed, steps):
    """Never an alias or a helper (zero_to_fp32.py is not step 32 from "fp32"); the step from the
    layout's own rule, never from the last digits of a name."""
    chosen = formats.layout(layout)
    taken = [n for n, is_dir in sorted(names.items()) if chosen.claims(n, str(tmp_path / n), is_dir)]
    assert sorted(taken) == sorted(claimed)
    assert [chosen.step(n, str(tmp_path / n)) for n in claimed] == steps


def test_auto_recognises_each_layout_by_its_entries(tmp_path):
    (tmp_path / "global_step10").mkdir()
    (tmp_path / "zero_to_fp32.py").write_text("#")
    chosen, reason = formats.recognise(str(tmp_path))
    assert chosen.name == "deepspeed" and reason == "auto: 1 entry like global_step10"
    (tmp_path / "checkpoint-10").mkdir()
    (tmp_path / "checkpoint-20").mkdir()
    chosen, reason = formats.recognise(str(tmp_path))
    assert chosen.name == "hf_trainer" and reason.endswith("(also like deepspeed)")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert formats.recognise(str(empty)) == (None, f"{empty} holds no checkpoint yet")
    (empty / "README.md").write_text("x")
    assert formats.recognise(str(empty))[1] == f"no known checkpoint layout in {empty} (it holds README.md)"


def test_bad_settings_name_the_setting():
    with pytest.raises(formats.InvalidLayout, match="checkpoint_format: 'megatron' is not one of auto, step_dirs"):
        formats.layout("megatron")
    with pytest.raises(formats.InvalidLayout, match="checkpoint_custom.pattern: required"):
        formats.layout("custom", {})
    with pytest.raises(formats.InvalidLayout, match="checkpoint_custom.step_regex: 'step_' has no group"):
        formats.layout("custom", {"pattern": "s*", "step_regex": "step_"})


def test_what_a_trainer_saves_on(tmp_path):
    hf = formats.layout("hf_trainer")
    assert formats.saves_on("auto", hf)[:2] == (frozenset(), frozenset())
    lightning = formats.layout("lightning")
    assert formats.saves_on("auto", lightning)[1] == {formats.signal.SIGTERM}  # its save finishes
    assert formats.saves_on("SIGINT", lightning)[:2] == ({formats.signal.SIGINT},
                                                         {formats.signal.SIGINT, formats.signal.SIGTERM})
    assert formats.saves_on("auto", formats.layout("step_dirs"))[0] == {formats.signal.SIGINT}
    assert formats.saves_on("none", None)[:2] == (frozenset(), frozenset())
    assert formats.saves_on("auto", None)[:2] == (None, None)


def test_the_pointer_of_a_layout_is_a_file_or_a_link(tmp_path):
    (tmp_path / "latest").write_text("global_step7\n")
    assert checkpoint_files.read_pointer(str(tmp_path), "latest") == "global_step7"
    os.symlink("dflash-step9", tmp_path / "dflash-latest")
    assert checkpoint_files.read_pointer(str(tmp_path), "dflash-latest") == "dflash-step9"
    assert checkpoint_files.read_pointer(str(tmp_path), "absent") is None


def test_the_file_checks_need_no_more_than_the_standard_library():
    """The CT has a bare Python: the registry, every layout and the file checks import nothing else
    (but each other)."""
    layouts = os.path.join(os.path.dirname(formats.__file__), "layouts")
    paths = [formats.__file__, checkpoint_files.__file__] + sorted(
        os.path.join(layouts, name) for name in os.listdir(layouts) if name.endswith(".py"))
    assert {sys.modules[type(layout).__module__].__file__ for layout in formats.LAYOUTS} <= set(paths)
    for path in paths:
        source = open(path, encoding="utf-8").read()
        imports = {line.split()[1] for line in source.splitlines()
                   if line.startswith(("import ", "from ")) and "__future__" not in line}
        assert {i for i in imports if not i.startswith("ansible_collections.dflash.lifecycle.plugins.module_utils.")} <= {
            "fnmatch", "io", "json", "os", "pickletools", "re", "signal", "struct", "zipfile"}, path


def test_dcp_data_without_its_metadata_is_incomplete_in_any_layout(tmp_path):
    """A torch.distributed.checkpoint save into step_N/ dirs (not torchtitan's step-N) still
    follows DCP's rule: .metadata is renamed into place last."""
    files = {"__0_0.distcp", "__1_0.distcp"}
    assert formats.layout("step_dirs").marker_problems(str(tmp_path), "step_5", str(tmp_path), files) == [
        checkpoint_files.NO_DCP_METADATA]
    assert formats.layout("step_dirs").marker_problems(str(tmp_path), "step_5", str(tmp_path),
                                                       files | {".metadata"}) == []
    assert formats.layout("dcp").marker_problems(str(tmp_path), "step-5", str(tmp_path), {"__0.metadata"}) == []


def test_dcp_data_rewritten_after_its_metadata_is_named(tmp_path):
    """DCP writes .metadata once all data is written: data newer than it is a later save into the
    same step-N (in place), whatever it left, and the metadata of before no longer describes it."""
    for name, ns in ((".metadata", 2_000), ("__0_0.distcp", 1_000), ("__1_0.distcp", 3_000)):
        (tmp_path / name).write_bytes(b"x")
        os.utime(tmp_path / name, ns=(ns, ns))
    files = {".metadata", "__0_0.distcp", "__1_0.distcp"}
    (problem,) = formats.layout("dcp").marker_problems(str(tmp_path), "step-5", str(tmp_path), files)
    assert problem.startswith("__1_0.distcp written after .metadata")
    assert formats.layout("step_dirs").marker_problems(str(tmp_path), "step_5", str(tmp_path), files) == [problem]
    os.utime(tmp_path / ".metadata", ns=(3_000, 3_000))
    assert formats.layout("dcp").marker_problems(str(tmp_path), "step-5", str(tmp_path), files) == []


def test_damage_of_any_shape_is_a_problem_never_an_error(tmp_path):
    import random
    rng = random.Random(5)
    whole = open(torch_like_zip(str(tmp_path / "w.pt")), "rb").read()
    tensors = safetensors_file(tmp_path / "w.safetensors").read_bytes()
    for data, suffix in ((whole, ".pt"), (tensors, ".safetensors")):
        for trial in range(300):
            damaged = bytearray(data)
            for _flip in range(rng.randint(1, 8)):
                damaged[rng.randrange(len(damaged))] = rng.randrange(256)
            damaged = damaged[:rng.randint(0, len(damaged))] if trial % 2 else damaged
            path = tmp_path / f"d{trial}{suffix}"
            path.write_bytes(bytes(damaged))
            problem = checkpoint_files.file_problem(str(path))
            assert problem is None or isinstance(problem, str)
            if len(damaged) < len(data):
                assert problem is not None, trial
