# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a checkpoint of each training framework is, read from its own files (Python 3.8
compatible, standard library only: the CT has a bare Python).

Each layout is a small object that answers the same questions: is this entry of the
directory a checkpoint, what is its step, is it complete (and why not), which one would the
trainer's own resume pick, and on which signals does the trainer save (or finish a save it
is writing). ``checkpoints.py``, the stop and the launch ask these objects; no framework's
name appears anywhere else.

Completeness never rests on a quiet directory. It is the layout's own marker (the file it
writes last, or the pointer it moves last), and every file structurally valid for its kind:

* a ``torch.save`` zip: the end-of-central-directory record at the end of the file (zip64
  too), the central directory right before it, every entry's data inside the file;
* a ``.safetensors`` file: its header's ``data_offsets`` end exactly at the file's end;
* a ``.json`` file: it parses.

Only headers and tails are read, so a 20 GB checkpoint is judged in milliseconds
(``bench/checkpoint_check.py``). The rules come from each framework's source, named on
its class.
"""

from __future__ import annotations

import fnmatch
import io
import json
import os
import pickletools
import re
import signal
import struct
import zipfile

# the launch moves a checkpoint the resume would pick but that is incomplete here, never deletes
MOVED_ASIDE = ".incomplete"
ZIP_LOCAL = b"PK\x03\x04"
ZIP_CENTRAL = b"PK\x01\x02"
ZIP_END = b"PK\x05\x06"
ZIP64_LOCATOR = b"PK\x06\x07"
ZIP64_END = b"PK\x06\x06"
ZIP_MAX_COMMENT = 0xFFFF
# read at most this much of a central directory or a header; a larger one is not a checkpoint file
HEADER_LIMIT = 64 << 20
TORCH_SUFFIXES = (".pt", ".pth", ".ckpt")
PICKLE_INT_OPS = {"BININT", "BININT1", "BININT2", "LONG1", "LONG4", "INT", "LONG"}
MEMO_OPS = {"PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"}


# -- file formats -----------------------------------------------------------------------------

def _read_at(handle, offset, length):
    handle.seek(offset)
    return handle.read(length)


def zip_problem(path, size=None):
    """Why path is not a whole zip archive (a torch.save file), or None."""
    return zip_listing(path, size)[0]


def zip_listing(path, size=None):
    """(why path is not a whole zip archive or None, the names of its entries)."""
    size = os.path.getsize(path) if size is None else size
    if size < 22:
        return f"{size} bytes: no zip end record (cut short)", []
    with open(path, "rb", buffering=0) as handle:  # unbuffered: each entry's 30-byte header, no more
        tail_len = min(size, 22 + ZIP_MAX_COMMENT + 20)
        tail = _read_at(handle, size - tail_len, tail_len)
        end = tail.rfind(ZIP_END)
        while end >= 0 and (end + 22 > tail_len or end + 22 + struct.unpack_from("<H", tail, end + 20)[0] != tail_len):
            end = tail.rfind(ZIP_END, 0, end)
        if end < 0:
            return "no zip end-of-central-directory record at its end (cut short)", []
        end_at = size - tail_len + end
        entries, cd_size, cd_offset = struct.unpack_from("<HII", tail, end + 10)
        cd_end = end_at
        locator = tail[end - 20:end] if end >= 20 else b""
        if 0xFFFFFFFF in (cd_size, cd_offset) or entries == 0xFFFF or locator.startswith(ZIP64_LOCATOR):
            # torch.save writes the zip64 end records whatever the size
            if not locator.startswith(ZIP64_LOCATOR):
                return "zip64 end record missing (cut short)", []
            record_at = struct.unpack_from("<Q", locator, 8)[0]
            record = _read_at(handle, record_at, 56)
            if record_at + 56 > end_at or not record.startswith(ZIP64_END):
                return "zip64 end record not where its locator says", []
            entries, cd_size, cd_offset = struct.unpack_from("<QQQ", record, 32)
            cd_end = record_at
        if cd_offset + cd_size != cd_end:
            return (f"central directory at {cd_offset}+{cd_size} does not end at the end record "
                    f"({cd_end})"), []
        if cd_size > HEADER_LIMIT:
            return f"central directory of {cd_size} bytes: not a checkpoint file", []
        directory = _read_at(handle, cd_offset, cd_size)
        return _zip_entries(handle, directory, entries, cd_offset)


def _zip_entries(handle, directory, entries, data_end):
    at, names = 0, []
    while at < len(directory):
        if directory[at:at + 4] != ZIP_CENTRAL or at + 46 > len(directory):
            return f"central directory entry {len(names)} is damaged", names
        (flags, csize, usize, name_len, extra_len, comment_len, offset) = struct.unpack_from(
            "<4x4xH10xII3H8xI", directory, at)
        name = directory[at + 46:at + 46 + name_len].decode("utf-8", "replace")
        extra = directory[at + 46 + name_len:at + 46 + name_len + extra_len]
        csize, offset = _zip64_sizes(extra, usize, csize, offset)
        local = _read_at(handle, offset, 30)
        if len(local) < 30 or not local.startswith(ZIP_LOCAL):
            return f"entry {name} has no local header", names
        local_name, local_extra = struct.unpack_from("<HH", local, 26)
        entry_end = offset + 30 + local_name + local_extra + csize + (16 if flags & 0x8 else 0)
        if entry_end > data_end:
            return f"entry {name} ends at {entry_end}, past the data ({data_end})", names
        at += 46 + name_len + extra_len + comment_len
        names.append(name)
    if len(names) != entries:
        return f"central directory lists {len(names)} entries, its end record {entries}", names
    return None, names


def _zip64_sizes(extra, usize, csize, offset):
    """The compressed size and local header offset, from the zip64 extra field where the
    central header holds 0xFFFFFFFF."""
    at = 0
    while at + 4 <= len(extra):
        kind, length = struct.unpack_from("<HH", extra, at)
        if kind == 1:
            values = iter(struct.unpack_from(f"<{length // 8}Q", extra, at + 4))
            if usize == 0xFFFFFFFF:
                next(values, None)
            if csize == 0xFFFFFFFF:
                csize = next(values, csize)
            if offset == 0xFFFFFFFF:
                offset = next(values, offset)
            break
        at += 4 + length
    return csize, offset


def torch_save_problem(path, size=None):
    """Why path is not a whole torch.save file (a zip holding */data.pkl), or None."""
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head != ZIP_LOCAL:
        if head[:1] == b"\x80":
            return "a legacy (non-zip) torch.save file: its end cannot be checked"
        return "not a torch.save zip" if head else "empty"
    problem, names = zip_listing(path, size)
    if problem:
        return problem
    if not any(name.endswith("/data.pkl") or name == "data.pkl" for name in names):
        return "a zip without data.pkl: not a torch.save file"
    return None


def safetensors_problem(path, size=None):
    """Why path is not a whole .safetensors file, or None."""
    size = os.path.getsize(path) if size is None else size
    if size < 8:
        return f"{size} bytes: no safetensors header (cut short)"
    with open(path, "rb") as handle:
        header_len = struct.unpack("<Q", handle.read(8))[0]
        if header_len > min(HEADER_LIMIT, size - 8):
            return f"header of {header_len} bytes does not fit in {size} bytes (cut short)"
        try:
            header = json.loads(handle.read(header_len))
        except ValueError as err:
            return f"header is not JSON ({err})"
    if not isinstance(header, dict):
        return "header is not a JSON object"
    ends = [t.get("data_offsets", [0, 0])[1] for k, t in header.items()
            if k != "__metadata__" and isinstance(t, dict)]
    data = size - 8 - header_len
    if max(ends, default=0) != data:
        return f"its tensors end at {max(ends, default=0)} bytes of data, the file holds {data} (cut short)"
    return None


def json_problem(path, size=None):
    try:
        with open(path, "rb") as handle:
            json.loads(handle.read())
    except ValueError as err:
        return f"does not parse as JSON ({err})"
    return None


def file_problem(path, size=None):
    """Why the file at path is not whole, by its kind, or None (a file of another kind
    counts when it exists). Damage of any shape is a problem, never an error."""
    try:
        return _file_problem(path, size)
    except (ValueError, struct.error, zipfile.BadZipFile, EOFError, KeyError) as err:
        return f"damaged ({err.__class__.__name__}: {err})"


def _file_problem(path, size):
    name = os.path.basename(path)
    if name.endswith(".safetensors"):
        return safetensors_problem(path, size)
    if name.endswith(".json"):
        return json_problem(path, size)
    if name.endswith(TORCH_SUFFIXES):
        return torch_save_problem(path, size)
    if name.endswith(".bin"):  # torch.save (training_args.bin, pytorch_model.bin), or opaque
        with open(path, "rb") as handle:
            head = handle.read(4)
        return torch_save_problem(path, size) if head == ZIP_LOCAL or head[:1] == b"\x80" else None
    return None


def pickled_int(path, key):
    """The int a torch.save file's data.pkl stores under key (the first such key), read from
    the pickle's opcodes without unpickling anything; None when it has none."""
    try:
        with zipfile.ZipFile(path) as archive:
            name = next((n for n in archive.namelist() if n.endswith("data.pkl")), None)
            if name is None or archive.getinfo(name).file_size > HEADER_LIMIT:
                return None
            data = archive.read(name)
        wanted = False
        for op, arg, _pos in pickletools.genops(io.BytesIO(data)):
            if op.name in MEMO_OPS:
                continue
            if wanted:
                return int(arg) if op.name in PICKLE_INT_OPS else None
            wanted = isinstance(arg, str) and arg == key
    except (OSError, zipfile.BadZipFile, ValueError, KeyError, EOFError, NotImplementedError, RuntimeError,
            struct.error):  # damaged: no step from it
        return None
    return None


