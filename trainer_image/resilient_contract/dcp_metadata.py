"""Read a DCP `.metadata` file without torch, without running code from it, in bounded time and memory.

`.metadata` is a pickle written by user pods, so it is hostile input. It is never handed to
`pickle.Unpickler`: a pure-Python interpreter of the pickle opcodes builds plain data only.
- A `pickletools` pre-scan bounds the opcode count, memo indices and MARK nesting, and rejects
  opcodes we never need (persistent ids, extension codes, buffers), BEFORE anything is built.
- Globals resolve to inert tokens (`Global`); calling an allow-listed one yields a fresh `Inert`
  record of its arguments and state. No real class is ever returned, called or mutated, so a
  BUILD cannot `setattr` on `pathlib.PurePosixPath` or anything else shared by the process.
- While building, nesting depth is tracked, a container stops accepting items once it sits inside
  another (so no cycles), integers are bounded and dict keys must hash cheaply.
- Error messages name opcodes and limits, never attacker bytes (no `repr` of parsed data).
Torch versions add or rename fields, so callers read only `storage_entries()` and tolerate the rest.
"""

from __future__ import annotations

import pickletools
from dataclasses import dataclass, field
from typing import Any

MAX_METADATA_BYTES = 32 * 1024 * 1024  # default cap; the operator's RTJ_METADATA_MAX_BYTES overrides it
MAX_INT_BITS = 64  # DCP offsets and lengths are int64; anything larger is not metadata


class UnsafeMetadata(ValueError):
    """The pickle asks for something outside the allow-list: it is skipped, never executed."""


class MalformedMetadata(ValueError):
    """The file is not a DCP metadata pickle we can read within the limits."""


@dataclass(frozen=True)
class Limits:
    """Bounds on one `.metadata` parse; each holds before the matching work or allocation happens."""

    max_bytes: int = MAX_METADATA_BYTES
    max_ops: int = 4_000_000  # a real .metadata spends about 5 bytes per opcode
    max_depth: int = 32  # DCP metadata nests about 6 deep
    max_marks: int = 32


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class Global:
    """An allow-listed global, by name only: the interpreter never imports or touches the real object."""

    qualname: str


@dataclass(eq=False)
class Inert:
    """What calling an allow-listed class produced: its name, arguments and pickled state, nothing else."""

    qualname: str
    args: tuple[Any, ...]
    state: dict[Any, Any] = field(default_factory=dict)

    __hash__ = object.__hash__  # identity: hashing never walks attacker data

    def get(self, name: str, default: Any = None) -> Any:
        return self.state.get(name, default)

    def __repr__(self) -> str:  # never print attacker data
        return f"<{type(self).__name__} {self.qualname.rsplit('.', 1)[-1][:40]}>"


_DCP_MODULES = frozenset({
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.filesystem",
    "torch.distributed.checkpoint.planner",
    "torch.distributed.checkpoint.storage",
    "torch.distributed.checkpoint._extension",
})  # fmt: skip
_DICT_GLOBALS = frozenset({("collections", "OrderedDict")})
_VALUE_GLOBALS = frozenset({("torch", "Size"), ("torch.serialization", "_get_layout"), ("torch._utils", "_get_layout")})
_INERT_GLOBALS = frozenset({
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "slice"), ("builtins", "complex"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"), ("pathlib._local", "PosixPath"), ("pathlib._local", "PurePosixPath"),
})  # fmt: skip
_REFUSED_OPS = frozenset({"PERSID", "BINPERSID", "EXT1", "EXT2", "EXT4", "INST", "OBJ", "NEXT_BUFFER",
                          "READONLY_BUFFER"})  # fmt: skip
_MAX_NAME = 200
# Opcodes that push their decoded argument (bounded ints are checked by the pre-scan).
_LEAF_OPS = frozenset({"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT", "STRING",
                       "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8",
                       "BINBYTES", "SHORT_BINBYTES", "BINBYTES8"})  # fmt: skip


def _cheap_key(key: Any) -> bool:
    return key is None or isinstance(key, str | bytes | int | float | bool | Global | Inert)


def _ignore(_: Any) -> None:
    pass


def _resolve(module: Any, name: Any) -> Global:
    """The token for an allow-listed global, or UnsafeMetadata (naming nothing from the file)."""
    if not isinstance(module, str) or not isinstance(name, str) or len(module) + len(name) > _MAX_NAME:
        raise UnsafeMetadata("it references a global that is not a plain name")
    key = (module, name)
    if key in _DICT_GLOBALS or key in _VALUE_GLOBALS or key in _INERT_GLOBALS:
        return Global(f"{module}.{name}")
    if module in _DCP_MODULES and name.isidentifier() and not name.startswith("__"):
        return Global(f"{module}.{name}")
    if module == "torch" and name.isidentifier() and not name.startswith("_"):
        return Global(f"torch.{name}")  # dtypes and memory formats: torch.float32 pickles as a global
    raise UnsafeMetadata("it references a global outside the allow-list of DCP metadata classes")


