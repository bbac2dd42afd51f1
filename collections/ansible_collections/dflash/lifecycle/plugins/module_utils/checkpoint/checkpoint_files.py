# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whether a checkpoint's files are whole, by their kind, read with the standard library (Python
3.8 compatible: the CT has a bare Python). The layouts (module_utils/checkpoint/layouts/) ask it.

* a ``torch.save`` zip: the end-of-central-directory record at the end of the file (zip64
  too), the central directory right before it, every entry's data inside the file;
* a ``.safetensors`` file: its header's ``data_offsets`` end exactly at the file's end;
* a ``.json`` file: it parses;
* torch.distributed.checkpoint data (``.distcp``): its ``.metadata`` there, and no data newer
  than it.

Only headers and tails are read, so a 20 GB checkpoint is judged in milliseconds
(``bench/checkpoint_check.py``). Pointers (a file naming a checkpoint, or a link to it) are
read here too.
"""

from __future__ import annotations

import io
import json
import os
import pickletools
import re
import struct
import zipfile

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


NO_DCP_METADATA = "no .metadata (DCP renames .metadata.tmp to .metadata last: the save did not finish)"


def has_dcp_metadata(files):
    """DCP's .metadata (or a rank's own __R.metadata), or torchtitan's HF index."""
    return bool(files & {".metadata", "model.safetensors.index.json"}) or any(
        re.match(r"^__\d+\.metadata$", os.path.basename(f)) for f in files)


def dcp_problems(path, files):
    """DCP data without its metadata, or rewritten after it. The coordinator writes .metadata
    once every rank's data is written, so data newer than it is a later save into the same
    checkpoint (an interrupt save at a periodic save's step, in place): the data the metadata
    describes is overwritten, cut short where that save did not finish. (Mtimes tick with the
    kernel's coarse clock, a few ms: a later save cut within that tick of the finish is not seen.)"""
    data = sorted(f for f in files if f.endswith(".distcp"))
    if not data:
        return []
    if not has_dcp_metadata(files):
        return [NO_DCP_METADATA]
    metadata = [mtime_ns(os.path.join(path, f)) for f in files
                if re.match(r"^(__\d+)?\.metadata$", os.path.basename(f))]
    written = max((m for m in metadata if m is not None), default=None)
    if written is None:  # torchtitan's HF index: no DCP metadata to compare with
        return []
    later = [f for f in data if (mtime_ns(os.path.join(path, f)) or 0) > written]
    return [f"{', '.join(later)} written after .metadata (a later save into this checkpoint: the data "
            ".metadata describes is overwritten, cut short if that save did not finish)"] if later else []


def mtime_ns(path):
    """path's mtime in nanoseconds; None when it is gone."""
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


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


def sharded_problems(index, files):
    try:
        with open(index, "rb") as handle:
            shards = set(json.loads(handle.read()).get("weight_map", {}).values())
    except (OSError, ValueError, AttributeError):
        return []
    return [f"no {shard} (the index lists it)" for shard in sorted(shards - set(files))]


def newest_mtime(path):
    newest = os.stat(path).st_mtime
    for root, _dirs, files in os.walk(path):
        for item in files:
            try:
                newest = max(newest, os.stat(os.path.join(root, item)).st_mtime)
            except OSError:
                continue
    return newest
