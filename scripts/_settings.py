'''Command-line options from a settings dataclass, shared by the scripts in this folder.

Each field becomes an option ``--field-name``. The string written right under a field (an
attribute docstring, as in CleanRL) is its --help text; the annotation gives its type::

    @dataclass
    class Settings:
        num_envs: int = 64
        """envs in the pool."""
        envs: list[str] = field(default_factory=lambda: ["CartPole-v1"])
        """env ids to run."""
        quick: bool = False
        """a short run, for CI."""

    settings = _settings.parse(Settings, argv, description=__doc__)

- ``bool``: a flag (``--quick``; ``--x/--no-x`` when the default is True);
- ``list[T]``: one or more values, and a repeated option adds to them (``--envs A B`` or
  ``--envs A --envs B``);
- ``Literal["a", "b"]``: one of those values;
- ``T | None``: a value of type T, or left out;
- a field without a default: a required option.

A script that needs to know which options were given (to fill in the others for ``--quick``, say)
calls ``parse_given`` instead of ``parse``, or ``build_parser`` to add options of its own.
'''

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from shmpool.option_docs import field_docs  # the library's reader of attribute docstrings

T = TypeVar("T")


def build_parser(
    cls: type, *, description: str | None = None, groups: Mapping[str, Iterable[str]] | None = None
) -> argparse.ArgumentParser:
    """A parser with one option per field of the dataclass ``cls``. Options left out parse as None
    (flags as False), so that the dataclass's own defaults apply. ``groups`` maps a section title of
    --help to the fields listed under it (the others are listed first)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    titles = {name: title for title, names in (groups or {}).items() for name in names}
    sections = {title: parser.add_argument_group(title) for title in (groups or {})}
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    for settings_field in dataclasses.fields(cls):
        name = settings_field.name
        section = sections[titles[name]] if name in titles else parser
        _add_option(section, settings_field, hints[name], docs.get(name, ""))
    return parser


def parse_given(
    cls: type,
    argv: list[str] | None = None,
    *,
    description: str | None = None,
    groups: Mapping[str, Iterable[str]] | None = None,
) -> dict[str, Any]:
    """The options given on the command line, by field name (flags always, as True or False)."""
    namespace = build_parser(cls, description=description, groups=groups).parse_args(argv)
    return {name: value for name, value in vars(namespace).items() if value is not None}


def parse(
    cls: type[T],
    argv: list[str] | None = None,
    *,
    description: str | None = None,
    groups: Mapping[str, Iterable[str]] | None = None,
) -> T:
    """An instance of the dataclass ``cls`` from the command line (``argv``, or ``sys.argv[1:]``)."""
    return cls(**parse_given(cls, argv, description=description, groups=groups))


def _add_option(parser: Any, settings_field: dataclasses.Field, hint: Any, doc: str) -> None:
    """Adds the option of one field, typed by its annotation ``hint``."""
    if settings_field.default is not dataclasses.MISSING:
        default = settings_field.default
    elif settings_field.default_factory is not dataclasses.MISSING:
        default = settings_field.default_factory()
    else:
        default = dataclasses.MISSING
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        (hint,) = [arg for arg in args if arg is not type(None)]
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    text = doc.rstrip(".") + _shown(default, hint)
    options: dict[str, Any] = {"help": text.replace("%", "%%"), "default": None}
    if hint is bool:  # a flag; --x/--no-x when it defaults to True (left out: None, the default applies)
        on = default is True
        options.update(action=argparse.BooleanOptionalAction if on else "store_true", default=None if on else False)
    elif origin is list:
        options.update(nargs="+", action="extend", type=args[0])
    elif origin is typing.Literal:
        options.update(choices=list(args), type=type(args[0]))
    else:
        options.update(type=hint)
    if default is dataclasses.MISSING:
        options.update(required=True)
    # A trailing underscore only dodges a Python keyword (async_): the flag is --async.
    flag = "--" + settings_field.name.rstrip("_").replace("_", "-")
    parser.add_argument(flag, dest=settings_field.name, **options)


def _shown(default: Any, hint: Any) -> str:
    """The default as --help shows it after the field's text (nothing for flags, None and required)."""
    if default is dataclasses.MISSING or default is None or default == [] or hint is bool:
        return ""
    if isinstance(default, list):
        return f" (default: {' '.join(map(str, default))})"
    return f" (default: {default!r})" if default == "" else f" (default: {default})"
