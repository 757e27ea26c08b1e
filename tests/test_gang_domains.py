"""Gang placement through the extender sees a link domain whole, whatever is free.

The gangs here name the link domain as the tier they must stay within
(``kube-icl.io/gang-required-tier: link-domain``); without it a gang that no link domain
holds is placed across the cluster (``tests/test_gang_tiers.py``).

The link domain's graph (which nodes are adjacent, wrap-around links included) follows
from the coordinates of every node in the domain. Full nodes, or nodes the kube-scheduler
left out of the candidates, must not change it: a ring of six with n5 full still has n4
and n0 apart. Checked against brute force on small domains, for rigid and elastic gangs.
"""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from test_scheduler_policies import Cluster
from test_scheduler_policies import gang_pod as any_gang_pod

from scheduler.config import ExtenderConfig
from scheduler.wire import ExtenderArgs
from tests.support.extender import pod_obj

Coords = tuple[int, ...]
LINKED = {"kube-icl.io/gang-required-tier": "link-domain"}


def gang_pod(name: str, gang: str, size: int, count: int, shape: str) -> dict[str, Any]:
    """A member of a gang that must stay within one link domain."""
    pod = any_gang_pod(name, gang, size, count, shape)
    pod["metadata"]["annotations"].update(LINKED)
    return pod


def truly_adjacent(a: Coords, b: Coords, dims: Coords, wrap: bool) -> bool:
    """Grid neighbours: one axis differs by one, or (ring, torus) the two ends of an axis longer than two."""
    diff = [axis for axis in range(len(dims)) if a[axis] != b[axis]]
    if len(diff) != 1:
        return False
    axis = diff[0]
    step = abs(a[axis] - b[axis])
    return step == 1 or (wrap and dims[axis] > 2 and step == dims[axis] - 1)


def connected(nodes: list[str], coords: dict[str, Coords], dims: Coords, wrap: bool) -> bool:
    seen, todo = {nodes[0]}, [nodes[0]]
    while todo:
        a = todo.pop()
        for b in nodes:
            if b not in seen and truly_adjacent(coords[a], coords[b], dims, wrap):
                seen.add(b)
                todo.append(b)
    return seen == set(nodes)


@st.composite
def domains(draw: st.DrawFn) -> tuple[str, dict[str, Coords], Coords]:
    kind = draw(st.sampled_from(["ring", "mesh", "torus"]))
    if kind == "ring":
        dims: Coords = (draw(st.integers(3, 7)),)
    else:
        dims = (draw(st.integers(1, 3)), draw(st.integers(2, 4)))
    coords = {f"n{i}": c for i, c in enumerate(itertools.product(*(range(n) for n in dims)))}
    return kind, coords, dims


def label_of(c: Coords) -> str:
    return ".".join(str(x) for x in c)


def domain_cluster(kind: str, coords: dict[str, Coords]) -> Cluster:
    labels = {
        n: {
            "kube-icl.io/link-domain": "rack",
            "kube-icl.io/link-domain-kind": kind,
            "kube-icl.io/link-coords": label_of(c),
        }
        for n, c in coords.items()
    }
    return Cluster({n: "ring:2" for n in coords}, ExtenderConfig(fair_share=False), labels=labels)


def fill(c: Cluster, node: str) -> None:
    c.add(pod_obj(f"fill-{node}", 2, "ring", node=node, annotations={"kube-icl.io/devices": "0,1"}))