# -- layouts ------------------------------------------------------------------------------------

def _names(listing):
    return sorted(listing)


class Layout:
    """One framework's way of saving. Subclasses set the class attributes and override the
    questions that differ."""

    name = ""
    title = ""
    source = ""
    entry = None            # regex of a checkpoint's name; group 1 its step
    dirs = True             # checkpoints are directories (else files)
    marker = None           # file a checkpoint directory holds once its save finished
    required = ()           # files (or alternatives, as tuples) a complete checkpoint holds
    aliases = ()            # names beside the checkpoints that are not checkpoints (globs)
    pointer = None          # a file or link naming the checkpoint the resume loads
    saves_on = frozenset()  # signals whose handler writes a checkpoint
    save_survives = frozenset()  # signals during which a save in progress still finishes
    resume_rule = ""

    def claims(self, name, path, is_dir):
        if is_dir != self.dirs or self.is_alias(name):
            return False
        return bool(self.entry and re.match(self.entry, name))

    def is_alias(self, name):
        return any(fnmatch.fnmatch(name, pat) for pat in self.aliases)

    def step(self, name, path):
        match = re.match(self.entry, name) if self.entry else None
        return int(match.group(1)) if match and match.group(1) else None

    def sort_key(self, name, info):
        return (info["step"] if info["step"] is not None else -1, info["mtime"])

    def marker_problems(self, directory, name, path, files):
        """Problems beyond the files themselves: the layout's own marker, and (whatever the
        layout) torch.distributed.checkpoint data without the .metadata DCP renames into place last."""
        found = _dcp_problems(path, files)
        if self.marker and self.marker not in files:
            found.append(f"no {self.marker} ({self.title} writes it last: the save did not finish)")
        for need in self.required:
            options = need if isinstance(need, tuple) else (need,)
            if not any(_present(files, option) for option in options):
                found.append(f"no {' or '.join(options)}")
        return found

    def pointed(self, directory):
        """The entry the layout's pointer names, or None."""
        return read_pointer(directory, self.pointer) if self.pointer else None

    def pointer_names(self, directory, name, info):
        """Whether the layout's pointer designates checkpoint name: True or False, None when the
        layout keeps no pointer or none is there yet."""
        if not self.pointer or not os.path.lexists(os.path.join(directory, self.pointer)):
            return None
        return self.pointed(directory) == name

    def resume_pick(self, directory, infos):
        """(name, words): the checkpoint the trainer's own resume loads, or (None, words)."""
        pointed = self.pointed(directory)
        if pointed is not None:
            return pointed, f"the one {self.pointer} names"
        ranked = sorted(infos, key=lambda n: self.sort_key(n, infos[n]))
        return (ranked[-1] if ranked else None), self.resume_rule

    def evidence(self, directory, listing):
        """Why directory looks like this layout (its checkpoints by name), or None."""
        claimed = [n for n, is_dir in listing.items() if self.claims(n, os.path.join(directory, n), is_dir)]
        if not claimed:
            return None
        return f"{len(claimed)} entr{'y' if len(claimed) == 1 else 'ies'} like {claimed[0]}"

    def describe(self):
        return {"name": self.name, "title": self.title, "saves_on": sorted(s.name for s in self.saves_on),
                "save_survives": sorted(s.name for s in self.save_survives)}


