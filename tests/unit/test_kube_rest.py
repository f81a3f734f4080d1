"""The CLI's Kubernetes reader: kubeconfigs read as kubectl reads them, and GET/list against a
loopback HTTPS server that checks what a real API server checks (client certificate, token)."""

from __future__ import annotations

import base64
import json
import os
import re
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare_hub.kube import rest
from gpushare_hub.kube.execcred import CredentialError, ExecPlugin, parse_exec_credential
from gpushare_hub.kube.kubeconfig import (
    Access,
    KubeconfigError,
    default_kubeconfig_paths,
    in_cluster_access,
    kubeconfig_problem,
    read_kubeconfig,
)
from gpushare_hub.kube.rest import ApiStatusError, RestClient, Unreachable
from gpushare_hub.localcluster.pki import PKI, Credential
from tests.unit import fakeapi


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def kubeconfig(
    path: Path,
    user: dict[str, Any],
    cluster: dict[str, Any] | None = None,
    current: str | None = "main",
    more: dict[str, Any] | None = None,
) -> Path:
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster or {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "main", "context": {"cluster": "c", "user": "u"}}],
        **(more or {}),
    }
    if current:
        doc["current-context"] = current
    path.write_text(yaml.safe_dump(doc))
    return path


EXEC_V1 = "client.authentication.k8s.io/v1"


# ---- reading kubeconfigs ----------------------------------------------------------------------


def test_paths_in_a_kubeconfig_are_relative_to_its_folder_and_data_is_decoded(tmp_path):
    (tmp_path / "sub").mkdir()
    kc = kubeconfig(
        tmp_path / "sub" / "config",
        {"client-certificate": "certs/me.crt", "client-key-data": b64(b"KEY"), "tokenFile": "/abs/token"},
        {"server": "https://k.example:443/", "certificate-authority": "ca.pem", "tls-server-name": "api"},
    )
    access = read_kubeconfig(str(kc))
    assert access.server == "https://k.example:443"
    assert access.ca_file == str(tmp_path / "sub" / "ca.pem")
    assert access.cert_file == str(tmp_path / "sub" / "certs" / "me.crt")
    assert (access.key_data, access.token_file, access.tls_server_name) == (b"KEY", "/abs/token", "api")
    assert "KEY" not in repr(access)


@pytest.mark.parametrize(
    ("cluster", "words"),
    [
        ({"insecure-skip-tls-verify": "false"}, "insecure-skip-tls-verify is 'false', not true or false"),
        ({"insecure-skip-tls-verify": True, "certificate-authority-data": "Y2E="}, "keep one of them"),
    ],
)
def test_tls_checks_are_never_turned_off_by_a_quoted_or_contradictory_setting(tmp_path, cluster, words):
    kc = kubeconfig(tmp_path / "kc", {"token": "t"}, {"server": "https://one:1", **cluster})
    with pytest.raises(KubeconfigError, match=words):
        read_kubeconfig(str(kc))


@pytest.mark.parametrize(
    ("more", "user", "words"),
    [
        ({"contexts": [{"name": "main", "context": "c"}]}, {"token": "t"}, "context 'main' is not a mapping"),
        ({"clusters": {"name": "c"}}, {"token": "t"}, "clusters is not a list of named entries"),
        ({}, {"exec": {"apiVersion": EXEC_V1, "command": "aws", "args": "token"}}, "exec args is not a list"),
        (
            {},
            {"exec": {"apiVersion": EXEC_V1, "command": "aws", "env": {"A": "b"}}},
            "exec env is not a list",
        ),
    ],
)
def test_a_kubeconfig_of_the_wrong_shape_is_named_not_a_traceback(tmp_path, more, user, words):
    kc = kubeconfig(tmp_path / "kc", user, more=more)
    with pytest.raises(KubeconfigError, match=re.escape(words)):
        read_kubeconfig(str(kc))


