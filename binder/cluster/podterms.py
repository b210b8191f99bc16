"""What a pod says about other pods: label selectors, pod (anti-)affinity terms and topology
spread constraints, converted once from the API's camelCase where pods enter
(`binder.cluster.objects`).

Selectors follow metav1.LabelSelectorAsSelector: a missing selector selects nothing, an empty
one selects everything, `matchLabels` are `In` requirements, and the requirements are ANDed. A
selector the API server would refuse (an unknown operator, `In` without values) selects nothing
here. `matchLabelKeys` and `mismatchLabelKeys` are merged into the selector from the pod's own
labels (`key In (value)`, `key NotIn (value)`; a key the pod lacks adds nothing), as the API
server and kube-scheduler merge them.

Everything here is hashable, so pods of one template share one evaluation. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

HOSTNAME_KEY = "kubernetes.io/hostname"
ZONE_KEY = "topology.kubernetes.io/zone"
SELECTOR_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})

Labels = Mapping[str, str]


@dataclass(frozen=True, slots=True)
class LabelRequirement:
    key: str
    operator: str
    """In, NotIn, Exists or DoesNotExist."""
    values: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A parsed metav1.LabelSelector: its requirements, ANDed. `valid` is False for one the API
    server would refuse: it selects nothing."""

    requirements: tuple[LabelRequirement, ...] = ()
    valid: bool = True

    def matches(self, labels: Labels) -> bool:
        return self.valid and _matches(self.requirements, labels)

    @property
    def empty(self) -> bool:
        """Selects every set of labels."""
        return self.valid and not self.requirements

    def with_requirements(self, extra: Sequence[LabelRequirement]) -> LabelSelector:
        if not extra:
            return self
        return LabelSelector((*self.requirements, *extra), self.valid)


NOTHING = LabelSelector((), valid=False)
EVERYTHING = LabelSelector()


def _matches(requirements: tuple[LabelRequirement, ...], labels: Labels) -> bool:
    for req in requirements:
        value = labels.get(req.key)
        op = req.operator
        if op == "In":
            if value is None or value not in req.values:
                return False
        elif op == "NotIn":
            if value is not None and value in req.values:
                return False
        elif op == "Exists":
            if value is None:
                return False
        elif value is not None:  # DoesNotExist
            return False
    return True


@dataclass(frozen=True, slots=True)
class PodAffinityTerm:
    """One pod (anti-)affinity term, its selector already merged with matchLabelKeys and
    mismatchLabelKeys for the pod that carries it."""

    selector: LabelSelector
    topology_key: str
    namespaces: frozenset[str]
    """Namespaces named by the term; with no namespaceSelector and none named, the pod's own."""
    namespace_selector: LabelSelector | None = None
    """None: only `namespaces`; otherwise also every namespace whose labels it selects."""

    def covers_namespace(self, namespace: str, namespace_labels: Labels | None) -> bool:
        """Whether the term looks at pods of `namespace` (labels None: the namespace is unknown,
        which only a namespaceSelector that selects everything covers)."""
        if namespace in self.namespaces:
            return True
        selector = self.namespace_selector
        if selector is None:
            return False
        if selector.empty:
            return True
        return namespace_labels is not None and selector.matches(namespace_labels)

    def matches(self, namespace: str, labels: Labels, namespace_labels: Labels | None) -> bool:
        """Whether a pod of that namespace and those labels is one the term selects."""
        return self.covers_namespace(namespace, namespace_labels) and self.selector.matches(labels)


@dataclass(frozen=True, slots=True)
class WeightedTerm:
    weight: int
    term: PodAffinityTerm


@dataclass(frozen=True, slots=True)
class PodAffinity:
    """A pod's pod affinity and anti-affinity, required and preferred."""

    required: tuple[PodAffinityTerm, ...] = ()
    required_anti: tuple[PodAffinityTerm, ...] = ()
    preferred: tuple[WeightedTerm, ...] = ()
    preferred_anti: tuple[WeightedTerm, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.required or self.required_anti or self.preferred or self.preferred_anti)


NO_AFFINITY = PodAffinity()

DO_NOT_SCHEDULE, SCHEDULE_ANYWAY = "DoNotSchedule", "ScheduleAnyway"
HONOR, IGNORE = "Honor", "Ignore"


@dataclass(frozen=True, slots=True)
class SpreadConstraint:
    """One topology spread constraint, its selector merged with matchLabelKeys."""

    max_skew: int
    topology_key: str
    when_unsatisfiable: str
    """DoNotSchedule (a filter) or ScheduleAnyway (a score)."""
    selector: LabelSelector
    min_domains: int = 1
    node_affinity_policy: str = HONOR
    node_taints_policy: str = IGNORE


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _sequence(value: object) -> Sequence[Any]:
    return value if isinstance(value, list | tuple) else ()


