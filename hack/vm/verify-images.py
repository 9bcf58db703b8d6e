#!/usr/bin/env python3
"""Checks every image scute lists, file by file, against its layers' digests.

    verify-images.py REGISTRY_ADDR [SCUTE_ROOT] [--cache DIR]     (run in the VM guest, as root)

For each image `crictl images` lists: its manifest by the digest scute recorded, the config
(which must be the image's ID) and each layer blob are read from scute's content store when
there and hashing to their digests, else from DIR (what earlier runs fetched), else fetched
from REGISTRY_ADDR (the path after the registry host is kept, as hack/mirrors.sh sends it) and
kept in DIR; scute drops layer blobs once unpacked, so without DIR every run fetches every
layer again. Each layer's uncompressed digest (the
config's diff_id) is checked, and every entry of its tar compared with the layer's
snapshot in SCUTE_ROOT/snapshots/<chain ID>/fs: regular files by size and SHA-256, directories,
symlinks by target, hard links by content. Whiteouts are not compared (an overlay whiteout is a
device node in the snapshot). None of this asks scute: it is what a power-cut test must not
take on trust, and every byte compared is hashed here against a digest. An image no registry names
(made on the node) is found by the manifest in the content store that names its config.

Prints one line per image; exit status 0 when every image matched, 1 when one did not, 2 when
the check could not run.
"""
import gzip
import hashlib
import io
import json
import os
import stat
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request

MANIFEST_TYPES = ", ".join([
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
])


def fetch(url, accept=None):
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.read()


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Mismatch(ValueError):
    """Bytes that do not hash to the digest they were read by."""


def checked(source, digest, data):
    if sha256(data) != digest:
        raise Mismatch(f"{digest} from {source.name} does not hash to its digest")
    return data


# Every source returns only bytes that hash to the digest asked for.


class Registry:
    """Documents and blobs as the registry serves them (the path after the host is kept)."""

    name = "the registry"

    def __init__(self, addr, repo):
        self.base = f"http://{addr}/v2/{repo}"

    def manifest(self, digest):
        return checked(self, digest, fetch(f"{self.base}/manifests/{digest}", MANIFEST_TYPES))

    def blob(self, digest):
        return checked(self, digest, fetch(f"{self.base}/blobs/{digest}"))


class ContentStore:
    """Blobs in scute's content store, for an image no registry serves (the embedded pause)."""

    name = "scute's content store"

    def __init__(self, root):
        self.dir = os.path.join(root, "content", "blobs", "sha256")

    def blob(self, digest):
        with open(os.path.join(self.dir, digest.split(":", 1)[1]), "rb") as f:
            return checked(self, digest, f.read())

    manifest = blob

    def manifest_of(self, config_digest):
        """The manifest among the store's small blobs whose config is this."""
        for name in os.listdir(self.dir):
            if os.path.getsize(os.path.join(self.dir, name)) > 1 << 20:
                continue
            try:
                doc = json.loads(self.blob("sha256:" + name))
            except ValueError:  # not JSON, or not its digest
                continue
            config = doc.get("config") if isinstance(doc, dict) else None
            if isinstance(config, dict) and config.get("digest") == config_digest:
                return doc
        return None


