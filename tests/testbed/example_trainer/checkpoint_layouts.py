"""The example trainer's imitations of real frameworks' checkpoints (test-only, standard library).

``DFLASH_TEST_CHECKPOINT_LAYOUT=<name>`` makes the example trainer save, resume and react to
signals the way that framework does; the unit tests build checkpoint directories with the
same writers. Each layout writes that framework's real file formats, in the order its source
writes them (named in each class):

* ``torch.save`` files are real torch zips: the records ``data.pkl``, ``.format_version``,
  ``.storage_alignment``, ``byteorder``, ``data/<key>`` (float32 storages), ``version`` and
  ``.data/serialization_id`` under one prefix, as ``torch/serialization.py _save`` writes
  them, with a protocol-2 ``data.pkl`` that rebuilds tensors through
  ``torch._utils._rebuild_tensor_v2`` - ``torch.load`` loads them (a unit test checks it with
  the real torch);
* ``.safetensors`` files: an 8-byte header length, the JSON header, the data (the real
  ``safetensors`` package reads them);
* JSON files.

Every file is written in chunks through a Pace, so a save can be made slow
(``DFLASH_TEST_SLOW_CHECKPOINT_SECONDS``), paused in the middle
(``DFLASH_TEST_SAVE_PAUSE_SECONDS``: a quiet gap after its first file) and killed at any
point, leaving exactly what that framework leaves.
"""

import array
import collections
import contextlib
import io
import json
import os
import pickle
import random
import re
import shutil
import signal
import struct
import sys
import tempfile
import time
import types
import zipfile
import zlib

CHUNKS_PER_FILE = 8


class Pace:
    """Spreads a save over slow seconds and pauses once after its first file."""

    def __init__(self, slow=0.0, pause=0.0, files=1):
        self.per_chunk = float(slow) / max(1, files * CHUNKS_PER_FILE)
        self.pause = float(pause)
        self.files_done = 0

    @classmethod
    def from_env(cls, files, reason):
        """The test switches, for the saves DFLASH_TEST_SLOW_SAVES names (all, interval, interrupt)."""
        env = os.environ
        if env.get("DFLASH_TEST_SLOW_SAVES", "all") not in ("all", reason):
            return cls()
        return cls(float(env.get("DFLASH_TEST_SLOW_CHECKPOINT_SECONDS", "0")),
                   float(env.get("DFLASH_TEST_SAVE_PAUSE_SECONDS", "0")), files)

    def chunk(self):
        if self.per_chunk:
            time.sleep(self.per_chunk)

    def file_done(self):
        self.files_done += 1
        if self.files_done == 1 and self.pause:
            time.sleep(self.pause)


class CountWrites(Pace):
    """Counts the writes of a save (every chunk and every file's end), at full speed."""

    def __init__(self):
        super().__init__()
        self.writes = 0

    def chunk(self):
        self.writes += 1

    def file_done(self):
        self.writes += 1


class KillAt(CountWrites):
    """SIGKILLs its own process at write number at: what a kill in the middle of a save leaves."""

    def __init__(self, at):
        super().__init__()
        self.at = at

    def chunk(self):
        super().chunk()
        if self.writes >= self.at:
            os.kill(os.getpid(), signal.SIGKILL)

    def file_done(self):
        super().file_done()
        if self.writes >= self.at:
            os.kill(os.getpid(), signal.SIGKILL)


class Tensor:
    """A float32 tensor of the imitations."""

    def __init__(self, values, shape=None):
        self.values = array.array("f", values)
        self.shape = tuple(shape) if shape else (len(self.values),)

    def tobytes(self):
        data = array.array("f", self.values)
        if sys.byteorder != "little":
            data.byteswap()
        return data.tobytes()


def matrix(weights):
    return Tensor([v for row in weights for v in row], (len(weights), len(weights[0])))


def unmatrix(values, rows):
    values = list(values)
    cols = len(values) // rows
    return [values[r * cols:(r + 1) * cols] for r in range(rows)]


def payload(kib):
    """An optimizer-like tensor of kib KiB, so a save has bytes to write."""
    rng = random.Random(kib)
    return Tensor([rng.random() for _ in range(max(1, int(kib) * 256))])


# -- torch.save -------------------------------------------------------------------------------

