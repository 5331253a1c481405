"""The documentation site (``docs/``, built by Sphinx in ``.ci/run``).

* The site's own pages (the front page and the guide pages, outside the
  README sections they include) have Python examples: they run here.
  The README's sections have their tests (``test_readme_*.py``), and
  ``docs/testing-your-backend.md`` has ``tests/kit/test_backend_guide.py``.
* Every ``{include}`` of a guide page finds its start and end markers, so a
  renamed README heading fails the test run, not only the docs build; and
  every README section is included by some page.
* The runnable example of ``docs/sqlite.md`` runs; the contract's Python
  blocks are signature sketches (``t.pause(group_id) -> bool``): their
  parameters are checked against the code's.
* With the docs tools installed (the ``docs`` extra; ``.ci/run`` installs
  them), a site whose reference lacks a public name fails to build, and the
  site ``.ci/run`` built (``LEASEQUEUE_DOCS_HTML``) has an entry with a
  signature for every public name and the ``--help`` of every subcommand.

Without the source tree (the installed-wheel test run copies ``tests/``
only) these tests skip with that reason; without Sphinx the build tests
skip, except where ``LEASEQUEUE_DOCS_HTML`` says the site was built (CI):
there a missing Sphinx fails.
"""

from __future__ import annotations

import html
import importlib
import inspect
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

pytestmark = pytest.mark.skipif(
    not (DOCS / "conf.py").is_file(), reason="needs the source tree (docs/ is not next to tests/)"
)

#: The site's own pages, whose examples this file runs.
OWN_PAGES = ["index.md", *sorted(str(p.relative_to(DOCS)) for p in (DOCS / "guide").glob("*.md"))]

_FENCE = re.compile(r"^(`{3,})(\{include\}|python)[ \t]*(.*?)\n(.*?)^\1[ \t]*$", re.M | re.S)


def _blocks(page: str) -> List[Tuple[str, str, str]]:
    """(kind, argument, body) of every include and python block of a page."""
    text = (DOCS / page).read_text(encoding="utf-8")
    return [(m.group(2), m.group(3).strip(), m.group(4)) for m in _FENCE.finditer(text)]


def _need_sphinx() -> None:
    try:
        import myst_parser  # noqa: F401
        import sphinx  # noqa: F401
    except ImportError as exc:
        if os.environ.get("LEASEQUEUE_DOCS_HTML"):
            pytest.fail(f"the site was built but its tools are missing here: {exc}")
        pytest.skip(f"the docs extra is not installed ({exc}): python -m pip install '.[docs]'")


# ------------------------------------------------------------------ without Sphinx


def test_the_site_pages_examples_run() -> None:
    ran = []
    for page in OWN_PAGES:
        for i, (kind, _, body) in enumerate(_blocks(page)):
            if kind == "python":
                exec(compile(body, f"docs/{page} (example {i + 1})", "exec"), {"__name__": "docs_example"})  # noqa: S102
                ran.append(page)
    assert "index.md" in ran, "the front page's example is gone"


def test_a_broken_example_fails() -> None:
    """The exec above really runs the code (a failing example fails)."""
    with pytest.raises(AssertionError):
        exec(compile("import leasequeue\nassert leasequeue.InMemoryTransport().claim('w', 1.0)", "x", "exec"), {})


def test_every_include_finds_its_markers() -> None:
    includes: Dict[str, int] = {}
    for page in sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if "_build" not in p.parts):
        for kind, argument, body in _blocks(page):
            if kind != "{include}":
                continue
            target = (DOCS / page).parent / argument
            assert target.is_file(), f"docs/{page} includes {argument}, which does not exist"
            text = target.read_text(encoding="utf-8")
            options = dict(re.findall(r"^:([\w-]+):[ \t]*(.*)$", body, re.M))
            start = 0
            for option in ("start-after", "end-before"):
                if option in options:
                    marker = options[option].strip().strip('"')
                    found = text.find(marker, start)
                    assert found >= 0, f"docs/{page}: {option} {marker!r} is not in {argument}"
                    start = found
            includes[target.name] = includes.get(target.name, 0) + 1
    # The guide is the README's story: it includes the README section by section.
    assert includes.get("README.md", 0) >= 6, includes