@settings(max_examples=200, deadline=None)
@given(domain=domains(), data=st.data())
def test_rigid_gang_lands_on_truly_adjacent_nodes_whenever_brute_force_can(
    domain: tuple[str, dict[str, Coords], Coords], data: st.DataObject
) -> None:
    kind, coords, dims = domain
    wrap = kind != "mesh"
    names = sorted(coords)
    full = data.draw(st.sets(st.sampled_from(names)), label="full")
    candidates = data.draw(st.sets(st.sampled_from(names)), label="candidates")
    members = data.draw(st.integers(2, 4), label="members")
    c = domain_cluster(kind, coords)
    for n in full:
        fill(c, n)
    pods = [c.add(gang_pod(f"w{i}", "job", members, 2, "ring")) for i in range(members)]
    got = c.ext.filter(ExtenderArgs(pod=pods[0], node_names=sorted(candidates)))
    usable = sorted(candidates - full)
    possible = any(
        connected(list(run), coords, dims, wrap) for run in itertools.combinations(usable, members)
    )  # each node holds one member (two devices)
    res = c.ext.gangs.book.reservations.get("default/job")
    if not possible:
        assert res is None and not got.node_names
        return
    assert res is not None, f"brute force places the gang on {usable}, the extender does not: {got.failed_nodes}"
    nodes = [s.node for s in res.slots]
    assert len(set(nodes)) == members and set(nodes) <= set(usable)
    assert connected(nodes, coords, dims, wrap), f"{nodes} are not adjacent in {kind} {dims}"


def test_a_full_node_does_not_close_a_ring_around_it() -> None:
    """Ring of six: n5 full, n2 and n3 full. n4 and n0 are not linked (n5 sits between them)."""
    coords = {f"n{i}": (i,) for i in range(6)}
    c = domain_cluster("ring", coords)
    for n in ("n2", "n3", "n5"):
        fill(c, n)
    pods = [c.add(gang_pod(f"w{i}", "job", 3, 2, "ring")) for i in range(3)]
    got = c.ext.filter(ExtenderArgs(pod=pods[0], node_names=sorted(coords)))
    assert not got.node_names and "default/job" not in c.ext.gangs.book.reservations
    c2 = domain_cluster("ring", coords)
    for n in ("n2", "n3"):
        fill(c2, n)
    pods = [c2.add(gang_pod(f"w{i}", "job", 3, 2, "ring")) for i in range(3)]
    got = c2.ext.filter(ExtenderArgs(pod=pods[0], node_names=sorted(coords)))
    assert set(got.node_names) in ({"n4", "n5", "n0"}, {"n5", "n0", "n1"}), "with n5 free the ring closes through it"


def elastic(name: str, least: int, most: int) -> Any:
    ann = {"kube-icl.io/gang": "el", "kube-icl.io/gang-min": str(least), "kube-icl.io/gang-max": str(most), **LINKED}
    return pod_obj(name, 2, "ring", annotations=ann)


def test_an_elastic_gang_starts_on_truly_adjacent_nodes() -> None:
    """The elastic gang's minimum is reserved as a rigid gang is: n4 and n0 of a ring of six with n5 full are apart."""
    coords = {f"n{i}": (i,) for i in range(6)}
    c = domain_cluster("ring", coords)
    for n in ("n1", "n2", "n3", "n5"):
        fill(c, n)
    pods = [c.add(elastic(f"e{i}", 2, 3)) for i in range(3)]
    got = c.ext.filter(ExtenderArgs(pod=pods[0], node_names=sorted(coords)))
    assert not got.node_names and "default/el" not in c.ext.gangs.book.reservations


def test_a_domain_with_bad_labels_does_not_stop_gangs_in_the_others() -> None:
    """A node of another domain with no coordinates (labels that cannot form a domain) leaves a good
    domain's gang placement alone: only the bad domain's nodes lose their links."""
    coords = {f"n{i}": (i,) for i in range(4)}
    labels = {
        n: {
            "kube-icl.io/link-domain": "rack",
            "kube-icl.io/link-domain-kind": "mesh",
            "kube-icl.io/link-coords": label_of(c),
        }
        for n, c in coords.items()
    }
    labels["odd"] = {"kube-icl.io/link-domain": "rack-a"}  # no coordinates
    c = Cluster({**{n: "ring:2" for n in coords}, "odd": "ring:2"}, ExtenderConfig(fair_share=False), labels=labels)
    pods = [c.add(gang_pod(f"w{i}", "job", 3, 2, "ring")) for i in range(3)]
    c.ext.filter(ExtenderArgs(pod=pods[0], node_names=sorted(coords)))
    res = c.ext.gangs.book.reservations.get("default/job")
    assert res is not None, "the gang spans three adjacent nodes of rack"
    nodes = sorted(s.node for s in res.slots)
    assert nodes in (["n0", "n1", "n2"], ["n1", "n2", "n3"])
