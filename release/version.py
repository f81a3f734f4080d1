"""The package's version, written once (``pyproject.toml``'s ``[project] version``), and every
place that must repeat it: the chart's ``version`` and ``appVersion`` (its images' default tag),
the hub image's tag in the Zero to JupyterHub examples, the JupyterLab extension's
``package.json``, the docs' image names and the install commands' chart version.

``python release/version.py`` writes them; ``--check`` writes nothing and names the stale ones
(the unit tier runs it); ``--set X.Y.Z`` first changes the version in ``pyproject.toml``.
``make version VERSION=X.Y.Z`` does the last.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# PEP 440 release versions as we tag them (X.Y.Z, or X.Y.ZrcN for a candidate).
VERSION = re.compile(r"\d+\.\d+\.\d+(rc\d+)?")
# Our images as the docs and examples name them, with their tag.
IMAGE_TAG = re.compile(
    r"((?:gpushare-extender|gpushare-device-plugin|k8s-hub-gpushare|singleuser):)[0-9][0-9a-z.]*"
)


def version() -> str:
    """The package's version, from pyproject.toml."""
    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return str(found)


def _chart(text: str, v: str) -> str:
    text = re.sub(r"(?m)^version: .*$", f"version: {v}", text)
    return re.sub(r"(?m)^appVersion: .*$", f'appVersion: "{v}"', text)


def _z2jh_values(text: str, v: str) -> str:
    """Our images' tags (the line after ``name: .../k8s-hub-gpushare`` or ``.../singleuser``)."""
    return re.sub(r'(name: \S+/(?:k8s-hub-gpushare|singleuser)\n\s+tag: )"[^"]*"', rf'\g<1>"{v}"', text)


def _package_json(text: str, v: str) -> str:
    doc = json.loads(text)
    doc["version"] = v
    return json.dumps(doc, indent=2) + "\n"


def _pip_pins(text: str, v: str) -> str:
    """``gpushare-hub[...]==X.Y.Z`` in the docs' install lines."""
    return re.sub(r"(gpushare-hub(?:\[[a-z,-]+\])?==)[0-9][0-9a-z.]*", rf"\g<1>{v}", text)


def _image_tags(text: str, v: str) -> str:
    return IMAGE_TAG.sub(rf"\g<1>{v}", text)


def _install_commands(text: str, v: str) -> str:
    """The published chart's ``--version`` and the release tag in the examples' URL."""
    text = re.sub(r"(charts/gpushare-hub --version )[0-9][0-9a-z.]*", rf"\g<1>{v}", text)
    return re.sub(r"(gpushare-hub/gpushare-hub/v)[0-9][0-9a-z.]*(/examples/)", rf"\g<1>{v}\g<2>", text)


# Each file that repeats the version, and how it is rewritten.
REPEATS: dict[str, Callable[[str, str], str]] = {
    "helm/gpushare-hub/Chart.yaml": _chart,
    "examples/z2jh-values.yaml": _z2jh_values,
    "examples/z2jh-small-cluster-values.yaml": _z2jh_values,
    "labextension/package.json": _package_json,
    "README.md": _install_commands,
    "docs/gpu-operator.md": _install_commands,
    "docs/install.md": _image_tags,
    "docs/notebook-image.md": _pip_pins,
    "images/extender/Dockerfile": _image_tags,
    "images/device-plugin/Dockerfile": _image_tags,
    "images/hub/Dockerfile": _image_tags,
    "images/singleuser/Dockerfile": _image_tags,
}


def stale(v: str) -> list[str]:
    """The files whose version is not ``v``."""
    return [
        rel for rel, fix in REPEATS.items() if fix((ROOT / rel).read_text(), v) != (ROOT / rel).read_text()
    ]


def set_version(v: str, path: Path = ROOT / "pyproject.toml") -> None:
    """Write ``v`` into ``path``'s (pyproject.toml's) [project] table."""
    if not VERSION.fullmatch(v):
        raise SystemExit(f"--set {v!r}: give a release version, X.Y.Z (or X.Y.ZrcN), e.g. 0.2.0")
    text, n = re.subn(r'(?m)^version = "[^"]*"$', f'version = "{v}"', path.read_text(), count=1)
    if n != 1:
        raise SystemExit('pyproject.toml has no `version = "..."` line in [project]')
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is stale")
    parser.add_argument("--set", metavar="X.Y.Z", help="change the version in pyproject.toml first")
    args = parser.parse_args(argv)
    if args.set:
        set_version(args.set)
    v = version()
    if args.check:
        old = stale(v)
        for rel in old:
            print(f"{rel} does not say version {v}: run `make version`", file=sys.stderr)
        return 1 if old else 0
    for rel, fix in REPEATS.items():
        path = ROOT / rel
        path.write_text(fix(path.read_text(), v))
    print(f"version {v} written into {', '.join(REPEATS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