def test_a_context_other_than_the_current_one_and_its_mistakes(tmp_path):
    more = {
        "contexts": [
            {"name": "main", "context": {"cluster": "c", "user": "u"}},
            {"name": "other", "context": {"cluster": "c2", "user": "u"}},
            {"name": "lost", "context": {"cluster": "nowhere", "user": "u"}},
        ],
        "clusters": [
            {"name": "c", "cluster": {"server": "https://one:1"}},
            {"name": "c2", "cluster": {"server": "https://two:2", "insecure-skip-tls-verify": True}},
        ],
    }
    kc = kubeconfig(tmp_path / "kc", {"token": "t"}, more=more)
    assert read_kubeconfig(str(kc)).server == "https://one:1"
    other = read_kubeconfig(str(kc), "other")
    assert (other.server, other.insecure, other.token) == ("https://two:2", True, "t")
    with pytest.raises(KubeconfigError, match=r"no context 'typo' in it \(contexts: lost, main, other\)"):
        read_kubeconfig(str(kc), "typo")
    with pytest.raises(KubeconfigError, match="names cluster 'nowhere', which it does not define"):
        read_kubeconfig(str(kc), "lost")
    bare = kubeconfig(tmp_path / "bare", {"token": "t"}, current=None)
    with pytest.raises(
        KubeconfigError, match="no current-context; choose one with: kubectl config use-context"
    ):
        read_kubeconfig(str(bare))
    assert kubeconfig_problem(str(bare)) is not None
    assert kubeconfig_problem(str(bare), context="main") is None


def test_kubeconfig_list_is_merged_as_kubectl_merges_it(tmp_path, monkeypatch):
    first = kubeconfig(tmp_path / "a", {"token": "from-a"}, {"server": "https://a:1"}, current=None)
    second = kubeconfig(tmp_path / "b", {"token": "from-b"}, {"server": "https://b:1"})
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(tmp_path / "missing"), str(first), str(second)]))
    paths = default_kubeconfig_paths()
    assert paths == [str(tmp_path / "missing"), str(first), str(second)]
    access = read_kubeconfig(paths)  # current-context from b, entries from a (the first wins)
    assert (access.server, access.token) == ("https://a:1", "from-a")
    monkeypatch.delenv("KUBECONFIG")
    assert default_kubeconfig_paths() == [str(Path("~/.kube/config").expanduser())]


@pytest.mark.parametrize(
    ("user", "words"),
    [
        (
            {"client-certificate-data": "%%%", "client-key-data": "QQ=="},
            "client-certificate-data is not base64",
        ),
        ({"client-certificate": "/x.crt"}, "a client certificate without its key"),
        ({"exec": {"command": "aws"}}, "exec apiVersion (none) is not supported"),
        (
            {"exec": {"apiVersion": "client.authentication.k8s.io/v1alpha1", "command": "aws"}},
            "v1alpha1 is not supported; use client.authentication.k8s.io/v1 or",
        ),
        ({"auth-provider": {"name": "gcp"}}, "auth-provider 'gcp' is not supported"),
    ],
)
def test_an_unusable_user_is_named_with_the_fix(tmp_path, user, words):
    with pytest.raises(KubeconfigError) as err:
        read_kubeconfig(str(kubeconfig(tmp_path / "kc", user)))
    assert words in str(err.value) and "'u'" in str(err.value)


def test_exec_and_oidc_users_are_read(tmp_path):
    spec = {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "command": "./bin/plugin",
        "args": ["token", "--cluster", "c"],
        "env": [{"name": "AWS_PROFILE", "value": "dev"}],
        "interactiveMode": "Never",
        "provideClusterInfo": True,
    }
    plugin = read_kubeconfig(str(kubeconfig(tmp_path / "kc", {"exec": spec}))).exec
    assert plugin == ExecPlugin(
        command="./bin/plugin",
        api_version="client.authentication.k8s.io/v1beta1",
        args=("token", "--cluster", "c"),
        env=(("AWS_PROFILE", "dev"),),
        interactive_mode="Never",
        provide_cluster_info=True,
        base_dir=str(tmp_path),
    )
    oidc = {"auth-provider": {"name": "oidc", "config": {"id-token": "eyJ"}}}
    assert read_kubeconfig(str(kubeconfig(tmp_path / "o", oidc))).token == "eyJ"


