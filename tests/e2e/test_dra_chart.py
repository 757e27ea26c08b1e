"""The chart's DRA DeviceClasses (``dra.enabled``): the same as ``icl dra classes``, accepted by the real
API server, absent by default, and a bad driver name is refused by the values schema."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from deviceplugin.dra.classes import device_classes

from .harness import ControlPlane
from .test_chart import helm_path, objects, run_helm, template

pytestmark = pytest.mark.e2e

CHART = Path(__file__).resolve().parents[2] / "charts" / "kube-icl"


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
