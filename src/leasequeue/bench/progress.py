"""The progress display on stderr while a benchmark runs."""

from __future__ import annotations

import sys
import time
from typing import Any

__all__ = ["Progress"]


class Progress:
    """A one-line progress display on stderr (plain lines when not a TTY)."""

    def __init__(self, total: int, enabled: bool = True, stream: Any = None) -> None:
        self.total = max(1, total)
        self.done = 0
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.perf_counter()
        self._last_heading = ""

    def step(self, heading: str, detail: str = "", advance: int = 1) -> None:
        """Show what runs now; ``advance`` steps of the total are then done."""
        if self.enabled:
            elapsed = time.perf_counter() - self.start
            pct = 100.0 * self.done / self.total
            line = f"[{pct:3.0f}% {elapsed:5.1f}s] {heading} {detail}"
            if self.tty:
                self.stream.write("\r\x1b[2K" + line[:120])
                self.stream.flush()
            elif heading != self._last_heading:
                self.stream.write(line + "\n")
                self.stream.flush()
            self._last_heading = heading
        self.done += advance

    def finish(self, message: str) -> None:
        """Close the display with a final line."""
        if self.enabled:
            elapsed = time.perf_counter() - self.start
            if self.tty:
                self.stream.write("\r\x1b[2K")
            self.stream.write(f"{message} ({elapsed:.1f}s)\n")
            self.stream.flush()