def test_in_cluster_access_reads_the_pods_environment_and_service_account(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeconfigError, match="not running in a pod"):
        in_cluster_access(str(tmp_path))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(KubeconfigError, match="automountServiceAccountToken: true"):
        in_cluster_access(str(tmp_path))
    (tmp_path / "token").write_text("sa-token\n")
    access = in_cluster_access(str(tmp_path))
    assert access.server == "https://[fd00::1]:443"
    assert (access.token_file, access.ca_file) == (str(tmp_path / "token"), str(tmp_path / "ca.crt"))


def test_exec_credential_output_is_checked():
    plugin = ExecPlugin(command="/usr/bin/aws", api_version="client.authentication.k8s.io/v1")

    def out(doc: Any) -> bytes:
        return json.dumps(doc).encode()

    ok = {"apiVersion": plugin.api_version, "kind": "ExecCredential", "status": {"token": "k8s-aws-v1.x"}}
    assert parse_exec_credential(out(ok), plugin).token == "k8s-aws-v1.x"
    certs = {**ok, "status": {"clientCertificateData": "CERT", "clientKeyData": "KEY"}}
    got = parse_exec_credential(out(certs), plugin)
    assert (got.cert_pem, got.key_pem) == (b"CERT", b"KEY")
    for bad, words in [
        (b"Error: expired", "printed no ExecCredential (not JSON)"),
        (out({**ok, "apiVersion": "client.authentication.k8s.io/v1beta1"}), "answered in"),
        (out({**ok, "status": {}}), "gave neither a token nor a client certificate"),
        (out({**ok, "status": "k8s-aws-v1.x"}), "whose status is not an object"),
        (out(["ExecCredential"]), "printed something other than an ExecCredential"),
    ]:
        with pytest.raises(CredentialError, match=re.escape(words)):
            parse_exec_credential(bad, plugin)


# ---- GET and list against a loopback HTTPS server -----------------------------------------------


pki = fakeapi.pki  # fixtures
apiserver = fakeapi.apiserver


def names(items: list[dict[str, Any]]) -> list[str]:
    return [i["metadata"]["name"] for i in items]


def test_lists_are_read_page_by_page_on_one_connection_with_a_token(apiserver, pki):
    with RestClient(Access(server=apiserver.server, ca_file=str(pki.ca), token="good-token")) as api:
        assert names(api.list("/api/v1/nodes", {"labelSelector": "gpushare=true"}, page=2)) == [
            "n0",
            "n1",
            "n2",
            "n3",
            "n4",
        ]
    queries = [q for _, q, _, _ in apiserver.requests]
    assert [q.get("continue") for q in queries] == [None, ["2"], ["4"]]
    assert all(q["limit"] == ["2"] and q["labelSelector"] == ["gpushare=true"] for q in queries)
    assert all(h["Authorization"] == "Bearer good-token" for _, _, h, _ in apiserver.requests)


@pytest.mark.parametrize(
    ("expired", "limits"), [(1, ["2", "2", "2", "2", "2"]), (2, ["2", "2", "2", "2", None])]
)
def test_an_expired_continue_token_starts_the_list_again_then_reads_it_whole(apiserver, pki, expired, limits):
    apiserver.expire = expired
    with RestClient(Access(server=apiserver.server, ca_file=str(pki.ca), token="good-token")) as api:
        assert names(api.list("/api/v1/nodes", page=2)) == ["n0", "n1", "n2", "n3", "n4"]
    assert [q.get("limit", [None])[0] for _, q, _, _ in apiserver.requests] == limits


def test_a_410_to_a_first_page_is_the_servers_answer_not_an_expired_token(apiserver, pki):
    apiserver.gone = True
    with (
        RestClient(Access(server=apiserver.server, ca_file=str(pki.ca), token="good-token")) as api,
        pytest.raises(ApiStatusError) as err,
    ):
        api.list("/api/v1/nodes", page=2)
    assert err.value.status == 410
    assert len(apiserver.requests) == 1  # no restart: there was no token to expire


