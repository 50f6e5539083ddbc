"""Older callers' names for the object-store backend; the code lives in `resilient_contract.storage.s3`."""

from __future__ import annotations

from resilient_contract.storage.s3 import (
    MAX_ROOT_PAGES,
    PAGE,
    SCHEME,
    S3Credentials,
    S3Error,
    S3Location,
    S3Store,
    describe_error,
    filesystem,
    parse_uri,
    warm_up,
)

__all__ = ["MAX_ROOT_PAGES", "PAGE", "SCHEME", "S3Credentials", "S3Error", "S3Location", "S3Store",
           "describe_error", "filesystem", "parse_uri", "warm_up"]