NO_DCP_METADATA = "no .metadata (DCP renames .metadata.tmp to .metadata last: the save did not finish)"


def _has_dcp_metadata(files):
    """DCP's .metadata (or a rank's own __R.metadata), or torchtitan's HF index."""
    return bool(files & {".metadata", "model.safetensors.index.json"}) or any(
        re.match(r"^__\d+\.metadata$", os.path.basename(f)) for f in files)


def _dcp_problems(path, files):
    """DCP data without its metadata, or rewritten after it. The coordinator writes .metadata
    once every rank's data is written, so data newer than it is a later save into the same
    checkpoint (an interrupt save at a periodic save's step, in place): the data the metadata
    describes is overwritten, cut short where that save did not finish. (Mtimes tick with the
    kernel's coarse clock, a few ms: a later save cut within that tick of the finish is not seen.)"""
    data = sorted(f for f in files if f.endswith(".distcp"))
    if not data:
        return []
    if not _has_dcp_metadata(files):
        return [NO_DCP_METADATA]
    metadata = [_mtime_ns(os.path.join(path, f)) for f in files
                if re.match(r"^(__\d+)?\.metadata$", os.path.basename(f))]
    written = max((m for m in metadata if m is not None), default=None)
    if written is None:  # torchtitan's HF index: no DCP metadata to compare with
        return []
    later = [f for f in data if (_mtime_ns(os.path.join(path, f)) or 0) > written]
    return [f"{', '.join(later)} written after .metadata (a later save into this checkpoint: the data "
            ".metadata describes is overwritten, cut short if that save did not finish)"] if later else []


