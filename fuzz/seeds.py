#!/usr/bin/env python3
"""Writes the seed inputs of every fuzz target into fuzz/corpus/<target>/seed-*.

The seeds are the shapes the project's tests use (a normal layer, the hostile layers of
tests/images.rs and tests/hostile_registry.rs, the SPDY frames of src/streaming/spdy's tests, the
documents a registry serves) so that the fuzzers start from inputs that reach deep. Deterministic:
running it again writes the same bytes. What the fuzzers keep beside them is minimised with
`hack/fuzz.sh --minimise`.
"""

import gzip
import io
import json
import subprocess
import tarfile
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "corpus"


def tar(entries, fmt=tarfile.GNU_FORMAT):
    """entries: (name, kind, payload) with kind file/dir/symlink/hardlink/fifo/chr."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for name, kind, payload in entries:
            info = tarfile.TarInfo(name)
            info.mtime = 1_700_000_000
            info.mode = 0o644
            data = None
            if kind == "file":
                data = payload
                info.size = len(data)
            elif kind == "dir":
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
            elif kind == "symlink":
                info.type = tarfile.SYMTYPE
                info.linkname = payload
            elif kind == "hardlink":
                info.type = tarfile.LNKTYPE
                info.linkname = payload
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
            elif kind == "chr":
                info.type = tarfile.CHRTYPE
                info.devmajor, info.devminor = 1, 3
            if kind == "pax":
                info.pax_headers = {"path": payload, "mtime": "1700000000.5"}
                info.size = 0
            t.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


LAYERS = {
    "normal": tar([
        ("etc", "dir", None),
        ("etc/passwd", "file", b"root:x:0:0:root:/root:/bin/sh\n"),
        ("bin", "dir", None),
        ("bin/sh", "file", b"\x7fELF"),
        ("bin/busybox", "hardlink", "bin/sh"),
        ("usr", "symlink", "/"),
        ("dev", "dir", None),
        ("dev/null", "chr", None),
        ("run", "dir", None),
        ("run/fifo", "fifo", None),
    ]),
    "whiteouts": tar([
        ("etc", "dir", None),
        ("etc/.wh.passwd", "file", b""),
        ("var", "dir", None),
        ("var/.wh..wh..opq", "file", b""),
    ]),
    "dotdot": tar([("../escape", "file", b"x")]),
    "absolute": tar([("/etc/escape", "file", b"x")]),
    "symlink-parent": tar([("link", "symlink", "/tmp"), ("link/escape", "file", b"x")]),
    "symlink-dotdot": tar([("up", "symlink", "../.."), ("up/escape", "file", b"x")]),
    "hardlink-out": tar([("link", "hardlink", "../../etc/passwd")]),
    "hardlink-through-symlink": tar([("s", "symlink", "/etc"), ("h", "hardlink", "s/passwd")]),
    "long-names-gnu": tar([("d" * 120 + "/" + "f" * 120, "file", b"long")]),
    "long-names-pax": tar([("p" * 300, "file", b"pax")], fmt=tarfile.PAX_FORMAT),
    "pax-path-escape": tar([("ok", "pax", "../pax-escape")], fmt=tarfile.PAX_FORMAT),
    "replace-dir-with-symlink": tar([("a", "dir", None), ("a", "symlink", "/"), ("a/b", "file", b"x")]),
}


def write(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / f"seed-{name}").write_bytes(data)


def zstd(data):
    return subprocess.run(["zstd", "-q", "-c", "-19"], input=data, capture_output=True, check=True).stdout


def main():
    for name, layer in LAYERS.items():
        write("layer_tar", name, layer)
    write("layer_tar", "truncated", LAYERS["normal"][:700])
    normal = LAYERS["normal"]
    gz = gzip.compress(normal, mtime=0)
    write("layer_stream", "gzip", b"\x00" + gz)
    write("layer_stream", "gzip-multimember", b"\x00" + gz + gzip.compress(LAYERS["whiteouts"], mtime=0))
    write("layer_stream", "gzip-truncated", b"\x00" + gz[: len(gz) // 2])
    write("layer_stream", "zstd", b"\x01" + zstd(normal))
    write("layer_stream", "zstd-dotdot", b"\x01" + zstd(LAYERS["dotdot"]))
    write("layer_stream", "plain", b"\x02" + normal)
    write("layer_stream", "zero-bomb-gzip", b"\x00" + gzip.compress(b"\0" * (1 << 20), mtime=0))

    for i, ref in enumerate([
        "busybox", "docker.io/library/busybox:latest", "registry.k8s.io/pause:3.10",
        "localhost:5000/a/b/c:tag", "127.0.0.1:44361/docker/library/busybox:1-musl",
        "[::1]:5000/img@sha256:" + "a" * 64, "quay.io/x/y:1@sha256:" + "b" * 64,
        "sha256:" + "c" * 64, "UPPER/case", "a" * 300, "host:99999/x", "x@sha512:" + "d" * 128,
    ]):
        write("reference", str(i), ref.encode())

    digest = "sha256:" + "e" * 64
    manifest = {
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest, "size": 100},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest, "size": 10}],
    }
    artifact = dict(manifest, artifactType="application/vnd.example+type", layers=[
        {"mediaType": "application/octet-stream", "digest": digest, "size": 3,
         "annotations": {"org.opencontainers.image.title": "model.bin"}}])
    index = {
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest, "size": 500,
             "platform": {"os": "linux", "architecture": "amd64"}},
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest, "size": 500,
             "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
        ],
    }
    docker = dict(manifest, mediaType="application/vnd.docker.distribution.manifest.v2+json")
    config = {
        "architecture": "amd64", "os": "linux",
        "config": {"User": "65534:65534", "Env": ["PATH=/bin"], "Entrypoint": ["/bin/sh"], "Cmd": ["-c", "true"],
                   "StopSignal": "SIGTERM"},
        "rootfs": {"type": "layers", "diff_ids": [digest, "sha256:" + "f" * 64]},
    }
    for name, doc in [("manifest", manifest), ("artifact", artifact), ("index", index), ("docker", docker),
                      ("config", config)]:
        write("image_documents", name, json.dumps(doc).encode())

    write("hosts_toml", "mirrors", b'''server = "https://registry-1.docker.io"
capabilities = ["pull", "resolve"]

[host."http://127.0.0.1:5000"]
  capabilities = ["pull", "resolve"]
  skip_verify = true
  [host."http://127.0.0.1:5000".header]
    x-custom = ["a", "b"]

[host."https://mirror.example/v2/prefix"]
  override_path = true
  ca = "ca.crt"
  client = [["client.crt", "client.key"]]
''')
    write("hosts_toml", "bad-types", b'server = 3\n[host."x"]\ncapabilities = "pull"\n')

    def hx(s):
        return bytes.fromhex(s.replace(" ", ""))
    block = "38eae3c6a7c202e50e50c24b4a04e50b6680004acbcf0708201095969f0fa200022829b108208000000000ffff"
    write("spdy_frames", "data", hx("00000001 00000005 68656c6c6f") + hx("7ffffffd 01000000"))
    write("spdy_frames", "syn-stream", hx(f"80030001 00000037 00000001 00000000 8000 {block}"))
    write("spdy_frames", "syn-stream-2", hx("80030001 0300000e 00000003 00000001 e009 00000000"))
    write("spdy_frames", "settings-ping-goaway", hx("80030004 0000000c 00000001 01000004 00000064")
          + hx("80030006 00000004 00000001") + hx("80030007 00000008 00000000 00000000"))
    write("spdy_frames", "rst-window", hx("80030003 00000008 00000001 00000005")
          + hx("80030009 00000008 00000001 00010000"))

    def block_of(pairs):
        out = len(pairs).to_bytes(4, "big")
        for k, v in pairs:
            out += len(k).to_bytes(4, "big") + k + len(v).to_bytes(4, "big") + v
        return out
    write("spdy_headers", "plain", block_of([(b"streamtype", b"stdout"), (b"port", b"8080"), (b"x", b"a\0b")]))
    write("spdy_headers", "compressed", hx(block))
    write("spdy_headers", "lying-count", (0x7fffffff).to_bytes(4, "big") + b"\0" * 8)

    write("websocket_channels", "binary", b"\x00hello")
    write("websocket_channels", "base64", b"1aGVsbG8gd29ybGQ=")
    write("websocket_channels", "resize", b'{"Width":80,"Height":24}{"Width":120,"Height":40}')
    write("websocket_channels", "non-ascii-first", "é aGk=".encode())

    write("shim_frames", "empty", b"\0\0\0\0")
    write("shim_frames", "stdout", b"\0\0\0\x04\x0a\x02hi")
    write("shim_frames", "oversized", b"\xff\xff\xff\xff")

    write("records", "sandbox", json.dumps({
        "id": "abc", "name": "n", "config": "", "runtime_handler": "", "created_at": 1, "state": "NotReady",
        "ips": [], "netns": None, "pause_pid": 0, "cni_result": None, "cgroups_path": "", "unclaimed": False,
    }).encode())
    write("records", "exit", b'{"exit_code":137,"finished_at_ns":1700000000000000000,"oom_killed":false}')
    write("records", "torn", b'{"id":"abc","name":"n","conf')
    write("records", "cni-cache", json.dumps({
        "containerId": "abc", "ifName": "eth0", "networkName": "scute",
        "config": {"cniVersion": "1.0.0", "plugins": [{"type": "bridge"}]}, "result": {}}).encode())

    write("cni_result", "bridge", json.dumps({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "scute0", "mac": "aa:bb:cc:dd:ee:ff"}, {"name": "eth0", "sandbox": "/run/netns/x"}],
        "ips": [{"interface": 1, "address": "10.88.0.5/16", "gateway": "10.88.0.1"},
                {"address": "fd00::5/64"}],
        "routes": [{"dst": "0.0.0.0/0"}], "dns": {}}).encode())
    write("cni_result", "old", b'{"cniVersion":"0.3.1","ip4":{"ip":"10.1.2.3/24"}}')

    write("cdi_spec", "json", json.dumps({
        "cdiVersion": "0.6.0", "kind": "vendor.example/gpu",
        "containerEdits": {"env": ["A=1"]},
        "devices": [{"name": "g0", "containerEdits": {
            "deviceNodes": [{"path": "/dev/vendor0", "hostPath": "/dev/null", "permissions": "rw"}],
            "mounts": [{"hostPath": "/tmp", "containerPath": "/vendor", "options": ["ro", "bind"]}],
            "hooks": [{"hookName": "createRuntime", "path": "/bin/true"}]}}]}).encode())
    write("cdi_spec", "yaml", b"cdiVersion: \"0.6.0\"\nkind: scute.test/fake\ndevices:\n  - name: dev0\n"
          b"    containerEdits:\n      deviceNodes: [{path: /dev/vendor-null, hostPath: /dev/null}]\n")
    write("cdi_spec", "yaml-aliases", b"a: &a [1, 2]\nb: &b [*a, *a]\nc: [*b, *b]\n")

    write("user_databases", "normal", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n"
          b"app:x:1000:1000::/home/app:/bin/sh\napp\0root:x:0:\nnogroup:x:65534:\napp:x:1000:\nwheel:x:10:app\n")
    write("user_databases", "minus-one", b"evil:x:4294967295:4294967295::/:/bin/sh\nevil\0evil:x:4294967295:evil\n")
    write("user_databases", "garbage", b"::::\n:x:\n\xff\xfe:x:1:1\n\0\n\n")

    write("mountinfo", "host", b"22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
          b"35 22 0:31 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755\n"
          b"40 22 0:44 / /with\\040space rw - overlay overlay rw,lowerdir=/a:/b,upperdir=/u,workdir=/w\n")
    write("mountinfo", "short", b"1 2 3\n\n- - -\n")


if __name__ == "__main__":
    main()
