"""Read a DCP `.metadata` file without torch and without running code from it.

`.metadata` is a pickle written by user pods, so the operator must never hand it to the full
unpickler. This unpickler resolves only an allow-list of globals (DCP metadata classes, torch
dtypes/sizes/layouts, pathlib paths) and maps each to an inert stand-in that merely records its
arguments and state. Anything else (os.system, builtins.eval, ...) raises `UnsafeMetadata`.
Torch versions add or rename fields, so callers read only `storage_entries()` and tolerate the rest.
"""

from __future__ import annotations

import io
import pathlib
import pickle
from dataclasses import dataclass
from typing import Any

MAX_METADATA_BYTES = 512 * 1024 * 1024


class UnsafeMetadata(pickle.UnpicklingError):
    """The pickle referenced a global outside the allow-list: it is skipped, never executed."""


class MalformedMetadata(ValueError):
    """The file is not a DCP metadata pickle we can read."""


class _Inert:
    """Stand-in for an allow-listed class: stores constructor args and pickled state, nothing else."""

    _qualname = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> _Inert:
        obj = super().__new__(cls)
        obj.__dict__["_args"] = args
        obj.__dict__["_state"] = {}
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        # Dataclasses with __slots__ pickle as (dict | None, slots dict); plain ones as a dict;
        # classes with a custom __getstate__ may pickle a tuple, which we keep as-is.
        merged: dict[str, Any] = {}
        if isinstance(state, tuple) and len(state) == 2 and all(s is None or isinstance(s, dict) for s in state):
            for part in state:
                merged.update(part or {})
        elif isinstance(state, dict):
            merged.update(state)
        else:
            merged["_raw"] = state
        self.__dict__["_state"] = merged

    def get(self, name: str, default: Any = None) -> Any:
        return self.__dict__["_state"].get(name, default)

    def __reduce__(self) -> Any:  # never re-pickled
        raise TypeError("inert metadata stand-ins cannot be pickled")

    def __repr__(self) -> str:
        return f"<{self._qualname} {self.__dict__['_state'] or self.__dict__['_args']}>"


def _inert(qualname: str) -> type[_Inert]:
    return type(qualname.rsplit(".", 1)[-1], (_Inert,), {"_qualname": qualname})


def _value(*args: Any) -> Any:
    """torch.Size(tuple), _get_layout('torch.strided'), dtype/enum lookups: keep the plain value."""
    return args[0] if len(args) == 1 else args


_DCP_MODULES = (
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.filesystem",
    "torch.distributed.checkpoint.planner",
    "torch.distributed.checkpoint.storage",
    "torch.distributed.checkpoint._extension",
)
_SAFE_BUILTINS = {
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "slice"): slice,
    ("builtins", "complex"): complex,
    ("collections", "OrderedDict"): dict,
    ("pathlib", "PosixPath"): pathlib.PurePosixPath,
    ("pathlib", "PurePosixPath"): pathlib.PurePosixPath,
    ("pathlib", "WindowsPath"): pathlib.PureWindowsPath,
    ("pathlib", "PureWindowsPath"): pathlib.PureWindowsPath,
    ("pathlib._local", "PosixPath"): pathlib.PurePosixPath,
    ("torch", "Size"): _value,
    ("torch.serialization", "_get_layout"): _value,
    ("torch._utils", "_get_layout"): _value,
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _SAFE_BUILTINS:
            return _SAFE_BUILTINS[(module, name)]
        if module in _DCP_MODULES and name.isidentifier() and not name.startswith("__"):
            return _inert(f"{module}.{name}")
        if module == "torch" and name.isidentifier() and not name.startswith("_"):
            # dtypes and memory formats are pickled as attributes of the torch module: torch.float32
            # becomes the string "torch.float32". Calls on such strings fail harmlessly.
            return f"torch.{name}"
        raise UnsafeMetadata(f"global {module}.{name} is not allowed in DCP metadata")


@dataclass(frozen=True)
class StorageEntry:
    """Where one chunk of one tensor/bytes item lives: `relative_path` must hold offset+length bytes."""

    relative_path: str
    offset: int
    length: int


def load(data: bytes) -> Any:
    """Unpickle `.metadata` bytes with the restricted unpickler (raises UnsafeMetadata/MalformedMetadata)."""
    if len(data) > MAX_METADATA_BYTES:
        raise MalformedMetadata(f".metadata is {len(data)} bytes, larger than {MAX_METADATA_BYTES}")
    try:
        return _RestrictedUnpickler(io.BytesIO(data)).load()
    except UnsafeMetadata:
        raise
    except Exception as exc:
        raise MalformedMetadata(f"cannot read .metadata: {type(exc).__name__}: {exc}") from None


def storage_entries(data: bytes) -> list[StorageEntry]:
    """The storage entries a DCP `.metadata` references; the only part the completeness check needs."""
    meta = load(data)
    if not isinstance(meta, _Inert) or not meta._qualname.endswith(".Metadata"):
        raise MalformedMetadata(f".metadata holds {type(meta).__name__}, not a DCP Metadata")
    storage = meta.get("storage_data")
    if not isinstance(storage, dict):
        raise MalformedMetadata(".metadata has no storage_data mapping (written by an unsupported storage?)")
    entries: list[StorageEntry] = []
    for info in storage.values():
        if not isinstance(info, _Inert):
            raise MalformedMetadata(f"unexpected storage entry {info!r}")
        path, offset, length = info.get("relative_path"), info.get("offset"), info.get("length")
        if not isinstance(path, str) or not isinstance(offset, int) or not isinstance(length, int):
            raise MalformedMetadata(f"storage entry without relative_path/offset/length: {info!r}")
        entries.append(StorageEntry(path, offset, length))
    return entries