def _mtime_ns(path):
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _present(files, pattern):
    return any(fnmatch.fnmatch(f, pattern) for f in files)


def read_pointer(directory, name):
    """The entry a pointer names: a file holding its name, or a symlink to it."""
    path = os.path.join(directory, name)
    try:
        if os.path.islink(path):
            return os.path.basename(os.readlink(path).rstrip("/")) or None
        with open(path, encoding="utf-8") as handle:
            return os.path.basename(handle.read(4096).strip().rstrip("/")) or None
    except (OSError, UnicodeDecodeError):
        return None


class StepDirs(Layout):
    name = "step_dirs"
    title = "step_N/ directories renamed into place, a latest pointer"
    source = ("this project's example trainer (tests/testbed/example_trainer): step_N/ written "
              "as .tmp-step_N-PID, renamed into place, then latest; it saves in its "
              "KeyboardInterrupt handler")
    entry = r"^step_(\d+)$"
    aliases = ("latest",)
    pointer = "latest"
    saves_on = frozenset({signal.SIGINT})
    save_survives = frozenset({signal.SIGINT})  # the handler writes the interrupted step again
    resume_rule = "the highest step_N (no latest pointer)"


class HFTrainer(Layout):
    name = "hf_trainer"
    title = "HF transformers Trainer"
    source = ("transformers src/transformers/trainer.py _save_checkpoint (model, tokenizer, "
              "training_args.bin, optimizer.pt, scheduler.pt, rng_state.pth, then "
              "trainer_state.json, then _rotate_checkpoints); trainer_utils.get_last_checkpoint")
    entry = r"^checkpoint-(\d+)$"
    marker = "trainer_state.json"
    resume_rule = "the highest checkpoint-N, unchecked (get_last_checkpoint)"

    def marker_problems(self, directory, name, path, files):
        found = super().marker_problems(directory, name, path, files)
        if found:
            return found
        try:
            with open(os.path.join(path, self.marker), "rb") as handle:
                step = json.loads(handle.read()).get("global_step")
        except (OSError, ValueError, AttributeError):
            return []  # the file check reports it
        if step != self.step(name, path):
            found.append(f"trainer_state.json says global_step {step}, not {self.step(name, path)}")
        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(index):
            found.extend(_sharded_problems(index, files))
        return found

    def resume_pick(self, directory, infos):
        ranked = sorted(infos, key=lambda n: infos[n]["step"])
        return (ranked[-1] if ranked else None), self.resume_rule


