"""The API server's failures, as the real API server reports them: `Status` objects.

One exception, `ApiError`, carries the HTTP code, the machine-readable `reason` and the `details`
of a `meta/v1 Status`; the constructors below build the exact messages kube-apiserver writes
(`pods "x" not found`, `Operation cannot be fulfilled on ...`), so clients that match on reason,
code or message behave as they would against a real cluster. This module does no I/O.
"""

from __future__ import annotations

from typing import Any

JsonObject = dict[str, Any]


class ApiError(Exception):
    """A request the API server refuses; `status()` is the body it answers with."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: JsonObject | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> JsonObject:
        """The `Status` object for this failure."""
        body: JsonObject = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if self.details:
            body["details"] = self.details
        body["code"] = self.code
        return body


def _details(group_resource: str, name: str) -> JsonObject:
    plural, _, group = group_resource.partition(".")
    details: JsonObject = {"name": name}
    if group:
        details["group"] = group
    details["kind"] = plural
    return details


def not_found(group_resource: str, name: str) -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f'{group_resource} "{name}" not found',
        _details(group_resource, name),
    )


def already_exists(group_resource: str, name: str) -> ApiError:
    return ApiError(
        409,
        "AlreadyExists",
        f'{group_resource} "{name}" already exists',
        _details(group_resource, name),
    )


def conflict(group_resource: str, name: str, why: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {group_resource} "{name}": {why}',
        _details(group_resource, name),
    )


STALE_OBJECT = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def invalid(
    kind: str, group: str, name: str, causes: list[tuple[str, str]], *, qualified: bool = False
) -> ApiError:
    """422 Invalid: `causes` are (field, message) pairs, as field validation reports them;
    `qualified` names the kind with its group (`TritonModel.tritonshare.io "x" is invalid`)."""
    summary = ", ".join(f"{field}: {message}" for field, message in causes)
    if len(causes) > 1:
        summary = f"[{summary}]"
    details: JsonObject = {"name": name}
    if group:
        details["group"] = group
    details["kind"] = kind
    details["causes"] = [
        {"reason": _cause_reason(message), "message": message, "field": field}
        for field, message in causes
    ]
    shown = f"{kind}.{group}" if qualified and group else kind
    return ApiError(422, "Invalid", f'{shown} "{name}" is invalid: {summary}', details)


def _cause_reason(message: str) -> str:
    for prefix, reason in (
        ("Required value", "FieldValueRequired"),
        ("Invalid value", "FieldValueInvalid"),
        ("Forbidden", "FieldValueForbidden"),
        ("Unsupported value", "FieldValueNotSupported"),
        ("Duplicate value", "FieldValueDuplicate"),
        ("Too long", "FieldValueTooLong"),
        ("Too many", "FieldValueTooMany"),
    ):
        if message.startswith(prefix):
            return reason
    return "FieldValueInvalid"


def unprocessable(message: str) -> ApiError:
    """422 without field causes, as a patch that cannot be applied is reported."""
    return ApiError(422, "Invalid", message)


def expired(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def method_not_allowed(verb: str, resource: str) -> ApiError:
    return ApiError(
        405,
        "MethodNotAllowed",
        f"the server does not allow this method on the requested resource ({verb} {resource})",
    )


def unsupported_media_type(content_type: str, accepted: list[str]) -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format ({content_type or 'no Content-Type'})"
        f" - accepted media types include: {', '.join(accepted)}",
    )


def too_large_resource_version(requested: int, current: int) -> ApiError:
    return ApiError(
        504,
        "Timeout",
        f"Too large resource version: {requested}, current: {current}",
        {
            "causes": [
                {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
            ],
            "retryAfterSeconds": 1,
        },
    )


def internal(message: str) -> ApiError:
    return ApiError(500, "InternalError", f"Internal error occurred: {message}")