def prescan(data: bytes, limits: Limits = DEFAULT_LIMITS) -> None:
    """Decode every opcode once and check the structural bounds before anything is built."""
    if len(data) > limits.max_bytes:
        raise MalformedMetadata(f".metadata is larger than the {limits.max_bytes}-byte cap")
    ops = memo_puts = marks = 0
    try:
        for opcode, arg, _pos in pickletools.genops(data):
            ops += 1
            if ops > limits.max_ops:
                raise MalformedMetadata(f".metadata has more than {limits.max_ops} pickle opcodes")
            name = opcode.name
            if name in _REFUSED_OPS:
                raise UnsafeMetadata(f"it uses the {name} pickle opcode, which DCP metadata never needs")
            if name in ("PUT", "BINPUT", "LONG_BINPUT"):
                if not isinstance(arg, int) or arg < 0 or arg > memo_puts:
                    raise MalformedMetadata(".metadata stores to a memo index out of sequence")
                memo_puts += 1
            elif name == "MEMOIZE":
                memo_puts += 1
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                if not isinstance(arg, int) or arg < 0 or arg >= memo_puts:
                    raise MalformedMetadata(".metadata reads a memo index that was never stored")
            elif name == "MARK":
                marks += 1
                if marks > limits.max_marks:
                    raise MalformedMetadata(f".metadata nests more than {limits.max_marks} MARKs")
            elif pickletools.markobject in opcode.stack_before:
                marks -= 1  # TUPLE, LIST, DICT, APPENDS, SETITEMS, ADDITEMS, FROZENSET, POP_MARK
            elif name == "GLOBAL":
                module, _, attr = str(arg).partition(" ")
                _resolve(module, attr)
            elif name in ("LONG", "LONG1", "LONG4") and isinstance(arg, int) and arg.bit_length() > MAX_INT_BITS:
                raise MalformedMetadata(f".metadata holds an integer wider than {MAX_INT_BITS} bits")
    except (UnsafeMetadata, MalformedMetadata):
        raise
    except Exception as exc:  # truncated, bad opcode, bad argument encoding, int-digit limits
        raise MalformedMetadata(f"cannot read .metadata: {type(exc).__name__} while decoding the pickle") from None


