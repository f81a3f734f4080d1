"""The images of images/*/Dockerfile build here and run the package (images/build.py).

buildah (chroot isolation, vfs storage) builds each Dockerfile unchanged on a debootstrap
base, from the host-built wheelhouse; an image whose inputs are unchanged is reused from
the cache. ``buildah run`` then runs Python inside each one. GPUSHARE_SKIP_IMAGES=1 skips
this module (a machine without buildah and debootstrap).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.scripts import load_script, require_image_tools

from .conftest import ROOT

build = load_script(ROOT / "images" / "build.py", "images_build")


@dataclass
class Built:
    builder: Any
    refs: dict[str, str]
    seconds: float


@pytest.fixture(scope="module")
def built() -> Built:
    if os.environ.get("GPUSHARE_SKIP_IMAGES") == "1":
        pytest.skip("GPUSHARE_SKIP_IMAGES=1")
    require_image_tools()
    builder = build.Builder()
    start = time.monotonic()
    try:
        refs = builder.build()
    except build.BuildError as err:
        pytest.fail(str(err), pytrace=False)
    return Built(builder, refs, time.monotonic() - start)


@pytest.mark.parametrize("image", build.IMAGES, ids=lambda i: i.name)
def test_the_package_imports_inside_each_image(built: Built, image: Any):
    out = built.builder.run_in(built.refs[image.name], "python", "-c", f"{image.check}; print('imported')")
    assert out.strip() == "imported"


def inspect(built: Built, name: str) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(
        built.builder.buildah("inspect", "--type=image", built.refs[name], capture=True)
    )["OCIv1"]["config"]
    return config


def test_each_image_runs_its_component_as_the_dockerfile_says(built: Built):
    extender, plugin = inspect(built, "extender"), inspect(built, "device-plugin")
    assert extender["Entrypoint"] == ["gpushare-extender"] and extender["User"] == "65532:65532"
    assert plugin["Entrypoint"] == ["gpushare-device-plugin"]
    uid = built.builder.run_in(built.refs["extender"], "python", "-c", "import os; print(os.getuid())")
    assert uid.strip() == "65532"
    # The console scripts are there and start (their --help needs no cluster).
    for name, script in (("extender", "gpushare-extender"), ("device-plugin", "gpushare-device-plugin")):
        assert "--" in built.builder.run_in(built.refs[name], script, "--help")


def test_nothing_came_from_the_package_index(built: Built):
    """Our wheel and its dependencies are the wheelhouse's: pip has no index configured inside."""
    out = built.builder.run_in(
        built.refs["device-plugin"],
        "python",
        "-c",
        "import importlib.metadata as m; print(m.version('gpushare-hub'), m.version('grpcio'))",
    )
    ours, grpc = out.split()
    assert ours == build.package_version() and grpc  # the checkout's version: the one wheel there


def test_a_second_build_reuses_every_image(built: Built, capsys: pytest.CaptureFixture[str]):
    again = build.Builder()
    start = time.monotonic()
    assert again.build() == built.refs
    assert again.timings == {}, again.timings  # no debootstrap, no wheelhouse, no build
    sizes = {name: built.builder.size(ref) for name, ref in built.refs.items()}
    assert all(size > 0 for size in sizes.values())
    with capsys.disabled():
        print()
        for name, ref in built.refs.items():
            print(f"  image {name}: {sizes[name] / 2**20:.0f} MiB ({ref})")
        steps = ", ".join(f"{k} {v:.0f} s" for k, v in built.builder.timings.items()) or "all cached"
        print(
            f"  images built in {built.seconds:.0f} s ({steps}); reused in {time.monotonic() - start:.1f} s"
        )


# -- the images local real nodes run (images/build.py node_images) ------------------------------


@pytest.fixture(scope="module")
def node_built(built: Built) -> Built:
    """Every node image (ours, singleuser, pause, kube-scheduler, chp); needs what
    `gpushare-localcluster build` made (kube-scheduler, the Kubernetes module's pause.c) and the
    npm package `gpushare-localcluster proxy` installed (installed here if missing)."""
    start = time.monotonic()
    try:
        refs = build.node_images(built.builder)
    except build.BuildError as err:
        pytest.fail(str(err), pytrace=False)
    return Built(built.builder, refs, time.monotonic() - start)