class _StorageRef:
    def __init__(self, key, tensor):
        self.key, self.tensor = key, tensor


@contextlib.contextmanager
def _torch_names():
    """torch._utils._rebuild_tensor_v2 and torch.FloatStorage as names pickle can refer to:
    the pickle torch.save writes names them (GLOBAL opcodes); torch itself is not needed."""
    torch = types.ModuleType("torch")
    utils = types.ModuleType("torch._utils")

    def _rebuild_tensor_v2(*args):
        raise RuntimeError("a name for pickle only")

    _rebuild_tensor_v2.__module__, _rebuild_tensor_v2.__qualname__ = "torch._utils", "_rebuild_tensor_v2"
    storage = type("FloatStorage", (), {"__module__": "torch"})
    torch._utils, utils._rebuild_tensor_v2, torch.FloatStorage = utils, _rebuild_tensor_v2, storage
    saved = {name: sys.modules.get(name) for name in ("torch", "torch._utils")}
    sys.modules.update({"torch": torch, "torch._utils": utils})
    try:
        yield _rebuild_tensor_v2, storage
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _torch_pickle(obj):
    """data.pkl of obj and its storages {key: bytes}, as torch.save pickles them."""
    storages = collections.OrderedDict()
    with _torch_names() as (rebuild, storage_class):

        class TorchPickler(pickle.Pickler):
            def reducer_override(self, item):
                if isinstance(item, Tensor):
                    key = str(len(storages))
                    storages[key] = item.tobytes()
                    stride, acc = [], 1
                    for dim in reversed(item.shape):
                        stride.insert(0, acc)
                        acc *= dim
                    return rebuild, (_StorageRef(key, item), 0, item.shape, tuple(stride), False,
                                     collections.OrderedDict())
                return NotImplemented

            def persistent_id(self, item):
                if isinstance(item, _StorageRef):
                    return ("storage", storage_class, item.key, "cpu", len(item.tensor.values))
                return None

        buffer = io.BytesIO()
        TorchPickler(buffer, protocol=2).dump(obj)
    return buffer.getvalue(), storages