@lru_cache(maxsize=4096)
def _selector_cached(frozen: tuple[Any, ...]) -> LabelSelector:
    match_labels, expressions = frozen
    requirements: list[LabelRequirement] = [
        LabelRequirement(key, "In", frozenset({value})) for key, value in match_labels
    ]
    for key, operator, values in expressions:
        if operator not in SELECTOR_OPERATORS:
            return NOTHING
        if operator in ("In", "NotIn") and not values:
            return NOTHING
        if operator in ("Exists", "DoesNotExist") and values:
            return NOTHING
        requirements.append(LabelRequirement(key, operator, frozenset(values)))
    return LabelSelector(tuple(requirements))


def selector_from_api(raw: object) -> LabelSelector:
    """metav1.LabelSelectorAsSelector: None selects nothing, {} everything."""
    if raw is None or not isinstance(raw, Mapping):
        return NOTHING
    match_labels = tuple(
        sorted((str(k), str(v)) for k, v in _mapping(raw.get("matchLabels")).items())
    )
    expressions = tuple(
        (
            str(e.get("key", "")),
            str(e.get("operator", "")),
            tuple(sorted(str(v) for v in _sequence(e.get("values")))),
        )
        for e in map(_mapping, _sequence(raw.get("matchExpressions")))
    )
    return _selector_cached((match_labels, expressions))


def _label_keys(keys: object, labels: Labels, operator: str) -> list[LabelRequirement]:
    return [
        LabelRequirement(str(key), operator, frozenset({labels[str(key)]}))
        for key in _sequence(keys)
        if str(key) in labels
    ]


def _affinity_term(raw: Mapping[str, Any], namespace: str, labels: Labels) -> PodAffinityTerm:
    selector = selector_from_api(raw.get("labelSelector"))
    if selector.valid:
        extra = _label_keys(raw.get("matchLabelKeys"), labels, "In")
        extra += _label_keys(raw.get("mismatchLabelKeys"), labels, "NotIn")
        selector = selector.with_requirements(extra)
    named = frozenset(str(n) for n in _sequence(raw.get("namespaces")))
    raw_ns_selector = raw.get("namespaceSelector")
    ns_selector = None if raw_ns_selector is None else selector_from_api(raw_ns_selector)
    if not named and ns_selector is None:
        named = frozenset({namespace})
    return PodAffinityTerm(selector, str(raw.get("topologyKey") or ""), named, ns_selector)


def _weighted(raw: object, namespace: str, labels: Labels) -> tuple[WeightedTerm, ...]:
    out = []
    for item in map(_mapping, _sequence(raw)):
        weight = item.get("weight", 0)
        term = _affinity_term(_mapping(item.get("podAffinityTerm")), namespace, labels)
        out.append(WeightedTerm(weight if isinstance(weight, int) else 0, term))
    return tuple(out)


def pod_affinity_from_spec(spec: Mapping[str, Any], namespace: str, labels: Labels) -> PodAffinity:
    affinity = _mapping(spec.get("affinity"))
    if not affinity:
        return NO_AFFINITY
    together = _mapping(affinity.get("podAffinity"))
    apart = _mapping(affinity.get("podAntiAffinity"))
    if not together and not apart:
        return NO_AFFINITY
    required_key = "requiredDuringSchedulingIgnoredDuringExecution"
    preferred_key = "preferredDuringSchedulingIgnoredDuringExecution"
    return PodAffinity(
        tuple(
            _affinity_term(t, namespace, labels)
            for t in map(_mapping, _sequence(together.get(required_key)))
        ),
        tuple(
            _affinity_term(t, namespace, labels)
            for t in map(_mapping, _sequence(apart.get(required_key)))
        ),
        _weighted(together.get(preferred_key), namespace, labels),
        _weighted(apart.get(preferred_key), namespace, labels),
    )


def spread_from_spec(spec: Mapping[str, Any], labels: Labels) -> tuple[SpreadConstraint, ...]:
    out = []
    for raw in map(_mapping, _sequence(spec.get("topologySpreadConstraints"))):
        selector = selector_from_api(raw.get("labelSelector"))
        if selector.valid:
            selector = selector.with_requirements(
                _label_keys(raw.get("matchLabelKeys"), labels, "In")
            )
        skew = raw.get("maxSkew", 1)
        min_domains = raw.get("minDomains")
        out.append(
            SpreadConstraint(
                max_skew=skew if isinstance(skew, int) and skew > 0 else 1,
                topology_key=str(raw.get("topologyKey") or ""),
                when_unsatisfiable=str(raw.get("whenUnsatisfiable") or DO_NOT_SCHEDULE),
                selector=selector,
                min_domains=min_domains if isinstance(min_domains, int) and min_domains > 0 else 1,
                node_affinity_policy=str(raw.get("nodeAffinityPolicy") or HONOR),
                node_taints_policy=str(raw.get("nodeTaintsPolicy") or IGNORE),
            )
        )
    return tuple(out)
