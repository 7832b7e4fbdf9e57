"""The progress bar of long commands (``drive``, ``migrate``): tqdm, from the ``cli`` extra.

Without tqdm installed the commands run the same, without a bar.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["Progress"]


class Progress:
    """A tqdm bar on stderr, or nothing; error lines print above it either way."""

    def __init__(self, show: bool, total: int | None = None, initial: int = 0, unit: str = " lines") -> None:
        self.bar: Any = None
        if show:
            try:
                from tqdm import tqdm
            except ImportError:
                print("statebound: no progress bar without tqdm (pip install 'statebound[cli]')", file=sys.stderr)
            else:
                self.bar = tqdm(total=total, initial=initial, unit=unit, file=sys.stderr, dynamic_ncols=True,
                                smoothing=0.1)

    def update(self, n: int) -> None:
        """Advance the bar by ``n``."""
        if self.bar is not None and n:
            self.bar.update(n)

    def error(self, message: str) -> None:
        """Print ``statebound: message`` on stderr, above the bar."""
        line = f"statebound: {message}"
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr)

    def out(self, line: str) -> None:
        """Print a line of the command's output on stdout, above the bar."""
        if self.bar is not None:
            self.bar.write(line, file=sys.stdout)
        else:
            print(line)

    def close(self) -> None:
        """Remove the bar."""
        if self.bar is not None:
            self.bar.close()
