"""Option values converted without pydantic, with typer's own rules and messages.

typer (from 0.2x) converts each option's value with a pydantic `TypeAdapter` it builds on first
use, so every command, `meshctl serve` among them, imported pydantic and built one adapter per
option: 8-9 MB of memory and 70-100 ms of CPU for `serve`'s 41 options, before the server had
done anything. The types meshctl's options have are plain (str, int with bounds, float, bool,
Path, a choice, a list of those), and for them the conversion is a line each: `plain` returns a
converter for such an option, in the shape typer asks of one (its `RuntimeParam`), and the
command class (`cli/app.py`) hands it to typer before parsing. An option of any other type is
left to typer, as is every option with a typer that converts otherwise (older typer, on click's
types): this is the same parser, only the conversion of values to plain types is done here.

The messages are pydantic's, as typer shows them (`Input should be a valid number, ...`), so a
wrong value reads the same as before.
"""

from __future__ import annotations

import os
import typing
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Final

try:  # typer's converters and errors; absent from a typer that converts with click's types
    from typer._click.exceptions import BadParameter
    from typer._coercion import RuntimeParam
    from typer._param_types import choice_coercion_annotation, coerce_cli_choice, coerce_cli_path
except ImportError:  # pragma: no cover - an older typer: it converts without pydantic anyway
    RuntimeParam = None  # type: ignore[assignment,misc]

#: The strings pydantic takes for a boolean (lower case).
_TRUE: Final = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE: Final = frozenset({"0", "off", "f", "false", "n", "no", ""})

Convert = Callable[[Any, Any, Any], Any]  # (value, param, ctx) -> value


def install(param: Any) -> None:
    """Give `param` (a typer option or argument) a plain converter, when it has a plain type and
    typer has not built its own yet."""
    if RuntimeParam is None or getattr(param, "_runtime_param", ...) is not None:
        return
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is None or descriptor.file_annotation is not None:
        return
    try:
        convert = _converter(descriptor.annotation, descriptor.parameter_info)
        if convert is not None:
            param._runtime_param = _Plain(descriptor.parameter_info, descriptor.annotation, convert)
    except (TypeError, AttributeError, ValueError):  # pragma: no cover - typer's private shapes moved
        return  # typer converts it, as it would without this module: slower, never wrong


if RuntimeParam is not None:

    @dataclass(frozen=True)
    class _Plain(RuntimeParam):
        """typer's converter contract, kept by a plain function."""

        convert: Convert

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            return self.convert(value, param, ctx)


def _converter(annotation: Any, info: Any) -> Convert | None:
    if getattr(info, "parser", None) is not None:
        return None
    if typing.get_origin(annotation) is list:
        (item,) = typing.get_args(annotation) or (None,)
        each = _converter(item, info) if item is not None else None
        if each is None:
            return None

        def convert_list(value: Any, param: Any, ctx: Any) -> list[Any]:
            values = value if isinstance(value, (list, tuple)) else [value]
            return [each(v, param, ctx) for v in values]

        return convert_list
    if (choice := choice_coercion_annotation(annotation, info)) is not None:
        choices, case_sensitive = choice

        def convert_choice(value: Any, param: Any, ctx: Any) -> Any:
            try:
                return coerce_cli_choice(value, choices=choices, case_sensitive=case_sensitive, ctx=ctx)
            except ValueError as exc:
                raise BadParameter(f"Value error, {exc}", ctx=ctx, param=param) from None

        return convert_choice
    if annotation is bool:
        return _bool
    if annotation is str:
        return _str
    if annotation in (int, float) and not getattr(info, "clamp", False):
        return _number(annotation, info.min, info.max)
    if isinstance(annotation, type) and issubclass(annotation, Path) and info.path_type in (None, annotation):

        def convert_path(value: Any, param: Any, ctx: Any) -> Any:
            if isinstance(value, (str, bytes)):
                value = annotation(os.fsdecode(value))
            return coerce_cli_path(value, info, path_type=annotation, param=param, ctx=ctx)

        return convert_path
    return None


def _str(value: Any, param: Any, ctx: Any) -> str:
    if isinstance(value, bytes):
        return os.fsdecode(value)
    if isinstance(value, Enum):
        return str(value.value)
    return value if isinstance(value, str) else str(value)


def _bool(value: Any, param: Any, ctx: Any) -> bool:
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise BadParameter("Input should be a valid boolean, unable to interpret input", ctx=ctx, param=param)


def _number(kind: type[Any], low: float | None, high: float | None) -> Convert:
    what = "an integer" if kind is int else "a number"
    name = "integer" if kind is int else "number"

    def convert(value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float, str, bytes)):
            raise BadParameter(f"Input should be a valid {name}", ctx=ctx, param=param)
        try:
            number = kind(value.strip() if isinstance(value, str) else value)
        except ValueError:
            raise BadParameter(
                f"Input should be a valid {name}, unable to parse string as {what}", ctx=ctx, param=param
            ) from None
        if low is not None and number < low:
            raise BadParameter(f"Input should be greater than or equal to {low}", ctx=ctx, param=param)
        if high is not None and number > high:
            raise BadParameter(f"Input should be less than or equal to {high}", ctx=ctx, param=param)
        return number

    return convert
