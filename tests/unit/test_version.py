"""The package's version is written once, in pyproject.toml; release/version.py writes it into
every file that repeats it (the chart, the examples, the labextension, the docs' and
Dockerfiles' image names), and the chart's images default to its appVersion."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import yaml

from tests.support.scripts import load_script

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


V = load_script(ROOT / "release" / "version.py", "release_version")


def test_every_file_that_repeats_the_version_says_pyprojects(capsys):
    assert V.main(["--check"]) == 0, capsys.readouterr().err
    ours = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((ROOT / "helm" / "gpushare-hub" / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == ours
    values = yaml.safe_load((ROOT / "helm" / "gpushare-hub" / "values.yaml").read_text())
    # The images of the same release: an empty tag is the appVersion (the chart tier renders it).
    assert values["extender"]["image"]["tag"] == values["devicePlugin"]["image"]["tag"] == ""
    z2jh = yaml.safe_load((ROOT / "examples" / "z2jh-values.yaml").read_text())
    assert z2jh["hub"]["image"]["tag"] == ours


def test_a_new_version_reaches_every_repeat_and_a_stale_one_is_named():
    new = "9.8.7"
    assert set(V.stale(new)) == set(V.REPEATS)  # each file says the version somewhere
    for rel, fix in V.REPEATS.items():
        old = (ROOT / rel).read_text()
        changed = fix(old, new)
        assert new in changed and fix(changed, new) == changed, rel  # written, and once is enough


@pytest.mark.parametrize("bad", ["1.2", "v1.2.3", "1.2.3-beta", "", "1.2.3\n"])
def test_set_refuses_a_version_that_is_not_a_release_naming_the_form(bad, tmp_path):
    copy = tmp_path / "pyproject.toml"
    copy.write_text((ROOT / "pyproject.toml").read_text())
    with pytest.raises(SystemExit, match=r"X\.Y\.Z"):
        V.set_version(bad, copy)
    assert copy.read_text() == (ROOT / "pyproject.toml").read_text()  # nothing written
    V.set_version("0.9.0rc1", copy)
    assert tomllib.loads(copy.read_text())["project"]["version"] == "0.9.0rc1"