def test_node_images_are_every_image_a_real_node_runs(node_built: Built, capsys: pytest.CaptureFixture[str]):
    assert tuple(node_built.refs) == build.NODE_IMAGE_NAMES
    assert set(build.NODE_IMAGE_NAMES) == {
        "extender", "device-plugin", "hub", "singleuser", "pause", "kube-scheduler", "chp",
    }  # fmt: skip
    again = build.Builder()
    assert build.node_images(again) == node_built.refs
    assert again.timings == {}, again.timings  # all reused: nothing built, no wheelhouse
    with_sizes = ", ".join(
        f"{name} {node_built.builder.size(ref) / 2**20:.0f} MiB" for name, ref in node_built.refs.items()
    )
    with capsys.disabled():
        print(f"\n  node images ({node_built.seconds:.0f} s; {node_built.builder.timings}): {with_sizes}")


def test_singleuser_runs_as_zero_to_jupyterhub_runs_it(node_built: Built):
    ref = node_built.refs["singleuser"]
    config = node_built.builder.config(ref)
    assert config["Cmd"] == ["jupyterhub-singleuser"] and not config.get("Entrypoint")
    assert config["User"] == "1000" and config["WorkingDir"] == "/home/jovyan"
    run = node_built.builder.run_in
    # singleuser.uid 1000, fsGid 100; the home is the user's to write.
    assert run(ref, "id", "-u").strip() == "1000"
    assert run(ref, "id", "-g").strip() == "100" and run(ref, "id", "-gn").strip() == "users"
    assert run(ref, "sh", "-c", "echo $HOME; pwd").split() == ["/home/jovyan", "/home/jovyan"]
    probe = "import pathlib; p = pathlib.Path('.probe'); p.write_text('x'); p.unlink(); print('ok')"
    assert run(ref, "python", "-c", probe).strip() == "ok"
    assert run(ref, "jupyterhub-singleuser", "--version").strip().split(".")[0] in {"5", "6"}
    assert run(ref, "jupyter", "lab", "--version").strip().startswith("4.")
    # The GPU-slice status bar: the built JupyterLab extension and its server extension, enabled.
    installed = run(ref, "python", "-m", "gpushare_hub.notebook.install", "--check")
    assert "gpushare-hub-statusbar and gpushare_hub.notebook.slicepage are installed" in installed
    # The package (and the start-up hook the plugin puts on PYTHONPATH) imports; no KubeSpawner.
    image = next(i for i in build.NODE_IMAGES if i.name == "singleuser")
    assert run(ref, "python", "-c", f"{image.check}; print('imported')").strip() == "imported"


def test_pause_is_upstreams_program_static_from_scratch(node_built: Built):
    ref = node_built.refs["pause"]
    config = node_built.builder.config(ref)
    assert config["Entrypoint"] == ["/pause"] and config["User"] == "65535:65535" and not config.get("Cmd")
    binary = node_built.builder.read_file(ref, "/pause")
    assert build.is_static_elf(binary), "/pause is not a static ELF executable"
    source, kubernetes = build.pause_source()
    # -DVERSION as upstream's Makefile sets it; buildah run starts the scratch image here.
    out = node_built.builder.run_in(ref, "/pause", "-v", user="65535:65535")
    assert out.strip() == f"pause.c v{build.pause_tag(source)}-{kubernetes}"
    inspected = json.loads(node_built.builder.buildah("inspect", "--type=image", ref, capture=True))
    assert len(json.loads(inspected["Manifest"])["layers"]) == 1  # FROM scratch: the one file


