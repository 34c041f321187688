"""Every relative link in the README and docs/ resolves: the file exists and, with a #fragment, the target page
has that heading (GitHub's anchors: lower case, punctuation dropped, spaces as dashes)."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # headings inside code blocks are not headings
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)}


def slug(heading: str) -> str:
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [t for t in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]  # not http:, mailto:


def test_slugs_are_githubs():
    assert slug("VTAB-1k fine-tuning") == "vtab-1k-fine-tuning"
    assert slug("The embedded LiT suite") == "the-embedded-lit-suite"
    assert slug("ImageNet-C robustness (mCE)") == "imagenet-c-robustness-mce"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest}")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target}: no heading #{fragment} in {dest.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


# files the commands write, named in their docs
OUTPUTS = {"REGRESSION.md", "LEADERBOARD.md", "table.md", "REANCHOR.md", "results/nightly/REANCHOR.md", "ARITHMETIC.md"}
TOP = ("docs/", "benchmarks/", "tasks/", "transferbench/", "tests/", "results/", ".ci/")
REFERENCE = re.compile(r"(?<![\w/.:-])((?:\.\./)?(?:[\w.-]+/)*[\w.-]+\.(?:md|py|yaml|json))(?![\w/])")
SOURCES = [
    *PAGES,
    REPO / "CHANGELOG.md",
    *sorted((REPO / "benchmarks").glob("*.md")),
    *sorted((REPO / "benchmarks").glob("*.py")),
    *sorted((REPO / "transferbench").rglob("*.py")),
    *sorted((REPO / "tasks").glob("*.yaml")),
]


def test_every_file_a_page_or_module_cites_exists():
    """Beyond links: a file named in prose, a docstring or a comment (`docs/regression.md`, `benchmarks/RESULTS.md`,
    `see DESIGN.md`) exists in the project. A path under one of the project's folders must resolve; a bare
    `NAME.md` must be some file of the project. Other libraries' files (`big_vision/optax.py`) are not ours."""
    names = {p.name for p in REPO.rglob("*.md") if ".git" not in p.parts}
    missing = []
    for source in SOURCES:
        for ref in REFERENCE.findall(source.read_text()):
            if ref in OUTPUTS:
                continue
            if ref.startswith(TOP) or ref.startswith("../"):
                found = (REPO / ref).exists() or (source.parent / ref).resolve().exists()
            elif ref.endswith(".md") and "/" not in ref:
                found = ref in names
            else:
                continue
            if not found:
                missing.append(f"{source.relative_to(REPO)}: {ref}")
    assert not missing, "files cited but not in the project: " + "; ".join(missing)


def test_the_file_check_sees_a_missing_file():
    assert REFERENCE.findall("as the paper says (see DESIGN.md); docs/x.md") == ["DESIGN.md", "docs/x.md"]
    assert REFERENCE.findall("https://github.com/a/b/blob/main/docs/x.md and big_vision/optax.py") == [
        "big_vision/optax.py"
    ]
