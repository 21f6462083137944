"""curl under canal against a native HTTP server: 64 MiB download and upload, hashes compared.

Under canal the server holds each request until `canal stat` lists curl's connection, so a
curl the library failed to intercept cannot pass. The "native" variants run the same curl
commands without canal: a failure there means the test environment is broken, not canal."""

import hashlib
import os

import pytest

import e2e_util
from canal_harness import need_tool, runner

BLOB_SIZE = 64 << 20


@pytest.fixture(scope="module")
def blob(tmp_path_factory):
    data = os.urandom(BLOB_SIZE)
    path = tmp_path_factory.mktemp("curl") / "blob.bin"
    path.write_bytes(data)
    return data, path, hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def http_server(blob):
    with e2e_util.BlobHTTPServer(blob[0]) as srv:
        yield srv


def _curl(run, mode, http_server, argv, name):
    """Run curl; under canal, hold the server until stat shows curl's connection."""
    if mode == "native":
        return run.run(argv, timeout=90, name=name)
    http_server.gate.clear()
    try:
        p = run.spawn(argv, name=name)
        run.wait_served(p, kind="tcp", peer_port=http_server.port, state="connected", timeout=30)
    finally:
        http_server.gate.set()
    return p.finish(90)


@pytest.mark.relay
@pytest.mark.parametrize("mode", ["native", "canal"])
def test_curl_download(request, mode, blob, http_server, tmp_path):
    curl = need_tool("curl")
    run = runner(request, mode)
    out = tmp_path / "download.bin"
    argv = [curl, "-sS", "--fail", "--max-time", "60", "-o", out, f"http://127.0.0.1:{http_server.port}/blob"]
    r = _curl(run, mode, http_server, argv, "curl-GET")
    assert r.returncode == 0, r.describe()
    size = out.stat().st_size
    assert size == BLOB_SIZE, f"downloaded {size} bytes, want {BLOB_SIZE}\n{r.describe()}"
    assert e2e_util.sha256_file(out) == blob[2], "downloaded file's SHA-256 differs from the served one"


@pytest.mark.relay
@pytest.mark.deadline(200)
@pytest.mark.parametrize("mode", ["native", "canal"])
def test_curl_upload(request, mode, blob, http_server):
    curl = need_tool("curl")
    run = runner(request, mode)
    _, path, digest = blob
    url = f"http://127.0.0.1:{http_server.port}/upload"
    for how, args in (("PUT", ["-T", path]), ("POST", ["--data-binary", f"@{path}", "-H", "Content-Type: application/octet-stream"])):
        before = len(http_server.uploads)
        r = _curl(run, mode, http_server, [curl, "-sS", "--fail", "--max-time", "60", *args, url], f"curl-{how}")
        assert r.returncode == 0, f"{how}:\n{r.describe()}"
        assert r.stdout.strip() == digest, f"{how}: server computed SHA-256 {r.stdout.strip()!r}, want {digest}"
        assert http_server.uploads[before:] == [(BLOB_SIZE, digest)], (
            f"{how}: server recorded {http_server.uploads[before:]}, want one upload of {BLOB_SIZE} bytes"
        )
