"""``luna-offline ensemble``: one student whose decision head is the ensemble of saved students' heads.

    luna-offline ensemble --students models/student benchmarks/data/student_s39_timing/egot --out out/ensemble

The students must share their base model and adapter (heads trained with ``distill --stage head`` on the same
cache do); a head saved alone may lack the adapter file as long as one of them holds it. pi_hat of the result
is the mean of the members' distributions, from one forward pass of the base
(``luna_core.student.head.HeadEnsemble``; docs/student.md, "An ensemble of heads").
"""

from __future__ import annotations

import argparse
from pathlib import Path

from luna_core.student import StudentError
from luna_core.student.ensemble import save_head_ensemble


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("ensemble", help="one student whose decision head is the mean of saved students' heads",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--students", nargs="+", required=True, type=Path, metavar="DIR",
                   help="saved students (at least 2), their heads in this order")
    p.add_argument("--out", required=True, type=Path, help="the ensemble student's folder (replaced atomically)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        out = save_head_ensemble(args.students, args.out)
    except StudentError as exc:
        raise SystemExit(f"luna-offline ensemble: {exc}") from exc
    print(f"[ensemble] {len(args.students)} heads -> {out}")
    return 0