class Cache(ContentStore):
    """What earlier runs fetched from the registry (--cache DIR), kept outside scute's root."""

    name = "the checker's cache"

    def __init__(self, directory):
        self.dir = directory
        os.makedirs(directory, exist_ok=True)

    def put(self, digest, data):
        path = os.path.join(self.dir, digest.split(":", 1)[1])
        with open(path + ".tmp", "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)


class StoreThenRegistry:
    """Each document or blob from scute's content store when it is there and hashes to its
    digest, else from the registry (a layer scute dropped after a power cut, or never kept).
    Local first: the guest reaches the registry through qemu's user-mode network, which once
    stalled a download past a minute."""

    def __init__(self, store, registry, cache=None):
        self.store, self.registry, self.cache = store, registry, cache
        self.used = set()

    @property
    def name(self):
        return " and ".join(sorted(self.used)) or self.store.name

    def _get(self, digest, local, remote):
        for source, read in [(self.store, local)] + ([(self.cache, self.cache.blob)] if self.cache else []):
            try:
                data = read(digest)
                self.used.add(source.name)
                return data
            except (FileNotFoundError, Mismatch):
                pass
        for attempt in range(3):
            try:
                data = remote(digest)
                self.used.add(self.registry.name)
                if self.cache:
                    self.cache.put(digest, data)
                return data
            except urllib.error.HTTPError:
                raise
            except (urllib.error.URLError, TimeoutError, ConnectionError):
                if attempt == 2:
                    raise

    def manifest(self, digest):
        return self._get(digest, self.store.manifest, self.registry.manifest)

    def blob(self, digest):
        return self._get(digest, self.store.blob, self.registry.blob)


def manifest_for(source, digest):
    doc = json.loads(source.manifest(digest))
    if "manifests" in doc:  # an index: the linux/amd64 entry
        for m in doc["manifests"]:
            p = m.get("platform", {})
            if p.get("os") == "linux" and p.get("architecture") == "amd64":
                return manifest_for(source, m["digest"])
        raise ValueError(f"index {digest} has no linux/amd64 manifest")
    return doc


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def compare_layer(tar_bytes, fs_dir):
    """Problems found comparing one uncompressed layer with its snapshot tree, and how many
    entries the layer has."""
    problems = []
    # Hashes by name in the tar and by inode on the disk: busybox is ~280 hard links to one file.
    hashes, disk_hashes = {}, {}
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as tar:
        for entry in tar:
            name = os.path.normpath(entry.name.lstrip("/"))
            base = os.path.basename(name)
            if name in (".", "") or base.startswith(".wh."):
                continue
            path = os.path.join(fs_dir, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                problems.append(f"{name}: missing")
                continue
            if entry.isdir():
                if not stat.S_ISDIR(st.st_mode):
                    problems.append(f"{name}: not a directory")
            elif entry.issym():
                if not stat.S_ISLNK(st.st_mode) or os.readlink(path) != entry.linkname:
                    problems.append(f"{name}: not a symlink to {entry.linkname}")
            elif entry.isreg() or entry.islnk():
                member = tar.getmember(entry.linkname) if entry.islnk() else entry
                if member.name not in hashes:
                    hashes[member.name] = hashlib.sha256(tar.extractfile(member).read()).hexdigest()
                want = hashes[member.name]
                if not stat.S_ISREG(st.st_mode):
                    problems.append(f"{name}: not a regular file")
                elif st.st_size != member.size:
                    problems.append(f"{name}: {st.st_size} bytes, the layer has {member.size}")
                else:
                    if st.st_ino not in disk_hashes:
                        disk_hashes[st.st_ino] = file_sha256(path)
                    if disk_hashes[st.st_ino] != want:
                        problems.append(f"{name}: contents differ from the layer's")
        return problems, len(tar.getmembers())


def verify(registry, root, image, cache):
    """One image: (ok, message)."""
    tags = image.get("repoTags") or []
    label = tags[0] if tags else image["id"][:19]
    digests = image.get("repoDigests") or []
    if digests:
        name, digest = digests[0].split("@", 1)
        source = StoreThenRegistry(ContentStore(root), Registry(registry, name.split("/", 1)[1]), cache)
        manifest = manifest_for(source, digest)
    else:
        # No registry named it (an image made on the node): its manifest in the content store.
        source = ContentStore(root)
        manifest = source.manifest_of(image["id"])
        if manifest is None:
            return False, f"{label}: no repo digest listed and no manifest in {source.name} names its config"
    config_digest = manifest["config"]["digest"]
    if config_digest != image["id"]:
        return False, f"{label}: scute's image ID {image['id']} is not the manifest's config {config_digest}"
    config = json.loads(source.blob(config_digest))
    diff_ids = config["rootfs"]["diff_ids"]
    chain = None
    files = 0
    problems = []
    for layer, diff_id in zip(manifest["layers"], diff_ids):
        blob = source.blob(layer["digest"])
        raw = gzip.decompress(blob) if "gzip" in layer["mediaType"] else blob
        if sha256(raw) != diff_id:
            return False, f"{label}: layer {layer['digest']} does not uncompress to {diff_id}"
        chain = diff_id if chain is None else sha256(f"{chain} {diff_id}".encode())
        fs_dir = os.path.join(root, "snapshots", chain.split(":", 1)[1], "fs")
        if not os.path.isdir(fs_dir):
            problems.append(f"snapshot {chain[:19]} of layer {diff_id[:19]}: no directory {fs_dir}")
            continue
        found, entries = compare_layer(raw, fs_dir)
        files += entries
        problems += [f"layer {diff_id[:19]}: {p}" for p in found]
    if problems:
        shown = "; ".join(problems[:8])
        more = f" (and {len(problems) - 8} more)" if len(problems) > 8 else ""
        return False, f"{label}: DAMAGED: {shown}{more}"
    return True, f"{label}: {len(diff_ids)} layer(s) from {source.name}, {files} entries match"


def main():
    args = sys.argv[1:]
    cache = None
    if "--cache" in args:
        at = args.index("--cache")
        if at + 1 >= len(args):
            print(__doc__, file=sys.stderr)
            return 2
        cache = Cache(args[at + 1])
        del args[at : at + 2]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    registry = args[0]
    root = args[1] if len(args) > 1 else "/var/lib/scute"
    try:
        out = subprocess.run(["crictl", "images", "-o", "json"], check=True, capture_output=True).stdout
        images = json.loads(out)["images"]
    except (OSError, subprocess.CalledProcessError, ValueError, KeyError) as e:
        print(f"verify-images: crictl images: {e}", file=sys.stderr)
        return 2
    bad = 0
    for image in images:
        try:
            ok, message = verify(registry, root, image, cache)
        except Exception as e:  # noqa: BLE001 - a failed fetch or a bad document is a finding
            ok, message = False, f"{(image.get('repoTags') or [image['id']])[0]}: could not be checked: {e}"
        print(("ok   " if ok else "FAIL ") + message)
        bad += not ok
    print(f"verify-images: {len(images)} image(s), {bad} not as their layers' digests say")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
