"""Strings that are not Unicode text (a lone UTF-16 surrogate) sent to each verb over HTTP on loopback.

JSON may spell half a surrogate pair (``"\\ud800"``); no UTF-8 answer can echo it. Every verb answers
400 with a one-line error naming the field, never a 500, and changes no state. Arbitrary text that is
valid Unicode gets the verb's normal 200 answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler import wire
from scheduler.config import ExtenderConfig
from tests.support import cachereads
from tests.support.extender import ExtenderHarness, node_obj, pod_obj

LONE = "\ud800"
VERBS = ("filter", "prioritize", "bind", "preempt")


@pytest.fixture(scope="module")
def h() -> Iterator[ExtenderHarness]:
    with ExtenderHarness(ExtenderConfig()) as harness:
        harness.fake.put_node(node_obj("a", "ring:8"))
        harness.fake.put_node(node_obj("b", "mesh:4x4"))
        harness.fake.put_pod(pod_obj("held", 2, "ring", node="a", annotations={"kube-icl.io/devices": "0,1"}))
        harness.fake.put_pod(pod_obj("waiting", 2, "ring"))
        harness.seen(lambda: len(harness.cache.nodes.node_names()) == 2 and len(cachereads.pods(harness.cache)) == 2)
        yield harness


def _pod(name: str = "p", namespace: str = "default", annotations: dict[str, str] | None = None) -> dict[str, Any]:
    pod = pod_obj("p", 2, "ring", uid="uid-p")
    pod["metadata"].update(name=name, namespace=namespace)
    pod["metadata"]["annotations"].update(annotations or {})
    return pod


def _decisions(h: ExtenderHarness) -> list[str]:
    code, text = h.get("/metrics")
    assert code == 200
    return [line for line in text.decode().splitlines() if line.startswith("kube_icl_extender_decisions_total")]


def _snapshot(h: ExtenderHarness) -> Any:
    """Everything a verb could change: the extender's state, its decisions, and its calls to the API server."""
    return h.extender.debug_state(), _decisions(h), len(h.fake.requests), len(h.fake.bindings)


CASES = [
    ("filter", {"Pod": _pod(), "NodeNames": ["a", "x" + LONE]}, "request body.NodeNames[1]"),
    ("filter", {"Pod": _pod(name="p" + LONE), "NodeNames": ["a"]}, "request body.Pod.metadata.name"),
    (
        "filter",
        {"Pod": _pod(annotations={"kube-icl.io/shape": "ring" + LONE}), "NodeNames": ["a"]},
        "request body.Pod.metadata.annotations['kube-icl.io/shape']",
    ),
    ("filter", {"Pod": _pod(annotations={LONE: "x"}), "NodeNames": ["a"]}, "request body.Pod.metadata.annotations"),
    ("prioritize", {"Pod": _pod(), "NodeNames": ["a", LONE]}, "request body.NodeNames[1]"),
    ("prioritize", {"Pod": _pod(namespace=LONE), "NodeNames": ["a"]}, "request body.Pod.metadata.namespace"),
    ("bind", {"PodName": "p" + LONE, "PodNamespace": "default", "PodUID": "u", "Node": "a"}, "request body.PodName"),
    ("bind", {"PodName": "waiting", "PodNamespace": "default", "PodUID": "", "Node": LONE}, "request body.Node"),
    ("bind", {"PodName": "p", "PodNamespace": LONE + "x", "PodUID": "u", "Node": "a"}, "request body.PodNamespace"),
    (
        "preempt",
        {"Pod": _pod(), "NodeNameToMetaVictims": {"a": {"Pods": [{"UID": LONE}]}}},
        "request body.NodeNameToMetaVictims.a.Pods[0].UID",
    ),
]


