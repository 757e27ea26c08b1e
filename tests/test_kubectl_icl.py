"""``kubectl icl`` without a cluster: its views of nodes, gangs and queues from API objects, how they are
rendered (tables, chip strips, drawings, JSON/YAML, the HTML page), and the command's kubectl-like
parsing, errors and exit codes. Against a real API server: tests/e2e/test_kubectl_icl_e2e.py.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from kubectlicl import cli, html, render, views
from kubectlicl.state import State, read_state, reservations
from scheduler.config import ExtenderConfig, QueueConfig, parse_config
from scheduler.gangrecords import GangRecords, Reservation, Slot
from scheduler.wire import RECORD_ANNOTATION, lease_record
from topology import Health, build_preset, encode_annotation

R = "kube-icl.io/accelerator"
NOW = 1_800_000_000.0


def node(name: str, preset: str | None = "ring:8", *, unhealthy: tuple[str, ...] = (), **labels: str) -> dict[str, Any]:
    annotations = {}
    if preset is not None:
        topo = build_preset(preset).with_health({d: Health.UNHEALTHY for d in unhealthy})
        annotations["kube-icl.io/topology"] = encode_annotation(topo)
    return {
        "metadata": {
            "name": name,
            "labels": {k.replace("__", "/"): v for k, v in labels.items()},
            "annotations": annotations,
        },
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def pod(
    name: str,
    count: int,
    *,
    namespace: str = "ml",
    node_name: str = "",
    devices: str = "",
    shape: str = "ring",
    created: str = "2026-01-01T00:00:00Z",
    **annotations: str,
) -> dict[str, Any]:
    """A pod asking ``count`` devices; keyword arguments are kube-icl.io/ annotations (gang_max: gang-max)."""
    ann = {"kube-icl.io/shape": shape, **{f"kube-icl.io/{k.replace('_', '-')}": v for k, v in annotations.items()}}
    if devices:
        ann["kube-icl.io/devices"] = devices
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"limits": {R: str(count)}}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {
        "metadata": {
            "name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}", "annotations": ann,
            "creationTimestamp": created,
        },
        "spec": spec,
        "status": {"phase": "Running" if node_name else "Pending"},
    }  # fmt: skip


def record(gang: str, slots: list[tuple[str, tuple[str, ...]]], expires_at: float, size: int = 0) -> dict[str, Any]:
    """A reservation Lease as the extender writes it (scheduler.wire.lease_record)."""
    res = Reservation(
        key=gang,
        size=size or len(slots),
        shape="ring",
        count=len(slots[0][1]),
        queue="ml",
        slots=[Slot(f"gang:{gang}#{i}", n, d) for i, (n, d) in enumerate(slots)],
        created=0.0,
        deadline=0.0,
        expires_at=expires_at,
    )
    return lease_record(res.record(), "kube-icl", "extender-0", expires_at - 120)


def state(
    nodes: list[dict[str, Any]],
    *pods: dict[str, Any],
    leases: tuple[dict[str, Any], ...] = (),
    cfg: ExtenderConfig | None = None,
) -> State:
    """The nodes, pods and records fed into the extender's cache and gang book, as kubectl icl reads them."""
    got = read_state(cfg or ExtenderConfig(), nodes, pods, leases, now=NOW)
    assert not got.warnings
    return got


def test_the_reservation_names_are_the_extenders_and_its_records_read_back() -> None:
    lease = record("ml/train", [("n1", ("4", "5")), ("n2", ("0", "1"))], NOW + 90)
    (listed,), warnings = reservations([lease])
    assert not warnings
    res = listed.record
    assert res.key == "ml/train" and res.size == 2 and res.count == 2 and res.queue == "ml"
    assert tuple((node, devices) for _owner, node, devices in res.slots) == (("n1", ("4", "5")), ("n2", ("0", "1")))
    assert res.expires_at == pytest.approx(NOW + 90, abs=0.01)
    assert listed.lease.startswith("kube-icl/kube-icl-gang-")


