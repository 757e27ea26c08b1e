"""``kube-icl.io/gang-layout`` has one writer and one reader, both in ``topology.contract``: the extender's
layouts (``scheduler.layout``) and the plugin's gang environment (``deviceplugin.gangenv``) go through them.

Properties: every layout the contract allows survives format -> parse unchanged (and its text survives
parse -> format); anything else, however malformed, raises ``ContractError`` naming the field and value,
never another exception (a plugin that raised anything else would fail the kubelet's Allocate).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deviceplugin.gangenv import gang_env
from scheduler.layout import Member, Where, layout_value
from topology.contract import (
    ORDER_INDEX,
    ORDER_RING,
    ContractError,
    GangLayout,
    LayoutMember,
    format_gang_layout,
    parse_gang_layout,
)

_LABEL = r"[a-z0-9]([-a-z0-9]{0,8}[a-z0-9])?"
dns_labels = st.from_regex(rf"\A{_LABEL}\Z")
subdomains = st.from_regex(rf"\A{_LABEL}(\.{_LABEL}){{0,2}}\Z")
label_values = st.from_regex(r"\A(([A-Za-z0-9][-A-Za-z0-9_.]{0,8})?[A-Za-z0-9])?\Z")
device_ids = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._:/-]{0,12}\Z")
names = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=20)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


tier_keys = st.from_regex(rf"\A({_LABEL}/)?[A-Za-z0-9]([-A-Za-z0-9_.]{{0,8}}[A-Za-z0-9])?\Z")


@st.composite
def layouts(draw: st.DrawFn) -> GangLayout:
    tiers = tuple(draw(st.lists(tier_keys, unique=True, max_size=3)))
    paths = st.lists(label_values, min_size=len(tiers), max_size=len(tiers)).map(tuple)
    members = draw(
        st.lists(
            st.builds(
                LayoutMember,
                pod=st.just("") | subdomains,
                node=subdomains,
                devices=st.lists(device_ids, unique=True, max_size=4).map(tuple),
                domain=label_values,
                coords=label_values,
                tiers=paths,
            ),
            min_size=1,
            max_size=6,
        )
    )
    rank = draw(st.integers(0, len(members) - 1))
    if not members[rank].pod:
        mine = members[rank]
        members[rank] = LayoutMember(draw(subdomains), mine.node, mine.devices, mine.domain, mine.coords, mine.tiers)
    least = draw(st.integers(1, 64))
    gang = f"{draw(dns_labels)}/{draw(names)}"
    generation = draw(st.integers(0, 2**63))
    order = draw(st.sampled_from([ORDER_RING, ORDER_INDEX]))
    return GangLayout(gang, generation, rank, least, draw(st.integers(least, 128)), tuple(members), tiers, order)


def _must_refuse(value: Any) -> None:
    with pytest.raises(ContractError, match=r"^annotation kube-icl\.io/gang-layout: "):
        parse_gang_layout(value)


def _read_or_refuse(value: Any) -> None:
    """Either a layout (whose text is then canonical again) or ContractError; anything else fails the test."""
    try:
        layout = parse_gang_layout(value)
    except ContractError as exc:
        assert str(exc).startswith("annotation kube-icl.io/gang-layout: ") and "\n" not in str(exc)
        return
    assert parse_gang_layout(format_gang_layout(layout)) == layout


@given(layouts())
def test_format_then_parse_is_the_identity(layout: GangLayout) -> None:
    text = format_gang_layout(layout)
    assert parse_gang_layout(text) == layout
    assert format_gang_layout(parse_gang_layout(text)) == text
    env = gang_env(text)  # the plugin's reading of the same text
    assert env["ICL_GANG"] == layout.gang and env["ICL_GANG_RANK"] == str(layout.rank)
    assert env["ICL_GANG_NODES"].split(",") == [m.node for m in layout.members]
    assert env.get("ICL_GANG_TIERS", "") == ",".join(layout.tiers)
    assert env.get("ICL_GANG_TIER_PATH", "") == ",".join(layout.members[layout.rank].tiers)
    version = 3 if layout.order == ORDER_INDEX else 2 if layout.tiers else 1
    assert json.loads(text)["v"] == version, "a layout in ring order without tiers stays version 1"


@given(layouts(), st.data())
def test_a_missing_or_unknown_key_is_refused(layout: GangLayout, data: st.DataObject) -> None:
    body = json.loads(format_gang_layout(layout))
    target = data.draw(st.sampled_from([body, *body["members"]]))
    if data.draw(st.booleans()):
        del target[data.draw(st.sampled_from(sorted(target)))]
    else:
        target[data.draw(st.text(min_size=1, max_size=8).filter(lambda k: k not in target))] = 1
    _must_refuse(json.dumps(body))


@given(layouts(), st.data(), json_values)
@settings(max_examples=300)
def test_any_field_replaced_by_any_json_is_read_or_refused(
    layout: GangLayout, data: st.DataObject, replacement: Any
) -> None:
    body = json.loads(format_gang_layout(layout))
    target = data.draw(st.sampled_from([body, *body["members"]]))
    key = data.draw(st.sampled_from(sorted(target)))
    target[key] = replacement
    if isinstance(replacement, (dict, list, float, type(None))) and key not in ("members", "devices", "tiers"):
        _must_refuse(json.dumps(body))  # no scalar field takes an object, a list, a float or null
    else:
        _read_or_refuse(json.dumps(body))


@given(st.text(max_size=200) | json_values.map(json.dumps))
def test_arbitrary_text_is_read_or_refused(text: str) -> None:
    _read_or_refuse(text)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "NoneType None is not text"),
        (b"{}", "bytes b'{}' is not text"),
        ("", "is not JSON"),
        ("[" * 100_000, "is not JSON"),  # the JSON reader's recursion limit, not a RecursionError
        ('{"v":1,"v":1}', "field 'v' is 1, given twice"),
        ('{"v":NaN}', "NaN is not JSON"),
        ('{"v":true}', "field 'v' is True, not version 1, 2 or 3"),
        ('{"v":4}', "field 'v' is 4, not version 1, 2 or 3"),
        ("[]", r"field '\(the value\)' is \[\], not an object"),
        (" " * (256 * 1024 + 1), "262145 bytes, over the API server's 262144"),
    ],
)
def test_malformed_values_name_what_is_wrong(value: Any, message: str) -> None:
    with pytest.raises(ContractError, match=message):
        parse_gang_layout(value)


def _text(**change: Any) -> str:
    body: dict[str, Any] = {
        "v": 1,
        "gang": "ns/job",
        "generation": 3,
        "rank": 0,
        "size": 2,
        "min": 1,
        "max": 2,
        "members": [
            {"pod": "w0", "node": "n0", "domain": "rack", "coords": "0", "devices": ["0", "1"]},
            {"pod": "", "node": "n1", "domain": "rack", "coords": "1", "devices": ["0"]},
        ],
    }
    body.update(change)
    return json.dumps(body)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (_text(size=3), "field 'size' is 3, not the 2 members listed"),
        (_text(rank=1), r"field 'members\[1\]\.pod' is '', empty for the member the layout is written for"),
        (_text(rank=-1), "field 'rank' is -1, below 0"),
        (_text(min=0), "field 'min' is 0, below 1"),
        (_text(max=0), "field 'max' is 0, below 1"),
        (_text(generation=1.5), "field 'generation' is 1.5, not a whole number"),
        (_text(gang="job"), "field 'gang' is 'job', not namespace/name"),
        (_text(gang="NS/job"), "field 'gang' is 'NS/job', not namespace/name"),
        (_text(gang="ns/a\x00b"), "field 'gang' is .*, not text an environment variable can carry"),
        (_text(members=[]), r"field 'members' is \[\], not a non-empty list"),
        (_text(members=[{"pod": "w0", "node": "N_0", "domain": "", "coords": "", "devices": []}]), "not a node name"),
        (
            _text(members=[{"pod": "w0", "node": "n0", "domain": "", "coords": "0,1", "devices": []}]),
            r"field 'members\[0\]\.coords' is '0,1', not a label value",
        ),
        (
            _text(members=[{"pod": "w0", "node": "n0", "domain": "", "coords": "", "devices": ["0", "0"]}]),
            r"field 'members\[0\]\.devices' is \['0', '0'\], repeating a device",
        ),
        (
            _text(members=[{"pod": "w0", "node": "n0", "domain": "", "coords": "", "devices": ["a b"]}]),
            r"field 'members\[0\]\.devices\[0\]' is 'a b', not a device id",
        ),
    ],
)
def test_each_field_is_checked(value: str, message: str) -> None:
    with pytest.raises(ContractError, match=message):
        gang_env(value)


def test_the_extenders_writer_is_the_contracts() -> None:
    ordered = [Member("w0", "n0", ("0", "1"), "u0"), Member("", "n1", ("2",))]
    text = layout_value("ns/job", 2, 3, 9, ordered, 0, {"n0": Where("rack", "0")})
    assert parse_gang_layout(text) == GangLayout(
        "ns/job", 9, 0, 2, 3, (LayoutMember("w0", "n0", ("0", "1"), "rack", "0"), LayoutMember("", "n1", ("2",)))
    )
    tiers = ("example.com/rack", "example.com/block")
    text = layout_value("ns/job", 2, 3, 9, ordered, 0, {"n0": Where("", "", ("r1", "b0"))}, tiers)
    assert parse_gang_layout(text) == GangLayout(
        "ns/job",
        9,
        0,
        2,
        3,
        (LayoutMember("w0", "n0", ("0", "1"), tiers=("r1", "b0")), LayoutMember("", "n1", ("2",), tiers=("", ""))),
        tiers,
    )
    assert gang_env(text)["ICL_GANG_MEMBER_TIERS"] == "r1,b0;,"
