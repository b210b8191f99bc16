"""How every part declares its settings: each once, and everything else follows from that.

A part's settings module lists `Setting`s (flag, kind, default, help, variable) in a `Declaration`.
From that one list come the command line (argparse, abbreviations refused), the environment
fallback (`TRITONSHARE_<FLAG>`; a flag wins over its variable, the variable over the default),
`--help` naming each flag's variable and default, and one wording for every bad value:
`--max-body: '12q' is not a Kubernetes quantity; write e.g. 512Mi`. The result is a mapping of
field names for the part's frozen Settings; checks across settings stay in the part.

Pure: it reads only the argv and the environment mapping it is given, never `os.environ`.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from common.contract import Keys, validate_model_id
from common.quantity import QuantityError, format_bytes, parse_quantity

ENV_PREFIX = "TRITONSHARE_"
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
    """The part's Settings field; default: the flag with underscores."""
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

    def parser(self) -> argparse.ArgumentParser:
        """The command line; `--help` prints every flag with its default and variable."""
        parser = _Parser(self.error, prog=self.prog, description=self.description)
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
