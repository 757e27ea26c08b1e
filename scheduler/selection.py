"""Which pods the extender watches: every pod, or only those labelled ``kube-icl.io/managed=true``.

The extender's cache keeps only pods that ask for its resource or belong to a gang
(:meth:`scheduler.cache.ClusterCache.upsert_pod` drops the others at once), so in a
large cluster almost every pod event it decodes is thrown away. With
``kube.podSelection: labelled`` it lists and watches pods with the label selector
``kube-icl.io/managed=true`` instead, and the API server sends it only those.

That is safe only if every pod the cache keeps carries the label, whoever created it.
Two admission policies (shipped by the chart, and built here by :func:`policies` so
tests apply exactly the same objects) make that a property of the API server:

- a MutatingAdmissionPolicy puts the label on every pod that needs it, on CREATE and
  UPDATE (``failurePolicy: Fail``);
- a ValidatingAdmissionPolicy (binding with ``validationActions: [Deny]``, ``failurePolicy:
  Fail``) refuses any pod CREATE or UPDATE that leaves such a pod without the label,
  so neither a missing mutating policy nor a later ``kubectl label pod X kube-icl.io/managed-``
  can produce one.

The extender trusts the label only while the validating policy and its binding are in
the cluster exactly as shipped (:func:`guard_problem`), re-checks that every
``guardIntervalSeconds``, and falls back to every pod (a full relist) as soon as they are
not. Pods created before the binding existed are not covered by it: the first start
after the binding appeared lists every pod (an audit); only when no pod that needs the
label lacks it does it record the binding's uid (a Lease annotation in the extender's
namespace), and later starts list only labelled pods. See docs/scheduler.md, "Scale".

With ``queueHolds: gate`` a third policy (:func:`gate_policies`) creates the same pods behind the
queue's scheduling gate (docs/scheduler.md, "Holds as scheduling gates").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.podspec import (
    ANN_GANG,
    GATE_QUEUE,
    LABEL_LIGHT_GROUP,
    LABEL_SCHED_PLUGINS_GROUP,
    LABEL_SCHED_PLUGINS_GROUP_OLD,
)

__all__ = [
    "AUDIT_ANNOTATION",
    "AUDIT_LEASE",
    "BINDING_NAME",
    "GATE_POLICY_NAME",
    "LABEL",
    "LABEL_SELECTOR",
    "POLICY_NAME",
    "gate_policies",
    "gate_predicate",
    "guard_problem",
    "needs_label",
    "policies",
    "predicate",
]

LABEL = "kube-icl.io/managed"
LABEL_SELECTOR = f"{LABEL}=true"
POLICY_NAME = "kube-icl-managed-pods"  # both policies (mutating and validating) and their bindings
BINDING_NAME = POLICY_NAME
AUDIT_LEASE = "kube-icl-pod-selection"
AUDIT_ANNOTATION = "kube-icl.io/audited-binding"

_GANG_LABELS = (LABEL_SCHED_PLUGINS_GROUP, LABEL_SCHED_PLUGINS_GROUP_OLD, LABEL_LIGHT_GROUP)


def _asks(containers: str, resource: str) -> str:
    part = (
        f"{containers}.exists(c, has(c.resources) && ("
        f"(has(c.resources.limits) && '{resource}' in c.resources.limits) || "
        f"(has(c.resources.requests) && '{resource}' in c.resources.requests)))"
    )
    return part if containers == "object.spec.containers" else f"(has({containers}) && {part})"


def predicate(resource: str) -> str:
    """The CEL condition "this pod needs the label": it names the resource in any container's or init
    container's requests or limits, or it names a gang (kube-icl.io/gang, a pod-group label,
    spec.schedulingGroup, spec.workloadRef). A superset of what the cache keeps (see :func:`needs_label`)."""
    labels = " || ".join(f"'{label}' in object.metadata.labels" for label in _GANG_LABELS)
    return (
        f"{_asks('object.spec.containers', resource)} || {_asks('object.spec.initContainers', resource)}"
        f" || (has(object.metadata.annotations) && '{ANN_GANG}' in object.metadata.annotations)"
        f" || (has(object.metadata.labels) && ({labels}))"
        " || has(object.spec.schedulingGroup) || has(object.spec.workloadRef)"
    )


def validation(resource: str) -> str:
    """The validating policy's expression: the pod does not need the label, or it carries it."""
    return (
        f"!({predicate(resource)}) || "
        f"(has(object.metadata.labels) && '{LABEL}' in object.metadata.labels"
        f" && object.metadata.labels['{LABEL}'] == 'true')"
    )