def test_kube_scheduler_starts_as_the_chart_runs_it(node_built: Built):
    from gpushare_hub.localcluster.build import Versions

    ref = node_built.refs["kube-scheduler"]
    config = node_built.builder.config(ref)
    assert config["Entrypoint"] == ["/usr/local/bin/kube-scheduler"]
    path = next(e for e in config["Env"] if e.startswith("PATH="))
    assert "/usr/local/bin" in path.removeprefix("PATH=").split(":")
    # The chart's container `command:` (its first word) and pod securityContext (uid 65532).
    template = (ROOT / "helm" / "gpushare-hub" / "templates" / "scheduler-deployment.yaml").read_text()
    found = re.search(r"command:\s*\n\s*- (\S+)", template)
    assert found and found.group(1) == "/usr/local/bin/kube-scheduler"
    command = found.group(1)
    out = node_built.builder.run_in(ref, command, "--version", user="65532:65532")
    assert out.strip() == f"Kubernetes {Versions.load().kubernetes}"


def free_ports(count: int) -> list[int]:
    import socket

    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def test_chp_serves_as_zero_to_jupyterhubs_proxy_pod_runs_it(node_built: Built):
    from gpushare_hub.localcluster.hub import PROXY_VERSION

    ref = node_built.refs["chp"]
    assert node_built.builder.config(ref)["User"] == "65534:65534"
    run = node_built.builder.run_in
    assert run(ref, "configurable-http-proxy", "--version", user="65534:65534").strip() == PROXY_VERSION
    # Started as the proxy pod's command starts it (chroot isolation shares this machine's
    # network, hence loopback and free ports): its API answers with the token, and the
    # liveness probe's /_chp_healthz answers.
    port, api = free_ports(2)
    probe = (
        "const get = (url, h) => fetch(url, {headers: h}).then(r => r.status);"
        "const go = async () => { for (let i = 0; i < 100; i++) { try {"
        f"  const a = await get('http://127.0.0.1:{api}/api/routes', {{Authorization: 'token t0k'}});"
        f"  const b = await get('http://127.0.0.1:{port}/_chp_healthz', {{}});"
        "  console.log(a, b); return; } catch (e) { await new Promise(r => setTimeout(r, 100)); } }"
        "  console.log('no answer'); };"
        "go();"
    )
    script = (
        f"CONFIGPROXY_AUTH_TOKEN=t0k configurable-http-proxy --ip=127.0.0.1 --api-ip=127.0.0.1 "
        f"--api-port={api} --port={port} --default-target=http://127.0.0.1:9 & pid=$!; "
        f'node -e "{probe}"; kill $pid; wait $pid || true'
    )
    out = run(ref, "sh", "-c", script, user="65534:65534")
    assert "200 200" in out.splitlines(), out  # chp logs to stdout too


def test_archives_import_into_containerd_under_their_names(node_built: Built):
    """What the real nodes do with each image: a docker archive, `ctr -n k8s.io images import`."""
    if not shutil.which("containerd") or not shutil.which("ctr"):
        pytest.skip("containerd is not installed (apt-get install -y containerd): no import to check")
    builder = node_built.builder
    names = build.chart_names()
    chosen = {names[key]: node_built.refs[key] for key in ("pause", "kube-scheduler", "extender")}
    archives = {name: builder.archive(ref, name) for name, ref in chosen.items()}
    # Cached: a second call writes nothing and gives the same file; no partial file is left.
    before = {name: tar.stat().st_mtime_ns for name, tar in archives.items()}
    assert {name: builder.archive(ref, name) for name, ref in chosen.items()} == archives
    assert {name: tar.stat().st_mtime_ns for name, tar in archives.items()} == before
    assert not list(archives[names["pause"]].parent.glob(".*partial*"))
    with pytest.raises(build.BuildError, match="not a full reference"):
        builder.archive(chosen[names["pause"]], "pause:3.10")
    leftovers = set(Path("/tmp").glob("gpushare-ctr-*"))
    listed = build.import_check(archives)
    assert set(archives) <= set(listed)
    # The throwaway containerd left no folder and no mount behind.
    assert set(Path("/tmp").glob("gpushare-ctr-*")) == leftovers
    assert "gpushare-ctr-" not in Path("/proc/self/mountinfo").read_text()
