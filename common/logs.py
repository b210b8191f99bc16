"""Logging set up once per process, as text for people or JSON for log pipelines.

Logs are sentences that name the subject and the consequence; structured fields passed with
`extra={...}` appear as keys in JSON output. A line about a pod, a node or a model passes
`extra=subject(...)`, so a log pipeline selects by `pod`, `namespace`, `node` and `model` instead
of parsing sentences; what is the same for a whole process (the agent's node, a proxy's model) is
given once to `configure_logging(fields=...)`.

Why not python-json-logger (pythonjsonlogger 4.x, not a dependency here): its JsonFormatter does
what `JsonFormatter` and `_Fields` below do (extra fields as keys with the standard attributes
left out, `static_fields` that a line's own `extra` overrides, the exception as text) and more,
but this line's shape needs it configured and subclassed anyway: `levelname` renamed to `level`
and lower-cased (no option lower-cases), `name` to `logger`, `exc_info` to `exception`, and the
time under `time` in UTC to the millisecond (its `timestamp` is the record's UTC datetime, written
to the microsecond). What would remain is a subclass about the size of this formatter, plus a
dependency in every part's image; tests/common/test_logs.py pins the line.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Literal

LogFormat = Literal["text", "json"]

_STANDARD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, extra fields, exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def subject(*, pod: str = "", node: str = "", model: str = "") -> dict[str, str]:
    """The `extra` of a line about a pod (`namespace/name`, given as `pod` and `namespace`), a
    node or a model; empty values are left out."""
    fields: dict[str, str] = {}
    if pod:
        namespace, _, name = pod.rpartition("/")
        fields["pod"] = name
        if namespace:
            fields["namespace"] = namespace
    if node:
        fields["node"] = node
    if model:
        fields["model"] = model
    return fields


class _Fields(logging.Filter):
    """Adds the process's own fields to every record that does not carry its own."""

    def __init__(self, fields: Mapping[str, str]) -> None:
        super().__init__()
        self.fields = {k: v for k, v in fields.items() if v}

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in self.fields.items():
            record.__dict__.setdefault(key, value)
        return True


def configure_logging(
    level: str = "INFO",
    fmt: LogFormat = "text",
    *,
    name: str = "",
    fields: Mapping[str, str] | None = None,
) -> None:
    """Configure the root logger; call once, from a part's `__main__`. `fields` (such as
    `subject(node=...)`) are added to every JSON line that does not set them itself."""
    handler = logging.StreamHandler(sys.stderr)
    if fields:
        handler.addFilter(_Fields(fields))
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        prefix = f"{name} " if name else ""
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s {prefix}%(levelname)s %(name)s: %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Client libraries are chatty at INFO about every request.
    for noisy in ("kubernetes", "urllib3", "aiohttp.access", "asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
