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

# The interpreter loop compares the opcode byte with locals named as in pickletools (LOAD_FAST, no tuple built).
# ruff: noqa: N806, PLR1714, SIM109, SIM905

from __future__ import annotations

import gc
import io
import pickletools
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
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
    max_ops: int = 24_000_000  # a real .metadata spends about 1.8 bytes per opcode (32 MB: ~18M)
    max_depth: int = 32  # DCP metadata nests about 6 deep
    max_marks: int = 32


DEFAULT_LIMITS = Limits()


RECORD, DICT_CLASS, VALUE_CLASS = "record", "dict", "value"  # what calling a `Global` builds
# Enum members pickle as getattr(EnumClass, "NAME") on some CPythons (Debian bookworm's 3.11.2; 3.11.7 pickles
# EnumClass(value)): DCP's _MEM_FORMAT_ENCODING in TensorProperties. Only (allow-listed class, plain name) is read.
MEMBER = "member"


@dataclass(frozen=True)
class Global:
    """An allow-listed global, by name only: the interpreter never imports or touches the real object."""

    qualname: str
    kind: str = RECORD  # RECORD: an `Inert`; DICT_CLASS: an empty dict (OrderedDict); VALUE_CLASS: its argument


_NO_STATE: Mapping[Any, Any] = MappingProxyType({})


class Inert:
    """What calling an allow-listed class produced: its name, arguments and pickled state, nothing else."""

    __slots__ = ("args", "qualname", "state")

    def __init__(self, qualname: str, args: tuple[Any, ...], state: Mapping[Any, Any] = _NO_STATE) -> None:
        self.qualname = qualname
        self.args = args
        self.state = state

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
_MEMBER_GLOBALS = frozenset({("builtins", "getattr")})
_VALUE_GLOBALS = frozenset({("torch", "Size"), ("torch.serialization", "_get_layout"), ("torch._utils", "_get_layout")})
_INERT_GLOBALS = frozenset({
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "slice"), ("builtins", "complex"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"), ("pathlib._local", "PosixPath"), ("pathlib._local", "PurePosixPath"),
})  # fmt: skip
_OPS = {ord(op.code): op for op in pickletools.opcodes}
_REFUSED_OPS = frozenset(ord(op.code) for op in pickletools.opcodes if op.name in {
    "PERSID", "BINPERSID", "EXT1", "EXT2", "EXT4", "INST", "OBJ", "NEXT_BUFFER", "READONLY_BUFFER"})  # fmt: skip
_MAX_NAME = 200
_MAX_LONG_BYTES = 9  # LONG1/LONG4 payload: a 64-bit value never needs more (checked before decoding)
_SIZED_OPS = frozenset(ord(op.code) for op in pickletools.opcodes if op.name in {
    "BINUNICODE", "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8", "BINSTRING",
    "SHORT_BINSTRING"})  # fmt: skip
_U16 = struct.Struct("<H").unpack_from
_U32 = struct.Struct("<I").unpack_from
_I32 = struct.Struct("<i").unpack_from
_U64 = struct.Struct("<Q").unpack_from
_F64 = struct.Struct(">d").unpack_from

# Opcode bytes, in the order `_Interpreter.run` unpacks them into locals (a LOAD_FAST per comparison).
_OPCODE_NAMES = (
    "MARK STOP POP POP_MARK DUP FLOAT INT BININT BININT1 LONG BININT2 NONE REDUCE STRING BINSTRING SHORT_BINSTRING "
    "UNICODE BINUNICODE APPEND BUILD GLOBAL DICT EMPTY_DICT APPENDS GET BINGET LONG_BINGET LIST EMPTY_LIST PUT BINPUT "
    "LONG_BINPUT SETITEM TUPLE EMPTY_TUPLE SETITEMS BINFLOAT PROTO NEWOBJ TUPLE1 TUPLE2 TUPLE3 NEWTRUE NEWFALSE LONG1 "
    "LONG4 BINBYTES SHORT_BINBYTES SHORT_BINUNICODE BINUNICODE8 BINBYTES8 EMPTY_SET ADDITEMS FROZENSET NEWOBJ_EX "
    "STACK_GLOBAL MEMOIZE FRAME BYTEARRAY8").split()
_OPCODES = tuple(next(ord(op.code) for op in pickletools.opcodes if op.name == name) for name in _OPCODE_NAMES)


def _cheap_key(key: Any) -> bool:
    return key is None or isinstance(key, str | bytes | int | float | bool | Global | Inert)