def test_a_client_certificate_given_as_data_is_used_and_its_files_are_removed(
    apiserver, pki, tmp_path, monkeypatch
):
    me: Credential = pki.issue("me", "alice")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    kc = kubeconfig(
        tmp_path / "kc",
        {"client-certificate-data": b64(me.cert.read_bytes()), "client-key-data": b64(me.key.read_bytes())},
        {"server": apiserver.server, "certificate-authority-data": b64(pki.ca.read_bytes())},
    )
    apiserver.gzip = False
    with RestClient(read_kubeconfig(str(kc))) as api:
        assert names(api.list("/api/v1/nodes")) == names(apiserver.lists["/api/v1/nodes"])
    assert apiserver.requests[0][3] == "alice"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kc"]  # no key left behind


def test_token_file_and_tls_server_name(apiserver, pki, tmp_path):
    (tmp_path / "token").write_text("good-token\n")
    access = Access(
        server=apiserver.server.replace("127.0.0.1", "localhost"),
        ca_file=str(pki.ca),
        token_file=str(tmp_path / "token"),
        tls_server_name="api.local",
    )
    with RestClient(access) as api:  # the certificate names 127.0.0.1 and api.local, not localhost
        assert names(api.get("/api/v1/nodes", {"limit": "1"})["items"]) == ["n0"]
    with RestClient(replace(access, tls_server_name="")) as api, pytest.raises(Unreachable, match="TLS"):
        api.get("/api/v1/nodes")


def test_refusals_and_failures_carry_the_status_or_the_reason(apiserver, pki):
    access = Access(server=apiserver.server, ca_file=str(pki.ca), token="wrong")
    with RestClient(access) as api, pytest.raises(ApiStatusError) as refused:
        api.list("/api/v1/nodes")
    assert (refused.value.status, refused.value.reason) == (401, "Unauthorized")
    apiserver.forbid = True
    good = Access(server=apiserver.server, ca_file=str(pki.ca), token="good-token")
    with RestClient(good) as api, pytest.raises(ApiStatusError) as forbidden:
        api.list("/api/v1/nodes")
    assert forbidden.value.status == 403 and "cannot list resource" in forbidden.value.message
    untrusted = PKI(Path(tempfile.mkdtemp(dir=pki.folder)))
    other_ca = Access(server=apiserver.server, ca_file=str(untrusted.ca), token="good-token")
    with RestClient(other_ca) as api, pytest.raises(Unreachable, match=r"\(TLS: certificate "):
        api.list("/api/v1/nodes")
    dead = RestClient(Access(server="https://127.0.0.1:1", token="t"), connect_timeout=2)
    with pytest.raises(Unreachable, match=r"at https://127.0.0.1:1 \(Connection refused\)"):
        dead.get("/api/v1/nodes")


def plugin_script(tmp_path: Path, status: dict[str, str], exit_code: int = 0) -> Path:
    """A credential plugin that records what kubectl would hand it and prints ``status``."""
    script = tmp_path / "bin" / "plugin"
    script.parent.mkdir(exist_ok=True)
    script.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"open({str(tmp_path / 'seen.json')!r}, 'w').write(json.dumps("
        "{'argv': sys.argv[1:], 'env': os.environ.get('PLUGIN_ENV'), "
        "'info': json.loads(os.environ['KUBERNETES_EXEC_INFO'])}))\n"
        f"print(json.dumps({{'apiVersion': 'client.authentication.k8s.io/v1', 'kind': 'ExecCredential', "
        f"'status': {status!r}}}))\nsys.exit({exit_code})\n"
    )
    script.chmod(0o755)
    return script


def exec_kubeconfig(tmp_path: Path, server: str, ca: Path) -> Path:
    spec = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": "bin/plugin",  # relative to the kubeconfig's folder, as kubectl has it
        "args": ["get-token", "--cluster", "c"],
        "env": [{"name": "PLUGIN_ENV", "value": "set"}],
        "interactiveMode": "Never",
        "provideClusterInfo": True,
    }
    return kubeconfig(
        tmp_path / "kc",
        {"exec": spec},
        {"server": server, "certificate-authority-data": b64(ca.read_bytes())},
    )