def test_every_readme_section_is_on_the_site() -> None:
    """The guide is the README split into pages: a section added to the
    README must be included by a page too (or the site silently lacks it)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ranges: List[Tuple[int, int]] = []
    for page in sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if "_build" not in p.parts):
        for kind, argument, body in _blocks(page):
            if kind == "{include}" and ((DOCS / page).parent / argument).resolve() == (ROOT / "README.md").resolve():
                options = dict(re.findall(r"^:([\w-]+):[ \t]*(.*)$", body, re.M))
                after, before = options.get("start-after"), options.get("end-before")
                start = readme.find(after.strip().strip('"')) if after is not None else 0
                end = readme.find(before.strip().strip('"'), start) if before is not None else len(readme)
                ranges.append((start, end))
    headings = [m.start() for m in re.finditer(r"^##? .*$", readme, re.M)]
    assert headings
    for pos in headings:
        heading = readme[pos:readme.index("\n", pos)]
        assert any(a <= pos < b for a, b in ranges), f"README section {heading!r} is on no page of the site"


def test_the_sqlite_page_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = [body for kind, _, body in _blocks("sqlite.md") if kind == "python" and "SQLiteTransport(" in body]
    assert blocks, "docs/sqlite.md has no example"
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks[0], "docs/sqlite.md", "exec"), {"__name__": "docs_example"})  # noqa: S102
    assert (tmp_path / "queue.db").is_file()


_SKETCH = re.compile(r"^[^#\n]*?\bt\.(\w+)\(([^()\n]*)\)", re.M)


def _is_literal(node: "ast.AST") -> bool:
    import ast

    try:
        ast.literal_eval(node)
    except ValueError:
        return False
    return True


def _sketches(text: str) -> List[Tuple[str, "inspect.Signature"]]:
    """The ``t.method(params)`` sketches of a page's Python blocks, as
    signatures (lines whose arguments are values, not parameters, are
    examples, not sketches, and are left out)."""
    import ast

    out = []
    for body in re.findall(r"```python\n(.*?)```", text, re.S):
        for m in _SKETCH.finditer(body):
            try:
                tree = ast.parse(f"def {m.group(1)}({m.group(2)}): pass")
            except SyntaxError:
                continue
            args = tree.body[0].args  # type: ignore[attr-defined]
            if not all(_is_literal(d) for d in list(args.defaults) + [d for d in args.kw_defaults if d is not None]):
                continue  # ``t.ack(lease, conn=conn)``: an example passing a variable, not a sketch
            params: List[inspect.Parameter] = []
            positional = args.args
            defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
            for arg, default in zip(positional, defaults):
                params.append(inspect.Parameter(
                    arg.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                    default=inspect.Parameter.empty if default is None else ast.literal_eval(default)))
            for arg, default in zip(args.kwonlyargs, args.kw_defaults):
                params.append(inspect.Parameter(
                    arg.arg, inspect.Parameter.KEYWORD_ONLY,
                    default=inspect.Parameter.empty if default is None else ast.literal_eval(default)))
            out.append((m.group(1), inspect.Signature(params)))
    return out


def _check_sketches(text: str, page: str) -> int:
    """Every parameter a sketch names is the code's, of the same kind, in
    the same order, with the same default; a required parameter of the code
    is never left out.  Returns how many sketches were checked."""
    from leasequeue import PyInMemoryTransport

    sketches = _sketches(text)
    for name, sketch in sketches:
        method = getattr(PyInMemoryTransport, name, None)
        assert method is not None, f"{page} sketches t.{name}(), which InMemoryTransport lacks"
        real = [p for p in inspect.signature(method).parameters.values() if p.name != "self"]
        names = [p.name for p in real]
        where = f"{page}: t.{name}{sketch} against the code's {name}{inspect.signature(method)}"
        order = []
        for param in sketch.parameters.values():
            assert param.name in names, where
            code = real[names.index(param.name)]
            order.append(names.index(param.name))
            keyword_only = inspect.Parameter.KEYWORD_ONLY
            assert (code.kind == keyword_only) == (param.kind == keyword_only), where
            assert (code.default is inspect.Parameter.empty) == (param.default is inspect.Parameter.empty), where
            if isinstance(code.default, (int, float, str, type(None))):
                assert code.default == param.default, where
        assert order == sorted(order), where
        for code in real:
            if code.default is inspect.Parameter.empty and code.kind not in (code.VAR_POSITIONAL, code.VAR_KEYWORD):
                assert code.name in sketch.parameters, where
    return len(sketches)


def test_the_contracts_signature_sketches_match_the_code() -> None:
    """``docs/contract.md`` sketches each call (``t.claim(worker_id,
    visibility, min_priority=0, *, timeout=0.0)``) in its Python blocks."""
    checked = _check_sketches((DOCS / "contract.md").read_text(encoding="utf-8"), "docs/contract.md")
    assert checked >= 15, checked


@pytest.mark.parametrize("sketch", [
    "t.publish(group, event, priority=0)",  # a renamed parameter
    "t.publish(group_id, event, priority=1)",  # another default
    "t.publish(group_id)",  # a required parameter left out
    "t.claim(worker_id, visibility, min_priority=0, timeout=0.0)",  # keyword-only shown as positional
    "t.no_such_call(lease)",  # a method the code lacks
])
def test_a_drifted_sketch_is_caught(sketch: str) -> None:
    text = f"```python\n{sketch}\n```\n"
    assert len(_sketches(text)) == 1
    with pytest.raises(AssertionError):
        _check_sketches(text, "sketch")


# ------------------------------------------------------------------ with Sphinx


def _copy_site(tmp_path: Path) -> Path:
    """A copy of the tree the site is built from (docs/ copied, the rest linked)."""
    root = tmp_path / "tree"
    root.mkdir()
    shutil.copytree(DOCS, root / "docs", ignore=shutil.ignore_patterns("_build", "__pycache__"))
    for name in ("src", "tools", "benchmarks", "README.md", "CHANGELOG.md"):
        (root / name).symlink_to(ROOT / name)
    return root


def _build(root: Path, builder: str = "dummy") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", builder,
         str(root / "docs"), str(root / "out")],
        capture_output=True, text=True, timeout=900,
    )


@pytest.mark.untraced(reason="a Sphinx build in child processes: it documents the code, it does not test it")
def test_a_public_name_without_a_reference_entry_fails_the_build(tmp_path: Path) -> None:
    _need_sphinx()
    root = _copy_site(tmp_path)
    page = root / "docs" / "reference" / "types.rst"
    text = page.read_text(encoding="utf-8")
    entry = ".. autoclass:: leasequeue.TransportStats\n   :members:\n"
    assert entry in text
    page.write_text(text.replace(entry, ""), encoding="utf-8")
    done = _build(root)
    assert done.returncode != 0, done.stdout + done.stderr
    assert "public name leasequeue.TransportStats has no reference entry" in done.stderr, done.stderr
    # and nothing else is wrong with the copy: every warning is about the removed entry
    warnings = [line for line in done.stderr.splitlines() if "WARNING" in line]
    assert warnings and all("TransportStats" in line for line in warnings), done.stderr


def _built_site() -> Path:
    built = os.environ.get("LEASEQUEUE_DOCS_HTML")
    if not built:
        pytest.skip("the site was not built in this run (.ci/run builds it and sets LEASEQUEUE_DOCS_HTML)")
    site = Path(built)
    assert (site / "index.html").is_file(), f"LEASEQUEUE_DOCS_HTML={built} holds no built site"
    return site


def test_every_public_name_has_an_entry_with_its_signature() -> None:
    site = _built_site()
    _need_sphinx()
    sys.path.insert(0, str(DOCS / "_ext"))
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from leasequeue_docs import public_names
    finally:
        del sys.path[:2]
    pages = "".join(p.read_text(encoding="utf-8") for p in sorted((site / "reference").glob("*.html")))
    for name in public_names():
        m = re.search(rf'<dt class="sig sig-object py" id="{re.escape(name)}">(.*?)</dt>', pages, re.S)
        assert m, f"{name} has no entry in the reference"
        module, _, attr = name.rpartition(".")
        obj = getattr(importlib.import_module(module), attr)
        if name in ("leasequeue.InMemoryTransport", "leasequeue.Lease"):  # the site documents the pure twin
            obj = getattr(importlib.import_module("leasequeue._backends.inmemory.transport_py"), attr)
        if not callable(obj) or getattr(obj, "_is_protocol", False) or getattr(obj, "__name__", attr) != attr:
            continue  # a value, a protocol (never instantiated) or an alias (PyInMemoryTransport)
        try:
            signature = str(inspect.signature(obj))
        except (TypeError, ValueError):  # a built-in's
            continue
        if signature not in ("()", "(*args, **kwargs)"):
            assert "sig-paren" in m.group(1), f"{name}: the entry has no signature {signature}"


def test_no_entry_shows_a_docstring_that_is_not_leasequeues() -> None:
    """A value's entry must not show its type's docstring (``str(object='')
    -> str``), nor a named tuple field "Alias for field number 3"."""
    site = _built_site()
    pages = html.unescape(" ".join(
        re.sub(r"<[^>]+>", "", p.read_text(encoding="utf-8")) for p in sorted((site / "reference").glob("*.html"))))
    borrowed = [t.__doc__.strip().splitlines()[0] for t in (str, tuple, int, float, dict, list, bool)]
    for text in [*borrowed, "Alias for field number"]:
        assert text not in pages, f"the reference shows {text!r}"


def test_the_command_line_reference_has_every_subcommand() -> None:
    site = _built_site()
    from leasequeue.__main__ import build_parser

    page = html.unescape(re.sub(r"<[^>]+>", "", (site / "reference" / "cli.html").read_text(encoding="utf-8")))
    parser = build_parser()
    subcommands = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    assert subcommands and subcommands[0].choices
    for name, sub in subcommands[0].choices.items():
        assert f"usage: leasequeue {name}" in page, f"no --help of leasequeue {name}"
        for action in sub._actions:
            for option in action.option_strings:
                assert option in page, f"leasequeue {name} {option} is not in the reference"