def torch_save(path, obj, pace):
    """Write obj as torch.save does (records in its order), chunk by chunk."""
    data_pkl, storages = _torch_pickle(obj)
    prefix = os.path.splitext(os.path.basename(path))[0]
    records = [("data.pkl", data_pkl), (".format_version", b"1"), (".storage_alignment", b"64"),
               ("byteorder", sys.byteorder.encode())]
    records += [(f"data/{key}", data) for key, data in storages.items()]
    records += [("version", b"3\n"), (".data/serialization_id", str(random.getrandbits(120)).encode())]
    step = max(1, sum(len(data) for _name, data in records) // CHUNKS_PER_FILE)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name, data in records:
            with archive.open(f"{prefix}/{name}", "w") as record:
                _in_chunks(record, data, step, pace)
    pace.file_done()


def sparse_torch_save(path, record_sizes):
    """A torch.save-layout zip64 archive whose storages are holes (a sparse file): data.pkl and
    the small records, then data/0 ... of the given sizes, zeros never written. For the
    completeness check's benchmark at checkpoint sizes (20 GB) a disk need not hold."""
    prefix = os.path.splitext(os.path.basename(path))[0]
    records = [("data.pkl", pickle.dumps({"records": len(record_sizes)}, protocol=2)),
               (".format_version", b"1"), (".storage_alignment", b"64"), ("byteorder", b"little")]
    records += [(f"data/{index}", size) for index, size in enumerate(record_sizes)]
    records += [("version", b"3\n")]
    zero_crc = {}
    central = []
    with open(path, "wb") as handle:
        for name, data in records:
            full = f"{prefix}/{name}".encode()
            size = data if isinstance(data, int) else len(data)
            if isinstance(data, int):
                if size not in zero_crc:
                    zero_crc[size] = _zero_crc(size)
                crc = zero_crc[size]
            else:
                crc = zlib.crc32(data)
            offset = handle.tell()
            extra = struct.pack("<HHQQ", 1, 16, size, size)
            handle.write(struct.pack("<4s5H3I2H", b"PK\x03\x04", 45, 0, 0, 0, 0, crc, 0xFFFFFFFF,
                                     0xFFFFFFFF, len(full), len(extra)) + full + extra)
            if isinstance(data, int):
                handle.seek(size, os.SEEK_CUR)  # the hole
            else:
                handle.write(data)
            central.append((full, crc, size, offset))
        cd_offset = handle.tell()
        for full, crc, size, offset in central:
            extra = struct.pack("<HHQQQ", 1, 24, size, size, offset)
            handle.write(struct.pack("<4s6H3I5H2I", b"PK\x01\x02", 45, 45, 0, 0, 0, 0, crc, 0xFFFFFFFF,
                                     0xFFFFFFFF, len(full), len(extra), 0, 0, 0, 0, 0xFFFFFFFF) + full + extra)
        cd_size = handle.tell() - cd_offset
        zip64_end = handle.tell()
        handle.write(struct.pack("<4sQ2H2I4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, len(central), len(central),
                                 cd_size, cd_offset))
        handle.write(struct.pack("<4sIQI", b"PK\x06\x07", 0, zip64_end, 1))
        handle.write(struct.pack("<4s4H2IH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0))


def _zero_crc(size, block=1 << 24):
    crc, zeros = 0, bytes(block)
    while size > 0:
        crc = zlib.crc32(zeros[:min(size, block)], crc)
        size -= block
    return crc


def sparse_safetensors(path, tensor_bytes):
    """A .safetensors file of tensors of the given sizes whose data is a hole (sparse)."""
    header, offset = {}, 0
    for index, size in enumerate(tensor_bytes):
        header[f"model.layers.{index}.weight"] = {"dtype": "BF16", "shape": [size // 2],
                                                  "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(text)) + text)
        handle.truncate(8 + len(text) + offset)


def torch_load(path):
    """obj of a torch.save file written here (tensors back as lists of floats)."""
    with zipfile.ZipFile(path) as archive:
        prefix = archive.namelist()[0].split("/")[0]
        storages = {}

        class TorchUnpickler(pickle.Unpickler):
            def find_class(self, module, name):
                if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
                    return lambda storage, offset, shape, stride, grad, hooks: list(storage)
                if (module, name) == ("torch", "FloatStorage"):
                    return "float32"
                if (module, name) == ("collections", "OrderedDict"):
                    return collections.OrderedDict
                raise pickle.UnpicklingError(f"{module}.{name} is not expected in a checkpoint")

            def persistent_load(self, pid):
                _kind, _type, key, _where, _numel = pid
                if key not in storages:
                    values = array.array("f")
                    values.frombytes(archive.read(f"{prefix}/data/{key}"))
                    storages[key] = values
                return storages[key]

        return TorchUnpickler(io.BytesIO(archive.read(f"{prefix}/data.pkl"))).load()


# -- safetensors and JSON -----------------------------------------------------------------------

def safetensors_save(path, tensors, pace, metadata=None):
    """A .safetensors file: header length, JSON header (padded to 8 bytes), the data."""
    header, offset, blobs = {}, 0, []
    for name, tensor in tensors.items():
        data = tensor.tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensor.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    _write_chunks(path, struct.pack("<Q", len(text)) + text + b"".join(blobs), pace)


def safetensors_load(path):
    with open(path, "rb") as handle:
        length = struct.unpack("<Q", handle.read(8))[0]
        header = json.loads(handle.read(length))
        data = handle.read()
    ends = [spec["data_offsets"][1] for name, spec in header.items() if name != "__metadata__"]
    if max(ends, default=0) != len(data):  # safetensors' own reader refuses it too
        raise ValueError(f"{path}: the header's tensors end at {max(ends, default=0)}, the data is {len(data)} bytes")
    found = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        values = array.array("f")
        values.frombytes(data[spec["data_offsets"][0]:spec["data_offsets"][1]])
        found[name] = list(values)
    return found


def read_file(path):
    """The content of a checkpoint file, by its kind, as its framework's loader reads it."""
    if path.endswith(".json"):
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    if path.endswith(".safetensors"):
        return safetensors_load(path)
    if path.endswith(".metadata"):
        with open(path, "rb") as handle:
            return pickle.load(handle)
    return torch_load(path)


def json_save(path, obj, pace):
    _write_chunks(path, json.dumps(obj, indent=2).encode(), pace)


def _write_chunks(path, data, pace):
    with open(path, "wb") as handle:
        _in_chunks(handle, data, max(1, len(data) // CHUNKS_PER_FILE), pace)
    pace.file_done()


def _in_chunks(handle, data, step, pace):
    """data written step bytes at a time, each flushed: a kill between two leaves the first."""
    for at in range(0, len(data), step):
        handle.write(data[at:at + step])
        handle.flush()
        pace.chunk()


def _replace_into(path, write):
    """Write to path.tmp, then rename it onto path (an atomic save)."""
    write(path + ".tmp")
    os.replace(path + ".tmp", path)


# -- the layouts --------------------------------------------------------------------------------

class Layout:
    """One framework's save, resume and signals. None saves on a signal (DFLASH_TEST_SAVES_ON
    makes one); finishes_save_on: the signals that let a save in progress finish."""

    name = ""
    files = 1
    finishes_save_on = ()
    # the files of a checkpoint directory its framework's resume reads (each must load); the
    # others it writes (tokenizer files, the model code, ...) a resume never opens
    resume_reads = ()

    def __init__(self, output_dir, kib=64):
        self.output_dir = output_dir
        self.kib = kib

    def path(self, name):
        return os.path.join(self.output_dir, name)

    def optimizer(self):
        return {"state": {0: {"exp_avg": payload(self.kib)}}, "param_groups": [{"lr": 6e-4, "params": [0]}]}

    def read_resume(self, path):
        """{file: its content} of every file in resume_reads, read as the framework's resume
        does: a missing or cut one raises."""
        return {name: read_file(os.path.join(path, name)) for name in self.resume_reads}


class HFTrainer(Layout):
    """transformers Trainer._save_checkpoint: checkpoint-N/ written in place - save_model
    (config.json, generation_config.json, model.safetensors, tokenizer files,
    training_args.bin), _save_optimizer_and_scheduler (optimizer.pt, scheduler.pt),
    _save_rng_state (rng_state.pth), then trainer_state.json last; then _rotate_checkpoints
    removes the oldest beyond save_total_limit. Resume: trainer_utils.get_last_checkpoint,
    the highest checkpoint-N, unchecked. No signal handler: a SIGINT ends it wherever it is."""

    name = "hf_trainer"
    files = 11
    save_total_limit = 3
    # Trainer._load_from_checkpoint (config.json parsed, the weights), _load_optimizer_and_scheduler,
    # _load_rng_state, TrainerState.load_from_json
    resume_reads = ("config.json", "model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth",
                    "trainer_state.json")

    def save(self, state, weights, pace):
        final = self.path(f"checkpoint-{state['step']}")
        os.makedirs(final, exist_ok=True)
        json_save(os.path.join(final, "config.json"), {"model_type": "dflash-drafter", "vocab_size": 32}, pace)
        json_save(os.path.join(final, "generation_config.json"), {"_from_model_config": True}, pace)
        safetensors_save(os.path.join(final, "model.safetensors"), {"weights": matrix(weights)}, pace,
                         {"format": "pt"})
        json_save(os.path.join(final, "tokenizer.json"), {"version": "1.0", "model": {"type": "BPE"}}, pace)
        json_save(os.path.join(final, "tokenizer_config.json"), {"model_max_length": 8192}, pace)
        json_save(os.path.join(final, "special_tokens_map.json"), {"eos_token": "</s>"}, pace)
        torch_save(os.path.join(final, "training_args.bin"), {"output_dir": self.output_dir}, pace)
        torch_save(os.path.join(final, "optimizer.pt"), self.optimizer(), pace)
        torch_save(os.path.join(final, "scheduler.pt"), {"last_epoch": state["step"]}, pace)
        torch_save(os.path.join(final, "rng_state.pth"), {"python": random.getstate()[1][:4]}, pace)
        json_save(os.path.join(final, "trainer_state.json"),
                  {"global_step": state["step"], "epoch": state["epoch"], "tokens": state["tokens"],
                   "log_history": [], "best_model_checkpoint": None}, pace)
        numbered = sorted((int(n.split("-")[1]), n) for n in os.listdir(self.output_dir)
                          if re.match(r"^checkpoint-\d+$", n))
        for _step, name in numbered[:-self.save_total_limit]:
            shutil.rmtree(self.path(name), ignore_errors=True)
        return final

    def resume_path(self):
        numbered = [(int(n.split("-")[1]), n) for n in os.listdir(self.output_dir)
                    if re.match(r"^checkpoint-\d+$", n) and os.path.isdir(self.path(n))]
        return self.path(max(numbered)[1]) if numbered else None

    def load(self, path):
        found = self.read_resume(path)
        saved = found["trainer_state.json"]
        return ({"step": saved["global_step"], "epoch": saved["epoch"], "tokens": saved["tokens"]},
                found["model.safetensors"]["weights"])


class Lightning(Layout):
    """Lightning ModelCheckpoint: epoch=E-step=S.ckpt saved by fabric's _atomic_save (torch.save
    into a temporary file of $TMPDIR, then moved into place: a copy into the final name when
    DFLASH_TEST_LIGHTNING_CROSS_FS=1, as across file systems), then last.ckpt saved the same
    way (save_last=True: a copy). Resume: ckpt_path="last". SIGTERM only sets a flag (the
    batch and a save in it finish); SIGINT is a KeyboardInterrupt, caught for a graceful
    shutdown without a save."""

    name = "lightning"
    files = 2
    finishes_save_on = ("SIGTERM",)

    def _atomic(self, final, obj, pace):
        if os.environ.get("DFLASH_TEST_LIGHTNING_CROSS_FS") == "1":
            torch_save(final, obj, pace)
            return
        fd, tmp = tempfile.mkstemp()
        os.close(fd)
        torch_save(tmp, obj, pace)
        shutil.move(tmp, final)

    def save(self, state, weights, pace):
        obj = {"epoch": state["epoch"], "global_step": state["step"], "pytorch-lightning_version": "2.5.0",
               "tokens": state["tokens"], "state_dict": {"weights": matrix(weights)},
               "optimizer_states": [self.optimizer()], "loops": {}}
        final = self.path(f"epoch={state['epoch']}-step={state['step']}.ckpt")
        self._atomic(final, obj, pace)
        self._atomic(self.path("last.ckpt"), obj, pace)
        return final

    def resume_path(self):
        last = self.path("last.ckpt")
        return last if os.path.exists(last) else None

    def load(self, path):
        obj = torch_load(path)
        return ({"step": obj["global_step"], "epoch": obj["epoch"], "tokens": obj["tokens"]},
                obj["state_dict"]["weights"])


class DeepSpeed(Layout):
    """DeepSpeed engine.save_checkpoint: global_stepN/mp_rank_00_model_states.pt
    (_save_checkpoint), global_stepN/zero_pp_rank_0_mp_rank_00_optim_states.pt
    (_save_zero_checkpoint), zero_to_fp32.py copied beside the tags (_copy_recovery_script),
    then latest, holding the tag, last. Resume: load_checkpoint reads latest. No signal
    handler."""

    name = "deepspeed"
    files = 4
    # load_checkpoint: _load_checkpoint (the module states), _load_zero_checkpoint (the optimizer's)
    resume_reads = ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt")

    def save(self, state, weights, pace):
        tag = f"global_step{state['step']}"
        final = self.path(tag)
        os.makedirs(final, exist_ok=True)
        torch_save(os.path.join(final, "mp_rank_00_model_states.pt"),
                   {"module": {"weights": matrix(weights)}, "global_steps": state["step"],
                    "global_samples": state["tokens"], "epoch": state["epoch"], "ds_version": "0.18.0"}, pace)
        torch_save(os.path.join(final, "zero_pp_rank_0_mp_rank_00_optim_states.pt"),
                   {"optimizer_state_dict": self.optimizer(), "ds_version": "0.18.0"}, pace)
        _write_chunks(self.path("zero_to_fp32.py"), b"#!/usr/bin/env python\n# recovery script\n", pace)
        _write_chunks(self.path("latest"), tag.encode(), pace)
        return final

    def resume_path(self):
        try:
            with open(self.path("latest"), encoding="utf-8") as handle:
                return self.path(handle.read().strip())
        except OSError:
            return None

    def load(self, path):
        obj = self.read_resume(path)["mp_rank_00_model_states.pt"]
        return ({"step": obj["global_steps"], "epoch": obj["epoch"], "tokens": obj["global_samples"]},
                obj["module"]["weights"])


class DCP(Layout):
    """torch.distributed.checkpoint FileSystemWriter (torchtitan's step-N folders): the data
    files __<rank>_<n>.distcp written in place (torch.save records of the items), then
    .metadata.tmp written and renamed to .metadata (_FileSystemWriter.finish). Resume
    (torchtitan): the highest step-N holding .metadata. No signal handler."""

    name = "dcp"
    files = 3
    # dcp.load: the metadata, then every item of the state dict (model and optimizer) from its file
    resume_reads = (".metadata", "__0_0.distcp", "__0_1.distcp")

    def save(self, state, weights, pace):
        final = self.path(f"step-{state['step']}")
        os.makedirs(final, exist_ok=True)
        torch_save(os.path.join(final, "__0_0.distcp"), {"weights": matrix(weights)}, pace)
        torch_save(os.path.join(final, "__0_1.distcp"), self.optimizer(), pace)
        meta = {"state_dict_metadata": {"weights": [32, 32]}, "step": state["step"],
                "epoch": state["epoch"], "tokens": state["tokens"]}
        _write_chunks(os.path.join(final, ".metadata.tmp"), pickle.dumps(meta, protocol=2), pace)
        os.rename(os.path.join(final, ".metadata.tmp"), os.path.join(final, ".metadata"))
        return final

    def resume_path(self):
        done = [(int(n.split("-")[1]), n) for n in os.listdir(self.output_dir)
                if re.match(r"^step-\d+$", n) and os.path.exists(self.path(os.path.join(n, ".metadata")))]
        return self.path(max(done)[1]) if done else None

    def load(self, path):
        found = self.read_resume(path)
        meta = found[".metadata"]
        return ({"step": meta["step"], "epoch": meta["epoch"], "tokens": meta["tokens"]},
                found["__0_0.distcp"]["weights"])


class SpecForgeScripts(Layout):
    """SpecForge scripts/train_dflash.py save_checkpoint (before the CheckpointManager):
    epoch_E_step_S/ in place - training_state.pt (torch.save), then save_pretrained
    (config.json, model.safetensors), then a copy of the model code (dflash.py); no marker.
    Resume: specforge/utils.py get_last_checkpoint, the highest (epoch, step), unchecked.
    No signal handler."""

    name = "specforge_scripts"
    files = 4
    # the training state (torch.load), the draft model's from_pretrained (config, weights)
    resume_reads = ("training_state.pt", "config.json", "model.safetensors")

    def save(self, state, weights, pace):
        final = self.path(f"epoch_{state['epoch']}_step_{state['step']}")
        os.makedirs(final, exist_ok=True)
        torch_save(os.path.join(final, "training_state.pt"),
                   {"epoch": state["epoch"], "global_step": state["step"], "tokens": state["tokens"],
                    **self.optimizer()}, pace)
        json_save(os.path.join(final, "config.json"), {"architectures": ["DFlashDraftModel"]}, pace)
        safetensors_save(os.path.join(final, "model.safetensors"), {"weights": matrix(weights)}, pace,
                         {"format": "pt"})
        _write_chunks(os.path.join(final, "dflash.py"), b"# the draft model's code\n" * 64, pace)
        return final

    def resume_path(self):
        found = []
        for name in os.listdir(self.output_dir):
            match = re.match(r"^epoch_(\d+)(?:_step_(\d+))?$", name)
            if match and os.path.isdir(self.path(name)):
                found.append((int(match.group(1)), int(match.group(2) or 0), name))
        return self.path(max(found)[2]) if found else None

    def load(self, path):
        found = self.read_resume(path)
        saved = found["training_state.pt"]
        return ({"step": saved["global_step"], "epoch": saved["epoch"], "tokens": saved["tokens"]},
                found["model.safetensors"]["weights"])


class SpecForge(Layout):
    """SpecForge specforge/training/checkpoint.py CheckpointManager.save: {run_id}-stepN/
    created, training_state_rank0.pt and training_state.pt each torch.save'd to a .tmp and
    renamed (_atomic_save), then the {run_id}-latest symlink repointed (_point), then the
    oldest rotated away. Resume: latest_dir, the -latest link. SIGINT and SIGTERM unwind
    the run (specforge/cli.py) without a save."""

    name = "specforge"
    files = 2
    # CheckpointManager.load: the shared training state and this rank's (its rank_state)
    resume_reads = ("training_state.pt", "training_state_rank0.pt")
    run_id = "dflash"
    max_checkpoints = 3

    def save(self, state, weights, pace):
        final = self.path(f"{self.run_id}-step{state['step']}")
        os.makedirs(final, exist_ok=True)
        _replace_into(os.path.join(final, "training_state_rank0.pt"),
                      lambda tmp: torch_save(tmp, {"optimizer": self.optimizer()}, pace))
        _replace_into(os.path.join(final, "training_state.pt"),
                      lambda tmp: torch_save(tmp, {"step": state["step"], "epoch": state["epoch"],
                                                   "tokens": state["tokens"],
                                                   "model": {"weights": matrix(weights)}}, pace))
        link = self.path(f"{self.run_id}-latest")
        if os.path.islink(link):
            os.remove(link)
        os.symlink(os.path.basename(final), link)
        steps = sorted((int(n.rsplit("step", 1)[1]), n) for n in os.listdir(self.output_dir)
                       if re.match(rf"^{self.run_id}-step\d+$", n))
        for _step, name in steps[:-self.max_checkpoints]:
            shutil.rmtree(self.path(name), ignore_errors=True)
        return final

    def resume_path(self):
        link = self.path(f"{self.run_id}-latest")
        return os.path.realpath(link) if os.path.islink(link) else None

    def load(self, path):
        saved = self.read_resume(path)["training_state.pt"]
        return ({"step": saved["step"], "epoch": saved["epoch"], "tokens": saved["tokens"]},
                saved["model"]["weights"])


LAYOUTS = {cls.name: cls for cls in (HFTrainer, Lightning, DeepSpeed, DCP, SpecForgeScripts, SpecForge)}


def named(name, output_dir, kib=64):
    if name not in LAYOUTS:
        raise SystemExit(f"DFLASH_TEST_CHECKPOINT_LAYOUT={name!r}: one of {', '.join(sorted(LAYOUTS))}")
    return LAYOUTS[name](output_dir, kib)


def writes_of_a_save(name, scratch):
    """How many writes one save of layout name makes (in scratch, a directory of its own)."""
    pace = CountWrites()
    os.makedirs(scratch, exist_ok=True)
    named(name, scratch, 16).save({"step": 1, "epoch": 0, "tokens": 1}, [[0.0] * 32] * 32, pace)
    return pace.writes


def judge(name, output_dir, paths):
    """What the framework itself finds: the checkpoint its resume picks and the step that loads
    (None when it does not load), for each path the step it loads, and the files its resume
    reads (reads)."""
    if name == "step_dirs":
        import train_dflash_pipeline as trainer  # beside this file

        def resume_path():
            return trainer.latest_checkpoint(output_dir)

        def load(path):
            return trainer.load_checkpoint(path, trainer.Model())
        reads = ("model.json", "trainer_state.json")
    else:
        layout = named(name, output_dir)
        resume_path, load, reads = layout.resume_path, lambda path: layout.load(path)[0], layout.resume_reads

    def loads(path):
        try:
            return load(path)["step"]
        except Exception:  # noqa: BLE001 - what the framework's loader raises on a cut file
            return None

    pick = resume_path()
    return {"pick": os.path.basename(pick) if pick else None, "pick_loads": loads(pick) if pick else None,
            "loads": {path: loads(path) for path in paths}, "reads": list(reads)}


def main(argv):
    """judge LAYOUT DIR [PATH...]: what judge() says, as JSON. cut LAYOUT DIR STEP FRACTION: a
    save of STEP killed (SIGKILL) after that fraction of its writes, as a crash leaves it."""
    if argv[0] == "judge":
        print(json.dumps(judge(argv[1], argv[2], argv[3:])))
    elif argv[0] == "cut":
        at = max(1, int(writes_of_a_save(argv[1], tempfile.mkdtemp()) * float(argv[4])))
        named(argv[1], argv[2], 16).save({"step": int(argv[3]), "epoch": 0, "tokens": 0},
                                         [[0.0] * 32] * 32, KillAt(at))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