def test_an_exec_plugins_token_is_used(apiserver, pki, tmp_path):
    plugin_script(tmp_path, {"token": "good-token"})
    with RestClient(read_kubeconfig(str(exec_kubeconfig(tmp_path, apiserver.server, pki.ca)))) as api:
        assert len(api.list("/api/v1/nodes")) == 5
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["argv"] == ["get-token", "--cluster", "c"] and seen["env"] == "set"
    assert seen["info"]["kind"] == "ExecCredential" and seen["info"]["spec"]["interactive"] is False
    assert seen["info"]["spec"]["cluster"]["server"] == apiserver.server


def test_an_exec_plugins_client_certificate_is_used(apiserver, pki, tmp_path):
    me = pki.issue("exec-me", "bob")
    status = {"clientCertificateData": me.cert.read_text(), "clientKeyData": me.key.read_text()}
    plugin_script(tmp_path, status)
    with RestClient(read_kubeconfig(str(exec_kubeconfig(tmp_path, apiserver.server, pki.ca)))) as api:
        api.list("/api/v1/nodes")
    assert apiserver.requests[0][3] == "bob"


def test_a_failing_or_missing_exec_plugin_is_named(apiserver, pki, tmp_path):
    plugin_script(tmp_path, {"token": "good-token"}, exit_code=3)
    api = RestClient(read_kubeconfig(str(exec_kubeconfig(tmp_path, apiserver.server, pki.ca))))
    with pytest.raises(CredentialError, match=r"plugin failed \(exit 3; its messages are above\)"):
        api.list("/api/v1/nodes")
    missing = Access(
        server=apiserver.server,
        exec=ExecPlugin(
            command="no-such-plugin-xyz",
            api_version="client.authentication.k8s.io/v1",
            install_hint="brew it",
        ),
    )
    with pytest.raises(CredentialError, match=r"no-such-plugin-xyz is not installed .*; brew it"):
        RestClient(missing).get("/api/v1/nodes")
    assert apiserver.requests == []


# ---- writes, kept connections, threads, renewed credentials --------------------------------------


def good(apiserver, pki) -> Access:
    return Access(server=apiserver.server, ca_file=str(pki.ca), token="good-token")


def test_a_merge_patch_and_a_create_send_json_and_return_the_servers_object(apiserver, pki):
    apiserver.objects["/api/v1/nodes/n0"] = {"metadata": {"name": "n0", "labels": {"a": "1", "b": "2"}}}
    with RestClient(good(apiserver, pki)) as api:
        node = api.patch_merge("/api/v1/nodes/n0", {"metadata": {"labels": {"a": None, "c": "3"}}})
        event = {"metadata": {"generateName": "p."}, "reason": "R"}
        created = api.post("/api/v1/namespaces/ns/events", event)
        with pytest.raises(ApiStatusError) as missing:
            api.patch_merge("/api/v1/nodes/gone", {"metadata": {}})
    assert node["metadata"]["labels"] == {"b": "2", "c": "3"}
    assert created["metadata"]["name"] == "p.0"
    assert apiserver.lists["/api/v1/namespaces/ns/events"] == [created]
    assert (missing.value.status, missing.value.reason) == (404, "Not Found")
    assert [(m, p, t) for m, p, t, _ in apiserver.writes] == [
        ("PATCH", "/api/v1/nodes/n0", "application/merge-patch+json"),
        ("POST", "/api/v1/namespaces/ns/events", "application/json"),
        ("PATCH", "/api/v1/nodes/gone", "application/merge-patch+json"),
    ]
    assert len(set(apiserver.ports)) == 1  # one connection kept for all of them


def test_a_connection_the_server_closed_while_idle_is_not_used_again(apiserver, pki):
    apiserver.objects["/api/v1/nodes/n0"] = {"metadata": {"name": "n0"}}
    apiserver.close_after = True  # as kube-apiserver closes a connection idle for 90 s
    with RestClient(good(apiserver, pki)) as api:
        for value in "abc":
            api.patch_merge("/api/v1/nodes/n0", {"metadata": {"labels": {"x": value}}})
    assert apiserver.objects["/api/v1/nodes/n0"]["metadata"]["labels"] == {"x": "c"}
    assert len(set(apiserver.ports)) == 3


