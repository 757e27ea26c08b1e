"""The chart's DRA DeviceClasses (``dra.enabled``): the same as ``icl dra classes``, accepted by the real
API server, absent by default, and a bad driver name is refused by the values schema."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from deviceplugin.dra.classes import device_classes
from deviceplugin.dra.pool import DRIVER

from .harness import ControlPlane
from .test_chart import CHART, helm_path, objects, release_namespace, run_helm, template

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def helm() -> str:
    return helm_path()


def test_deviceclasses_are_the_drivers_and_the_api_server_takes_them(
    control_plane: ControlPlane, helm: str, tmp_path: Path
) -> None:
    assert not [d for d in objects(template(helm, None)) if d["kind"] == "DeviceClass"]
    text = template(helm, None, sets=["dra.enabled=true", "dra.driver=accel.example.com"])
    classes = [d for d in objects(text) if d["kind"] == "DeviceClass"]
    want = device_classes("accel.example.com")
    assert [(c["metadata"]["name"], c["spec"]) for c in classes] == [(w["metadata"]["name"], w["spec"]) for w in want]
    path = tmp_path / "classes.yaml"
    path.write_text("\n---\n".join(yaml.safe_dump(c) for c in classes))
    out = control_plane.server_dry_run_apply(path)
    assert out.stdout.count("(server dry run)") == len(classes), out.stdout


def test_a_bad_driver_name_is_one_line_naming_it(helm: str) -> None:
    result = run_helm(helm, "template", "r", str(CHART), "--set", "dra.enabled=true", "--set", "dra.driver=Bad_x")
    assert result.returncode != 0
    assert "/dra/driver" in result.stderr and "'Bad_x'" in result.stderr


def test_the_driver_daemonset_runs_icl_dra_run_and_its_account_has_exactly_its_rights(
    control_plane: ControlPlane, helm: str, tmp_path: Path
) -> None:
    from icl.cli import build_parser

    from .test_chart import can_i

    suffix, namespace = release_namespace(control_plane, "icl-dra")
    sets = [
        "dra.enabled=true",
        "dra.backend=sim",
        "dra.topology=hcm:8",
        "dra.extraArgs={--resync=5}",
        "dra.selection=taints",
        "dra.subset=tiled",
    ]
    text = template(helm, None, release=f"dra-{suffix}", namespace=namespace, sets=sets)
    docs = [
        d for d in objects(text) if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "dra-driver"
    ]
    assert sorted(d["kind"] for d in docs) == ["ClusterRole", "ClusterRoleBinding", "DaemonSet", "ServiceAccount"]
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    assert container["command"][:3] == ["icl", "dra", "run"]
    args = build_parser().parse_args(container["command"][1:])  # what the image's `icl` will parse
    assert (args.backend, args.topology, args.driver, args.resync) == ("sim", "hcm:8", DRIVER, 5.0)
    assert (args.selection, args.subset) == ("taints", "tiled")
    assert args.plugin_dir == f"/var/lib/kubelet/plugins/{DRIVER}" and args.cdi_dir == "/var/run/cdi"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins_registry", "/var/run/cdi"} <= mounts
    path = tmp_path / "driver.yaml"
    path.write_text("\n---\n".join(yaml.safe_dump(d) for d in docs))
    out = control_plane.kubectl("apply", "-f", str(path))
    assert out.returncode == 0, out.stderr
    (sa,) = [d for d in docs if d["kind"] == "ServiceAccount"]
    user = f"system:serviceaccount:{namespace}:{sa['metadata']['name']}"
    allowed = [
        ("create", "resourceslices.resource.k8s.io"),
        ("update", "resourceslices.resource.k8s.io"),
        ("delete", "resourceslices.resource.k8s.io"),
        ("list", "resourceslices.resource.k8s.io"),
        ("list", "resourceclaims.resource.k8s.io"),
        ("get", "resourceclaims.resource.k8s.io"),
        ("get", "nodes"),
    ]
    denied = [
        ("update", "resourceclaims.resource.k8s.io"),
        ("patch", "nodes"),
        ("create", "pods"),
        ("list", "secrets"),
        ("create", "deviceclasses.resource.k8s.io"),
    ]
    assert [can_i(control_plane, user, v, r) for v, r in allowed] == [True] * len(allowed)
    assert [can_i(control_plane, user, v, r) for v, r in denied] == [False] * len(denied)
    control_plane.kubectl("delete", "-f", str(path), "--wait=false", check=False)
