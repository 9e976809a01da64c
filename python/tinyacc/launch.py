"""`python3 -m tinyacc.launch`: `tinyacc launch` started from Python, as
`python -m torch.distributed.run` is torchrun.

    python3 -m tinyacc.launch --nproc_per_node 2 train.py --lr 3e-4

takes the same flags (torchrun's spellings too) and runs a .py script with
the interpreter that runs this module, with this tinyacc package importable
on every rank. The command is TINYACC_CLI, else the repository's
build/tinyacc next to this package, else `tinyacc` on PATH.
"""

import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def find_cli():
    """The tinyacc command's path, or None."""
    env = os.environ.get("TINYACC_CLI")
    if env:
        return env
    built = os.path.join(os.path.dirname(os.path.dirname(HERE)), "build", "tinyacc")
    if os.access(built, os.X_OK):
        return built
    return shutil.which("tinyacc")


def main(args=None):
    args = sys.argv[1:] if args is None else list(args)
    cli = find_cli()
    if cli is None:
        sys.stderr.write("tinyacc.launch: the tinyacc command was not found: build it (go build -o build/tinyacc "
                         "./cmd/tinyacc), put it on PATH or set TINYACC_CLI to its path\n")
        return 2
    env = dict(os.environ)
    pkg_root = os.path.dirname(HERE)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if pkg_root not in paths:
        env["PYTHONPATH"] = os.pathsep.join([pkg_root] + paths)
    os.execve(cli, [cli, "launch", "--python", sys.executable] + args, env)


if __name__ == "__main__":
    sys.exit(main())
