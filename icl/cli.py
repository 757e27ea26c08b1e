"""The ``icl`` command: one entry point, one subcommand per part of kube-icl.

This package sits above the parts it dispatches to (the device plugin, the DRA driver, the extender, the
topology CLI, the link probe and the simulator) and none of them imports it. Each part registers its own subcommands
through a ``register(subparsers, common)`` function in its ``cli`` module. Only the module of the subcommand
being run is imported (``icl plugin`` and ``icl extender`` never import the simulator or matplotlib); ``icl
--help`` and a command line without a known subcommand import them all, to list or reject. Heavy imports
happen inside the handlers, so ``icl --help`` stays fast. Logging is configured here and only here.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from collections.abc import Sequence

__all__ = ["COMMANDS", "build_parser", "main", "version_string"]

# Subcommand -> the module that registers it, in the order ``icl --help`` lists them.
COMMANDS: dict[str, str] = {
    "topo": "topocli.cli",
    "demo": "icl.demo",
    "plugin": "deviceplugin.cli",
    "dra": "deviceplugin.dra.cli",
    "kubelet-emu": "simulator.kubelet_cli",
    "probe": "probe.cli",
    "extender": "scheduler.cli",
    "sim": "simulator.sim_cli",
}

# Verbs a subcommand's own module must not carry because they need the simulator: the subcommand's
# ``register`` returns its verbs' subparsers action and this module's ``register`` adds to it.
VERBS_ELSEWHERE: dict[str, str] = {
    "dra": "icl.dra_measure",  # `icl dra measure` replays the DRA allocator in the simulator
}

LOG_LEVELS = ("debug", "info", "warning", "error")
DEFAULT_LOG_LEVEL = "info"
EXIT_BROKEN_PIPE = 1  # as in the Python docs' recipe; a shell pipeline reports its last command's status anyway


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "ts": self.formatTime(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload)


def _configure_logging(level: str, json_logs: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if json_logs:
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


def version_string() -> str:
    """``icl VERSION``, plus `` (revision REV)`` when the image build stamped one in ``$ICL_REVISION``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        text = f"icl {version('kube-icl')}"
    except PackageNotFoundError:  # pragma: no cover - running from a tree that was never installed
        text = "icl (not installed)"
    revision = os.environ.get("ICL_REVISION", "").strip()
    return f"{text} (revision {revision})" if revision else text


def _command_in(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names, when that can be read without parsing: the first word that is not an
    option, skipping the value of ``--log-level``. An unusual line (say, an abbreviated option) gives a word
    that is no command, and then every command is registered: slower, never wrong."""
    words = iter(argv)
    for word in words:
        if word == "--log-level":
            next(words, None)
        elif word == "--":
            return next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``icl`` parser: with ``command`` (a key of ``COMMANDS``) only that subcommand, else all of them."""
    # The shared logging options go before or after the subcommand. Their default is SUPPRESS so
    # that a subcommand's parser, which knows them too, does not overwrite a value given earlier
    # with its own default; ``main`` supplies the defaults.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--log-level",
        default=argparse.SUPPRESS,
        choices=LOG_LEVELS,
        help=f"log verbosity (default: {DEFAULT_LOG_LEVEL}, icl demo: warning; before or after the subcommand)",
    )
    common.add_argument(
        "--json-logs",
        action="store_true",
        default=argparse.SUPPRESS,
        help="write logs as one JSON object per line (before or after the subcommand)",
    )
    parser = argparse.ArgumentParser(
        prog="icl",
        description=(
            "kube-icl: place accelerator jobs on devices that are actually linked together. "
            "Subcommands cover the topology library, the device plugin, the scheduler extender "
            "and the placement simulator."
        ),
        parents=[common],
    )
    parser.add_argument("--version", action="version", version=version_string(), help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    names = [command] if command is not None and command in COMMANDS else list(COMMANDS)
    for name in names:
        verbs = importlib.import_module(COMMANDS[name]).register(sub, common)
        if name in VERBS_ELSEWHERE:
            importlib.import_module(VERBS_ELSEWHERE[name]).register(verbs, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command_in(words))
    args = parser.parse_args(words)
    # --log-level, else the subcommand's own default (``icl demo`` keeps the extender it runs quiet), else info
    level = getattr(args, "log_level", getattr(args, "default_log_level", DEFAULT_LOG_LEVEL))
    _configure_logging(level, getattr(args, "json_logs", False))
    try:
        code: int = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (``icl topo show ... | head -1``): stop quietly. Point stdout at devnull
        # so that the interpreter's final flush does not raise again (the Python docs' recipe, "Note on
        # SIGPIPE" in the signal module).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
