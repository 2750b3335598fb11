"""The repository stands alone: a clone has everything its documentation and its package point to.

- No file holds an absolute path of one machine (a work, home or Users folder at the root of a path; see
  ``ABSOLUTE``).
- What users read or install — README.md, docs/, the package ``dufs/`` and pyproject.toml — points to nothing
  outside the repository: no ``../shared``, no design notes or papers that only sit beside a checkout. The examples
  may name their default data folder (``shared/data`` beside the clone, overridden by ``--data DIR``), but not the
  design notes or the papers.
- Every relative link of every Markdown file resolves to a file or folder of the repository, and every ``#anchor``
  to a heading of the file it names.

Fast: no data, no cluster; the files are those git tracks (plus untracked files it does not ignore), or, outside a
git checkout (an unpacked sdist), every file under the root except build and cache folders.
"""

from __future__ import annotations

import os
import re
import subprocess
import unicodedata
from pathlib import Path
from urllib.parse import unquote

import pytest

from dufs.testing import patience

ROOT = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve()

# folders never scanned when walking (outside git): builds, caches, virtual environments, outputs
_SKIP_DIRS = {".git", "build", "dist", "__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis", ".mypy_cache",
              ".venv", "venv", ".tox", "dufs-demo", "out", "node_modules"}
_SKIP_DIR_SUFFIXES = (".egg-info", ".zarr", ".dufs-partial", ".dufs-side")

# an absolute path of one machine: a home or work folder at the start of a path (not inside a URL or a word)
ABSOLUTE = re.compile(r"(?<![\w.~/-])/(?:work|home|Users)/|\b[A-Za-z]:\\\\?Users\\")
# pointers to what sits beside a checkout but is no part of the repository
OUTSIDE = re.compile(r"\.\./shared\b|\bshared/papers\b|\bDESIGN\.md\b|\bSTYLE\.md\b")
OUTSIDE_EXAMPLES = re.compile(r"\bshared/papers\b|\bDESIGN\.md\b|\bSTYLE\.md\b")


def _walk() -> list[Path]:
    out = []
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if x not in _SKIP_DIRS and not x.endswith(_SKIP_DIR_SUFFIXES)]
        out += [Path(d) / f for f in files]
    return out


def _repository_files() -> list[Path]:
    try:
        res = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, check=True, timeout=patience(60))
        paths = [ROOT / n for n in res.stdout.decode("utf-8", "surrogateescape").split("\0") if n]
    except (OSError, subprocess.SubprocessError):
        paths = []
    if not paths:  # not a git checkout (or git is missing)
        paths = _walk()
    return sorted(p for p in paths if p.is_file())


FILES = _repository_files()


def _text(path: Path) -> str | None:
    """The file's text, or None for a binary file."""
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _hits(pattern: re.Pattern, paths: list[Path]) -> list[str]:
    """``file:line: text`` for every line of ``paths`` that ``pattern`` matches."""
    found = []
    for p in paths:
        if p == THIS:
            continue
        text = _text(p)
        if text is None:
            continue
        for no, line in enumerate(text.splitlines(), 1):
            if pattern.search(line):
                found.append(f"{_rel(p)}:{no}: {line.strip()[:160]}")
    return found


def _shipped(rel: str) -> bool:
    return rel in ("README.md", "pyproject.toml") or rel.startswith(("docs/", "dufs/"))


def test_files_found():
    names = {_rel(p) for p in FILES}
    assert {"README.md", "pyproject.toml", "dufs/__init__.py", "tests/test_repository.py"} <= names


def test_no_absolute_machine_paths():
    hits = _hits(ABSOLUTE, FILES)
    assert not hits, "absolute paths of one machine (use paths relative to the repository, or options):\n" + \
        "\n".join(hits)


def test_shipped_files_point_inside_the_repository():
    shipped = [p for p in FILES if _shipped(_rel(p))]
    hits = _hits(OUTSIDE, shipped)
    hits += _hits(OUTSIDE_EXAMPLES, [p for p in FILES if _rel(p).startswith("examples/")])
    assert not hits, ("pointers to files outside the repository (cite docs/methods.md, docs/architecture.md, or "
                      "the papers by authors and title):\n" + "\n".join(hits))


# ------------------------------------------------------------------------------------------------ markdown links
_FENCE = re.compile(r"^(\s*)(```|~~~)")
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
_REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, with inline code spans blanked."""
    out, fence = [], None
    for no, line in enumerate(text.splitlines(), 1):
        m = _FENCE.match(line)
        if m:
            fence = None if fence == m.group(2) else (fence or m.group(2))
            continue
        if fence is None:
            out.append((no, _INLINE_CODE.sub("code", line)))
    return out


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = text.replace("`", "").replace("*", "")
    text = unicodedata.normalize("NFC", text).strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = _text(path) or ""
    seen: dict[str, int] = {}
    out = set()
    in_fence = None
    for line in text.splitlines():
        m = _FENCE.match(line)
        if m:
            in_fence = None if in_fence == m.group(2) else (in_fence or m.group(2))
            continue
        if in_fence:
            continue
        h = _HEADING.match(line)
        if h:
            s = _slug(h.group(2))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def _links(path: Path) -> list[tuple[int, str]]:
    found = []
    for no, line in _prose_lines(_text(path) or ""):
        found += [(no, m.group(1)) for m in _LINK.finditer(line)]
        r = _REFDEF.match(line)
        if r:
            found.append((no, r.group(1)))
    return found


MARKDOWN = [p for p in FILES if p.suffix.lower() in (".md", ".markdown")]


def test_markdown_files_found():
    names = {_rel(p) for p in MARKDOWN}
    assert {"README.md", "docs/methods.md", "docs/architecture.md"} <= names


@pytest.mark.parametrize("doc", MARKDOWN, ids=_rel)
def test_markdown_links_resolve(doc):
    bad = []
    for no, target in _links(doc):
        if not target or _SCHEME.match(target) or target.startswith("//"):
            continue  # an external URL (http:, mailto:, ...)
        where, _, anchor = target.partition("#")
        dest = doc if not where else (doc.parent / unquote(where)).resolve()
        try:
            dest.relative_to(ROOT)
        except ValueError:
            bad.append(f"{_rel(doc)}:{no}: {target} points outside the repository")
            continue
        if not dest.exists():
            bad.append(f"{_rel(doc)}:{no}: {target}: no such file in the repository")
            continue
        if dest.is_dir() and not any(p.is_relative_to(dest) for p in FILES):
            bad.append(f"{_rel(doc)}:{no}: {target}: a folder with no file of the repository")
            continue
        if anchor and dest.is_file() and dest.suffix.lower() in (".md", ".markdown") \
                and unquote(anchor).lower() not in _anchors(dest):
            bad.append(f"{_rel(doc)}:{no}: {target}: no heading #{anchor} in {_rel(dest)}")
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_slug_matches_github():
    assert _slug("The engine: the feature-blocked matrix") == "the-engine-the-feature-blocked-matrix"
    assert _slug("LapAOFS and LapDOFS") == "lapaofs-and-lapdofs"
    assert _slug("Kernel `MMFS` (poly2, rbf)") == "kernel-mmfs-poly2-rbf"
    assert _slug("Partitioning the sample axis (the plan)") == "partitioning-the-sample-axis-the-plan"
