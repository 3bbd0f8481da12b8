"""The documentation: README.md (the front page) and the MkDocs site built from docs/ (mkdocs.yml).

The site is built as `make docs` builds it, strictly (any warning, a broken link or anchor
included, fails it), into a temporary folder; the reference page's generated tables are checked
against the kit's schema and `snakedvc --help`; the tutorial page is opened in a real headless
Chromium. The tutorial's blocks themselves are run by tests/test_tutorial.py and test_install.py.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from tests.browser import CHROMIUM, open_page
from tests.conftest import REPO
from tests.test_tutorial import tutorial_blocks

README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = ["index", "tutorial", "dvc-pipelines", "slurm", "training", "sweeps", "records", "reliability",
         "reference", "benchmarks", "architecture", "snakemake-upgrade"]  # fmt: skip


def build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("docs") / "site"
    proc = build(REPO, site)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "WARNING" not in proc.stderr, proc.stderr[-4000:]
    return site


class _Page(HTMLParser):
    """Element ids and table cells' code of one built page."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.cell_code: list[str] = []
        self._in_cell = self._in_code = False
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.ids |= {value for name, value in attrs if name == "id" and value}
        self._in_cell = self._in_cell or tag == "td"
        self._in_code = self._in_code or (tag == "code" and self._in_cell)

    def handle_endtag(self, tag: str) -> None:
        self._in_cell = self._in_cell and tag != "td"
        self._in_code = self._in_code and tag != "code"

    def handle_data(self, data: str) -> None:
        if self._in_code:
            self.cell_code.append(data)


def page(site: Path, name: str) -> _Page:
    return _Page((site / f"{name}.html").read_text())


def test_the_site_builds_strictly_with_every_page_and_fetches_nothing(site: Path) -> None:
    for name in PAGES:
        assert (site / f"{name}.html").is_file(), name
    # No web fonts, no script or style from elsewhere: the pages open offline (a compute node).
    for html in site.rglob("*.html"):
        text = html.read_text()
        assert not re.findall(r"<(?:script|link)[^>]+(?:src|href)=\"(?:https?:)?//", text), html
        assert "fonts.googleapis" not in text and "fonts.gstatic" not in text, html


@pytest.mark.parametrize("breakage", ["a link to a missing page", "an anchor that no heading has", "no marker"])
def test_the_strict_build_fails_on_a_broken_link_or_a_missing_generated_table(tmp_path: Path, breakage: str) -> None:
    project = tmp_path / "project"
    shutil.copytree(DOCS, project / "docs")
    shutil.copy2(REPO / "mkdocs.yml", project / "mkdocs.yml")
    (project / "scripts").symlink_to(REPO / "scripts")
    page, old, new = {
        "a link to a missing page": ("sweeps.md", "", "\nSee [the old page](no-such-page.md).\n"),
        "an anchor that no heading has": ("sweeps.md", "", "\nSee [resume](training.md#no-such-heading).\n"),
        "no marker": ("reference.md", "<!-- snakedvc:config-keys -->", ""),
    }[breakage]
    text = (project / "docs" / page).read_text()
    (project / "docs" / page).write_text(text.replace(old, new) if old else text + new)
    proc = build(project, tmp_path / "site")
    assert proc.returncode != 0, proc.stderr[-3000:]
    said = {"a link to a missing page": "no-such-page.md", "an anchor that no heading has": "#no-such-heading"}
    assert said.get(breakage, "snakedvc:config-keys") in proc.stderr, proc.stderr[-3000:]


def readme_links() -> list[str]:
    text = README.read_text()
    return re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r"(?:src|href)=\"([^\"]+)\"", text)


def test_the_readme_is_a_short_front_page_whose_links_all_resolve(site: Path) -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move the detail to a page under docs/"
    local = [link for link in readme_links() if not re.match(r"[a-z]+:", link)]
    assert {"docs/tutorial.md", "docs/reference.md", "docs/slurm.md"} <= {link.split("#")[0] for link in local}
    for link in local:
        path, _, anchor = link.partition("#")
        assert (REPO / path).exists(), f"README.md links to {path}, which does not exist"
        if anchor and path.startswith("docs/") and path.endswith(".md"):
            built = path.removeprefix("docs/").removesuffix(".md")
            assert anchor in page(site, built).ids, f"README.md links to {link}: the page has no such heading"


def code_lines(text: str) -> list[str]:
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
    return [line.rstrip() for block in blocks for line in block.splitlines() if line.strip()]


def test_the_readmes_quickstart_is_made_of_the_docs_own_lines() -> None:
    """What a user copies from the front page is what the pages hold (and their tests run)."""
    text = README.read_text()
    quickstart = text[text.index("## Quickstart") :].split("\n## ", 1)[0]
    shown = code_lines(quickstart)
    docs = set(code_lines((DOCS / "tutorial.md").read_text()) + code_lines((DOCS / "dvc-pipelines.md").read_text()))
    assert len(shown) >= 10 and [line for line in shown if line not in docs] == []


