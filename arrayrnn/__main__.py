"""``python -m arrayrnn warmup``: compile the numba engine's loops into numba's on-disk cache ahead of use."""

from __future__ import annotations

import argparse
import pickle
import sys

from .frontend import compile_ahead


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m arrayrnn", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    warm = commands.add_parser("warmup", help="compile the numba engine's loops now (e.g. in a server or CI "
                                              "image), with a progress bar")
    warm.add_argument("--modes", nargs="+", default=list(compile_ahead.KINDS),
                      help="mode names (lstm, gru, rnn_tanh, rnn_relu); default: lstm gru rnn")
    warm.add_argument("--dtypes", nargs="+", default=list(compile_ahead.DTYPES),
                      help="float32 and/or float64")
    warm.add_argument("--inference-only", action="store_true", help="skip the backward's loops")
    warm.add_argument("--quiet", action="store_true", help="no progress bar")
    warm.add_argument("--family", help=argparse.SUPPRESS)       # the background compile's child process
    warm.add_argument("--path", help=argparse.SUPPRESS)         # ... or the child that compiles one call's
    warm.add_argument("--signatures", help=argparse.SUPPRESS)   # where that child writes what it compiled
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.family is not None or args.path is not None:
        if args.family is not None:
            signatures = compile_ahead.compile_family(compile_ahead.Family.parse(args.family))
        else:
            signatures = compile_ahead.compile_path(compile_ahead.Path.parse(args.path))
        if args.signatures == "-":
            sys.stdout.buffer.write(pickle.dumps(signatures))
        elif args.signatures is not None:
            with open(args.signatures, "wb") as file:
                pickle.dump(signatures, file)
        return 0
    try:
        compile_ahead.warmup(args.modes, args.dtypes, training=not args.inference_only,
                             progress=not args.quiet)
    except ValueError as err:
        print(f"python -m arrayrnn warmup: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
