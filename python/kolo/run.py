"""``python -m kolo.run -n 4 train.py ...``: kolo-run, the launcher that
starts a job's processes on this host with the variables torchrun sets
(``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``), stops them all when one fails, and exits non-zero
naming the rank. Installed as the ``kolo-run`` command too."""

import argparse
import sys

from . import _kolo


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="kolo-run",
        description="Starts the processes of a kolo job with torchrun's variables.",
    )
    parser.add_argument("-n", "--nproc-per-node", type=int, default=1, help="processes on this host")
    parser.add_argument("--nnodes", type=int, default=1, help="hosts in the job")
    parser.add_argument("--node-rank", type=int, default=0, help="this host's place among them")
    parser.add_argument("--master-addr", default="127.0.0.1", help="the host of rank 0")
    parser.add_argument("--master-port", type=int, default=29500, help="its port (0: a free one)")
    parser.add_argument("--token", default=None, help="the job's rendezvous token")
    parser.add_argument("--grace", type=float, default=10.0, help="seconds before stragglers are killed")
    parser.add_argument("program", nargs=argparse.REMAINDER, help="the program and its arguments")
    args = parser.parse_args(argv)
    program = list(args.program)
    if program and program[0] == "--":
        program = program[1:]
    if not program:
        parser.error("no program to run")
    if program[0].endswith(".py"):
        program = [sys.executable] + program
    return _kolo.launch(
        program,
        nproc_per_node=args.nproc_per_node,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        master_addr=args.master_addr,
        master_port=args.master_port,
        token=args.token,
        grace=args.grace,
    )


if __name__ == "__main__":
    sys.exit(main())
