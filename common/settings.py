"""How every part declares its settings: each once, and everything else follows from that.

A part's Settings is a frozen dataclass marked `@declared`; each field is written once, as
`name: type = setting("flag", "help", kind, default="text")`, which is both the field (its type,
its default) and its `Setting` (flag, variable, help, how its text is read). The field's default
is its default text read by its kind when the class is defined (constants, never the
environment), so the default --help shows is the default applied.
`Declaration.of(Settings, ...)` collects the fields' settings, in field order, into the part's
`Declaration`. From that one list come the command line (argparse, abbreviations refused), the
environment fallback (`TRITONSHARE_<FLAG>`; a flag wins over its variable, the variable over the
default), `--help` naming each flag's variable and default, and one wording for every bad value:
`--max-body: '12q' is not a Kubernetes quantity; write e.g. 512Mi`. The result is a mapping of
field names for the part's Settings; checks across settings stay in the part. Commands without a
settings object (the binder's CLI, the simulated node's own flags) list `Setting`s directly.

Pure: it reads only the argv and the environment mapping it is given, never `os.environ`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar, dataclass_transform

from common.contract import DEFAULT_PREFIX, Keys, validate_model_id
from common.quantity import QuantityError, format_bytes, parse_quantity
from common.version import version_line

ENV_PREFIX = "TRITONSHARE_"
DECLARED = "tritonshare.setting"
"""The key of a field's `Setting` in its dataclass field's metadata."""
TRUE_WORDS = ("1", "true", "yes")
FALSE_WORDS = ("0", "false", "no")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

Kind = Callable[[str], Any]
"""Turns the text of a flag or variable into the field's value, or raises BadValueError."""


class BadValueError(ValueError):
    """A kind's refusal, worded to follow the value: "is not a number of seconds"."""


def env_name(flag: str) -> str:
    """The environment variable of a flag: `--gpu-mem-reserve` -> TRITONSHARE_GPU_MEM_RESERVE."""
    return ENV_PREFIX + flag.lstrip("-").upper().replace("-", "_")


def described(help_text: str, default: object, variable: str | None) -> str:
    """`help_text (default D; env V)`; without a default `(env V)`; without a variable `(default
    D)`."""
    parts = []
    if not (default is None or default == "" or default is False):
        parts.append(f"default {default}")
    if variable:
        parts.append(f"env {variable}")
    return f"{help_text} ({'; '.join(parts)})" if parts else help_text


# Kinds: each turns the text as given into the field's value.


def text(value: str) -> str:
    return value


def path(value: str) -> Path:
    return Path(value)


def names(value: str) -> tuple[str, ...]:
    """A comma-separated list; blanks around names and empty names are dropped."""
    return tuple(name.strip() for name in value.split(",") if name.strip())


def boolean(value: str) -> bool:
    word = value.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise BadValueError("is neither true nor false")


def one_of(*choices: str, case: Callable[[str], str] = str.lower) -> Kind:
    """One of `choices`, compared after `case` (lower-casing by default)."""
    if len(choices) == 2:
        expected = f"is neither {choices[0]!r} nor {choices[1]!r}"
    else:
        expected = "is not one of " + ", ".join(repr(c) for c in choices)

    def kind(value: str) -> str:
        chosen = case(value.strip())
        if chosen not in choices:
            raise BadValueError(expected)
        return chosen

    return kind


log_level = one_of(*LOG_LEVELS, case=str.upper)
log_format = one_of("text", "json")


