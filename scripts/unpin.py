"""Copy a hashed lock file without the pins of the named packages (scripts/lock.sh --upgrade-package).

    python scripts/unpin.py SRC OUT [NAME ...]

A pin is its ``name==version`` line and the indented lines after it (hashes, ``# via``).
"""

from __future__ import annotations

import re
import sys


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main(src: str, out: str, *names: str) -> None:
    drop = {_norm(name) for name in names}
    kept: list[str] = []
    skip = False
    with open(src, encoding="utf-8") as lock:
        for line in lock:
            head = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==", line)
            if head:
                skip = _norm(head[1]) in drop
            elif not line.startswith(" "):
                skip = False
            if not skip:
                kept.append(line)
    with open(out, "w", encoding="utf-8") as copy:
        copy.writelines(kept)


if __name__ == "__main__":
    main(*sys.argv[1:])
