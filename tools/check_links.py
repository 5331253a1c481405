#!/usr/bin/env python3
"""Check every link in every Markdown file of the repository.

    python3 tools/check_links.py            # from anywhere; checks this repository
    python3 tools/check_links.py --root DIR # another tree (the tests use this)

* A relative link must name a file or directory that exists in the tree
  (a leading ``/`` means the repository root, as on GitHub).
* A ``#fragment`` pointing into a Markdown file must be one of its headings'
  GitHub-style anchors (lowercase, punctuation dropped, spaces to hyphens,
  ``-1``, ``-2`` for repeats) or an explicit ``<a name=...>`` / ``id=...``;
  into another file only GitHub's line anchors (``#L10``, ``#L10-L20``).
* An absolute address (``https://...``, ``mailto:...``, any scheme) must be
  in ``ALLOWED`` below: this machine has no network, so an address is
  allowed only once someone has checked that it exists.  Every absolute
  address found is listed.
* The ``[project.urls]`` of ``pyproject.toml`` are held to the same list,
  so an invented project address cannot come back.

Links inside code blocks and code spans are not links and are skipped.
Exit status: 0 when every link resolves, 1 otherwise (each dead link is
printed as ``file:line: message``).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple
from urllib.parse import unquote

#: Absolute addresses known to exist, each checked by hand (exact match,
#: fragment included).  Add an address here only after checking it.
ALLOWED: Set[str] = set()

#: Directories never searched for Markdown files (besides any holding a
#: ``pyvenv.cfg``, i.e. a virtual environment).
SKIP_DIRS = {".git", "build", "dist", "node_modules", "__pycache__", ".tox", ".nox"}

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)", re.S)
_INLINE = re.compile(
    r"!?\[(?:[^\[\]\\]|\\.|\[[^\[\]]*\])*\]"  # [text], one level of nested brackets
    r"\(\s*(<[^>\n]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)"  # (target
    r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)"  # "title")
)
_REF_DEF = re.compile(r"^ {0,3}\[([^\]]+)\]:\s*(<[^>]*>|\S+)")
_HTML_ATTR = re.compile(r"<(?:a|img|link|source)\b[^>]*?\b(?:href|src)\s*=\s*(\"[^\"]*\"|'[^']*')", re.I)
_HTML_ANCHOR = re.compile(r"<[a-z][^>]*?\b(?:name|id)\s*=\s*(\"[^\"]*\"|'[^']*')", re.I)
_AUTOLINK = re.compile(r"<([a-zA-Z][a-zA-Z0-9+.-]{1,31}:[^<>\s]*)>")
_BARE_URL = re.compile(r"(?<![\w/<(\"'=])(?:https?://|www\.)[^\s<>\"'`]*[^\s<>\"'`.,;:!?)\]*_~]")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
_LINE_ANCHOR = re.compile(r"^L\d+(?:C\d+)?(?:-L\d+(?:C\d+)?)?$")


# ------------------------------------------------------------ reading Markdown


def _mask_code(text: str) -> str:
    """The text with fenced code blocks and code spans blanked out (same
    length and line numbers), so that nothing inside them counts."""
    out: List[str] = []
    fence: Optional[str] = None
    for line in text.splitlines(keepends=True):
        m = _FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * len(m.group(1))
            out.append(_blank(line))
        elif fence is not None:
            if m and m.group(1).startswith(fence) and not line.strip()[len(m.group(1)):].strip():
                fence = None
            out.append(_blank(line))
        else:
            out.append(line)
    masked = "".join(out)
    return _CODE_SPAN.sub(lambda m: _blank(m.group(0)), masked)


def _blank(s: str) -> str:
    return re.sub(r"[^\n]", " ", s)


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _heading_text(raw: str) -> str:
    """A heading's rendered text: code spans keep their content, links and
    images become their text, emphasis markers and HTML tags go."""
    parts: List[str] = []
    last = 0
    for m in _CODE_SPAN.finditer(raw):
        parts.append(_strip_inline(raw[last:m.start()]))
        parts.append(m.group(2).strip())
        last = m.end()
    parts.append(_strip_inline(raw[last:]))
    return "".join(parts)


def _strip_inline(s: str) -> str:
    s = re.sub(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\([^)]*\)", r"\1", s)  # [text](url) -> text
    s = re.sub(r"<[^>]+>", "", s)  # HTML tags
    s = re.sub(r"(\*{1,3}|(?<!\w)_{1,3})(\S(?:.*?\S)?)\1(?!\w)", r"\2", s)  # *em*, **strong**, _em_
    return s.replace("\\", "")


def slug(text: str) -> str:
    """GitHub's anchor for a heading's rendered text (before de-duplication)."""
    s = text.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)  # punctuation and symbols go; letters, digits, _ and - stay
    return s.replace(" ", "-")


def anchors(text: str) -> Set[str]:
    """Every anchor a Markdown document defines: heading slugs (``x``,
    ``x-1``, ... for repeats) and explicit HTML ``name``/``id`` attributes."""
    masked = _mask_code(text)
    lines = text.splitlines()
    mlines = masked.splitlines()
    seen: Dict[str, int] = {}
    out: Set[str] = set()
    for i, mline in enumerate(mlines):
        heading: Optional[str] = None
        m = _ATX.match(mline)
        if m:
            heading = _ATX.match(lines[i]).group(2) or ""  # type: ignore[union-attr]
        elif (
            i + 1 < len(mlines)
            and _SETEXT.match(mlines[i + 1])
            and mline.strip()
            and not _ATX.match(mline)
            and not re.match(r"^\s*([-*+]|\d+[.)]|>|\|)", mline)
            and (i == 0 or not mlines[i - 1].strip() or not _SETEXT.match(mlines[i - 1]))
        ):
            heading = lines[i].strip()
        if heading is None:
            continue
        base = slug(_heading_text(heading))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    for m in _HTML_ANCHOR.finditer(masked):
        out.add(m.group(1)[1:-1])
    return out


def links(text: str) -> Iterator[Tuple[int, str]]:
    """(line, target) of every link in a Markdown document, code excluded."""
    masked = _mask_code(text)
    found: List[Tuple[int, str]] = []
    spans: List[Tuple[int, int]] = []
    for m in _INLINE.finditer(masked):
        target = m.group(1)
        if target.startswith("<"):
            target = target[1:-1]
        found.append((m.start(1), target))
        spans.append(m.span(1))
    for m in re.finditer(r"^.*$", masked, re.M):
        d = _REF_DEF.match(m.group(0))
        if d:
            target = d.group(2)
            found.append((m.start() + d.start(2), target[1:-1] if target.startswith("<") else target))
            spans.append((m.start() + d.start(2), m.start() + d.end(2)))
    for m in _HTML_ATTR.finditer(masked):
        found.append((m.start(1), m.group(1)[1:-1]))
        spans.append(m.span(1))
    for m in _AUTOLINK.finditer(masked):
        found.append((m.start(1), m.group(1)))
        spans.append(m.span(1))
    for m in _BARE_URL.finditer(masked):
        if not any(a <= m.start() < b for a, b in spans):
            found.append((m.start(), m.group(0)))
    for pos, target in sorted(found):
        yield _line_of(masked, pos), target


# ------------------------------------------------------------ checking


class Checker:
    """Checks the links of the Markdown files under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.errors: List[str] = []
        self.absolute: Dict[str, List[str]] = {}
        self._anchor_cache: Dict[Path, Set[str]] = {}

    def markdown_files(self) -> List[Path]:
        out: List[Path] = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            here = Path(dirpath)
            dirnames[:] = sorted(
                d for d in dirnames
                if d not in SKIP_DIRS
                and not d.endswith(".egg-info")
                and not (d.startswith(".") and d != ".github")
                and not (here / d / "pyvenv.cfg").exists()
            )
            out.extend(here / f for f in sorted(filenames) if f.lower().endswith((".md", ".markdown")))
        return out

    def _anchors(self, path: Path) -> Set[str]:
        if path not in self._anchor_cache:
            self._anchor_cache[path] = anchors(path.read_text(encoding="utf-8"))
        return self._anchor_cache[path]

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def check_target(self, where: str, source: Path, target: str) -> None:
        """Record an error if ``target`` (a link in ``source``) is dead."""
        if not target:
            self.errors.append(f"{where}: empty link")
            return
        if _SCHEME.match(target) or target.startswith(("//", "www.")):
            self.absolute.setdefault(target, []).append(where)
            if target not in ALLOWED:
                self.errors.append(
                    f"{where}: absolute address {target} is not in the allowlist"
                    " (tools/check_links.py ALLOWED; add it only after checking it exists)"
                )
            return
        path_part, _, fragment = target.partition("#")
        path_part = unquote(path_part.split("?", 1)[0])
        if not path_part:
            dest = source
        elif path_part.startswith("/"):
            dest = self.root / path_part.lstrip("/")
        else:
            dest = source.parent / path_part
        dest = Path(os.path.normpath(dest))
        try:
            dest.relative_to(self.root)
        except ValueError:
            self.errors.append(f"{where}: {target} points outside the repository")
            return
        if not dest.exists():
            self.errors.append(f"{where}: {target}: no such file or directory ({self._rel(dest)})")
            return
        if not fragment:
            return
        fragment = unquote(fragment)
        if dest.is_file() and dest.suffix.lower() in (".md", ".markdown"):
            if fragment not in self._anchors(dest) and fragment.lower() not in self._anchors(dest):
                self.errors.append(f"{where}: {target}: no heading or anchor #{fragment} in {self._rel(dest)}")
        elif not (dest.is_file() and _LINE_ANCHOR.match(fragment)):
            self.errors.append(f"{where}: {target}: #{fragment} is not an anchor GitHub makes for {self._rel(dest)}")

    def check_markdown(self, path: Path) -> int:
        text = path.read_text(encoding="utf-8")
        count = 0
        for line, target in links(text):
            self.check_target(f"{self._rel(path)}:{line}", path, target)
            count += 1
        return count

    def check_pyproject(self) -> int:
        """The addresses in ``[project.urls]`` must be allowlisted too."""
        path = self.root / "pyproject.toml"
        if not path.is_file():
            return 0
        count = 0
        section = None
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            stripped = line.strip()
            if stripped.startswith("["):
                section = stripped
                continue
            if section in ("[project.urls]", "[urls]") and "=" in stripped and not stripped.startswith("#"):
                value = stripped.split("=", 1)[1].strip().strip("\"'")
                self.check_target(f"pyproject.toml:{n}", path, value)
                count += 1
        return count

    def run(self) -> Tuple[int, int]:
        files = self.markdown_files()
        count = sum(self.check_markdown(p) for p in files)
        count += self.check_pyproject()
        return len(files), count


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=str(Path(__file__).resolve().parent.parent),
                    help="the tree to check (default: this repository)")
    args = ap.parse_args(argv)
    checker = Checker(Path(args.root))
    files, count = checker.run()
    if checker.absolute:
        print("absolute addresses:")
        for url, where in sorted(checker.absolute.items()):
            status = "allowlisted" if url in ALLOWED else "NOT ALLOWLISTED"
            print(f"  {url}  ({status}; {', '.join(where)})")
    for error in checker.errors:
        print(error)
    print(f"{files} Markdown files, {count} links: "
          + (f"{len(checker.errors)} dead" if checker.errors else "all resolve"))
    return 1 if checker.errors else 0


if __name__ == "__main__":
    sys.exit(main())
