"""The build step's bookkeeping: versions, cache keys, what counts as a complete cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpushare_hub.localcluster import build


def versions_file(tmp: Path, k8s: str = "v1.34.4") -> Path:
    p = tmp / "versions.toml"
    p.write_text(
        f'[go]\nminimum = "1.25.0"\n[kubernetes]\nversion = "{k8s}"\n[etcd]\nversion = "v3.6.10"\n'
        '[kwok]\nversion = "v0.8.0"\n[helm]\nversion = "v3.19.5"\n'
    )
    return p


def test_staging_modules_use_the_matching_v0_release(tmp_path):
    v = build.Versions.load(versions_file(tmp_path, "v1.34.4"))
    assert v.staging_version == "v0.34.4"


def test_pinned_kubernetes_is_134_or_newer():
    major, minor = build.Versions.load().kubernetes.removeprefix("v").split(".")[:2]
    assert (int(major), int(minor)) >= (1, 34)


def test_cache_key_follows_the_versions_file(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSHARE_K8S_CACHE", str(tmp_path / "cache"))
    a = build.cache_dir(versions_file(tmp_path, "v1.34.4"))
    b = build.cache_dir(versions_file(tmp_path, "v1.35.4"))
    assert a != b and a.parent == b.parent == tmp_path / "cache"
    assert not str(a).startswith(str(Path(__file__).parents[2]))  # outside the repo


def test_a_partial_cache_is_not_taken_for_complete(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSHARE_K8S_CACHE", str(tmp_path / "cache"))
    vf = versions_file(tmp_path)
    bdir = build.bin_dir(vf)
    bdir.mkdir(parents=True)
    for name in build.BINARIES:
        (bdir / name).write_text("#!/bin/sh\n")
        (bdir / name).chmod(0o755)
    assert build.missing_binaries(vf) == ["kwok"]  # its stage file is missing
    build.kwok_stages_file(bdir).write_text("---\n")
    assert build.missing_binaries(vf) == []
    (bdir / "etcd").chmod(0o644)
    assert build.missing_binaries(vf) == ["etcd"]


def test_missing_go_is_explained(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(build, "GO_FALLBACKS", ())
    with pytest.raises(build.BuildError, match="no `go` on PATH"):
        build.check_go(build.Versions.load())


def test_versions_file_without_a_key_names_it(tmp_path):
    p = tmp_path / "versions.toml"
    p.write_text('[go]\nminimum = "1.25.0"\n')
    with pytest.raises(build.BuildError, match="missing key 'kubernetes'"):
        build.Versions.load(p)


def test_go_runs_with_the_local_toolchain_only(tmp_path, monkeypatch):
    monkeypatch.setenv("GOBIN", "/somewhere/else")
    monkeypatch.setenv("GOTOOLCHAIN", "auto")
    env = build._go_env(tmp_path)
    assert env["GOTOOLCHAIN"] == "local" and env["GOFLAGS"] == "-mod=mod"
    assert "GOBIN" not in env  # binaries go to the cache, never to the user's GOBIN


def test_each_pinned_kubernetes_has_its_own_cache_and_the_first_keeps_its_folder(monkeypatch):
    monkeypatch.delenv(build.VERSION_ENV, raising=False)
    sets = build.Versions.all()
    assert [v.kubernetes for v in sets][:1] == [build.Versions.load().kubernetes]
    assert len({v.cache_key for v in sets}) == len(sets) >= 2
    # The key is the version set's: a version pinned again later finds its old folder.
    first = build.Versions.load()
    assert first.cache_key == build.Versions.load(kubernetes=first.kubernetes).cache_key


def test_the_version_is_picked_by_env_in_full_or_by_minor(tmp_path, monkeypatch):
    vf = versions_file(tmp_path)
    vf.write_text(vf.read_text() + '[also."v1.36.3"]\ngo = "1.26.0"\n')
    monkeypatch.setenv(build.VERSION_ENV, "1.36")
    v = build.Versions.load(vf)
    assert (v.kubernetes, v.go_minimum, v.etcd, v.staging_version) == (
        "v1.36.3",
        "1.26.0",
        "v3.6.10",
        "v0.36.3",
    )
    monkeypatch.setenv(build.VERSION_ENV, "v1.36.3")
    assert build.cache_dir(vf).name == v.cache_key != build.Versions.load(vf, "v1.34").cache_key
    monkeypatch.setenv(build.VERSION_ENV, "v1.35")
    with pytest.raises(build.BuildError, match=r"not pinned once .*pinned: v1.34.4, v1.36.3"):
        build.Versions.load(vf)


def test_the_groups_of_binaries_are_each_binary_once():
    grouped = [b for group in build.GROUPS.values() for b in group]
    assert sorted(grouped) == sorted(build.BINARIES)


def test_a_run_that_needs_only_the_control_plane_does_not_build_the_kubelet(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSHARE_K8S_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(build.VERSION_ENV, raising=False)
    bdir = build.bin_dir()
    bdir.mkdir(parents=True)
    for name in (*build.GROUPS["control-plane"], *build.GROUPS["clients"]):
        (bdir / name).write_text("#!/bin/sh\n")
        (bdir / name).chmod(0o755)
    build.kwok_stages_file(bdir).write_text("---\n")

    def no_go(v: build.Versions) -> str:
        raise build.BuildError("would build")

    monkeypatch.setattr(build, "check_go", no_go)
    assert build.build(only=list(build.GROUPS["control-plane"])) == bdir
    with pytest.raises(build.BuildError, match="would build"):
        build.build()  # everything: the kubelet and kube-proxy are missing


def test_the_command_line_names_groups_of_binaries(monkeypatch, capsys):
    asked: list[list[str] | None] = []
    monkeypatch.setattr(build, "build", lambda force=False, only=None: asked.append(only) or Path("/bin"))
    assert build.main(["--only", "control-plane", "helm"]) == 0
    assert asked == [[*build.GROUPS["control-plane"], "helm"]]