def test_an_unreadable_reservation_is_a_warning_naming_the_lease() -> None:
    lease = record("ml/train", [("n1", ("4", "5"))], NOW)
    lease["metadata"]["annotations"][RECORD_ANNOTATION] = "{not json"
    got, warnings = reservations([lease])
    assert got == [] and len(warnings) == 1
    assert warnings[0].startswith(f"lease {lease['metadata']['namespace']}/{lease['metadata']['name']}: ")


def test_chips_are_busy_reserved_unhealthy_or_free_and_the_largest_free_shape_follows() -> None:
    nodes = [node("n1", unhealthy=("7",), **{"kube-icl.io__link-domain": "rack-1", "example.com__rack": "r1"})]
    pods = (pod("a", 2, node_name="n1", devices="0,1"), pod("waiting", 4))
    held = (record("ml/train", [("n1", ("4", "5"))], NOW + 60),)
    (n1,) = views.node_summaries(state(nodes, *pods, leases=held), tiers=("example.com/rack", "example.com/block"))
    assert [c.state for c in n1.chips] == ["busy", "busy", "free", "free", "reserved", "reserved", "free", "unhealthy"]
    assert n1.chips[0].pods == ("ml/a",) and n1.chips[4].gang == "ml/train"
    assert render.strip(n1) == "AA··++·x"
    assert (n1.largest_ring, n1.largest_group) == (2, 2)  # free 2,3 and 6 on a ring of 8: a pair is the most
    assert n1.domain == "rack-1" and n1.tiers == (("example.com/rack", "r1"),)


def test_a_claimed_slot_is_busy_and_an_expired_reservation_holds_nothing() -> None:
    m0 = pod("m0", 2, node_name="n1", devices="4,5", gang="train", gang_size="2")
    train = record("ml/train", [("n1", ("4", "5")), ("n1", ("0", "1"))], NOW + 60)
    held = (train, record("ml/old", [("n1", ("2", "3"))], NOW - 1))
    (n1,) = views.node_summaries(state([node("n1")], m0, leases=held))
    assert render.strip(n1) == "++··AA··"
    assert (n1.largest_ring, n1.largest_group) == (2, 2)  # on a ring of 8, free 2,3 and 6,7 are two pairs


def test_a_node_without_the_annotation_says_so_and_pods_without_devices_are_listed_apart() -> None:
    pods = (pod("rogue", 2, node_name="n1"), pod("other", 1, node_name="elsewhere", devices="0"))
    n0, n1 = views.node_summaries(state([node("n1"), node("n0", None)], *pods))
    assert n0.name == "n0" and n0.topology is None and n0.error == views.NO_TOPOLOGY and n0.chips == ()
    assert n1.unattributed == (("ml/rogue", 2),) and n1.count("free") == 8
    table = render.nodes_table([n0, n1])
    assert "n1  ?  ml/rogue  2 chips, which not known" in table.replace("   ", "  ")


def test_the_nodes_table_has_kubectl_columns_a_strip_per_node_and_a_legend_of_pods() -> None:
    nodes = [
        node("n1", "mesh:2x4", **{"kube-icl.io__link-domain": "d1", "kube-icl.io__link-coords": "0.1"}),
        node("n2"),
    ]
    pods = (
        pod("new", 1, node_name="n1", devices="7", shape="any", created="2026-01-02T00:00:00Z"),
        pod("old", 4, node_name="n1", devices="0,1,5,4", shape="mesh:2x2", created="2026-01-01T00:00:00Z"),
    )
    out = render.nodes_table(views.node_summaries(state(nodes, *pods)), wide=True)
    lines = out.splitlines()
    assert re.split(r"\s{3,}", lines[0]) == [
        "NODE", "TOPOLOGY", "CHIPS", "FREE", "BUSY", "RESERVED", "UNHEALTHY", "LARGEST FREE", "DOMAIN", "TIERS",
        "STATUS", "PODS",
    ]  # fmt: skip
    assert re.split(r"\s{3,}", lines[1]) == [
        "n1", "mesh:2x4", "AA··AA·B", "3/8", "5", "0", "0", "ring:2 any:3", "d1@0.1", "<none>", "Ready", "2",
    ]  # fmt: skip
    assert re.split(r"\s{3,}", lines[2])[:8] == ["n2", "ring:8", "········", "8/8", "0", "0", "0", "ring:8 any:8"]
    assert "n1  A  ml/old  chips 0,1,5,4" in out and "n1  B  ml/new  chips 7" in out