def _resolve(module: Any, name: Any) -> Global:
    """The token for an allow-listed global, or UnsafeMetadata (naming nothing from the file)."""
    if not isinstance(module, str) or not isinstance(name, str) or len(module) + len(name) > _MAX_NAME:
        raise UnsafeMetadata("it references a global that is not a plain name")
    key = (module, name)
    if key in _DICT_GLOBALS:
        return Global(f"{module}.{name}", DICT_CLASS)
    if key in _VALUE_GLOBALS:
        return Global(f"{module}.{name}", VALUE_CLASS)
    if key in _MEMBER_GLOBALS:
        return Global(f"{module}.{name}", MEMBER)
    if key in _INERT_GLOBALS:
        return Global(f"{module}.{name}")
    if module in _DCP_MODULES and name.isidentifier() and not name.startswith("__"):
        return Global(f"{module}.{name}")
    if module == "torch" and name.isidentifier() and not name.startswith("_"):
        return Global(f"torch.{name}")  # dtypes and memory formats: torch.float32 pickles as a global
    raise UnsafeMetadata("it references a global outside the allow-list of DCP metadata classes")


def _wide(value: int) -> int:
    if value.bit_length() > MAX_INT_BITS:
        raise MalformedMetadata(f".metadata holds an integer wider than {MAX_INT_BITS} bits")
    return value


