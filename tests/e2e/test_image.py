"""The container image, built from the Dockerfile without a Docker daemon, smoke-tested as it would run.

``make image`` (``hack/image/build.py``) runs the Dockerfile's steps in a chroot of a debootstrap of
the base's Debian release and assembles an OCI image with crane; these tests take that image's
root filesystem and OCI layout for the current tree (same cache key) and check:

* the OCI layout: every blob matches its digest and size; the config says what the Dockerfile
  says (non-root user, entry point, OCI labels with the pyproject version and the git revision);
  the layer carries ``icl`` in the venv and leaves matplotlib, pip and the sources out;
* each entry point, run inside the image's root filesystem with the image's environment, user
  and an empty capability set (as the manifests' ``drop: [ALL]``): ``icl --version``,
  ``icl topo show``, ``icl plugin --backend sim`` serving its socket to the kubelet emulator
  running on the host, ``icl extender`` answering HTTP on loopback against the real API server.

They need root (chroot, mount namespaces). Without a built image they skip with one line saying
how to build it; with ``ICL_E2E_REQUIRED=1`` (CI) that skip is a failure.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import http.client
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tomllib
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack.image import build, rootfs
from topology import build_preset, encode_annotation

from .harness import Component, ControlPlane, e2e_required, free_port, wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
RESOURCE = "kube-icl.io/accelerator"
IMAGE_USER = "65532:65532"
PLUGIN_DIR = "/var/lib/kubelet/device-plugins"


@dataclass(frozen=True)
class Image:
    directory: Path
    summary: dict[str, Any]

    @property
    def rootfs(self) -> Path:
        return self.directory / "rootfs"

    @property
    def env(self) -> dict[str, str]:
        env: dict[str, str] = self.summary["env"]
        return env

    def argv(
        self, args: Sequence[str], *, user: str = IMAGE_USER, writable: Sequence[str] = (), workdir: str = "/"
    ) -> list[str]:
        """``args`` inside the image as the manifests run it: ``user``, the image's environment, no
        capabilities, a read-only root filesystem with a tmpfs on /tmp, ``writable`` as host volumes."""
        ids = rootfs.resolve_user(self.rootfs, user)
        argv: list[str] = rootfs.chroot_argv(
            self.rootfs,
            list(args),
            user=ids,
            env=self.env,
            workdir=workdir,
            keep_caps=False,
            read_only=True,
            writable=writable,
        )
        return argv

    def run(self, args: Sequence[str], timeout: float = 120, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run to completion; on timeout the whole process group goes (a uid change clears unshare's
        parent-death signal, so killing ``unshare`` alone would leave the command running)."""
        argv = self.argv(args, **kwargs)
        process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise
        return subprocess.CompletedProcess(argv, process.returncode, out, err)


def _skip_or_fail(reason: str) -> None:
    if e2e_required():
        pytest.fail(f"{reason} (ICL_E2E_REQUIRED=1)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def image() -> Image:
    if os.geteuid() != 0:
        _skip_or_fail("the image smoke tests chroot into the image: run as root (CI does)")
    # ICL_IMAGE_DIR: test an image built earlier (by default, the one built from this very tree).
    directory = Path(os.environ.get("ICL_IMAGE_DIR") or build.image_dir())
    summary_path = directory / "summary.json"
    if not summary_path.exists():
        _skip_or_fail(f"no image built for this tree at {directory}: run `make image` (as root)")
    summary = json.loads(summary_path.read_text())
    if not summary.get("oci"):
        _skip_or_fail(f"{directory} has a root filesystem but no OCI image: run `make image`")
    return Image(directory, summary)


def _pyproject_version() -> str:
    version: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return version


# --------------------------------------------------------------------------- the OCI image


def _blob(layout: Path, descriptor: Mapping[str, Any]) -> bytes:
    algorithm, _, digest = str(descriptor["digest"]).partition(":")
    data = (layout / "blobs" / algorithm / digest).read_bytes()
    assert hashlib.new(algorithm, data).hexdigest() == digest, descriptor["digest"]
    assert len(data) == descriptor["size"], descriptor
    return data


def _image_manifest(layout: Path) -> dict[str, Any]:
    index = json.loads((layout / "index.json").read_text())
    manifest: dict[str, Any] = json.loads(_blob(layout, index["manifests"][0]))
    if "manifests" in manifest:  # an image index one level down
        manifest = json.loads(_blob(layout, manifest["manifests"][0]))
    return manifest


def test_oci_layout_and_config_say_what_the_dockerfile_says(image: Image) -> None:
    layout = image.directory / "oci"
    manifest = _image_manifest(layout)
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    config = json.loads(_blob(layout, manifest["config"]))
    body = config["config"]
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout.strip()
    assert (config["os"], config["architecture"]) == ("linux", arch)
    assert body["User"] == IMAGE_USER
    assert body["Entrypoint"] == ["icl"] and body["Cmd"] == ["--help"]
    env = dict(item.split("=", 1) for item in body["Env"])
    assert env["PATH"].split(":")[0] == "/opt/kube-icl/bin"
    revision = image.summary["build_args"]["REVISION"]
    assert env["ICL_REVISION"] == revision
    labels = body["Labels"]
    assert labels["org.opencontainers.image.version"] == _pyproject_version()
    assert labels["org.opencontainers.image.revision"] == revision
    assert (
        labels["org.opencontainers.image.licenses"]
        == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]
    )
    for key in ("title", "description", "source"):
        assert labels[f"org.opencontainers.image.{key}"], key
    # The layers as pulled: what the image runs is in, what it does not need is out.
    names: set[str] = set()
    for descriptor in manifest["layers"]:
        data = _blob(layout, descriptor)
        if descriptor["mediaType"].endswith("gzip"):
            data = gzip.decompress(data)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            names.update(member.name.removeprefix("./") for member in tar.getmembers())
    site = "opt/kube-icl/lib/python3.11/site-packages"
    assert "opt/kube-icl/bin/icl" in names and "usr/bin/python3.11" in names
    assert f"{site}/deviceplugin/server.py" in names and f"{site}/scheduler/extender.py" in names
    assert not any(n.startswith((f"{site}/matplotlib/", f"{site}/pip/", "src/", "opt/build/")) for n in names)
    assert not any(n.startswith("usr/share/man/") for n in names)
    assert image.summary["compressed_bytes"] == sum(d["size"] for d in manifest["layers"]) + manifest["config"]["size"]


