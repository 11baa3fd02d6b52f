"""Settings dataclasses shared by every trimq program: declared with ``setting()``, validated from their metadata,
merged from a TOML table, the environment and flags. ``build_settings`` is pure (callers pass the parsed file
and the environment); ``load_settings`` reads the TOML file and ``os.environ`` for the daemons.

An invalid value raises ConfigError naming the setting, the value, what is allowed and where it came from.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import field
from typing import Any


class ConfigError(ValueError):
    """A setting is invalid; the message names the setting, the value and what is allowed."""


#: Tables a TOML file shared by several trimq programs may hold, one per program (docs/CONFIGURATION.md).
CONFIG_SECTIONS = ("namesrv", "broker", "producer", "consumer", "admin", "audit")


def setting(default: Any, doc: str, *, min: float | None = None, max: float | None = None,
            choices: tuple[Any, ...] | None = None, also: tuple[Any, ...] = ()) -> Any:
    """A dataclass field carrying its documentation and allowed range (``also``: extra allowed values, e.g. -1)."""
    meta = {"doc": doc, "min": min, "max": max, "choices": choices, "also": also}
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def range_text(f: dataclasses.Field[Any]) -> str:
    """`` in [lo, hi]`` (or `` (-1 or [lo, hi])``) for an error message; empty when unbounded."""
    lo, hi, also = f.metadata.get("min"), f.metadata.get("max"), f.metadata.get("also") or ()
    if lo is None and hi is None:
        return ""
    rng = f"[{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
    prefix = " or ".join(str(a) for a in also)
    return f" ({prefix} or {rng})" if prefix else f" in {rng}"


def validate_dataclass(obj: Any) -> None:
    """Type- and range-check every field of a settings dataclass from its metadata."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        expected = type(f.default) if f.default is not dataclasses.MISSING else None
        if expected is bool:
            if not isinstance(value, bool):
                raise ConfigError(f"{f.name} = {value!r}: must be true or false")
            continue
        if expected is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{f.name} = {value!r}: must be an integer{range_text(f)}")
        if expected is float and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ConfigError(f"{f.name} = {value!r}: must be a number{range_text(f)}")
        if expected is str and not isinstance(value, str):
            raise ConfigError(f"{f.name} = {value!r}: must be a string")
        if value in (f.metadata.get("also") or ()):
            continue
        lo, hi, choices = f.metadata.get("min"), f.metadata.get("max"), f.metadata.get("choices")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise ConfigError(f"{f.name} = {value!r}: out of range{range_text(f)}")
        if choices and value not in choices:
            raise ConfigError(f"{f.name} = {value!r}: must be one of {', '.join(map(str, choices))}")


def coerce(f: dataclasses.Field[Any], raw: str) -> Any:
    """Turn an environment string into the field's type; ConfigError when it cannot be."""
    kind = type(f.default)
    if kind is bool:
        low = raw.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{f.name} = {raw!r}: must be true or false")
    if kind is int:
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"{f.name} = {raw!r}: must be an integer{range_text(f)}") from None
    if kind is float:
        try:
            return float(raw)
        except ValueError:
            raise ConfigError(f"{f.name} = {raw!r}: must be a number{range_text(f)}") from None
    return raw


def env_prefix_of(cls: type[Any]) -> str:
    """The environment prefix of a settings class: its ``ENV_PREFIX`` (``TRIMQ_BROKER_``, ``TRIMQ_NAMESRV_``,
    ``TRIMQ_CLIENT_``), one per program so that no variable means two things in one environment."""
    return str(getattr(cls, "ENV_PREFIX", "TRIMQ_"))


def env_var(cls: type[Any], name: str) -> str:
    """The environment variable of setting ``name`` of ``cls`` (its prefix + the name in capitals)."""
    return env_prefix_of(cls) + name.upper()


