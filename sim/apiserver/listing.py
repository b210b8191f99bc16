"""Lists: selectors, the node index, `limit`/`continue` paging and resourceVersion semantics.

Builds a `...List` body from cached object JSON (no per-item serialisation), honouring
`resourceVersion` with `resourceVersionMatch` (NotOlderThan: the current state; Exact: the state at
that version, rebuilt from the history, 410 if older; newer than now: 504) and continue tokens
shaped like upstream's. Reads the store; writes nothing; knows nothing of HTTP.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from typing import Any

from sim.apiserver.errors import ApiError, bad_request, expired, invalid, too_large_resource_version
from sim.apiserver.resources import PODS, Resource
from sim.apiserver.selectors import FieldSelector, LabelSelector
from sim.apiserver.store import Store, Stored

JsonObject = dict[str, Any]

CONTINUE_TOO_OLD = (
    "The provided continue parameter is too old to display a consistent list result. You can"
    " start a new list without the continue parameter, or use the continue token in this response"
    " to retrieve the remainder of the results. Continuing with the provided token results in an"
    " inconsistent list - objects that were created, modified, or deleted between the time the"
    " first chunk was returned and now may show up in the list."
)


def _list_options_error(message: str) -> ApiError:
    return invalid("ListOptions", "meta.k8s.io", "", [("resourceVersionMatch", message)])


def parse_rv(text: str) -> int:
    try:
        value = int(text)
    except ValueError as e:
        raise bad_request(f"invalid resource version: {text!r} is not a resourceVersion") from e
    if value < 0:
        raise bad_request(f"invalid resource version: {text!r} is negative")
    return value


def encode_continue(rv: int, after: tuple[str, str]) -> str:
    token = {"v": "meta.k8s.io/v1", "rv": rv, "start": f"{after[0]}/{after[1]}\x00"}
    return base64.urlsafe_b64encode(json.dumps(token).encode()).decode()


def decode_continue(token: str) -> tuple[int, tuple[str, str]]:
    try:
        decoded = json.loads(base64.urlsafe_b64decode(token.encode()))
        start = str(decoded["start"]).rstrip("\x00")
        namespace, _, name = start.rpartition("/")
        return int(decoded["rv"]), (namespace, name)
    except (ValueError, KeyError, TypeError, binascii.Error) as e:
        raise bad_request(f"continue key is not valid: {e}") from e


def list_body(
    store: Store,
    resource: Resource,
    namespace: str | None,
    labels: LabelSelector,
    fields: FieldSelector,
    query: Mapping[str, str],
) -> bytes:
    """The JSON of the `...List` answering a list request with these query parameters."""
    limit = _int(query.get("limit"), "limit")
    token = query.get("continue", "")
    rv_text = query.get("resourceVersion", "")
    match = query.get("resourceVersionMatch", "")
    if match and match not in ("Exact", "NotOlderThan"):
        raise _list_options_error(
            f'Unsupported value: "{match}": supported values: "Exact", "NotOlderThan"'
        )
    if match and not rv_text:
        raise _list_options_error(
            "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided"
        )
    if token and rv_text:
        raise _list_options_error(
            "Forbidden: specifying resource version is not allowed when using continue"
        )
    after = None
    list_rv = store.rv
    if token:
        list_rv, after = decode_continue(token)
        if list_rv < store.oldest_replayable_rv:
            raise expired(CONTINUE_TOO_OLD)
    candidates: Iterable[Stored]
    if rv_text and match == "Exact":
        wanted = parse_rv(rv_text)
        if wanted == 0:
            raise _list_options_error(
                'Forbidden: resourceVersionMatch "exact" is forbidden for resourceVersion "0"'
            )
        if wanted > store.rv:
            raise too_large_resource_version(wanted, store.rv)
        list_rv = wanted
        if wanted < store.oldest_replayable_rv:
            raise expired("The resourceVersion for the provided list is too old.")
        candidates = store.state_at(resource, namespace, wanted)
    else:
        if rv_text and rv_text != "0" and parse_rv(rv_text) > store.rv:
            raise too_large_resource_version(parse_rv(rv_text), store.rv)
        node = fields.equality("spec.nodeName") if resource is PODS else None
        if node is not None:
            candidates = store.pods_on_node(node, namespace, after)
        else:
            candidates = store.objects(resource, namespace, after)
    selecting = bool(labels.requirements or fields.terms)
    items: list[bytes] = []
    last: Stored | None = None
    more = False
    for stored in candidates:
        if after is not None and (stored.namespace, stored.name) <= after:
            continue
        if selecting and not (labels.matches(stored.obj) and fields.matches(stored.obj)):
            continue
        if limit and len(items) >= limit:
            more = True
            break
        items.append(stored.body())
        last = stored
    metadata: JsonObject = {"resourceVersion": str(list_rv)}
    if more and last is not None:
        metadata["continue"] = encode_continue(list_rv, (last.namespace, last.name))
        if not selecting and namespace is None and not token:
            metadata["remainingItemCount"] = store.count(resource) - len(items)
    head = json.dumps(
        {"kind": resource.list_kind, "apiVersion": resource.api_version, "metadata": metadata},
        separators=(",", ":"),
    ).encode()
    return head[:-1] + b',"items":[' + b",".join(items) + b"]}"


def _int(value: str | None, name: str) -> int:
    if not value:
        return 0
    try:
        return int(value)
    except ValueError as e:
        raise bad_request(f"invalid value for {name}: {value!r} is not an integer") from e