def test_version_names_the_package_and_the_revision(image: Image) -> None:
    result = image.run(["icl", "--version"])
    assert result.returncode == 0, result.stderr
    revision = image.summary["build_args"]["REVISION"]
    expected = f"icl {_pyproject_version()}" + (f" (revision {revision})" if revision else "")
    assert result.stdout.strip() == expected


def test_topo_show_draws_as_the_checkout_does(image: Image) -> None:
    inside = image.run(["icl", "topo", "show", "ring:4"])
    host = subprocess.run([sys.executable, "-m", "icl", "topo", "show", "ring:4"], capture_output=True, text=True)
    assert inside.returncode == 0, inside.stderr
    assert inside.stdout == host.stdout and "ring:4" in inside.stdout


def test_sim_without_matplotlib_refuses_plots_and_runs_without(image: Image) -> None:
    inside = Path("/run") / f"icl-sim-{uuid.uuid4().hex[:8]}"
    host_dir = image.rootfs / inside.relative_to("/")
    host_dir.mkdir(parents=True)
    os.chown(host_dir, *rootfs.resolve_user(image.rootfs, IMAGE_USER))
    small = ["icl", "sim", "--mode", "fill", "--tasks", "30", "--seeds", "1", "--policies", "icl", "--no-progress"]
    try:
        refused = image.run([*small, "--out", str(inside / "plots")], writable=[str(inside)])
        assert refused.returncode == 2 and "kube-icl[plot]" in refused.stderr, refused.stderr
        ran = image.run([*small, "--out", str(inside / "data"), "--no-plots"], writable=[str(inside)])
        assert ran.returncode == 0, ran.stderr[-2000:]
        assert (host_dir / "data" / "fill_runs.csv").exists() and not (host_dir / "plots").exists()
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)


# --------------------------------------------------------------------------- the device plugin


@pytest.fixture
def device_plugin_dir(image: Image) -> Iterator[Path]:
    """The kubelet's device-plugin directory inside the image, owned by root with mode 0755 as on a node."""
    path = image.rootfs / PLUGIN_DIR.lstrip("/")
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    os.chown(path, 0, 0)
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _start_kubelet_emu(plugin_dir: Path, tmp_path: Path, admits: Sequence[int]) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "icl", "kubelet-emu", "--plugin-dir", str(plugin_dir), "--wait", "60"]
    for count in admits:
        argv += ["--admit", str(count)]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=(tmp_path / "kubelet-emu.log").open("w"), text=True)
    wait_for(lambda: (plugin_dir / "kubelet.sock").exists(), what="kubelet.sock", timeout=30)
    return process


def test_plugin_as_uid_0_without_capabilities_serves_the_kubelet(
    image: Image, device_plugin_dir: Path, tmp_path: Path
) -> None:
    """The DaemonSet's settings: uid 0 (owner of the kubelet's directory), every capability dropped."""
    emulator = _start_kubelet_emu(device_plugin_dir, tmp_path, [2, 4])
    argv = image.argv(["icl", "plugin", "--backend", "sim", "--topology", "ring:8"], user="0:0", writable=[PLUGIN_DIR])
    plugin = Component("image-plugin", argv, tmp_path / "plugin.log").start()
    try:
        out, _ = emulator.communicate(timeout=90)
        assert emulator.returncode == 0, (tmp_path / "kubelet-emu.log").read_text()[-2000:] + plugin.log_tail()
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        assert lines[0]["registered"] == RESOURCE and len(lines[0]["devices"]) == 8, out
        admitted = [line["allocate_order"] for line in lines if "asked" in line]
        assert [len(a) for a in admitted] == [2, 4], out
        assert not set(admitted[0]) & set(admitted[1])
        socket = device_plugin_dir / "kube-icl.sock"
        assert socket.is_socket() and socket.stat().st_uid == 0
        assert plugin.running, plugin.log_tail()
    finally:
        if emulator.poll() is None:
            emulator.kill()
            emulator.wait()
        plugin.stop()
    assert plugin.returncode == 0, plugin.log_tail()


