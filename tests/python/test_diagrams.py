"""The docs' diagrams (docs/diagrams/*.dot, rendered by scripts/render_diagrams.sh): each SVG
is committed beside its source and must be the rendering of that source as it is now."""
import html
import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DIAGRAMS = sorted((ROOT / "docs" / "diagrams").glob("*.dot"))


def texts(svg: str):
    """The text lines an SVG shows, unescaped, in order."""
    return [html.unescape(t) for t in re.findall(r"<text[^>]*>([^<]*)</text>", svg)]


def labels(dot: str):
    """Every line of every label in a dot source."""
    out = []
    for label in re.findall(r'label="((?:[^"\\]|\\.)*)"', dot):
        out += [line.replace('\\"', '"') for line in label.split("\\n") if line]
    return out


def test_there_is_a_diagram():
    assert DIAGRAMS, "docs/diagrams/ has no .dot source"


@pytest.mark.parametrize("src", DIAGRAMS, ids=lambda p: p.name)
def test_the_svg_shows_every_label_of_its_source(src):
    svg = src.with_suffix(".svg")
    assert svg.is_file(), f"{svg.name} is missing: run scripts/render_diagrams.sh"
    shown = set(texts(svg.read_text()))
    missing = [line for line in labels(src.read_text()) if line not in shown]
    assert not missing, f"{svg.name} is older than {src.name} (run scripts/render_diagrams.sh): {missing}"


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz's dot is not installed")
@pytest.mark.parametrize("src", DIAGRAMS, ids=lambda p: p.name)
def test_the_svg_is_the_rendering_of_its_source(src):
    fresh = subprocess.run(["dot", "-Tsvg", str(src)], capture_output=True, text=True, check=True).stdout
    assert texts(fresh) == texts(src.with_suffix(".svg").read_text()), \
        f"run scripts/render_diagrams.sh: {src.with_suffix('.svg').name} differs from {src.name}'s rendering"