def retired_env_vars(cls: type[Any], environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """``(old, new)`` for each variable of ``environ`` named as ``cls`` used to read it (its
    ``RETIRED_ENV_PREFIX`` + the setting's name: ``TRIMQ_MAX_MESSAGE_SIZE`` meant the broker's limit to the
    broker and the client's to the clients)."""
    retired = getattr(cls, "RETIRED_ENV_PREFIX", None)
    if not retired:
        return []
    fields = dataclasses.fields(cls)
    current = {env_var(cls, f.name) for f in fields}
    out = []
    for f in fields:
        old = retired + f.name.upper()
        if old in environ and old not in current:
            out.append((old, env_var(cls, f.name)))
    return out


def refuse_retired_env_vars(cls: type[Any], environ: Mapping[str, str]) -> None:
    """ConfigError naming the new variable when ``environ`` holds a retired name of a ``cls`` setting."""
    found = retired_env_vars(cls, environ)
    if len(found) == 1:
        what = f"environment variable {found[0][0]} is no longer read: use {found[0][1]}"
    elif found:
        what = "environment variables no longer read: " + ", ".join(f"{old} (use {new})" for old, new in found)
    else:
        return
    raise ConfigError(f"{what}; each program reads its own prefix (TRIMQ_BROKER_, TRIMQ_NAMESRV_, TRIMQ_CLIENT_): "
                      "docs/CONFIGURATION.md")


def build_settings(cls: type[Any], *, file_data: Mapping[str, Any] | None = None, file_name: str = "",
                   environ: Mapping[str, str] | None = None, env_prefix: str | None = None,
                   overrides: Mapping[str, Any] | None = None, section: str | None = None) -> Any:
    """A validated ``cls`` from defaults < ``file_data`` (a parsed TOML document) < ``environ`` < ``overrides``.

    The document holds the settings at the top level or in a ``[section]`` table; a table that is not one of
    :data:`CONFIG_SECTIONS` is refused (a misspelt ``[brokr]`` would otherwise be silently ignored), and so is
    a document holding only other programs' tables. ``None`` overrides (flags not given) are ignored.
    Environment variables are ``env_prefix`` (default: the class's, :func:`env_prefix_of`) + the setting's name
    in capitals; a retired name of one of the class's settings is refused (:func:`refuse_retired_env_vars`).
    """
    refuse_retired_env_vars(cls, environ or {})
    if env_prefix is None:
        env_prefix = env_prefix_of(cls)
    names = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if file_data is not None:
        data: Mapping[str, Any] = file_data
        unknown = [k for k, v in data.items() if isinstance(v, dict) and k not in CONFIG_SECTIONS]
        if unknown:
            raise ConfigError(f"config file {file_name}: unknown section [{unknown[0]}] "
                              f"(sections: {', '.join(CONFIG_SECTIONS)})")
        nested = False
        if section is not None and section in data:
            if not isinstance(data[section], dict):
                raise ConfigError(f"config file {file_name}: {section!r} must be a table ([{section}])")
            data, nested = data[section], True
        elif section is not None and data and all(isinstance(v, dict) for v in data.values()):
            raise ConfigError(f"config file {file_name}: no [{section}] table "
                              f"(it has {', '.join(f'[{k}]' for k in data)})")
        for k, v in data.items():
            if isinstance(v, dict):
                if not nested:
                    continue  # another program's section
                raise ConfigError(f"config file {file_name}: unknown setting table [{section}.{k}]")
            if k not in names:
                where = f" in [{section}]" if nested else ""
                raise ConfigError(f"config file {file_name}: unknown setting {k!r}{where}")
            values[k] = v
            sources[k] = f"config file {file_name}"
    for name, f in names.items():
        var = env_prefix + name.upper()
        raw = (environ or {}).get(var)
        if raw is not None:
            try:
                values[name] = coerce(f, raw)
            except ConfigError as exc:
                raise ConfigError(f"{exc} (from environment variable {var})") from None
            sources[name] = f"environment variable {var}"
    for k, v in (overrides or {}).items():
        if v is not None:
            if k not in names:
                raise ConfigError(f"unknown setting {k!r}")
            values[k] = v
            sources[k] = "command line"
    try:
        obj = cls(**values)
        obj.validate()
    except ConfigError as exc:
        name = str(exc).split(" = ", 1)[0]
        if name in sources:
            raise ConfigError(f"{exc} (from {sources[name]})") from None
        raise
    return obj


def describe_settings(obj: Any) -> list[dict[str, Any]]:
    """Name, value, default, range and doc of every setting (for ``--print-config`` and the docs)."""
    return [{"name": f.name, "value": getattr(obj, f.name), "default": f.default, "doc": f.metadata.get("doc", ""),
             "min": f.metadata.get("min"), "max": f.metadata.get("max"), "choices": f.metadata.get("choices")}
            for f in dataclasses.fields(obj)]


def read_toml(path: str) -> dict[str, Any]:
    """A TOML file's document; ConfigError saying why it cannot be read."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def load_settings(cls: type[Any], *, config_file: str | None = None, env_prefix: str | None = None,
                  overrides: dict[str, Any] | None = None, section: str | None = None) -> Any:
    """Build a settings dataclass from defaults < TOML file < environment < ``overrides`` (flags), validated
    (:func:`build_settings` has the rules)."""
    return build_settings(cls, file_data=read_toml(config_file) if config_file else None,
                          file_name=config_file or "", environ=os.environ, env_prefix=env_prefix,
                          overrides=overrides, section=section)
