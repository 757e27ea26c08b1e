"""What a gang member learns of its gang: the kube-icl.io/gang-layout annotation the extender writes at
bind (and rewrites when an elastic gang grows or shrinks), and the ICL_GANG_* environment the plugin
derives from it at Allocate (real gRPC with the kubelet emulator)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_elastic import elastic_pod, evicted, line_cluster
from test_scheduler_policies import gang_pod

from deviceplugin.backends.sim import SimBackend
from deviceplugin.gangenv import gang_env
from deviceplugin.pods import FilePodSource
from tests.support.plugin import async_test, running_plugin, short_tmpdir
from topology import build_preset
from topology.contract import ContractError, parse_gang_layout

R = "kube-icl.io/accelerator"


def layout(c: Any, name: str) -> dict[str, Any]:
    value = c.api.pods[("default", name)]["metadata"]["annotations"]["kube-icl.io/gang-layout"]
    parse_gang_layout(value)  # the extender writes only what the contract's one reader takes
    return dict(json.loads(value))


def test_every_member_of_a_rigid_gang_learns_its_rank_along_the_link_domain() -> None:
    c = line_cluster(3)
    members = [c.add(gang_pod(f"w{i}", "job", 3, 8, "ring")) for i in range(3)]
    placed = {m["metadata"]["name"]: c.schedule(m) for m in reversed(members)}
    seen = {name: layout(c, name) for name in placed}
    ranks = {name: lay["rank"] for name, lay in seen.items()}
    assert sorted(ranks.values()) == [0, 1, 2], "distinct ranks, known from the first bind on"
    for name, lay in seen.items():
        assert lay["gang"] == "default/job" and lay["size"] == 3 and (lay["min"], lay["max"]) == (3, 3)
        assert [m["node"] for m in lay["members"]] == ["n0", "n1", "n2"], "ring order along the domain"
        assert [m["coords"] for m in lay["members"]] == ["0", "1", "2"]
        me = lay["members"][lay["rank"]]
        assert me["node"] == placed[name] and me["pod"] == name
        assert me["devices"] == c.api.pods[("default", name)]["metadata"]["annotations"]["kube-icl.io/devices"].split(
            ","
        )
    # the first member bound saw the others' reserved slots, with no pod name yet
    first = seen["w2"]
    assert sorted(m["pod"] for m in first["members"]) == ["", "", "w2"]


def test_an_elastic_gang_rewrites_its_members_layouts_as_it_grows_and_shrinks() -> None:
    c = line_cluster(4)
    members = [c.add(elastic_pod(f"w{i}", "job", 2, 4)) for i in range(3)]
    c.ext.start()
    try:
        for m in members[:2]:
            assert c.schedule(m) is not None
        c.ext.sweep()
        before = layout(c, "w0")
        assert c.schedule(members[2]) == "n2"
        evicted(c)  # flushes the background writes
        grown = {n: layout(c, n) for n in ("w0", "w1", "w2")}
        assert all(g["size"] == 3 for g in grown.values())
        assert all(g["generation"] > before["generation"] for g in grown.values())
        assert sorted(g["rank"] for g in grown.values()) == [0, 1, 2]
        assert [m["pod"] for m in grown["w0"]["members"]] == ["w0", "w1", "w2"]
        # w1 (in the middle) fails: the gang shrinks to 2 and both survivors learn it
        c.api.pods[("default", "w1")]["status"]["phase"] = "Failed"
        c.sync()
        assert evicted(c) == []
        shrunk = {n: layout(c, n) for n in ("w0", "w2")}
        assert [m["pod"] for m in shrunk["w0"]["members"]] == ["w0", "w2"]
        assert (shrunk["w0"]["rank"], shrunk["w2"]["rank"]) == (0, 1)
    finally:
        c.ext.stop()


def test_gang_env_from_a_layout() -> None:
    members = [
        {"pod": "a", "node": "n0", "domain": "rack", "coords": "0", "devices": ["0"]},
        {"pod": "b", "node": "n0", "domain": "rack", "coords": "0", "devices": ["4"]},
        {"pod": "c", "node": "n1", "domain": "rack", "coords": "1", "devices": ["0"]},
    ]
    value = json.dumps(
        {"v": 1, "gang": "ns/g", "generation": 7, "rank": 1, "size": 3, "min": 2, "max": 4, "members": members}
    )
    env = gang_env(value)
    assert env == {
        "ICL_GANG": "ns/g",
        "ICL_GANG_RANK": "1",
        "ICL_GANG_SIZE": "3",
        "ICL_GANG_MIN": "2",
        "ICL_GANG_MAX": "4",
        "ICL_GANG_GENERATION": "7",
        "ICL_GANG_NODES": "n0,n0,n1",
        "ICL_GANG_COORDS": "0;0;1",
        "ICL_GANG_DOMAIN": "rack",
        "ICL_GANG_NODE_RANK": "0",
        "ICL_GANG_NNODES": "2",
        "ICL_GANG_LOCAL_RANK": "1",
        "ICL_GANG_LOCAL_SIZE": "2",
    }
    for bad, message in [
        ("{", "not JSON"),
        (json.dumps({"v": 4}), "field 'v' is 4, not version 1, 2 or 3"),
        (value.replace('"rank": 1', '"rank": 5'), r"field 'rank' is 5, outside 0\.\.2"),
        (value.replace('"node": "n1"', '"node": 3'), r"field 'members\[2\]\.node' is 3, not a node name"),
        # a lone surrogate cannot travel in the Allocate response: the old reader passed it on
        (value.replace('"ns/g"', '"ns/\\ud800"'), "field 'gang' is .*, not text an environment variable can carry"),
    ]:
        with pytest.raises(ContractError, match=message):
            gang_env(bad)


@async_test
async def test_the_plugin_hands_the_layout_to_the_container() -> None:
    c = line_cluster(2)
    members = [c.add(gang_pod(f"w{i}", "job", 2, 4, "any")) for i in range(2)]
    for m in members:
        assert c.schedule(m) == "n0"
    pod = c.api.pods[("default", "w1")]
    lay = json.loads(pod["metadata"]["annotations"]["kube-icl.io/gang-layout"])
    with short_tmpdir() as d, short_tmpdir() as files:
        stored = {**pod, "spec": {**pod["spec"], "nodeName": "node-a"}}  # the plugin's own node
        path = Path(files) / "pods.json"  # not in the plugin directory, which the kubelet emulator owns
        path.write_text(json.dumps({"kind": "PodList", "items": [stored]}))
        backend = SimBackend(build_preset("ring:8"), recover_after=2, probe_interval=0.05)
        async with running_plugin(d, backend, FilePodSource(path)) as h:
            a = await h.kubelet.admit(pod["metadata"]["uid"], "main", R, 4)
            assert ",".join(sorted(a.devices)) == ",".join(sorted(lay["members"][lay["rank"]]["devices"]))
            assert a.envs["ICL_GANG"] == "default/job"
            assert a.envs["ICL_GANG_RANK"] == str(lay["rank"])
            assert a.envs["ICL_GANG_NODES"] == "n0,n0" and a.envs["ICL_GANG_NNODES"] == "1"
            assert a.envs["ICL_GANG_LOCAL_SIZE"] == "2" and a.envs["ICL_GANG_LOCAL_RANK"] == str(lay["rank"])
            assert a.envs["ICL_VISIBLE_DEVICES"]  # the node's own variables are still there
            # a pod without a layout gets no gang variables
            plain = {**stored, "metadata": {**stored["metadata"], "uid": "u-plain", "name": "plain"}}
            plain["metadata"]["annotations"] = {"kube-icl.io/shape": "any", "kube-icl.io/devices": ""}
            path.write_text(json.dumps({"kind": "PodList", "items": [plain]}))
            b = await h.kubelet.admit("u-plain", "main", R, 4)
            assert not [k for k in b.envs if k.startswith("ICL_GANG")]


def test_annotate_pod_is_a_merge_patch_guarded_by_the_uid() -> None:
    from scheduler.kube import KubeError, RestKubeAPI
    from tests.support.extender import FakeAPIServer, pod_obj

    with FakeAPIServer() as fake:
        fake.put_pod(pod_obj("w0", 4, "any", annotations={"keep": "me"}))
        api = RestKubeAPI.from_url(fake.url, timeout_s=5)
        uid = fake.pod("default", "w0")["metadata"]["uid"]  # type: ignore[index]
        api.annotate_pod("default", "w0", uid, {"kube-icl.io/gang-layout": "{}"})
        ann = fake.pod("default", "w0")["metadata"]["annotations"]  # type: ignore[index]
        assert ann["kube-icl.io/gang-layout"] == "{}" and ann["keep"] == "me"
        with pytest.raises(KubeError) as err:
            api.annotate_pod("default", "w0", "another-uid", {"kube-icl.io/gang-layout": "x"})
        assert err.value.status == 422
        assert fake.pod("default", "w0")["metadata"]["annotations"]["kube-icl.io/gang-layout"] == "{}"  # type: ignore[index]