def test_the_drawing_marks_each_pods_chips_and_names_the_pods() -> None:
    a = pod("a", 2, node_name="n1", devices="0,1")
    held = (record("ml/train", [("n1", ("4", "5"))], NOW + 60),)
    drawing = render.node_drawings(views.node_summaries(state([node("n1")], a, leases=held)))
    assert drawing.startswith("node/n1: 2 busy, 2 reserved, 0 unhealthy, 4 free of 8;")
    assert "A0" in drawing and "+4" in drawing and "·2" in drawing
    assert "  A  ml/a: 0,1" in drawing and "  +  gang ml/train: reserved, not claimed yet" in drawing


def test_node_documents_carry_every_chip_with_its_state_and_pods() -> None:
    a = pod("a", 2, node_name="n1", devices="0,1")
    doc = render.node_docs(views.node_summaries(state([node("n1", unhealthy=("3",))], a)))
    (item,) = doc["items"]
    assert item["chips"] == {"total": 8, "free": 5, "busy": 2, "reserved": 0, "unhealthy": 1}
    assert item["devices"][0] == {"id": "0", "state": "busy", "pods": ["ml/a"]}
    assert item["devices"][3]["state"] == "unhealthy"
    assert item["largestFree"] == {"ring": 2, "any": 4}  # free 2 | 4,5,6,7 on a ring of 8
    assert yaml.safe_load(yaml.safe_dump(doc)) == json.loads(json.dumps(doc))


def test_gangs_show_members_bound_and_pending_sizes_and_the_reservation() -> None:
    pods = (
        pod("w0", 2, node_name="n1", devices="4,5", gang="train", gang_min="2", gang_max="4",
            gang_required_tier="link-domain"),
        pod("w1", 2, gang="train", gang_min="2", gang_max="4"),
        pod("w2", 2, gang="train", gang_min="2", gang_max="4"),
        pod("solo", 1, node_name="n1", devices="0"),
    )  # fmt: skip
    held = (
        record("ml/train", [("n1", ("4", "5")), ("n2", ("0", "1"))], NOW + 90),
        record("ml/orphan", [("n3", ("0", "1"))], NOW - 30, size=3),
    )
    orphan, train = views.gang_views(state([], *pods, leases=held))  # as kubectl icl gangs: no node listed
    assert train.key == "ml/train" and (train.minimum, train.maximum, train.elastic) == (2, 4, True)
    assert train.bound == (("ml/w0", "n1"),) and train.pending == ("ml/w1", "ml/w2")
    assert train.tier == "link-domain" and train.shape == "ring" and train.count == 2
    assert [s.claimed_by for s in train.slots] == ["ml/w0", ""]
    assert orphan.minimum == 3 and orphan.bound == () and orphan.pending == ()
    lines = render.gangs_table([orphan, train], now=NOW).splitlines()
    assert re.split(r"\s{3,}", lines[0]) == [
        "NAMESPACE", "GANG", "SIZE", "BOUND", "PENDING", "SHAPE", "QUEUE", "TIER", "RESERVATION"
    ]  # fmt: skip
    assert re.split(r"\s{3,}", lines[1]) == [
        "ml",
        "orphan",
        "3",
        "0",
        "0",
        "2x ring",
        "ml",
        "<none>",
        "0/1 claimed, expired 30s ago",
    ]
    assert re.split(r"\s{3,}", lines[2]) == [
        "ml", "train", "2-4", "1", "2", "2x ring", "ml", "link-domain", "1/2 claimed, expires in 1m30s"
    ]  # fmt: skip
    doc = render.gang_docs([train], now=NOW)["items"][0]
    assert doc["reservation"]["slots"][0] == {"node": "n1", "devices": ["4", "5"], "claimedBy": "ml/w0"}
    assert doc["reservation"]["expiresInSeconds"] == pytest.approx(90, abs=0.1)


