"""Sphinx configuration of the leasequeue documentation site.

Build it (from the repository's root, on a fresh clone)::

    python -m pip install ".[docs]" && python -m sphinx -W --keep-going -b html docs docs/_build/html

Why Sphinx with myst-parser (and not mkdocs-material with mkdocstrings):

* the Markdown pages of ``docs/`` (the contract, its decisions, the backend
  pages) stay exactly as they are, rendered by myst-parser, and the guide
  pages *include* the README's sections (myst's ``{include}`` with
  ``start-after``/``end-before``) instead of copying them, so they cannot
  drift from the README whose examples the tests run;
* autodoc reads the signatures and type hints from the code itself, the way
  the libraries users compare us with (multidict, yarl, aiohttp,
  procrastinate, dramatiq) document theirs;
* ``-W`` turns every warning into an error, and with ``nitpicky`` a type in
  a signature that names an undocumented leasequeue class is one: the build
  is the reference's test.  mkdocs has a ``--strict`` mode too, but its
  cross-reference checking of API names is weaker.
* three dependencies: sphinx, myst-parser and the furo theme (the
  ``docs`` extra in pyproject.toml).

What the local extension (``_ext/leasequeue_docs.py``) adds: the command
lines' ``--help`` generated from the argparse parser, a page for each
committed benchmark result, links written for GitHub (relative to the
repository) made to work on the site, and a check that every public name
has a reference entry.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent

# The reference documents the source tree it is built from, whatever is
# installed, and documents the pure-Python twin of InMemoryTransport: it has
# the same signatures and docstrings as the compiled one (tests/inmemory/
# test_parity.py) and, unlike a compiled class, type hints autodoc can read.
os.environ["LEASEQUEUE_NO_EXTENSIONS"] = "1"
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(DOCS / "_ext"))
# tools/check_links.py: its GitHub-style heading anchors are the site's too
# (myst_heading_slug_func below), so a link that works on GitHub works here.
sys.path.insert(0, str(ROOT / "tools"))

import leasequeue  # noqa: E402

project = "leasequeue"
author = "leasequeue developers"
copyright = "leasequeue developers"  # noqa: A001 - Sphinx's name
release = leasequeue.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "leasequeue_docs",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
templates_path: list = []

# --- MyST
myst_enable_extensions = ["colon_fence", "deflist"]
# Anchors for every heading level, named as GitHub names them (the same
# function tools/check_links.py checks the Markdown with).
myst_heading_anchors = 6
myst_heading_slug_func = "check_links.slug"

# --- autodoc
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_member_order = "bysource"
autodoc_preserve_defaults = True
add_module_names = False
python_use_unqualified_type_names = True

# Every cross-reference must resolve: a signature naming a leasequeue type
# that has no entry is an error.  Standard-library and psycopg names have no
# inventory here (the build machine has no network for intersphinx), so
# they are the only ones let through.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(typing|typing_extensions|collections|collections\.abc|os|pathlib|asyncio|threading|types|"
               r"sqlite3|psycopg|argparse|random|_thread|concurrent\.futures|logging)(\.\w+)+"),
    (r"py:.*", r"(Path|PathLike|Callable|Awaitable|Coroutine|Iterable|Iterator|Sequence|Mapping|Hashable|"
               r"Random|TracebackType|Self|Literal|Protocol|NamedTuple|Event|Lock|RLock|Connection|"
               r"AbstractEventLoop|Future|ellipsis|EllipsisType|NoneType)"),
]
# Type variables and private helper types that public signatures name; they
# have no entry of their own (the text around each signature says what they
# are).
nitpick_ignore = [
    ("py:class", "leasequeue._protocol.L"),  # the lease type of a transport (a TypeVar bound to LeaseLike)
    ("py:obj", "leasequeue._protocol.L"),  # the same, in the bases of Transport
    ("py:class", "leasequeue._protocol.L_contra"),  # the lease type Quarantine takes (contravariant)
    ("py:obj", "leasequeue._protocol.L_contra"),
    ("py:class", "leasequeue._backends.inmemory.transport_py._Self"),  # __enter__ returns the transport
    ("py:class", "leasequeue._backends.sqlite.transport._Self"),
    ("py:class", "leasequeue._backends.postgres.transport._Self"),
    ("py:class", "leasequeue.testing._harness.Harness"),  # what replay() returns
    ("py:class", "leasequeue.testing._generator.Capabilities"),  # DifferentialSummary.capabilities
    ("py:class", "Capabilities"),  # the same, as the NamedTuple field annotation names it
    ("py:class", "Hook"),  # the worker's hook type, Callable[[Job, Optional[BaseException]], Any]
]

# --- HTML
html_theme = "furo"
html_title = f"leasequeue {release}"
html_static_path: list = []
html_show_sourcelink = False
