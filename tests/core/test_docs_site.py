"""The manual builds without a warning, and the README's links lead somewhere.

The build is `mkdocs build --strict` (mkdocs.yml): a dead link, a missing
anchor, a page left out of the nav, a `/v1` or `/api` route in no route
table and a plain route no page names are all warnings, so any of them
fails it. The README is not part of the site (it links into docs/ as files,
the way GitHub shows them), so its links are checked here: every relative
link must lead to a file that exists, and every `#anchor` must name a
heading of the README or of the page it points into, by GitHub's rule for
anchors (which mkdocs.yml gives the site too)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading (and pymdownx's `slugify(case="lower")`, the site's)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"<[^>]*>", "", text).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every heading's anchor, the second and later of one name numbered as GitHub does."""
    seen: dict[str, int] = {}
    found = set()
    for line in FENCE.sub("", markdown).splitlines():
        match = re.match(r"#{1,6} +(.+?) *#*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(path: Path) -> list[str]:
    """What is wrong with the relative links and anchors of one Markdown file."""
    text = FENCE.sub("", path.read_text())
    wrong = []
    for target in LINK.findall(text) + IMAGE.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            wrong.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest.read_text())):
            wrong.append(f"{target}: no heading #{anchor} in {dest.name}")
    return wrong


def test_the_manual_builds_strict_without_a_warning(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                          str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert "WARNING" not in output, output
    generated = (tmp_path / "site" / "reference" / "openai.html").read_text()
    assert "/v1/chat/completions" in generated and "Generated from" in generated


def test_the_readme_links_lead_to_files_and_headings_that_exist():
    assert broken_links(ROOT / "README.md") == []


def test_the_readme_opens_with_the_two_setup_commands():
    """CI (`.ci/run`) runs the README's test command; the front page keeps both commands first."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```sh\n(.*?)```", readme, re.S)
    assert block is not None and readme.index("```sh") < readme.index("\n## ")
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    assert commands == ["make serve", "make test"]


@pytest.mark.parametrize("link, wrong", [
    ("[a](docs/using/nowhere.md)", "no file docs/using/nowhere.md"),
    ("[a](docs/serving/router.md#no-such-heading)", "no heading #no-such-heading in router.md"),
    ("[a](#no-such-section)", "no heading #no-such-section in README.md"),
])
def test_a_broken_readme_link_is_found(tmp_path, link, wrong):
    readme = tmp_path / "README.md"
    readme.write_text((ROOT / "README.md").read_text().replace("## Where to read on", f"## Where to read on\n\n{link}"))
    (tmp_path / "docs").symlink_to(ROOT / "docs")
    assert [w.split(": ", 1)[1] for w in broken_links(readme)] == [wrong]


def test_anchors_follow_githubs_rule():
    assert slug("Models on other machines (`--models-remote`)") == "models-on-other-machines---models-remote"
    assert slug("The dashboard's sign-in") == "the-dashboards-sign-in"
    assert anchors("# Routes\n## Routes\n```\n# not a heading\n```\n") == {"routes", "routes-1"}