def _collecting(gang: str, node_name: str) -> dict[str, Any]:
    """The record of a gang collecting all 8 devices of ``node_name`` for one ring of 8."""
    devices = tuple(str(i) for i in range(8))
    res = Reservation(
        key=gang,
        size=1,
        shape="ring",
        count=8,
        queue="ml",
        slots=[Slot(f"gang:{gang}#0", node_name, devices, waiting=True)],
        created=0.0,
        deadline=0.0,
        domain=node_name,
        expires_at=NOW + 3600,
        collecting=True,
    )
    return lease_record(res.record(), "kube-icl", "extender-0", NOW)


def test_gangs_show_a_collecting_gang_with_the_devices_it_holds_and_where() -> None:
    big = pod("big", 8, gang="big", gang_size="1")
    busy = pod("busy", 4, node_name="n1", devices="0,1,2,3", shape="any")
    (gang,) = views.gang_views(state([node("n1")], big, busy, leases=(_collecting("ml/big", "n1"),)))
    assert gang.collecting == "collecting: 4 of 8 devices held in domain n1"
    line = render.gangs_table([gang], now=NOW).splitlines()[1]
    assert re.split(r"\s{3,}", line)[-1] == "collecting: 4 of 8 devices held in domain n1"
    assert render.gang_docs([gang], now=NOW)["items"][0]["reservation"]["collecting"] == gang.collecting


def test_queues_take_weight_and_quota_from_the_config_and_shares_from_the_extenders_rule() -> None:
    cfg = ExtenderConfig(queues={"research": QueueConfig("research", 2.0, 8)}, default_queue_weight=1.0)
    nodes = [node("n1"), node("n2"), node("m1", "mesh:2x2")]
    pods = (
        pod("r1", 4, node_name="n1", devices="0,1,2,3", queue="research"),
        pod("r2", 2, node_name="m1", devices="0,1", queue="research"),
        pod("r3", 4, queue="research"),
        pod("b1", 4, namespace="batch", node_name="n2", devices="0,1,2,3"),
        pod("b2", 1, namespace="batch"),
        pod("b3", 1, namespace="batch"),
    )
    research, batch = sorted(views.queue_views(state(nodes, *pods, cfg=cfg)), key=lambda q: q.name, reverse=True)
    # research: 4 of 16 ring chips, 2 of 4 mesh chips -> dominant 0.5, over weight 2
    assert (research.weight, research.quota, research.devices, research.pending) == (2.0, 8, 6, 1)
    assert research.share == pytest.approx(0.25) and research.pools == {"mesh:2x2": 2, "ring:8": 4}
    assert (batch.weight, batch.quota, batch.devices, batch.pending, batch.share) == (1.0, None, 4, 2, 0.25)
    lines = render.queues_table([batch, research]).splitlines()
    assert re.split(r"\s{3,}", lines[1]) == ["batch", "1", "<none>", "4", "0.250", "2", "ring:8=4"]
    assert re.split(r"\s{3,}", lines[2]) == ["research", "2", "8", "6", "0.250", "1", "mesh:2x2=2,ring:8=4"]
    doc = render.queue_docs([research], "configmap kube-icl/kube-icl-extender")
    assert doc["configFrom"] == "configmap kube-icl/kube-icl-extender" and doc["items"][0]["dominantShare"] == 0.25