def seconds(*, positive: bool = False, minimum: float = 0.0) -> Kind:
    """A finite number of seconds: at least `minimum`, or more than 0 when `positive`."""

    def kind(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise BadValueError("is not a number of seconds") from None
        if positive and not (number > 0 and math.isfinite(number)):
            raise BadValueError("must be more than 0 seconds (and finite)")
        if not math.isfinite(number):
            raise BadValueError("is not a finite number of seconds")
        if number < 0:
            raise BadValueError("is negative; use 0 or more")
        if number < minimum:
            raise BadValueError(f"must be at least {minimum:g} seconds")
        return number

    return kind


def number(*, minimum: float = 0.0, below: float = math.inf) -> Kind:
    """A finite number from `minimum` up to (not including) `below`."""

    def kind(value: str) -> float:
        try:
            parsed = float(value)
        except ValueError:
            raise BadValueError("is not a number") from None
        if not (minimum <= parsed < below):
            limit = "" if below == math.inf else f" and below {below:g}"
            raise BadValueError(f"must be at least {minimum:g}{limit}")
        return parsed

    return kind


def whole(*, minimum: int = 0) -> Kind:
    """A whole number of at least `minimum`."""

    def kind(value: str) -> int:
        try:
            parsed = int(value)
        except ValueError:
            raise BadValueError("is not a whole number") from None
        if parsed < minimum:
            if minimum == 0:
                raise BadValueError("is negative; use 0 or more")
            raise BadValueError(f"must be a whole number of {minimum} or more")
        return parsed

    return kind


def node_cpus() -> int:
    """The CPUs this process may run on: the node's, unless its pod is pinned to some."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def whole_or_cpus(value: str) -> int:
    """A whole number of 0 or more, or `auto`: the node's CPUs (`node_cpus`)."""
    if value.strip().lower() == "auto":
        return node_cpus()
    try:
        parsed: int = whole()(value)
    except BadValueError as e:
        raise BadValueError(f"{e} (or auto, the node's CPUs)") from None
    return parsed


def quantity(*, minimum: int = 0) -> Kind:
    """Bytes, as a Kubernetes quantity (`512Mi`, `2Gi`, `1e9`), of at least `minimum`."""

    def kind(value: str) -> int:
        try:
            amount = parse_quantity(value)
        except QuantityError:
            raise BadValueError(
                "is not a Kubernetes quantity; write e.g. 512Mi, 2Gi, 500M or 1e9"
            ) from None
        if amount < minimum:
            if minimum == 1:
                raise BadValueError("must be more than 0 bytes")
            raise BadValueError(f"is less than {format_bytes(minimum)}")
        return amount

    return kind


def _split_host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise BadValueError("is not host:port; write e.g. 0.0.0.0:9000")
    return host.strip("[]"), int(port)


def address(value: str) -> tuple[str, int]:
    """Where to listen, `host:port` (port 0: any free one); no host means 0.0.0.0."""
    host, port = _split_host_port(value)
    return host or "0.0.0.0", port


def host_port(value: str) -> str:
    """`host:port` (a host is required, no scheme), kept as written."""
    if "://" in value:
        raise BadValueError("has a scheme; write only host:port")
    host, _ = _split_host_port(value)
    if not host:
        raise BadValueError("has no host; write e.g. 127.0.0.1:8000")
    return value


def port(*, minimum: int = 1) -> Kind:
    def kind(value: str) -> int:
        if not value.isdigit() or not minimum <= int(value) <= 65535:
            raise BadValueError(f"is not a port; write a number from {minimum} to 65535")
        return int(value)

    return kind


def key_prefix(value: str) -> Keys:
    """The contract's keys under this prefix."""
    return Keys(value)


def model_id(value: str) -> str:
    return validate_model_id(value)


@dataclass(frozen=True)
class Setting:
    """One setting: how it is written on the command line and in the environment, what it means,
    and what it becomes."""

    flag: str
    """The long flag without dashes: `gpu-mem-reserve`."""
    help: str
    """What it sets, for --help; the default and the variable are appended."""
    kind: Kind = text
    """Text -> value; raises BadValueError (or ValueError) for a value the part cannot use."""
    default: str | None = None
    """The default as one would write it (shown in --help and parsed like a given value). None:
    the field keeps the default of the part's Settings class."""
    field: str = ""
    """The part's Settings field: the name of the field a `@declared` class declares it on
    (`Declaration.of` fills it in); default: the flag with underscores."""
    env: str | None = ""
    """The variable; "" means TRITONSHARE_<FLAG>, None means the flag has none."""
    also_env: tuple[str, ...] = ()
    """Variables read when `env` is unset, such as NODE_NAME from the Downward API."""
    required: str = ""
    """If set, the setting must be given; the text says what it is for."""
    switch: bool = False
    """A flag without a value (on when given, or when its variable is 1, true or yes)."""
    aliases: tuple[str, ...] = ()
    """Other spellings on the command line, such as `-n`."""

    @property
    def option(self) -> str:
        return f"--{self.flag}"

    @property
    def dest(self) -> str:
        return self.flag.replace("-", "_")

    @property
    def name(self) -> str:
        return self.field or self.dest

    @property
    def variable(self) -> str | None:
        if self.env is None:
            return None
        return self.env or env_name(self.flag)

    @property
    def variables(self) -> tuple[str, ...]:
        first = self.variable
        return ((first,) if first else ()) + self.also_env

    def describe(self) -> str:
        variables = " or ".join(self.variables) or None
        if self.switch:
            return described(f"{self.help}; off unless given", None, variables)
        return described(self.help, self.default, variables)


class _Parser(argparse.ArgumentParser):
    """argparse that raises the part's error instead of printing usage and exiting with 2."""

    def __init__(self, refuse: Callable[[str], Exception], **kwargs: Any) -> None:
        super().__init__(allow_abbrev=False, **kwargs)
        self._refuse = refuse

    def error(self, message: str) -> NoReturn:
        raise self._refuse(f"{message}; run `{self.prog} --help` for the flags")


class Declaration:
    """A part's settings, declared once; `values()` parses argv and the environment with them."""

    def __init__(
        self,
        prog: str,
        description: str,
        settings: Iterable[Setting],
        *,
        error: Callable[[str], Exception],
    ) -> None:
        self.prog = prog
        self.description = description
        self.settings = tuple(settings)
        self.error = error
        flags = [s.flag for s in self.settings]
        if len(set(flags)) != len(flags):
            raise ValueError(f"{prog}: a flag is declared twice in {flags}")

    @classmethod
    def of(
        cls,
        settings_class: type,
        prog: str,
        description: str,
        *,
        error: Callable[[str], Exception],
    ) -> Declaration:
        """The declaration of a `@declared` class: its fields' settings, in field order (the
        order of --help). Every field must be declared with `setting()`, or with `unflagged()`
        where only code sets it: a field with neither is declared half, and refused."""
        if not dataclasses.is_dataclass(settings_class):
            raise TypeError(f"{prog}: {settings_class.__name__} is not a @declared class")
        settings = []
        for f in dataclasses.fields(settings_class):
            declared_setting = f.metadata.get(DECLARED, dataclasses.MISSING)
            if declared_setting is None:
                continue  # unflagged(): only code sets it
            if not isinstance(declared_setting, Setting):
                raise TypeError(
                    f"{prog}: {settings_class.__name__}.{f.name} is declared half: it has no "
                    "flag; declare it with setting(flag, help, kind, default=...), or with "
                    "unflagged(default=...) if only code sets it"
                )
            settings.append(dataclasses.replace(declared_setting, field=f.name))
        return cls(prog, description, settings, error=error)

    def parser(self) -> argparse.ArgumentParser:
        """The command line; `--help` prints every flag with its default and variable, and
        `--version` the version of tritonshare."""
        parser = _Parser(self.error, prog=self.prog, description=self.description)
        parser.add_argument(
            "--version",
            action="version",
            version=version_line(self.prog),
            help="print the version of tritonshare and exit",
        )
        self.add_to(parser)
        return parser

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """Add the flags to a parser (or a sub-command's); unset flags leave no attribute, so
        the same flag on a command and a sub-command does not reset the other."""
        for s in self.settings:
            if s.switch:
                parser.add_argument(
                    s.option,
                    *s.aliases,
                    dest=s.dest,
                    action="store_const",
                    const="true",
                    default=argparse.SUPPRESS,
                    help=s.describe(),
                )
            else:
                parser.add_argument(
                    s.option, *s.aliases, dest=s.dest, default=argparse.SUPPRESS, help=s.describe()
                )

    def values(self, argv: Sequence[str], environ: Mapping[str, str]) -> dict[str, Any]:
        """The part's Settings fields from argv, else the environment, else the defaults."""
        given = vars(self.parser().parse_args(list(argv)))
        return self.resolve(given, environ)

    def resolve(self, given: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
        """Fields from already parsed flags (`given`, by dest) and the environment."""
        values: dict[str, Any] = {}
        for s in self.settings:
            raw, where = self._raw(s, given, environ)
            if raw is None:
                if s.required:
                    raise self.error(
                        f"{s.option} is required ({s.required}): set the flag"
                        + (f" or {' or '.join(s.variables)}" if s.variables else "")
                    )
                continue
            if s.switch:
                values[s.name] = raw.strip().lower() in TRUE_WORDS
                continue
            try:
                values[s.name] = s.kind(raw)
            except BadValueError as e:
                raise self.error(f"{where}: {raw!r} {e}") from e
            except ValueError as e:  # another module's refusal, such as a ContractError
                raise self.error(f"{where}: {e}") from e
        return values

    def raw(self, argv: Sequence[str], environ: Mapping[str, str], flag: str) -> str | None:
        """One setting's text, read leniently (other flags may be wrong or unknown)."""
        (setting,) = (s for s in self.settings if s.flag == flag)
        parser = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
        parser.add_argument(setting.option, dest=setting.dest, default=argparse.SUPPRESS)
        known, _ = parser.parse_known_args(list(argv))
        return self._raw(setting, vars(known), environ)[0]

    def _raw(
        self, s: Setting, given: Mapping[str, Any], environ: Mapping[str, str]
    ) -> tuple[str | None, str]:
        """The text of a setting and where it came from; an empty text counts as not given."""
        if given.get(s.dest) not in (None, ""):
            return str(given[s.dest]), s.option
        for variable in s.variables:
            if environ.get(variable, "") != "":
                return environ[variable], f"{variable} (for {s.option})"
        if s.default not in (None, ""):
            return s.default, f"the default of {s.option}"
        return None, s.option


T = TypeVar("T")


def setting(
    flag: str,
    help: str,
    kind: Kind = text,
    *,
    default: object = dataclasses.MISSING,
    default_factory: Callable[[], object] | None = None,
    env: str | None = "",
    also_env: tuple[str, ...] = (),
    required: str = "",
    switch: bool = False,
    aliases: tuple[str, ...] = (),
) -> Any:
    """A field of a `@declared` settings class and its setting, declared once.

    `default` is either text, written as on the command line (`"30"`, `"1Gi"`), which --help
    shows and `kind` reads into the field's default; or empty text or a value that is no text
    (None, False, ()), kept as the field's default and shown nowhere (an empty value counts as
    not given, as on the command line). No default and no `default_factory`: the field
    must be given to the constructor. The other arguments are `Setting`'s. `default` and
    `default_factory` are keywords, as `dataclasses.field`'s: that is how type checkers (the
    `dataclass_transform` below) see which fields have one.
    """
    shown = default if isinstance(default, str) and default else None
    declared_setting = Setting(
        flag,
        help,
        kind,
        shown,
        env=env,
        also_env=also_env,
        required=required,
        switch=switch,
        aliases=aliases,
    )
    if required and shown is not None:
        raise ValueError(f"--{flag} is declared required and with a default; choose one")
    metadata = {DECLARED: declared_setting}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    if shown is not None:
        try:
            default = kind(shown)
        except ValueError as e:
            raise ValueError(f"--{flag}: its default {default!r} is refused: {e}") from e
    return dataclasses.field(default=default, metadata=metadata)


def log_level_flag(help: str = "log level") -> Any:
    """The --log-level every part has, in the part's words."""
    return setting("log-level", help, log_level, default="INFO")


def log_format_flag() -> Any:
    """The --log-format every part has: `text` for people, `json` for log pipelines."""
    return setting("log-format", "text or json", log_format, default="text")


def keys_flag(help: str = "prefix of the contract's keys") -> Any:
    """The --key-prefix of a part that reads it as the contract's `Keys`."""
    return setting("key-prefix", help, key_prefix, default=DEFAULT_PREFIX)


def unflagged(*, default: object) -> Any:
    """A field of a `@declared` class that no flag or variable sets: the part's code (or a test)
    gives it, such as the simulated API server's audit size."""
    return dataclasses.field(default=default, metadata={DECLARED: None})


@dataclass_transform(frozen_default=True, field_specifiers=(setting, unflagged))
def declared(cls: type[T]) -> type[T]:
    """A part's settings: a frozen dataclass whose fields are each declared with `setting()`."""
    return dataclasses.dataclass(frozen=True)(cls)