# The pages a user reads to do something (style practice 20), as against the reference and the
# development notes.
GUIDES = ["index", "tutorial", "dvc-pipelines", "slurm", "training", "sweeps", "records", "reliability", "ui"]
CODE_WIDTH = 88  # what a code block shows without scrolling, at the site's width


@pytest.mark.parametrize("name", GUIDES)
def test_a_guide_reads_as_a_get_started_page(name: str) -> None:
    """Code lines fit the page, no list item runs past three lines, and the page shows what a user
    sees (an output block, a table or a picture). Exempt: the tutorial's titled blocks (files a
    reader copies whole) and lines the README's quickstart shows, kept as it has them."""
    text = (DOCS / f"{name}.md").read_text()
    quickstart = set(code_lines(README.read_text()))
    blocks = re.findall(r"^```([^\n]*)\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
    wide = [line for head, body in blocks if 'title="' not in head for line in body.splitlines()
            if len(line) > CODE_WIDTH and line.rstrip() not in quickstart]  # fmt: skip
    assert wide == [], f"docs/{name}.md: code lines over {CODE_WIDTH} characters: {wide}"
    prose = re.sub(r"^```.*?^```$", "", text, flags=re.MULTILINE | re.DOTALL)
    items = re.findall(r"^ *(?:[-*]|\d+\.) .*?(?=^ *(?:[-*]|\d+\.) |^\s*$|\Z)", prose, re.MULTILINE | re.DOTALL)
    long = [item.splitlines()[0] for item in items if len(item.strip().splitlines()) > 3]
    assert long == [], f"docs/{name}.md: list items over three lines (make them a paragraph or a table): {long}"
    shows = re.search(r"^```(text|console)|^\|.*\|$|!\[", text, re.MULTILINE)
    assert shows, f"docs/{name}.md shows nothing a user sees: no output block, table or picture"


def schema_keys(schema: dict, prefix: str = "snakedvc") -> list[str]:
    keys = []
    for name, spec in schema.get("properties", {}).items():
        keys += [f"{prefix}.{name}", *schema_keys(spec, f"{prefix}.{name}")]
    return keys


def test_the_reference_lists_every_key_of_the_kit_schema_and_every_command(site: Path) -> None:
    schema = yaml.safe_load((REPO / "src/snakedvc/schemas/snakedvc.schema.yaml").read_text())
    keys = schema_keys(schema)
    assert {"snakedvc.tracking", "snakedvc.experiment.name", "snakedvc.sweep.strategy"} <= set(keys)
    reference = page(site, "reference")
    assert [key for key in keys if key not in reference.cell_code] == []
    html = (site / "reference.html").read_text()
    strategy = schema["properties"]["sweep"]["properties"]["strategy"]
    assert " ".join(strategy["description"].split()[:6]) in html  # descriptions come with the keys
    # Every command `snakedvc --help` lists, under its own heading.
    help_text = subprocess.run(
        [sys.executable, "-m", "snakedvc", "--help"], capture_output=True, text=True, check=True
    ).stdout
    commands = re.findall(r"^    (\w[\w-]*)", help_text, re.MULTILINE)
    assert {"launch", "submit", "init", "exp"} <= set(commands)
    for command in commands:
        assert any(i == f"snakedvc-{command}" or i.startswith(f"snakedvc-{command}-") for i in reference.ids), command


def test_the_reference_page_holds_its_generated_parts_as_they_are_now() -> None:
    """docs/reference.md as GitHub shows it (no build): the commands and config keys are there, and
    they are what the kit's parser and schema give today."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import mkdocs_hooks
    finally:
        sys.path.remove(str(REPO / "scripts"))
    text = (DOCS / "reference.md").read_text()
    assert "| `snakedvc.sweep.strategy` |" in text and "### `snakedvc launch`" in text
    assert mkdocs_hooks.filled(text) == text, "docs/reference.md is stale: run python scripts/mkdocs_hooks.py"


@pytest.mark.skipif(not CHROMIUM, reason="needs chromium: make test (make browser)")
def test_the_tutorial_page_renders_in_a_browser_with_its_titled_blocks(site: Path, tmp_path: Path) -> None:
    shot = tmp_path / "tutorial.png"  # left for a person to look at
    view = open_page(site / "tutorial.html", shot)
    assert view.errors == []
    assert view.title == "Tutorial - snakedvc"  # the nav's name, then the site's
    shown = [line.rstrip("¶") for line in view.text.splitlines()]  # a heading ends in its permalink
    assert "Use snakedvc in your own project" in shown  # the page's own heading
    assert "Reference: what each capability asks of your code, and how it works" in " ".join(view.headings)
    for title, block in tutorial_blocks().items():
        assert title in shown, f"the block titled {title!r} shows no title"
        first = next(line for line in block.splitlines() if line.strip())
        assert first in view.text, f"the block titled {title!r} is not on the page"
    # A real picture of a long page: a PNG of the viewport's width and many screens high.
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert width > 1000 and height > 3000, (width, height)
    assert len(png) > 100_000