def _sharded_problems(index, files):
    try:
        with open(index, "rb") as handle:
            shards = set(json.loads(handle.read()).get("weight_map", {}).values())
    except (OSError, ValueError, AttributeError):
        return []
    return [f"no {shard} (the index lists it)" for shard in sorted(shards - set(files))]


class Lightning(Layout):
    name = "lightning"
    title = "PyTorch Lightning ModelCheckpoint"
    source = ("lightning src/lightning/pytorch/callbacks/model_checkpoint.py (epoch=E-step=S.ckpt, "
              "last.ckpt a link or a copy); fabric/utilities/cloud_io.py _atomic_save (torch.save "
              "through an fsspec transaction: a temporary file moved into place)")
    entry = r"^(?!last(-v\d+)?\.ckpt$).*\.ckpt$"
    dirs = False
    aliases = ("last.ckpt", "last-v*.ckpt")
    pointer = "last.ckpt"
    # Lightning's SIGTERM handler only sets a flag: the batch and a save in it finish
    save_survives = frozenset({signal.SIGTERM})
    resume_rule = "last.ckpt (ckpt_path='last'); otherwise only the path given"

    def step(self, name, path):
        match = re.search(r"(?:^|[-_])step=(\d+)", name)
        if match:
            return int(match.group(1))
        return pickled_int(path, "global_step")

    def pointer_names(self, directory, name, info):
        last = os.path.join(directory, self.pointer)
        if os.path.islink(last):
            return read_pointer(directory, self.pointer) == name
        if os.path.isfile(last):  # a copy of the newest save: the same step
            return pickled_int(last, "global_step") == info["step"]
        return None

    def resume_pick(self, directory, infos):
        last = os.path.join(directory, self.pointer)
        if os.path.islink(last):
            return read_pointer(directory, self.pointer), "the checkpoint last.ckpt links to"
        if os.path.isfile(last):
            return self.pointer, "last.ckpt (a copy of the newest save)"
        return None, "none: without last.ckpt Lightning resumes only from the path given"


class DeepSpeed(Layout):
    name = "deepspeed"
    title = "DeepSpeed save_checkpoint"
    source = ("DeepSpeed deepspeed/runtime/engine.py save_checkpoint, _save_checkpoint, "
              "_save_zero_checkpoint, _copy_recovery_script (model and optimizer states in "
              "the tag's directory, zero_to_fp32.py beside it, then latest); load_checkpoint "
              "reads latest")
    entry = r"^global_step(\d+)$"
    aliases = ("latest", "latest_universal", "zero_to_fp32.py")
    pointer = "latest"
    required = ("*model_states.pt",)
    resume_rule = "the tag latest names (no latest: nothing)"

    def claims(self, name, path, is_dir):
        if not is_dir or self.is_alias(name):
            return False
        if re.match(self.entry, name):
            return True
        try:  # a custom tag: a directory holding model states
            return any(f.endswith("model_states.pt") for f in os.listdir(path))
        except OSError:
            return False

    def step(self, name, path):
        step = super().step(name, path)
        if step is not None:
            return step
        try:
            states = sorted(f for f in os.listdir(path) if f.endswith("model_states.pt"))
        except OSError:
            return None
        return pickled_int(os.path.join(path, states[0]), "global_steps") if states else None

    def marker_problems(self, directory, name, path, files):
        found = super().marker_problems(directory, name, path, files)
        pointed = self.pointed(directory)
        named = os.path.join(directory, pointed) if pointed else None
        # latest is written last: a tag newer than the one it names did not finish (a latest cut
        # short names no tag, and says nothing of them)
        if not found and pointed != name and named and os.path.isdir(named) and \
                _newest_mtime(path) > _newest_mtime(named):
            found.append(f"latest names {pointed}, not {name} (DeepSpeed writes latest last: the save "
                         "did not finish)")
        return found

    def resume_pick(self, directory, infos):
        pointed = self.pointed(directory)
        return pointed, self.resume_rule if pointed is None else "the tag latest names"


def _newest_mtime(path):
    newest = os.stat(path).st_mtime
    for root, _dirs, files in os.walk(path):
        for item in files:
            try:
                newest = max(newest, os.stat(os.path.join(root, item)).st_mtime)
            except OSError:
                continue
    return newest