def test_a_kept_connection_is_used_again_in_a_process_with_over_a_thousand_descriptors(apiserver, pki):
    """select() refuses descriptors from 1024 on: with it, every request of a busy process took
    a new connection (a new TLS handshake each) while saying nothing. poll() has no such limit."""
    apiserver.objects["/api/v1/nodes/n0"] = {"metadata": {"name": "n0"}}
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        with RestClient(good(apiserver, pki)) as api:
            for value in "abc":
                api.patch_merge("/api/v1/nodes/n0", {"metadata": {"labels": {"x": value}}})
    finally:
        for fd in filler:
            os.close(fd)
    assert apiserver.objects["/api/v1/nodes/n0"]["metadata"]["labels"] == {"x": "c"}
    assert len(set(apiserver.ports)) == 1


def test_only_a_get_is_sent_again_when_its_kept_connection_turns_out_closed(apiserver, pki, monkeypatch):
    monkeypatch.setattr(rest, "dropped", lambda conn: False)  # the close is not seen before sending
    apiserver.objects["/api/v1/nodes/n0"] = {"metadata": {"name": "n0"}}
    apiserver.close_after = True
    with RestClient(good(apiserver, pki)) as api:
        api.get("/api/v1/nodes/n0")
        assert api.get("/api/v1/nodes/n0")["metadata"]["name"] == "n0"  # sent again on a new connection
        with pytest.raises(Unreachable):
            api.patch_merge("/api/v1/nodes/n0", {"metadata": {"labels": {"x": "1"}}})
        api.get("/api/v1/nodes/n0")
        with pytest.raises(Unreachable):
            api.post("/api/v1/namespaces/ns/events", {"metadata": {"name": "e"}})
    assert apiserver.writes == []  # neither reached the server, and neither was sent twice
    assert [p for p, *_ in apiserver.requests] == [f"{fakeapi.PREFIX}/api/v1/nodes/n0"] * 3
    assert len(set(apiserver.ports)) == 3


def test_threads_share_one_client_each_request_on_a_connection_of_its_own(apiserver, pki):
    apiserver.delay = 0.05
    api = RestClient(good(apiserver, pki))
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: names(api.get("/api/v1/nodes")["items"]), range(32)))
    assert answers == [["n0", "n1", "n2", "n3", "n4"]] * 32
    assert len(set(apiserver.ports)) > 1  # requests overlapped instead of queueing on one connection
    assert len(api._idle) <= rest.KEEP_IDLE
    api.close()
    assert api._idle == []


def test_a_token_file_is_read_again_and_a_401_fetches_it_once_more(apiserver, pki, tmp_path, monkeypatch):
    token = tmp_path / "token"
    token.write_text("good-token\n")
    api = RestClient(Access(server=apiserver.server, ca_file=str(pki.ca), token_file=str(token)))
    api.get("/api/v1/nodes")
    apiserver.tokens, _ = {"rotated"}, token.write_text("rotated")  # the kubelet rotated it
    api.get("/api/v1/nodes")  # 401 with the old one: read the file again, send again
    monkeypatch.setattr(rest, "TOKEN_REREAD", 0.0)
    apiserver.tokens.add("third")
    token.write_text("third")
    api.get("/api/v1/nodes")  # read again when its time has come, without a 401
    sent = [h["Authorization"].removeprefix("Bearer ") for _, _, h, _ in apiserver.requests]
    assert sent == ["good-token", "good-token", "rotated", "third"]
    fixed = RestClient(Access(server=apiserver.server, ca_file=str(pki.ca), token="good-token"))
    with pytest.raises(ApiStatusError, match="401"):
        fixed.get("/api/v1/nodes")  # a token written in the kubeconfig cannot be renewed
    assert len(apiserver.requests) == 5
