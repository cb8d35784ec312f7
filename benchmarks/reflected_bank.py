"""Build the memory bank of the full-stack closed-loop runs: the default bank plus reflection items.

The ``luna-no-reflection`` ablation (docs/benchmarks.md, "Full stack in closed loop") only differs from
``luna`` when the bank holds reflection items. The items used there came from one reflection round
(docs/reflection.md, "Measured: one reflection round": 4 reflections on hard_stationary_in_traffic_05
appended to the then default bank, kept as ``benchmarks/data/bank_minilm672``); they are kept as journal records in
``benchmarks/data/reflection_items_round_hard.jsonl`` so that the bank can be rebuilt exactly without
re-running the round (20 min of CPU)::

    .venv/bin/python benchmarks/reflected_bank.py --out out/eval/reflected-bank

The base bank's journal is copied, opened once as a writer (as a reflection round opens its copy: a
bank above 10k items keeps the IVF lists trained on the base items), and the records appended after validation (framing, checksum,
``source == "reflection"``, sequence numbers continuing the base bank's); the result is opened as a
bank to check it.

An ablation leaves items out: ``--without-near-misses <round>/reflections.jsonl[.xz]`` drops the items a
round wrote for failures that were near misses only (no collision), so that their share of the round's
gain can be measured (docs/reflection.md), and ``--without <item id>`` drops one item; the records kept
are re-sequenced to continue the base bank::

    .venv/bin/python benchmarks/reflected_bank.py --base models/memory_bank \
        --items benchmarks/data/reflection_round_s30/reflection_items.jsonl \
        --without-near-misses benchmarks/data/reflection_round_s30/reflections.jsonl.xz --out <bank>
"""

from __future__ import annotations

import argparse
import json
import lzma
import shutil
import sys
from pathlib import Path
from typing import Iterable

from luna_core.assets import unpacked
from luna_core.memory.bank import JOURNAL, MANIFEST, VERSION_FILE, MemoryBank, stored_version
from luna_core.memory.journal import Journal, scan

REPO = Path(__file__).resolve().parents[1]
#: The bank the kept reflection items extend (the default bank until session 8, MiniLM-embedded).
BASE_BANK = REPO / "benchmarks" / "data" / "bank_minilm672"


def near_miss_items(reflections: Path) -> set[str]:
    """Ids of the items a round wrote (``reflections.jsonl``, optionally xz-compressed: one line per
    failure with its request and result) for failures that were near misses without a collision."""
    opener = lzma.open if reflections.suffix == ".xz" else open
    ids = set()
    with opener(reflections, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f):
            try:
                row = json.loads(line)
                request, item_id = row["request"], (row["result"] or {}).get("memory_item_id")
                if item_id and request["near_misses"] and not request["colliding_ids"]:
                    ids.add(item_id)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise SystemExit(f"{reflections}: line {n + 1} is not a reflection row ({exc!r})") from None
    return ids


def build(base: Path, items: Path, out: Path, without: Iterable[str] = ()) -> MemoryBank:
    """Copy ``base`` (unpacked where compressed) to ``out`` and append the reflection records of ``items``
    except those whose id is in ``without`` (the rest re-sequenced); returns the bank."""
    base = unpacked(base)
    found = scan(items)
    if found.skipped or found.corrupt_tail or found.torn_tail:
        bad = ", ".join(b.describe() for b in found.skipped + found.corrupt_tail) or "none"
        raise SystemExit(f"{items}: corrupt records: {bad}; {found.torn_tail} torn byte(s)")
    version = stored_version(base)
    for n, record in enumerate(found.records):
        if record.get("source") != "reflection" or record.get("seq") != version + 1 + n:
            raise SystemExit(f"{items}: record #{n} is not reflection item seq {version + 1 + n} "
                             f"(source {record.get('source')!r}, seq {record.get('seq')!r})")
    without = set(without)
    unknown = without - {r["id"] for r in found.records}
    if unknown:
        raise SystemExit(f"{items}: no record with id(s) {sorted(unknown)} to leave out")
    kept = [dict(r, seq=version + 1 + n) for n, r in enumerate(r for r in found.records if r["id"] not in without)]
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for name in (MANIFEST, JOURNAL, VERSION_FILE):
        shutil.copy2(base / name, out / name)
    MemoryBank.open(out, writable=True).close()  # as a round's copy: a large bank keeps its IVF lists
    journal = Journal(out / JOURNAL)
    try:
        journal.append_many(kept)
    finally:
        journal.close()
    (out / VERSION_FILE).write_text(f"{version + len(kept)}\n")
    return MemoryBank.open(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, default=BASE_BANK)
    parser.add_argument("--items", type=Path, default=REPO / "benchmarks" / "data" / "reflection_items_round_hard.jsonl")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--without-near-misses", type=Path, metavar="REFLECTIONS",
                        help="leave out the items this round's reflections.jsonl[.xz] wrote for near misses")
    parser.add_argument("--without", action="append", default=[], metavar="ITEM_ID",
                        help="leave out this item (repeatable), e.g. the second copy of a duplicated revision")
    args = parser.parse_args(argv)
    without = (near_miss_items(args.without_near_misses) if args.without_near_misses else set()) | set(args.without)
    bank = build(args.base, args.items, args.out, without)
    reflections = sum(item.source == "reflection" for item in bank.items)
    print(f"{args.out}: {len(bank)} items ({reflections} reflection items), version {bank.version}"
          + (f"; left out {len(without)} item(s)" if without else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