class DCP(Layout):
    name = "dcp"
    title = "torch.distributed.checkpoint (torchtitan)"
    source = ("torch/distributed/checkpoint/filesystem.py _FileSystemWriter.finish (data files "
              "__R_I.distcp in place, then .metadata.tmp renamed to .metadata); torchtitan "
              "components/checkpointer/dcp.py (step-N, the highest step with .metadata loads)")
    entry = r"^step-(\d+)$"
    resume_rule = "the highest step-N holding .metadata"

    def marker_problems(self, directory, name, path, files):
        return _dcp_problems(path, files) if _has_dcp_metadata(files) else [NO_DCP_METADATA]

    def resume_pick(self, directory, infos):
        done = [n for n in infos if os.path.exists(os.path.join(directory, n, ".metadata"))]
        ranked = sorted(done, key=lambda n: infos[n]["step"])
        return (ranked[-1] if ranked else None), self.resume_rule


class SpecForgeScripts(Layout):
    name = "specforge_scripts"
    title = "SpecForge scripts/train_*.py (epoch_E_step_S)"
    source = ("SpecForge scripts/train_dflash.py, train_eagle3.py save_checkpoint "
              "(training_state.pt, then save_pretrained: config.json, model.safetensors, then "
              "a copy of the model code; no marker); specforge/utils.py get_last_checkpoint")
    entry = r"^epoch_(\d+)(?:_step_(\d+))?$"
    required = ("training_state.pt", "config.json", ("model.safetensors", "model.safetensors.index.json",
                                                     "pytorch_model.bin"))
    resume_rule = "the highest (epoch, step), unchecked (get_last_checkpoint)"

    def step(self, name, path):
        match = re.match(self.entry, name)
        return int(match.group(2)) if match and match.group(2) else None

    def sort_key(self, name, info):
        match = re.match(self.entry, name)
        return (int(match.group(1)), int(match.group(2) or 0))

    def marker_problems(self, directory, name, path, files):
        found = super().marker_problems(directory, name, path, files)
        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(index):
            found.extend(_sharded_problems(index, files))
        return found


class SpecForge(Layout):
    name = "specforge"
    title = "SpecForge CheckpointManager ({run_id}-stepN, {run_id}-latest)"
    source = ("SpecForge specforge/training/checkpoint.py CheckpointManager.save (rank files and "
              "training_state.pt each torch.save to a .tmp and renamed, then the {run_id}-latest "
              "link); resolve_resume_dir, latest_dir")
    entry = r"^.+-step(\d+)$"
    marker = "training_state.pt"
    aliases = ("*-latest", "*-best", "*.best_meta.json")
    resume_rule = "the *-latest link, else the highest step holding training_state.pt"

    @staticmethod
    def latest_links(directory):
        try:
            return sorted(n for n in os.listdir(directory) if n.endswith("-latest")
                          and os.path.islink(os.path.join(directory, n)))
        except OSError:
            return []

    def pointer_names(self, directory, name, info):
        links = [n for n in self.latest_links(directory) if name.startswith(n[:-len("latest")])]
        return read_pointer(directory, links[0]) == name if links else None

    def resume_pick(self, directory, infos):
        links = self.latest_links(directory)
        if len(links) == 1:
            return read_pointer(directory, links[0]), f"the one {links[0]} links to"
        done = [n for n in infos if not infos[n]["problems"]]
        ranked = sorted(done, key=lambda n: infos[n]["step"])
        return (ranked[-1] if ranked else None), self.resume_rule


class Custom(Layout):
    """A layout described by the user: pattern (glob), marker, step_regex and pointer."""

    name = "custom"
    title = "custom"
    source = "the checkpoint_custom settings"
    resume_rule = "the pointer's entry, else the highest step, unchecked"

    def __init__(self, settings):
        settings = settings or {}
        self.pattern = settings.get("pattern")
        if not self.pattern:
            raise InvalidLayout("checkpoint_custom.pattern: required with checkpoint_format=custom")
        self.marker = settings.get("marker") or None
        self.pointer = settings.get("pointer") or None
        self.aliases = (self.pointer,) if self.pointer else ()
        self.step_regex = settings.get("step_regex") or None
        try:
            if self.step_regex and re.compile(self.step_regex).groups < 1:
                raise InvalidLayout(f"checkpoint_custom.step_regex: {self.step_regex!r} has no group for the step")
        except re.error as err:
            raise InvalidLayout(f"checkpoint_custom.step_regex: {err}") from None
        self.title = f"custom ({self.pattern})"

    def claims(self, name, path, is_dir):
        return not self.is_alias(name) and fnmatch.fnmatch(name, self.pattern)

    def step(self, name, path):
        match = re.search(self.step_regex, name) if self.step_regex else None
        return int(match.group(1)) if match else None