@pytest.mark.parametrize(("verb", "body", "field"), CASES, ids=[f"{v}:{f.split('.', 1)[1]}" for v, _, f in CASES])
def test_a_lone_surrogate_is_a_400_naming_the_field_and_changes_nothing(
    h: ExtenderHarness, verb: str, body: dict[str, Any], field: str
) -> None:
    before = _snapshot(h)
    code, answer = h.post(verb, body)
    assert code == 400, answer
    assert answer["Error"].startswith(field + ": ") or answer["Error"].startswith(field + ": key ")
    assert "lone surrogate" in answer["Error"] and "\n" not in answer["Error"]
    assert _snapshot(h) == before


def test_encoded_surrogates_and_other_bad_utf8_are_a_400(h: ExtenderHarness) -> None:
    # CESU-8 bytes for U+D800 inside a node name, and a stray continuation byte.
    for raw in (
        b'{"Pod":' + json.dumps(_pod()).encode() + b',"NodeNames":["a\xed\xa0\x80"]}',
        b'{"NodeNames":["\x80"]}',
    ):
        before = _snapshot(h)
        code, answer = h.post("filter", None, raw=raw)
        assert code == 400 and answer["Error"].startswith("request body is not valid JSON: not UTF-8 text (")
        assert _snapshot(h) == before


def test_a_surrogate_pair_is_one_character_and_is_answered() -> None:
    assert wire.decode_json(b'["\\ud83d\\ude00"]') == ["\U0001f600"]
    with pytest.raises(wire.WireError, match=r"request body\[0\]: '\\udc00x' holds a lone surrogate"):
        wire.decode_json('["\\udc00x"]')
    with pytest.raises(wire.WireError, match=r"request body\[0\]: '\\udc00' holds"):
        wire.decode_json('["\udc00"]')  # text (not bytes) may hold the surrogate itself


def test_replies_are_encoded_even_if_state_held_a_surrogate() -> None:
    """Defence in depth: encoding never raises; such text goes out as ASCII escapes."""
    assert json.loads(wire.encode_json({"Error": "pod x" + LONE})) == {"Error": "pod x" + LONE}
    assert json.loads(wire.encode_priority_list(["a", LONE], [3, 4])) == [
        {"Host": "a", "Score": 3},
        {"Host": LONE, "Score": 4},
    ]
    assert wire.encode_priority_list(["é"], [1]) == '[{"Host":"é","Score":1}]'.encode()


# ---------------------------------------------------------------------- arbitrary text

text = st.text(st.characters(exclude_categories=()), max_size=8)  # surrogates included
name = st.text(st.characters(exclude_categories=()), min_size=1, max_size=8)


def _has_lone_surrogate(value: Any) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in json.dumps(value, ensure_ascii=False))


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    verb = draw(st.sampled_from(VERBS))
    if verb == "bind":
        return verb, {
            "PodName": draw(name | st.just("waiting")),
            "PodNamespace": draw(text | st.just("default")),
            "PodUID": draw(text),
            "Node": draw(name | st.just("a")),
        }
    annotations = draw(
        st.dictionaries(
            st.sampled_from(["kube-icl.io/shape", "kube-icl.io/queue"]) | text,
            st.sampled_from(["ring", "mesh:2x2", "any"]) | text,
            max_size=3,
        )
    )
    pod = _pod(draw(name), draw(text | st.just("default")), annotations)
    nodes = draw(st.lists(st.sampled_from(["a", "b"]) | text, max_size=4))
    if verb == "preempt":
        victims = {n: {"Pods": [{"UID": u} for u in draw(st.lists(text, max_size=3))]} for n in nodes}
        return verb, {"Pod": pod, "NodeNameToMetaVictims": victims}
    return verb, {"Pod": pod, "NodeNames": nodes}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request=requests())
def test_arbitrary_text_in_names_and_annotations_never_gets_a_500(
    h: ExtenderHarness, request: tuple[str, dict[str, Any]]
) -> None:
    verb, body = request
    before = _snapshot(h)
    code, answer = h.post(verb, body)
    if _has_lone_surrogate(body):
        assert code == 400 and "lone surrogate" in answer["Error"], answer
        assert _snapshot(h) == before
    else:
        assert code == 200, answer
    cachereads.check_invariants(h.cache)
