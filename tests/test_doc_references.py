"""What the prose names exists: every dotted `braid.<module>.<name>` in README.md, docs/ and the code's docstrings and comments resolves
to a module or attribute, and every relative link in README.md and docs/ to a file and heading."""

from __future__ import annotations

import ast
import importlib
import io
import pkgutil
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
CODE = sorted(p for top in ("layers", "infra", "functions", "tests", "scripts") for p in (ROOT / top).rglob("*.py") if "node_modules" not in p.parts)
REFERENCE = re.compile(r"(?<![\w/.\-])braid(?:\.[A-Za-z_]\w*)+\*?")  # not a file name such as pg-braid.key or a path
LINK = re.compile(r"\]\(([^)\s]+)\)")


def prose_of(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of a Python file's comments and docstrings: where a name is prose, not code."""
    source = path.read_text()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc and node.body:
                yield node.body[0].lineno, doc


def resolves(reference: str) -> bool:
    """A module (the longest importable prefix) and then attributes of it. `braid.cli.commands.MODULE`: a placeholder in
    capitals stands for any name, so its prefix must resolve; `braid.pipeline.verify_*`: some name there starts so."""
    parts = reference.split(".")
    for at, part in enumerate(parts):
        if part.isupper():
            return resolves(".".join(parts[:at]))
    if reference.endswith("*"):
        parent, _, stem = reference[:-1].rpartition(".")
        try:
            found = importlib.import_module(parent)
        except ImportError:
            return False
        names = {m.name for m in pkgutil.iter_modules(getattr(found, "__path__", []))} | set(dir(found))
        return any(name.startswith(stem) for name in names)
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def references() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            found += [(f"{doc.relative_to(ROOT)}:{number}", r) for r in REFERENCE.findall(line)]
    for path in CODE:
        for number, text in prose_of(path):
            found += [(f"{path.relative_to(ROOT)}:{number}", r) for r in REFERENCE.findall(text)]
    return found


def test_the_prose_names_braid_modules_and_attributes_that_exist() -> None:
    found = references()
    assert len({r for _, r in found}) > 20  # the scan reads the prose (README, docs, docstrings, comments)
    stale = sorted({(where, r) for where, r in found if not resolves(r)})
    assert stale == []


def test_a_stale_reference_is_caught() -> None:
    assert resolves("braid.pipeline.worker.process_item") and resolves("braid.errors.EXIT_CODES")
    assert not resolves("braid.pipeline.prune_run") and not resolves("braid.errors.NoSuchError")
    assert resolves("braid.pipeline.verify_*") and not resolves("braid.pipeline.nothing_*")
    assert resolves("braid.cli.commands.MODULE") and not resolves("braid.clients.MODULE")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    """The headings' anchors and the explicit ones (`<a id="catalog"></a>`, for a heading that names its files)."""
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    return {slug(m) for m in re.findall(r"^#+ (.*)$", text, re.M)} | set(re.findall(r'<a id="([\w-]+)"></a>', text))


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_heading(doc: Path) -> None:
    broken = []
    for target in LINK.findall(re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)):
        if re.match(r"^[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists() or (anchor and (file.is_dir() or anchor not in anchors(file))):
            broken.append(target)
    assert broken == []


def test_the_exit_code_table_lists_exactly_the_codes_braid_returns() -> None:
    from braid.errors import EXIT_CODES

    usage = (ROOT / "docs" / "usage.md").read_text()
    section = usage[usage.index("## Exit codes") :]
    table = section[section.index("| code") : section.index("\n\n", section.index("| code"))]
    documented = [int(row.strip("|").split("|")[0]) for row in table.splitlines()[2:]]
    assert documented == sorted(EXIT_CODES)


def test_every_documented_restore_extracts_into_a_directory_the_block_makes_new() -> None:
    """A restore example never extracts over a live data directory: its block makes the target with `mkdir` first."""
    found = []
    for doc in DOCS:
        for block in re.findall(r"```sh\n(.*?)```", doc.read_text(), re.S):
            for target in re.findall(r"braid restore .*-- tar -x -C (\S+)", block):
                found.append(target)
                made = re.search(rf"^mkdir (?:-p )?{re.escape(target)}(\s|$)", block, re.M)
                assert made and made.start() < block.index(f"tar -x -C {target}"), (doc.name, target)
    assert len(found) >= 4