def test_queues_show_the_tree_indented_with_guarantees_borrowed_and_lent_devices() -> None:
    """org: team-a (a1, a2) idle, team-b (b1) holding 12 of its 8: team-b borrows 4 that team-a lends,
    each of team-a's projects 2 of its idle 4."""
    cfg = parse_config(
        {
            "queueTree": [
                {
                    "name": "org",
                    "children": [
                        {
                            "name": "team-a",
                            "weight": 2,
                            "children": [
                                {"name": "a1", "nominalQuota": {"devices": 4}},
                                {"name": "a2", "nominalQuota": {"devices": 4}},
                            ],
                        },
                        {"name": "team-b", "children": [{"name": "b1", "nominalQuota": {"devices": 8}}]},
                    ],
                }
            ],
            "queues": {"batch": {"weight": 1}},
        }
    )
    pods = (
        pod("b-n1", 8, node_name="n1", devices="0,1,2,3,4,5,6,7", queue="b1"),
        pod("b-n2", 4, node_name="n2", devices="0,1,2,3", queue="b1"),
        pod("a1-wait", 2, queue="a1"),
        pod("x", 2, namespace="batch", node_name="n2", devices="4,5"),
    )
    got = state([node("n1"), node("n2")], *pods, cfg=cfg)
    flat = views.queue_views(got)
    assert [q.name for q in flat] == ["batch"], "the tree's queues are shown in the tree, not as flat queues"
    tree = {n.name: n for n in views.queue_tree_views(got)}
    assert list(tree) == ["org", "team-a", "a1", "a2", "team-b", "b1"]
    b, a = tree["team-b"], tree["team-a"]
    assert (b.guarantee, b.held, b.borrowed, b.lent) == (8, 12, 4, 0)
    assert (a.guarantee, a.held, a.borrowed, a.lent, a.pending, a.weight) == (8, 0, 0, 4, 1, 2.0)
    assert (tree["a1"].lent, tree["a2"].lent, tree["b1"].borrowed) == (0, 0, 4)
    assert b.share == pytest.approx(4 / 16) and a.share == 0.0
    lines = render.queue_tree_table(list(tree.values())).splitlines()
    assert re.split(r"\s{3,}", lines[0]) == [
        "QUEUE TREE",
        "WEIGHT",
        "GUARANTEE",
        "HELD",
        "BORROWED",
        "LENT",
        "SHARE",
        "PENDING",
    ]
    assert lines[2].startswith("  team-a ") and lines[3].startswith("    a1 ")
    assert re.split(r"\s{3,}", lines[5].strip()) == ["team-b", "1", "8", "12", "4", "0", "0.250", "0"]
    doc = render.queue_docs(flat, "", list(tree.values()))
    assert doc["tree"][1] == {
        "queue": "team-a",
        "parent": "org",
        "depth": 1,
        "leaf": False,
        "weight": 2.0,
        "guarantee": 8,
        "held": 0,
        "borrowed": 0,
        "lent": 4,
        "dominantShare": 0.0,
        "pending": 1,
    }


def test_the_html_page_draws_every_chip_self_contained() -> None:
    a = pod("a", 4, node_name="n1", devices="0,1,5,4", shape="mesh:2x2")
    held = (record("ml/train", [("n2", ("0", "1"))], NOW + 60),)
    nodes = views.node_summaries(state([node("n1", "torus:4x4", unhealthy=("15",)), node("n2")], a, leases=held))
    page = html.page(nodes, now=NOW)
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") == 2
    assert page.count('<g class="chip') == 16 + 8
    assert page.count('<g class="chip busy">') == 4 and page.count('<g class="chip unhealthy">') == 1
    assert page.count('<g class="chip reserved">') == 2 and "reserved for gang ml/train" in page
    assert "<title>chip 0: ml/a</title>" in page
    assert "2 nodes, 24 chips: 17 free, 4 busy, 2 reserved, 1 unhealthy" in page
    # nothing is fetched: no script, no link, no remote source
    assert "<script" not in page and "<link" not in page and not re.search(r'(src|href)="(https?:)?//', page)