class InvalidLayout(ValueError):
    """A checkpoint format setting is wrong; the message names the setting."""


LAYOUTS = (StepDirs(), HFTrainer(), Lightning(), DeepSpeed(), DCP(), SpecForgeScripts(), SpecForge())
NAMES = ("auto",) + tuple(layout.name for layout in LAYOUTS) + ("custom",)
SAVES_ON = ("auto", "SIGINT", "SIGTERM", "none")
# the options of every module that reads a checkpoint directory (doc fragment
# dflash.lifecycle.checkpoint_format)
ARGUMENT_SPEC = {
    "checkpoint_format": {"type": "str", "choices": list(NAMES), "default": "auto"},
    "checkpoint_custom": {"type": "dict", "options": {
        "pattern": {"type": "str", "required": True},
        "marker": {"type": "str"},
        "step_regex": {"type": "str"},
        "pointer": {"type": "str"},
    }},
}


def signal_set(names):
    found = set()
    for name in names:
        try:
            found.add(signal.Signals[str(name).upper() if str(name).upper().startswith("SIG") else "SIG" + str(name).upper()])
        except KeyError:
            raise InvalidLayout(f"unknown signal {name!r}") from None
    return found


def layout(name, custom=None):
    """The layout called name (None for auto); InvalidLayout for an unknown name."""
    if name == "auto":
        return None
    if name == "custom":
        return Custom(custom)
    for candidate in LAYOUTS:
        if candidate.name == name:
            return candidate
    raise InvalidLayout(f"checkpoint_format: {name!r} is not one of {', '.join(NAMES)}")


def listing(directory):
    """{name: is a directory} of what directory holds, without temporary names' filter."""
    found = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return found
    for name in names:
        if name == MOVED_ASIDE:
            continue
        found[name] = os.path.isdir(os.path.join(directory, name)) and not os.path.islink(
            os.path.join(directory, name))
    return found


def recognise(directory, held=None):
    """(layout, reason) that the directory's entries show, or (None, reason) when none does.
    Several matching: the one that claims the most entries."""
    held = listing(directory) if held is None else held
    scored = []
    for candidate in LAYOUTS:
        words = candidate.evidence(directory, held)
        if words:
            claimed = sum(1 for n, d in held.items() if candidate.claims(n, os.path.join(directory, n), d))
            scored.append((claimed, -LAYOUTS.index(candidate), candidate, words))
    if not scored:
        shown = ", ".join(sorted(held)[:8]) + (" ..." if len(held) > 8 else "")
        return None, (f"no known checkpoint layout in {directory} (it holds {shown})" if held
                      else f"{directory} holds no checkpoint yet")
    scored.sort(reverse=True)
    best = scored[0]
    reason = f"auto: {best[3]}"
    if len(scored) > 1:
        reason += " (also like " + ", ".join(s[2].name for s in scored[1:]) + ")"
    return best[2], reason


def saves_on(setting, chosen):
    """(signals the trainer saves on, signals a save in progress survives, words) from the
    trainer_run_saves_on setting and the layout; (None, None, words) when unknown."""
    if setting and setting != "auto":
        signals = frozenset() if setting == "none" else frozenset(signal_set([setting]))
        survives = signals | (chosen.save_survives if chosen else frozenset())
        return signals, survives, f"saves_on={setting}"
    if chosen is None:
        return None, None, "saves_on=auto, and the checkpoint layout is not known yet"
    words = (f"a {chosen.title} trainer saves on " + "/".join(sorted(s.name for s in chosen.saves_on))
             if chosen.saves_on else f"a {chosen.title} trainer saves nothing on a signal")
    return chosen.saves_on, chosen.saves_on | chosen.save_survives, f"saves_on=auto: {words}"
