"""The one way every `cdt` command reports a user's mistake: one line on stderr, exit code 2.

A `UserError` names what is wrong with the input (a bad value, a missing or corrupt file, an
output that would replace earlier work) in one line; the command stops before writing anything.
Everything else that escapes a command is our own bug and keeps its traceback.
`cdt_cli` applies the same rule to every subcommand; each command's `main` applies
`exit_on_user_errors` too (`python -m training.export_cli ...` answers the same way).
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from collections.abc import Callable
from typing import NoReturn, ParamSpec, TypeVar

USER_ERROR_EXIT = 2
"""The exit code of every user mistake (argparse's, for a bad option, is the same)."""

Params = ParamSpec("Params")
Result = TypeVar("Result")


class UserError(Exception):
    """A command's input cannot work: reported as one line naming the problem, exit code 2."""


# The optional dependencies, by the name `import` reports, and the extra that installs each.
EXTRAS: dict[str, str] = {
    **dict.fromkeys(
        ("torch", "h5py", "tyro", "onnx", "onnxscript", "matplotlib", "tensorboard"), "train"
    ),
    **dict.fromkeys(
        (
            "fastapi",
            "starlette",
            "uvicorn",
            "onnxruntime",
            "pydantic_settings",
            "prometheus_client",
            "redis",
        ),
        "serve",
    ),
    **dict.fromkeys(("httpx", "websockets"), "client"),
    **dict.fromkeys(("gymnasium", "bullet_safety_gym", "pybullet"), "sim"),
}


def one_line(error: BaseException | str, limit: int | None = None) -> str:
    """The error's message on one line (pydantic and others write several): control characters
    and runs of whitespace become one space, the whole cut to `limit` characters; an exception
    without a message gives its type's name."""
    text = "".join(c if c.isprintable() else " " for c in str(error))
    flat = " ".join(text.split())
    if not flat and isinstance(error, BaseException):
        flat = type(error).__name__
    return flat if limit is None or len(flat) <= limit else flat[: limit - 3] + "..."


def missing_extra(error: ModuleNotFoundError) -> str | None:
    """The extra that installs the module `error` misses, or None when it is none of ours."""
    return EXTRAS.get((error.name or "").split(".")[0])


def stop(prog: str, message: BaseException | str) -> NoReturn:
    """Write `prog: message` as one line on stderr and exit with USER_ERROR_EXIT."""
    sys.stderr.write(f"{prog}: {one_line(message)}\n")
    raise SystemExit(USER_ERROR_EXIT)


ErrorType = type[Exception] | str
"""A library's user-facing error class, or its dotted name ("package.module.Name"). A name is
looked up only once an error is caught, among the modules loaded by then, so naming an error of
a torch module imports no torch before a command has parsed its arguments (`--help` stays fast)."""


def user_error_types(*error_types: ErrorType) -> tuple[type[Exception], ...]:
    """`UserError` and each of `error_types` that is loaded (an error whose module was never
    imported cannot have been raised)."""
    found: list[type[Exception]] = [UserError]
    for named in error_types:
        kind: object = named
        if isinstance(named, str):
            module, _, name = named.rpartition(".")
            kind = getattr(sys.modules.get(module), name, None)
        if isinstance(kind, type) and issubclass(kind, Exception):
            found.append(kind)
    return tuple(found)


def exit_on_user_errors(
    prog: str, *error_types: ErrorType
) -> Callable[[Callable[Params, Result]], Callable[Params, Result]]:
    """Decorate a command's `main`: a `UserError` (or one of `error_types`, the user-facing
    errors of libraries the command calls) and a missing optional dependency each become one
    line and exit code 2; any other exception keeps its traceback."""

    def decorate(main: Callable[Params, Result]) -> Callable[Params, Result]:
        @functools.wraps(main)
        def run(*args: Params.args, **kwargs: Params.kwargs) -> Result:
            try:
                return main(*args, **kwargs)
            except ModuleNotFoundError as error:
                extra = missing_extra(error)
                if extra is None:
                    raise
                stop(prog, install_hint(error.name or "", extra))
            except Exception as error:
                if isinstance(error, user_error_types(*error_types)):
                    stop(prog, error)
                raise

        return run

    return decorate


def require(module: str) -> None:
    """Raise now the `ModuleNotFoundError` a late import of `module` would raise after the work
    (a command reports it as the extra to install), when this install lacks it."""
    if importlib.util.find_spec(module) is None:
        raise ModuleNotFoundError(f"No module named {module!r}", name=module)


def install_hint(module: str, extra: str) -> str:
    """What to install for a missing optional dependency (one line)."""
    return f"needs {module}, from the [{extra}] extra: pip install -e '.[{extra}]'"
