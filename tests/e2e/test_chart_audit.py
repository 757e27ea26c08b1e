"""The chart's devicePlugin.audit values: the plugin's audit config and the PodResources mount, on or off."""

from __future__ import annotations

from typing import Any

import yaml

from deviceplugin.config import config_from_mapping

from .test_chart import helm, objects, run_helm, template  # noqa: F401  (helm is a fixture)


def _plugin(text: str) -> tuple[dict[str, Any], Any]:
    docs = objects(text)
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"].endswith("-default")]
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and "plugin.yaml" in d.get("data", {})]
    return ds["spec"]["template"]["spec"], config_from_mapping(
        yaml.safe_load(cm["data"]["plugin.yaml"]), node_name="node-a"
    )


def test_the_audit_is_on_by_default_with_the_kubelets_socket_mounted_read_only(helm: str) -> None:  # noqa: F811
    pod, config = _plugin(template(helm, None))
    assert (config.audit.enabled, config.audit.interval) == (True, 30.0)
    assert str(config.audit.socket) == "/var/lib/kubelet/pod-resources/kubelet.sock"
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "pod-resources"]
    assert mount == {"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources", "readOnly": True}
    (volume,) = [v for v in pod["volumes"] if v["name"] == "pod-resources"]
    assert volume["hostPath"] == {"path": "/var/lib/kubelet/pod-resources", "type": "DirectoryOrCreate"}


def test_the_audit_values_set_the_interval_or_turn_it_off_with_its_mount(helm: str) -> None:  # noqa: F811
    _, config = _plugin(template(helm, None, sets=["devicePlugin.audit.intervalSeconds=5"]))
    assert (config.audit.enabled, config.audit.interval) == (True, 5.0)
    pod, config = _plugin(template(helm, None, sets=["devicePlugin.audit.enabled=false"]))
    assert config.audit.enabled is False
    assert "pod-resources" not in {v["name"] for v in pod["volumes"]}
    assert "pod-resources" not in {m["name"] for m in pod["containers"][0]["volumeMounts"]}


def test_a_bad_audit_value_is_refused_by_the_schema(helm: str) -> None:  # noqa: F811
    from .test_chart import CHART

    for item, field in (
        ("devicePlugin.audit.intervalSeconds=0", "intervalSeconds"),
        ("devicePlugin.audit.every=1", "every"),
    ):
        result = run_helm(helm, "template", "r", str(CHART), "--set", item)
        assert result.returncode != 0 and field in result.stderr, result.stderr