def needs_label(pod: Mapping[str, Any], resource: str) -> bool:
    """:func:`predicate` in Python, on a pod's JSON (tests check the two agree on the real API server)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    for key in ("containers", "initContainers"):
        for c in spec.get(key) or ():
            res = (c or {}).get("resources") or {}
            if any(resource in (res.get(part) or {}) for part in ("limits", "requests")):
                return True
    if ANN_GANG in (meta.get("annotations") or {}):
        return True
    labels = meta.get("labels") or {}
    if any(label in labels for label in _GANG_LABELS):
        return True
    return spec.get("schedulingGroup") is not None or spec.get("workloadRef") is not None


_RULES = [
    {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": ["CREATE", "UPDATE"],
        "resources": ["pods"],
    }
]


_API = "admissionregistration.k8s.io/v1"


def _meta(name: str) -> dict[str, Any]:
    return {"name": name, "labels": {"app.kubernetes.io/part-of": "kube-icl"}}


def _mutating(name: str, rules: list[dict[str, Any]], condition: tuple[str, str], apply: str) -> list[dict[str, Any]]:
    """A MutatingAdmissionPolicy that applies ``apply`` to the pods matching ``condition`` (name, CEL), and
    its binding."""
    meta = _meta(name)
    return [
        {
            "apiVersion": _API,
            "kind": "MutatingAdmissionPolicy",
            "metadata": meta,
            "spec": {
                "matchConstraints": {"resourceRules": rules},
                "matchConditions": [{"name": condition[0], "expression": condition[1]}],
                "failurePolicy": "Fail",
                "reinvocationPolicy": "IfNeeded",
                "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": apply}}],
            },
        },
        {"apiVersion": _API, "kind": "MutatingAdmissionPolicyBinding", "metadata": meta, "spec": {"policyName": name}},
    ]


def policies(resource: str) -> list[dict[str, Any]]:
    """The two admission policies and their bindings (admissionregistration.k8s.io/v1), as the chart ships them."""
    meta = _meta(POLICY_NAME)
    label = f'Object{{metadata: Object.metadata{{labels: {{"{LABEL}": "true"}}}}}}'
    return [
        *_mutating(POLICY_NAME, _RULES, ("needs-label", predicate(resource)), label),
        {
            "apiVersion": _API,
            "kind": "ValidatingAdmissionPolicy",
            "metadata": meta,
            "spec": {
                "matchConstraints": {"resourceRules": _RULES},
                "failurePolicy": "Fail",
                "validations": [
                    {
                        "expression": validation(resource),
                        "message": f"a pod that asks for {resource} or names a gang must carry the label {LABEL}=true "
                        "(the kube-icl extender watches only such pods)",
                        "reason": "Invalid",
                    }
                ],
            },
        },
        {
            "apiVersion": _API,
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": meta,
            "spec": {"policyName": POLICY_NAME, "validationActions": ["Deny"]},
        },
    ]


GATE_POLICY_NAME = "kube-icl-queue-gate"  # queueHolds: gate: the mutating policy and binding that add the gate


def gate_predicate(resource: str) -> str:
    """The CEL condition "create this pod behind the queue gate": it needs the label (:func:`predicate`)
    and names no node (the API server refuses scheduling gates on a pod created with ``spec.nodeName``)."""
    return f"!has(object.spec.nodeName) && ({predicate(resource)})"


def gate_policies(resource: str) -> list[dict[str, Any]]:
    """The MutatingAdmissionPolicy and its binding that create every pod the extender manages behind the
    scheduling gate :data:`scheduler.podspec.GATE_QUEUE` (``queueHolds: gate``), as the chart ships them.
    CREATE only: the API server lets a pod's gates be removed, never added, so the gate loop's patch
    must not bring it back. ``schedulingGates`` is a list keyed by name: the apply keeps other gates."""
    rules = [{**_RULES[0], "operations": ["CREATE"]}]
    gate = f'Object{{spec: Object.spec{{schedulingGates: [Object.spec.schedulingGates{{name: "{GATE_QUEUE}"}}]}}}}'
    return _mutating(GATE_POLICY_NAME, rules, ("queued-pod", gate_predicate(resource)), gate)


def guard_problem(policy: Mapping[str, Any] | None, binding: Mapping[str, Any] | None, resource: str) -> str:
    """ "" when the validating policy and its binding make the label a guarantee, else why not (one line)."""
    where = f"ValidatingAdmissionPolicy {POLICY_NAME}"
    if policy is None:
        return f"{where} is not in the cluster"
    if binding is None:
        return f"ValidatingAdmissionPolicyBinding {BINDING_NAME} is not in the cluster"
    spec = policy.get("spec") or {}
    if (spec.get("failurePolicy") or "Fail") != "Fail":
        return f"{where}: failurePolicy is {spec.get('failurePolicy')!r}, not 'Fail'"
    expressions = [str((v or {}).get("expression") or "") for v in spec.get("validations") or ()]
    if validation(resource) not in expressions:
        return f"{where}: its validation is not the one this extender ships for {resource}"
    if spec.get("matchConditions"):
        return f"{where}: matchConditions narrow it"
    match = spec.get("matchConstraints") or {}

    def covers(rule: Mapping[str, Any]) -> bool:
        ops = set(rule.get("operations") or ())
        return (
            "" in (rule.get("apiGroups") or ())
            and bool({"pods", "*"} & set(rule.get("resources") or ()))
            and ("*" in ops or {"CREATE", "UPDATE"} <= ops)
        )

    if not any(covers(r) for r in match.get("resourceRules") or ()):
        return f"{where}: does not match pod CREATE and UPDATE"
    for key in ("namespaceSelector", "objectSelector", "excludeResourceRules"):
        if match.get(key):
            return f"{where}: matchConstraints.{key} narrows it"
    bspec = binding.get("spec") or {}
    if bspec.get("policyName") != POLICY_NAME:
        return f"ValidatingAdmissionPolicyBinding {BINDING_NAME}: policyName is {bspec.get('policyName')!r}"
    if "Deny" not in (bspec.get("validationActions") or ()):
        return f"ValidatingAdmissionPolicyBinding {BINDING_NAME}: validationActions lack 'Deny'"
    if bspec.get("paramRef"):
        return f"ValidatingAdmissionPolicyBinding {BINDING_NAME}: paramRef is not expected"
    for key in ("namespaceSelector", "objectSelector", "resourceRules", "excludeResourceRules"):
        if (bspec.get("matchResources") or {}).get(key):
            return f"ValidatingAdmissionPolicyBinding {BINDING_NAME}: matchResources.{key} narrows it"
    return ""


def binding_uid(policy: Mapping[str, Any], binding: Mapping[str, Any]) -> str:
    """What the audit record names: the policy's and the binding's uids (a re-created one is a new guard)."""
    return f"{(policy.get('metadata') or {}).get('uid')}/{(binding.get('metadata') or {}).get('uid')}"