class _Interpreter:
    """One pass over the opcodes that checks every bound at the opcode that would break it, before the
    allocation it guards, and builds only plain data, `Global` tokens and `Inert` records.

    - opcode count: counted as each opcode is decoded; memo: a PUT may only store at the next free
      index (or overwrite one), a GET only read one stored; MARK nesting: checked at each MARK;
      integers: the byte count is checked before decoding; strings: their length against the buffer.
    - nesting depth: every container built here has its depth recorded (by id; all stay alive so
      no id is reused); a container stops accepting items once it sits inside another, so depths
      never change behind our back and no cycle can form.
    - dict keys must hash in constant time; BUILD only fills in an `Inert` record made here.
    """

    def __init__(self, limits: Limits) -> None:
        self.max_depth = limits.max_depth
        self.depth: dict[int, int] = {}  # id -> nesting depth of every container built
        self.sealed: set[int] = set()  # ids of containers already inside another
        self.alive: list[Any] = []  # every container built stays alive, so no id is ever reused

    # -- bookkeeping ------------------------------------------------------------------------------
    def new(self, obj: Any, children: Any = ()) -> Any:
        """Register a container built from `children` (which are nested, hence sealed, by this)."""
        depth, sealed = self.depth, self.sealed
        d = 1
        for child in children:
            cd = depth.get(id(child))
            if cd is not None:
                sealed.add(id(child))
                if cd >= d:
                    d = cd + 1
        if d > self.max_depth:
            raise MalformedMetadata(f".metadata nests deeper than {self.max_depth} levels")
        depth[id(obj)] = d
        self.alive.append(obj)
        return obj

    def grow(self, target: Any, children: Any) -> None:
        """Account for `children` going into `target`, which must not sit inside anything yet."""
        depth, sealed = self.depth, self.sealed
        tid = id(target)
        if tid in sealed:
            raise MalformedMetadata(".metadata modifies a container after nesting it (not written by DCP)")
        d = depth[tid]
        for child in children:
            cid = id(child)
            cd = depth.get(cid)
            if cd is not None:
                if cid == tid:
                    raise MalformedMetadata(".metadata puts a container inside itself (not written by DCP)")
                sealed.add(cid)
                if cd >= d:
                    d = cd + 1
        if d > self.max_depth:
            raise MalformedMetadata(f".metadata nests deeper than {self.max_depth} levels")
        depth[tid] = d

    def extend(self, target: Any, items: list[Any]) -> None:
        if type(target) is not list:
            raise MalformedMetadata(".metadata appends to something that is not a list")
        self.grow(target, items)
        target.extend(items)

    def setitems(self, target: Any, items: list[Any]) -> None:
        if type(target) is not dict or len(items) % 2:
            raise MalformedMetadata(".metadata sets items on something that is not a dict")
        self.grow(target, items)
        keys = items[::2]
        if not all(type(key) is str for key in keys) and not all(map(self.cheap_key, keys)):
            raise MalformedMetadata(".metadata uses a dict key DCP never writes")
        target.update(zip(keys, items[1::2], strict=True))

    def cheap_key(self, key: Any) -> bool:
        """Scalars, tokens, records, or short flat tuples of those: each hashes in constant time."""
        if _cheap_key(key):
            return True
        return (type(key) is tuple and len(key) <= 16 and self.depth.get(id(key), 0) <= 1
                and all(map(_cheap_key, key)))  # fmt: skip

    def call(self, func: Any, args: Any, kwargs: Any = None) -> Any:
        if type(func) is not Global:
            raise UnsafeMetadata("it calls something that is not an allow-listed class")
        if type(args) is not tuple or (kwargs is not None and type(kwargs) is not dict):
            raise MalformedMetadata(".metadata calls a class with malformed arguments")
        kind = func.kind
        if kind == RECORD:
            return self.new(Inert(func.qualname, args), args + tuple(kwargs.values()) if kwargs else args)
        if kind == DICT_CLASS:
            if args or kwargs:
                raise MalformedMetadata(".metadata builds an OrderedDict in a way DCP never does")
            return self.new({})
        if kind == MEMBER:  # getattr(allow-listed class, "NAME"): a token by name, nothing is looked up
            if kwargs or len(args) != 2 or type(args[0]) is not Global or args[0].kind != RECORD \
                    or type(args[1]) is not str or not args[1].isidentifier() or args[1].startswith("__") \
                    or len(args[1]) > _MAX_NAME:
                raise UnsafeMetadata("it calls getattr on something other than an allow-listed class")
            return Global(f"{args[0].qualname}.{args[1]}")
        return args[0] if len(args) == 1 else args  # VALUE_CLASS: torch.Size(tuple), _get_layout(name)

    def build(self, target: Any, state: Any) -> None:
        """BUILD only fills in a record this interpreter made; everything else is refused."""
        if type(target) is not Inert:
            raise UnsafeMetadata("it sets state on something that is not a DCP metadata record")
        if id(target) in self.sealed:
            raise MalformedMetadata(".metadata modifies a record after nesting it (not written by DCP)")
        self.grow(target, [state])  # seals the state: it can never change after this
        if type(state) is dict:
            target.state = state  # the common case: shared, not copied (a GET'd state costs nothing)
            return
        parts = state if type(state) is tuple and len(state) == 2 else (state,)
        merged: dict[Any, Any] = {}
        for part in parts:
            if type(part) is dict:
                if len(part) > 64:  # a copy per BUILD: bounded, so a reused state cannot go quadratic
                    raise MalformedMetadata(".metadata sets a record's slot state DCP never writes")
                merged.update(part)  # keys were checked when the dict was built
            elif part is not None:
                merged["_raw"] = part  # a custom __getstate__: kept, never interpreted
        target.state = merged

    # -- the interpreter --------------------------------------------------------------------------
    def run(self, data: bytes, limits: Limits) -> Any:
        """Interpret `data`; the hot opcodes of real DCP metadata come first in the branch chain."""
        max_ops, max_marks, max_depth = limits.max_ops, limits.max_marks, limits.max_depth
        new, call, build, setitems = self.new, self.call, self.build, self.setitems
        depth, depth_get, alive_push = self.depth, self.depth.get, self.alive.append
        size = len(data)
        stack: list[Any] = []
        push = stack.append
        marks: list[list[Any]] = []
        memo: list[Any] = []
        memo_push = memo.append
        text = io.BytesIO(data)  # the rare newline-terminated (protocol 0) arguments, via pickletools
        (MARK, STOP, POP, POP_MARK, DUP, _, _, BININT, BININT1, _, BININT2, NONE, REDUCE, _, BINSTRING,
         SHORT_BINSTRING, _, BINUNICODE, APPEND, BUILD, GLOBAL, DICT, EMPTY_DICT, APPENDS, GET, BINGET,
         LONG_BINGET, LIST, EMPTY_LIST, PUT, BINPUT, LONG_BINPUT, SETITEM, TUPLE, EMPTY_TUPLE, SETITEMS, BINFLOAT,
         PROTO, NEWOBJ, TUPLE1, TUPLE2, TUPLE3, NEWTRUE, NEWFALSE, LONG1, LONG4, _, SHORT_BINBYTES, SHORT_BINUNICODE,
         BINUNICODE8, BINBYTES8, EMPTY_SET, ADDITEMS, FROZENSET, NEWOBJ_EX, STACK_GLOBAL, MEMOIZE, FRAME,
         BYTEARRAY8) = _OPCODES  # fmt: skip
        sealed = self.sealed
        pos = ops = 0
        while True:
            op = data[pos]
            pos += 1
            ops += 1
            if ops > max_ops:
                raise MalformedMetadata(f".metadata has more than {max_ops} pickle opcodes")
            if op == MEMOIZE:
                memo_push(stack[-1])
            elif op == BINGET or op == LONG_BINGET:
                if op == BINGET:
                    index = data[pos]
                    pos += 1
                else:
                    (index,) = _U32(data, pos)
                    pos += 4
                try:  # unsigned: only too large can fail
                    push(memo[index])
                except IndexError:
                    raise MalformedMetadata(".metadata reads a memo index that was never stored") from None
            elif op == BININT1:
                push(data[pos])
                pos += 1
            elif op == MARK:
                if len(marks) >= max_marks:
                    raise MalformedMetadata(f".metadata nests more than {max_marks} MARKs")
                marks.append(stack)
                stack = []
                push = stack.append
            elif op == EMPTY_TUPLE:
                push(())
            elif op == NEWOBJ or op == REDUCE:
                args = stack.pop()
                func = stack[-1]
                if type(func) is Global and func.kind == RECORD and type(args) is tuple and not args:  # a dataclass
                    record = Inert(func.qualname, ())
                    depth[id(record)] = 1
                    alive_push(record)
                    stack[-1] = record
                else:
                    stack[-1] = call(func, args)
            elif op == TUPLE1 or op == TUPLE2:  # inline `new` for the commonest containers (torch.Size, keys)
                if op == TUPLE1:
                    items: Any = (stack[-1],)
                else:
                    items = (stack[-2], stack[-1])
                    del stack[-1]
                d = 1
                for child in items:
                    cd = depth_get(id(child))
                    if cd is not None:
                        sealed.add(id(child))
                        if cd >= d:
                            d = cd + 1
                if d > max_depth:
                    raise MalformedMetadata(f".metadata nests deeper than {max_depth} levels")
                depth[id(items)] = d
                alive_push(items)
                stack[-1] = items
            elif op == BUILD:
                state = stack.pop()
                target = stack[-1]
                sd = depth_get(id(state))
                if type(target) is Inert and type(state) is dict and id(target) not in sealed and sd is not None:
                    sealed.add(id(state))  # inline `build` for a record's state dict: shared, never copied
                    d = depth[id(target)]
                    if sd >= d:
                        d = sd + 1
                        if d > max_depth:
                            raise MalformedMetadata(f".metadata nests deeper than {max_depth} levels")
                        depth[id(target)] = d
                    target.state = state
                else:
                    build(target, state)
            elif op == SETITEMS:
                items = stack
                stack = marks.pop()
                push = stack.append
                setitems(stack[-1], items)
            elif op == EMPTY_DICT:
                obj: Any = {}
                depth[id(obj)] = 1
                alive_push(obj)
                push(obj)
            elif op == SHORT_BINUNICODE:
                end = pos + 1 + data[pos]
                if end > size:
                    raise MalformedMetadata(".metadata ends inside a string (truncated?)")
                push(data[pos + 1 : end].decode("utf-8", "surrogatepass"))
                pos = end
            elif op == TUPLE3:
                if len(stack) < 3:
                    raise MalformedMetadata(".metadata pops an empty stack")
                items = tuple(stack[-3:])
                del stack[-3:]
                push(new(items, items))
            elif op == NEWFALSE:
                push(False)
            elif op == NEWTRUE:
                push(True)
            elif op == NONE:
                push(None)
            elif op == BININT2:
                push(_U16(data, pos)[0])
                pos += 2
            elif op == BININT:
                push(_I32(data, pos)[0])
                pos += 4
            elif op == LONG1 or op == LONG4:
                if op == LONG1:
                    n, pos = data[pos], pos + 1
                else:
                    (n,), pos = _I32(data, pos), pos + 4
                if n > _MAX_LONG_BYTES:
                    raise MalformedMetadata(f".metadata holds an integer wider than {MAX_INT_BITS} bits")
                if n < 0 or pos + n > size:
                    raise MalformedMetadata(".metadata ends inside an integer (truncated?)")
                push(_wide(int.from_bytes(data[pos : pos + n], "little", signed=True)))
                pos += n
            elif op == BINPUT or op == LONG_BINPUT:
                if op == BINPUT:
                    index, pos = data[pos], pos + 1
                else:
                    (index,), pos = _U32(data, pos), pos + 4
                self._put(memo, index, stack[-1])
            elif op == STACK_GLOBAL:
                attr = stack.pop()
                stack[-1] = _resolve(stack[-1], attr)
            elif op == EMPTY_LIST:
                push(new([]))
            elif op == APPEND:
                value = stack.pop()
                self.extend(stack[-1], [value])
            elif op == APPENDS or op == ADDITEMS:
                items = stack
                stack = marks.pop()
                push = stack.append
                self.extend(stack[-1], items)
            elif op == FRAME:
                pos += 8  # frames only group opcodes for buffered readers: the whole file is in memory
            elif op == PROTO:
                pos += 1
            elif op in _SIZED_OPS:
                if op == SHORT_BINBYTES or op == SHORT_BINSTRING:
                    n, pos = data[pos], pos + 1
                elif op == BINUNICODE8 or op == BINBYTES8 or op == BYTEARRAY8:
                    (n,), pos = _U64(data, pos), pos + 8
                elif op == BINSTRING:
                    (n,), pos = _I32(data, pos), pos + 4
                else:
                    (n,), pos = _U32(data, pos), pos + 4
                end = pos + n
                if n < 0 or end > size:
                    raise MalformedMetadata(".metadata ends inside a string (truncated?)")
                raw = data[pos:end]
                if op == BINUNICODE or op == BINUNICODE8:
                    push(raw.decode("utf-8", "surrogatepass"))
                elif op == BINSTRING or op == SHORT_BINSTRING:
                    push(raw.decode("latin-1"))
                else:
                    push(raw)  # BYTEARRAY8 too: immutable, nothing built here can change later
                pos = end
            elif op == BINFLOAT:
                push(_F64(data, pos)[0])
                pos += 8
            elif op == EMPTY_SET:
                push(new([]))  # a set is only iterated: a list avoids hashing items
            elif op == TUPLE or op == FROZENSET or op == LIST or op == DICT:
                items = stack
                stack = marks.pop()
                push = stack.append
                if op == LIST:
                    push(new(items, items))
                elif op == DICT:
                    target = new({})
                    self.setitems(target, items)
                    push(target)
                else:
                    tup = tuple(items)
                    push(new(tup, tup))
            elif op == SETITEM:
                value = stack.pop()
                key = stack.pop()
                self.setitems(stack[-1], [key, value])
            elif op == POP:
                stack.pop()
            elif op == POP_MARK:
                stack = marks.pop()
                push = stack.append
            elif op == DUP:
                push(stack[-1])
            elif op == NEWOBJ_EX:
                kwargs = stack.pop()
                args = stack.pop()
                stack[-1] = call(stack[-1], args, kwargs)
            elif op == STOP:
                if len(stack) != 1 or marks:
                    raise MalformedMetadata(".metadata ends with a malformed stack")
                return stack[0]
            elif op in _REFUSED_OPS:
                name = _OPS[op].name
                raise UnsafeMetadata(f"it uses the {name} pickle opcode, which DCP metadata never needs")
            elif op in _OPS:  # the protocol-0 opcodes with a newline-terminated argument
                text.seek(pos)
                arg = _OPS[op].arg.reader(text)  # type: ignore[union-attr]
                pos = text.tell()
                if op == GLOBAL:
                    module, _, attr = arg.partition(" ")
                    push(_resolve(module, attr))
                elif op == GET:
                    if type(arg) is not int or not 0 <= arg < len(memo):
                        raise MalformedMetadata(".metadata reads a memo index that was never stored")
                    push(memo[arg])
                elif op == PUT:
                    if type(arg) is not int:
                        raise MalformedMetadata(".metadata stores to a memo index out of sequence")
                    self._put(memo, arg, stack[-1])
                else:  # INT, LONG, FLOAT, STRING, UNICODE
                    push(_wide(arg) if type(arg) is int else arg)
            else:
                raise MalformedMetadata("cannot read .metadata: an unknown pickle opcode")

    @staticmethod
    def _put(memo: list[Any], index: int, value: Any) -> None:
        if index < len(memo):
            memo[index] = value
        elif index == len(memo):
            memo.append(value)
        else:
            raise MalformedMetadata(".metadata stores to a memo index out of sequence")


def load(data: bytes, limits: Limits = DEFAULT_LIMITS) -> Any:
    """Interpret `.metadata` bytes into plain data and `Inert` records (raises Unsafe/MalformedMetadata)."""
    if len(data) > limits.max_bytes:
        raise MalformedMetadata(f".metadata is larger than the {limits.max_bytes}-byte cap")
    collecting = gc.isenabled()
    gc.disable()  # nothing built here can form a cycle; collections would rescan millions of containers
    try:
        return _Interpreter(limits).run(bytes(data), limits)
    except (UnsafeMetadata, MalformedMetadata):
        raise
    except MemoryError:
        raise
    except IndexError:
        raise MalformedMetadata("cannot read .metadata: it pops an empty stack or ends before STOP") from None
    except Exception as exc:  # struct.error on a truncated argument, UnicodeDecodeError, ValueError, ...
        raise MalformedMetadata(f"cannot read .metadata: {type(exc).__name__} while decoding the pickle") from None
    finally:
        if collecting:
            gc.enable()


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
