"""`python -m resilient_trainer latest DIR`: the newest complete checkpoint under DIR, and why newer ones
were skipped.

Prints the checkpoint's path on stdout (so `--resume-from "$(python -m resilient_trainer latest DIR)"`
works) and one `skipped <path>: <reason>` line per newer incomplete directory on stderr. Exit status:
0 found, 1 none complete (or DIR missing), 2 DIR unreadable. Uses resilient_contract.storage.discover,
the same rule the operator applies. Torch-free.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from resilient_contract.storage import discover


def latest(root: str) -> int:
    listing = discover(os.path.abspath(root) if "://" not in root else root)
    for verdict in listing.skipped:
        print(f"skipped {verdict.path}: {verdict.reason}", file=sys.stderr)
    if listing.error:
        print(f"error: {listing.error}", file=sys.stderr)
        return 1 if listing.missing else 2
    if listing.latest is None:
        print(f"no complete checkpoint under {listing.root}", file=sys.stderr)
        return 1
    print(listing.latest.path)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m resilient_trainer", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("latest", help="print the newest complete checkpoint under a root").add_argument("root")
    args = p.parse_args(argv)
    return latest(args.root)


if __name__ == "__main__":
    sys.exit(main())
