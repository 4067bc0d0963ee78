"""Package metadata `pip show laya-onnx` reports: where to look, and nothing made up."""

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

PROJECT = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]


def test_project_urls_are_real_addresses():
    urls = PROJECT["urls"]
    assert urls["Model card"] == "https://huggingface.co/convaiinnovations/laya"
    for name, url in urls.items():
        assert url.startswith("https://") and "example" not in url and "TODO" not in url, name


def test_authors_keywords_classifiers():
    assert PROJECT["authors"] and all(a.get("name") for a in PROJECT["authors"])
    assert {"laya", "onnx", "onnxruntime"} <= set(PROJECT["keywords"])
    classifiers = PROJECT["classifiers"]
    assert "Programming Language :: Python :: 3 :: Only" in classifiers
    # `license` is an SPDX expression; setuptools refuses a License :: classifier beside it.
    assert PROJECT["license"] == "Apache-2.0" and not any(c.startswith("License ::") for c in classifiers)