def test_options_go_before_or_after_the_command() -> None:
    parser = cli.build_parser()
    before = parser.parse_args(["-o", "json", "--context", "c1", "queues"])
    after = parser.parse_args(["queues", "-o", "json", "--context", "c1"])
    assert before.output == after.output == "json" and before.context == after.context == "c1"
    nodes = parser.parse_args(["nodes", "-l", "pool=dgx", "--draw"])
    assert nodes.selector == "pool=dgx" and nodes.draw


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["nodes", "--bogus"], "error: unrecognized arguments: --bogus"),
        (["frobnicate"], "error: argument COMMAND: invalid choice: 'frobnicate'"),
        (["queues", "--queue", "research"], "error: argument --queue: 'research': expected NAME=WEIGHT"),
        (["nodes", "-o", "xml"], "error: argument -o/--output: invalid choice: 'xml'"),
    ],
)
def test_usage_errors_are_one_line_and_exit_1_as_kubectls(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err


def test_help_names_the_commands_as_kubectl_runs_them(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: kubectl icl ")
    for command in ("nodes", "gangs", "queues"):
        assert f"kubectl icl {command}" in out


def test_no_kubeconfig_is_one_line_and_exit_1(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    assert cli.main(["nodes"]) == 1
    err = capsys.readouterr().err
    assert err == f"error: kubeconfig {tmp_path / 'missing'}: no such file\n"


def test_an_unreachable_api_server_is_one_line_and_exit_1(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1", "kind": "Config", "current-context": "c",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
            }
        )
    )  # fmt: skip
    assert cli.main(["--kubeconfig", str(config), "nodes"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot reach the API server http://127.0.0.1:9 (") and err.count("\n") == 1, err
    assert "Connection refused" in err


def test_a_record_without_expires_at_is_unreadable_to_the_extender_and_the_tool_alike() -> None:
    # the tool once fell back on the Lease's acquireTime + leaseDurationSeconds; the extender never did
    lease = record("ml/train", [("n1", ("4", "5"))], NOW + 60)
    body = json.loads(lease["metadata"]["annotations"][RECORD_ANNOTATION])
    del body["expiresAt"]
    lease["metadata"]["annotations"][RECORD_ANNOTATION] = json.dumps(body)
    kept, stale = GangRecords.load([lease], NOW)
    assert kept == [] and stale == [lease["metadata"]["name"]]
    got, warnings = reservations([lease])
    assert got == [] and warnings == [
        f"lease kube-icl/{lease['metadata']['name']}: annotation {RECORD_ANNOTATION}: no field 'expiresAt'"
    ]
    read = read_state(ExtenderConfig(), [node("n1")], [], [lease], now=NOW)
    (n1,) = views.node_summaries(read)
    assert render.strip(n1) == "········" and views.gang_views(read) == []


def test_chips_are_held_as_the_extenders_cache_holds_them() -> None:
    # an ended pod holds nothing; of two pods naming one chip the first holds it and the second is counted
    # by size; a pod asking no device holds none, whatever its annotation says
    pods = (
        pod("done", 2, node_name="n1", devices="0,1") | {"status": {"phase": "Succeeded"}},
        pod("first", 2, node_name="n1", devices="2,3"),
        pod("second", 2, node_name="n1", devices="3,4", created="2026-01-02T00:00:00Z"),
        pod("none", 0, node_name="n1", devices="6,7"),
    )
    read = state([node("n1")], *pods)
    (n1,) = views.node_summaries(read)
    extender = read.cache.nodes.holders("n1")
    assert extender is not None
    assert {c.id for c in n1.chips if c.state == "free"} == extender.view.free == {"0", "1", "4", "5", "6", "7"}
    assert n1.holders == (("ml/first", ("2", "3")),) and n1.unattributed == (("ml/second", 2),)
    (ml,) = views.queue_views(read)
    assert ml.devices == 4 and ml.pools == {"ring:8": 4}  # first's 2 and second's 2, counted by size