class _Builder:
    """Executes the opcodes `prescan` accepted, building only plain data, tokens and `Inert` records."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.stack: list[Any] = []
        self.marks: list[list[Any]] = []
        self.memo: dict[int, Any] = {}
        self.depth: dict[int, int] = {}  # id -> nesting depth of every container built
        self.sealed: dict[int, Any] = {}  # id -> container already inside another
        self.alive: list[Any] = []  # every container built stays alive, so no id is ever reused
        self._last: list[Any] = []

    # -- bookkeeping ------------------------------------------------------------------------------
    def _depth(self, obj: Any) -> int:
        return self.depth.get(id(obj), 0)

    def _new(self, obj: Any, children: Any = ()) -> Any:
        d = 1
        for child in children:
            d = max(d, self._insert(child) + 1)
        self._check_depth(d)
        self.depth[id(obj)] = d
        self.alive.append(obj)
        return obj

    def _insert(self, child: Any) -> int:
        if id(child) in self.depth:
            self.sealed[id(child)] = child
        return self._depth(child)

    def _check_depth(self, d: int) -> None:
        if d > self.limits.max_depth:
            raise MalformedMetadata(f".metadata nests deeper than {self.limits.max_depth} levels")

    def _grow(self, container: Any, children: Any) -> None:
        if id(container) in self.sealed:
            raise MalformedMetadata(".metadata modifies a container after nesting it (not written by DCP)")
        d = self._depth(container)
        for child in children:
            if child is container:
                raise MalformedMetadata(".metadata puts a container inside itself (not written by DCP)")
            d = max(d, self._insert(child) + 1)
        self._check_depth(d)
        self.depth[id(container)] = d

    def _pop_mark(self) -> list[Any]:
        items = self.stack
        self.stack = self.marks.pop()
        return items

    def _key(self, key: Any) -> Any:
        """Dict keys must hash in constant time: scalars, tokens, records, or short flat tuples of those."""
        if _cheap_key(key):
            return key
        if isinstance(key, tuple) and len(key) <= 16 and self._depth(key) <= 1 and all(map(_cheap_key, key)):
            return key
        raise MalformedMetadata(".metadata uses a dict key DCP never writes")

    def _call(self, func: Any, args: Any, kwargs: Any = None) -> Any:
        if not isinstance(func, Global):
            raise UnsafeMetadata("it calls something that is not an allow-listed class")
        if not isinstance(args, tuple) or (kwargs is not None and not isinstance(kwargs, dict)):
            raise MalformedMetadata(".metadata calls a class with malformed arguments")
        module, _, name = func.qualname.rpartition(".")
        if (module, name) in _DICT_GLOBALS:
            if args or kwargs:
                raise MalformedMetadata(".metadata builds an OrderedDict in a way DCP never does")
            return self._new({})
        if (module, name) in _VALUE_GLOBALS:
            return args[0] if len(args) == 1 else args  # torch.Size(tuple), _get_layout(name)
        record = Inert(func.qualname, args)
        return self._new(record, args + tuple((kwargs or {}).values()))

    # -- the interpreter --------------------------------------------------------------------------
    def run(self, data: bytes) -> Any:
        table = self._table()
        for opcode, arg, _pos in pickletools.genops(data):
            name = opcode.name
            if name in _LEAF_OPS:
                self.stack.append(arg)
            elif name == "STOP":
                if len(self.stack) != 1 or self.marks:
                    raise MalformedMetadata(".metadata ends with a malformed stack")
                return self.stack[0]
            else:
                handler = table.get(name)
                if handler is None:
                    raise UnsafeMetadata(f"it uses the {name} pickle opcode, which DCP metadata never needs")
                handler(arg)
        raise MalformedMetadata(".metadata has no STOP opcode")

    def _table(self) -> dict[str, Any]:
        """One small handler per opcode (arg is the decoded argument, None for most)."""
        push = self._push
        return {
            "PROTO": _ignore, "FRAME": _ignore,
            "BYTEARRAY8": lambda a: push(bytes(a)),  # immutable: nothing built here can change later
            "NONE": lambda a: push(None), "NEWTRUE": lambda a: push(True), "NEWFALSE": lambda a: push(False),
            "MARK": self._mark, "POP": lambda a: self.stack.pop(), "POP_MARK": lambda a: self._pop_mark(),
            "DUP": lambda a: push(self.stack[-1]),
            "PUT": self._put, "BINPUT": self._put, "LONG_BINPUT": self._put,
            "MEMOIZE": lambda a: self._put(len(self.memo)),
            "GET": self._get, "BINGET": self._get, "LONG_BINGET": self._get,
            "EMPTY_LIST": lambda a: push(self._new([])), "EMPTY_DICT": lambda a: push(self._new({})),
            "EMPTY_SET": lambda a: push(self._new([])),  # a set is only iterated: a list avoids hashing items
            "EMPTY_TUPLE": lambda a: push(()),
            "TUPLE1": lambda a: self._tuple_n(1), "TUPLE2": lambda a: self._tuple_n(2),
            "TUPLE3": lambda a: self._tuple_n(3),
            "TUPLE": self._tuple_mark, "FROZENSET": self._tuple_mark,
            "LIST": lambda a: self._list_mark(), "DICT": lambda a: push(self._dict_from(self._pop_mark())),
            "APPEND": self._append, "APPENDS": self._appends, "ADDITEMS": self._appends,
            "SETITEM": self._setitem, "SETITEMS": lambda a: self._setitems(self._pop_mark_top(), self._last),
            "GLOBAL": self._global, "STACK_GLOBAL": self._stack_global,
            "REDUCE": self._reduce, "NEWOBJ": self._reduce, "NEWOBJ_EX": self._newobj_ex,
            "BUILD": self._build_op,
        }  # fmt: skip

    def _push(self, value: Any) -> None:
        self.stack.append(value)

    def _mark(self, _: Any) -> None:
        self.marks.append(self.stack)
        self.stack = []

    def _pop_mark_top(self) -> Any:
        """Pop to the last MARK; keep the items in `_last` and return the object under the mark."""
        self._last = self._pop_mark()
        return self.stack[-1]

    def _put(self, index: int) -> None:
        self.memo[index] = self.stack[-1]

    def _get(self, index: int) -> None:
        self.stack.append(self.memo[index])

    def _tuple_n(self, n: int) -> None:
        stack = self.stack
        if len(stack) < n:
            raise MalformedMetadata(".metadata pops an empty stack")
        items = tuple(stack[-n:])
        del stack[-n:]
        stack.append(self._new(items, items))

    def _tuple_mark(self, _: Any) -> None:
        items = tuple(self._pop_mark())
        self.stack.append(self._new(items, items))

    def _list_mark(self) -> None:
        items = self._pop_mark()
        self.stack.append(self._new(list(items), items))

    def _append(self, _: Any) -> None:
        value = self.stack.pop()
        self._extend(self.stack[-1], [value])

    def _appends(self, _: Any) -> None:
        items = self._pop_mark()
        self._extend(self.stack[-1], items)

    def _setitem(self, _: Any) -> None:
        value, key = self.stack.pop(), self.stack.pop()
        self._setitems(self.stack[-1], [key, value])

    def _global(self, arg: Any) -> None:
        module, _, attr = str(arg).partition(" ")
        self.stack.append(_resolve(module, attr))

    def _stack_global(self, _: Any) -> None:
        attr, module = self.stack.pop(), self.stack.pop()
        self.stack.append(_resolve(module, attr))

    def _reduce(self, _: Any) -> None:
        args = self.stack.pop()
        self.stack.append(self._call(self.stack.pop(), args))

    def _newobj_ex(self, _: Any) -> None:
        kwargs, args = self.stack.pop(), self.stack.pop()
        self.stack.append(self._call(self.stack.pop(), args, kwargs))

    def _build_op(self, _: Any) -> None:
        state = self.stack.pop()
        self._build(self.stack[-1], state)

    def _extend(self, target: Any, items: list[Any]) -> None:
        if not isinstance(target, list):
            raise MalformedMetadata(".metadata appends to something that is not a list")
        self._grow(target, items)
        target.extend(items)

    def _setitems(self, target: Any, items: list[Any]) -> None:
        if not isinstance(target, dict) or len(items) % 2:
            raise MalformedMetadata(".metadata sets items on something that is not a dict")
        self._grow(target, items)
        for i in range(0, len(items), 2):
            target[self._key(items[i])] = items[i + 1]

    def _dict_from(self, items: list[Any]) -> dict[Any, Any]:
        result: dict[Any, Any] = self._new({})
        self._setitems(result, items)
        return result

    def _build(self, target: Any, state: Any) -> None:
        """BUILD only fills in a record this interpreter made; everything else is refused."""
        if not isinstance(target, Inert):
            raise UnsafeMetadata("it sets state on something that is not a DCP metadata record")
        if id(target) in self.sealed:
            raise MalformedMetadata(".metadata modifies a record after nesting it (not written by DCP)")
        parts = state if isinstance(state, tuple) and len(state) == 2 else (state,)
        merged: dict[Any, Any] = {}
        for part in parts:
            if isinstance(part, dict):
                merged.update(part)  # keys were checked when the dict was built
            elif part is not None:
                merged["_raw"] = part  # a custom __getstate__: kept, never interpreted
        self._grow(target, [state])
        target.state = merged


def load(data: bytes, limits: Limits = DEFAULT_LIMITS) -> Any:
    """Interpret `.metadata` bytes into plain data and `Inert` records (raises Unsafe/MalformedMetadata)."""
    prescan(data, limits)
    try:
        return _Builder(limits).run(data)
    except (UnsafeMetadata, MalformedMetadata):
        raise
    except MemoryError:
        raise
    except Exception as exc:  # IndexError on an empty stack, KeyError, TypeError, ...
        raise MalformedMetadata(f"cannot read .metadata: {type(exc).__name__} while building it") from None


@dataclass(frozen=True)
class StorageEntry:
    """Where one chunk of one tensor/bytes item lives: `relative_path` must hold offset+length bytes."""

    relative_path: str
    offset: int
    length: int


_MAX_OFFSET = 2**63
_METADATA_MODULE = "torch.distributed.checkpoint.metadata"


def storage_entries(data: bytes, limits: Limits = DEFAULT_LIMITS) -> list[StorageEntry]:
    """The storage entries a DCP `.metadata` references; the only part the completeness check needs."""
    meta = load(data, limits)
    if not isinstance(meta, Inert) or meta.qualname.rpartition(".") != (_METADATA_MODULE, ".", "Metadata"):
        raise MalformedMetadata(".metadata is not a DCP Metadata record")
    storage = meta.get("storage_data")
    if not isinstance(storage, dict):
        raise MalformedMetadata(".metadata has no storage_data mapping (written by an unsupported storage?)")
    entries: list[StorageEntry] = []
    for info in storage.values():
        if not isinstance(info, Inert):
            raise MalformedMetadata(".metadata has a storage entry that is not a DCP storage record")
        path, offset, length = info.get("relative_path"), info.get("offset"), info.get("length")
        if not isinstance(path, str) or type(offset) is not int or type(length) is not int:
            raise MalformedMetadata(".metadata has a storage entry without relative_path/offset/length")
        if not (0 <= offset < _MAX_OFFSET and 0 <= length < _MAX_OFFSET) or len(path) > 4096:
            raise MalformedMetadata(".metadata has a storage entry with an impossible offset, length or path")
        entries.append(StorageEntry(path, offset, length))
    return entries
