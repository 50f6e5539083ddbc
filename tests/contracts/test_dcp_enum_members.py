"""Enum members in a DCP .metadata, as CPythons that pickle them by name write them: getattr(cls, "NAME").

Debian bookworm's Python 3.11.2 pickles TensorProperties' memory format this way (3.11.7 pickles cls(value));
the trainer image's stand-in base uses it, and the real-node lane found every checkpoint it wrote refused.
"""

from __future__ import annotations

import pytest

from resilient_contract import dcp_metadata

ENCODING = "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING"


def _str(text: str) -> bytes:
    return b"X" + len(text.encode()).to_bytes(4, "little") + text.encode()


def by_name(owner: str, name: str) -> bytes:
    """{"memory_format": getattr(<owner>, name)} as protocol-2 opcodes (what such a CPython writes)."""
    module, _, qualname = owner.rpartition(".")
    return (b"\x80\x02}" + _str("memory_format") + b"cbuiltins\ngetattr\n" + f"c{module}\n{qualname}\n".encode()
            + _str(name) + b"\x86Rs.")


def test_a_member_of_an_allow_listed_class_by_name_is_a_token() -> None:
    loaded = dcp_metadata.load(by_name(ENCODING, "TORCH_CONTIGUOUS_FORMAT"))
    assert loaded["memory_format"] == dcp_metadata.Global(f"{ENCODING}.TORCH_CONTIGUOUS_FORMAT")


@pytest.mark.parametrize("name", ["__class__", "__reduce__", "not an identifier"])
def test_getattr_for_anything_but_a_plain_member_is_refused(name: str) -> None:
    with pytest.raises(dcp_metadata.UnsafeMetadata):
        dcp_metadata.load(by_name(ENCODING, name))


def test_getattr_on_a_global_outside_the_allow_list_is_refused() -> None:
    with pytest.raises(dcp_metadata.UnsafeMetadata):
        dcp_metadata.load(by_name("os.system", "x"))
