"""Files only the current user may read (run configurations carry connection secrets)."""

from __future__ import annotations

import os
from pathlib import Path


def write_private(path: str | Path, text: str) -> None:
    """Write `text` to `path` with mode 0600 from the moment the file exists."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