def test_plugin_as_the_image_user_cannot_use_the_kubelets_directory(
    image: Image, device_plugin_dir: Path, tmp_path: Path
) -> None:
    """Why the DaemonSet overrides the image's user: uid 65532 may not create its socket there.

    A directory it may not write in is a permanent error: the plugin says so in one line and exits 1
    (no retry loop, unlike a kubelet restart).
    """
    emulator = _start_kubelet_emu(device_plugin_dir, tmp_path, [1])
    argv = image.argv(["icl", "plugin", "--backend", "sim", "--topology", "ring:8"], writable=[PLUGIN_DIR])
    plugin = Component("image-plugin-non-root", argv, tmp_path / "plugin.log").start()
    try:
        wait_for(lambda: not plugin.running, what="the plugin's exit", timeout=60)
        assert plugin.returncode == 1
        log = plugin.log_path.read_text(errors="replace")
        assert "icl plugin: cannot create the socket" in log and "uid 65532 may not write in" in log, log
        assert not (device_plugin_dir / "kube-icl.sock").exists()
        assert emulator.poll() is None  # still waiting: nothing registered
    finally:
        plugin.stop()
        emulator.kill()
        emulator.wait()


# --------------------------------------------------------------------------- the extender


def _portable_kubeconfig(source: Path) -> str:
    """The admin kubeconfig with its certificate files inlined, so that it reads the same inside the image."""
    doc = yaml.safe_load(source.read_text())
    for section, key in (("clusters", "cluster"), ("users", "user")):
        for entry in doc.get(section, []):
            body = entry[key]
            for field_name in list(body):
                if field_name in ("certificate-authority", "client-certificate", "client-key"):
                    data = Path(body.pop(field_name)).read_bytes()
                    body[f"{field_name}-data"] = base64.b64encode(data).decode()
    return yaml.safe_dump(doc)


def _http(port: int, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        connection.request(method, path, payload, headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _pod(name: str, count: int, shape: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": str(uuid.uuid4()),
            "annotations": {"kube-icl.io/shape": shape},
        },
        "spec": {
            "schedulerName": "kube-icl",
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": {RESOURCE: str(count)}}}],
        },
        "status": {"phase": "Pending"},
    }


def test_extender_as_the_image_user_answers_the_scheduler_verbs(
    image: Image, control_plane: ControlPlane, tmp_path: Path
) -> None:
    node = f"img-{uuid.uuid4().hex[:6]}"
    topo = build_preset("torus:4x4")
    control_plane.create_node(
        node,
        annotations={"kube-icl.io/topology": encode_annotation(topo)},
        allocatable={RESOURCE: str(len(topo.ids))},
    )
    inside = Path("/run") / f"icl-{uuid.uuid4().hex[:8]}"
    host_dir = image.rootfs / inside.relative_to("/")
    host_dir.mkdir(parents=True)
    try:
        (host_dir / "kubeconfig").write_text(_portable_kubeconfig(control_plane.kubeconfig))
        (host_dir / "kubeconfig").chmod(0o644)
        port = free_port()
        argv = image.argv(
            ["icl", "extender", "--kubeconfig", str(inside / "kubeconfig"), "--host", "127.0.0.1", "--port", str(port)]
        )
        extender = Component("image-extender", argv, tmp_path / "extender.log").start()
        try:
            wait_for(lambda: _http(port, "GET", "/readyz")[0] == 200, what="icl extender /readyz", timeout=60)
            assert _http(port, "GET", "/healthz") == (200, b"ok\n")
            code, body = _http(port, "POST", "/filter", {"Pod": _pod("fits", 4, "ring"), "NodeNames": [node]})
            assert code == 200, body
            assert json.loads(body)["NodeNames"] == [node], body
            code, body = _http(port, "POST", "/filter", {"Pod": _pod("too-big", 32, "ring"), "NodeNames": [node]})
            result = json.loads(body)
            failed = {**(result.get("FailedNodes") or {}), **(result.get("FailedAndUnresolvableNodes") or {})}
            assert code == 200 and not result["NodeNames"] and node in failed, result
            code, metrics = _http(port, "GET", "/metrics")
            assert code == 200 and b"kube_icl_extender_decisions_total" in metrics
        finally:
            extender.stop()
        assert extender.returncode == 0, extender.log_tail()
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)
        control_plane.core.delete_node(node)
