"""The ``wse`` command.

Each subcommand lives with the part it drives and registers itself here by
name: ``module:function`` taking the argument list and returning an exit code.
A user's mistake (:class:`wse.config.UsageError`) is printed as one line on
stderr with exit code 2, never as a traceback.
"""

from __future__ import annotations

import importlib
import sys

from .config import UsageError

#: subcommand -> (module, function, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "asm": ("wse.firmware.tools", "asm_main", "assemble a PE program: wse asm FILE.s -o FILE.bin"),
    "disasm": ("wse.firmware.tools", "disasm_main", "disassemble a PE program: wse disasm FILE.bin"),
    "kernel": ("wse.sim.runner", "main", "run a library kernel on random data and check it"),
    "train": ("wse.host.appliance.cli", "main", "train a PyTorch model on the fabric"),
    "report": ("wse.host.appliance.runreport", "main", "the one-page report of a training run: wse report RUN"),
    "trace": ("wse.host.appliance.phasetrace", "main", "record one phase of a training step on the golden model"),
    "generate": ("wse.host.appliance.gpt_generate", "main", "sample text from a GPT run: wse generate RUN --prompt TEXT"),
}


def _usage() -> str:
    lines = ["usage: wse COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``wse`` command; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"wse: unknown command {name!r}; expected one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module_name, func_name, _ = COMMANDS[name]
    return run(lambda: getattr(importlib.import_module(module_name), func_name)(rest), f"wse {name}")


def run(main, name: str) -> int:
    """``main()``'s exit code (0 for None): a user's mistake (:class:`UsageError`) printed as one
    line ``name: message`` and 2, an interrupt ``name: interrupted`` and 130; anything else raised.
    The ``wse`` command and the benchmark scripts' entry points share it."""
    try:
        return int(main() or 0)
    except UsageError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
