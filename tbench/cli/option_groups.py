"""Options that several commands declare together, declared once: a group is a dataclass whose fields are the
options (the Annotated aliases of options.py, with their defaults). A command takes the group as one parameter;
`with_option_groups` shows typer the group's options in its place and hands the command the group built from them,
so each command's options and help stay what they were."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing


def with_option_groups(command):
    """`command` with each parameter annotated by an option group replaced, for typer, by the group's options."""
    signature = inspect.signature(command, eval_str=True)
    groups: dict[str, type] = {}
    parameters: list[inspect.Parameter] = []
    for parameter in signature.parameters.values():
        group = parameter.annotation
        if not (isinstance(group, type) and dataclasses.is_dataclass(group)):
            parameters.append(parameter)
            continue
        groups[parameter.name] = group
        hints = typing.get_type_hints(group, include_extras=True)  # the typer.Option each field is annotated with
        parameters += [
            inspect.Parameter(field.name, parameter.kind, default=field.default, annotation=hints[field.name])
            for field in dataclasses.fields(group)
        ]

    @functools.wraps(command)
    def grouped(**options):
        for name, group in groups.items():
            options[name] = group(**{field.name: options.pop(field.name) for field in dataclasses.fields(group)})
        return command(**options)

    grouped.__signature__ = signature.replace(parameters=parameters)
    grouped.__annotations__ = {p.name: p.annotation for p in parameters}
    return grouped
