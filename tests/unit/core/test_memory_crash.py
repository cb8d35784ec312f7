"""Crash safety ("Show" of issue 4): a writer process appending items is killed with SIGKILL mid-run;
every item it acknowledged (printed after ``append`` returned) is in the bank, which opens cleanly.

Five rounds on the same bank (single appends, then large batches whose write a kill can tear) check
that recovery is followed by good appends. Meanwhile a reader in this process
follows the writer with ``refresh``, as ``decision_inference`` follows the reflection client.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np

from luna_core.memory import JournalWarning, MemoryBank, SceneVectorEmbedder
from luna_core.memory.bank import JOURNAL
from luna_core.memory.journal import scan

DIM = 16

CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    from luna_core.memory import MemoryBank, SceneVectorEmbedder
    from luna_core.types import MemoryItem

    path, prefix, seed, batch, max_answer = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), \
        int(sys.argv[5])
    rng = np.random.default_rng(seed)
    bank = MemoryBank.open(path, SceneVectorEmbedder(%d), writable=True)
    print("ready", flush=True)
    i = 0
    while True:
        items = []
        for _ in range(batch):
            items.append(MemoryItem(id=f"{prefix}-{i}", query=f"[Traffic state] scene {prefix} {i}",
                                    answer="A" * int(rng.integers(10, max_answer)),
                                    distribution=rng.dirichlet(np.ones(10)),
                                    scene_vector=rng.normal(size=%d).astype(np.float32)))
            i += 1
        bank.append_many(items) if batch > 1 else bank.append(items[0])
        print("\\n".join(item.id for item in items), flush=True)  # the acknowledgements
""" % (DIM, DIM))

#: (items per append, largest answer in bytes, acknowledgements before the kill). Single appends as
#: the reflection client makes them; then ~20 MB batches, whose write() a SIGKILL can cut short
#: (the kernel stops a large write at a fatal signal), so that the torn-tail recovery runs for real.
ROUNDS = ((1, 400_000, 15), (1, 400_000, 30), (1, 400_000, 45), (20, 2_000_000, 40), (20, 2_000_000, 60))


def _run_and_kill(path: str, prefix: str, seed: int, batch: int, max_answer: int, acks_before_kill: int,
                  reader: MemoryBank) -> list[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-c", CHILD, path, prefix, str(seed), str(batch),
                             str(max_answer)], stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == b"ready"
    acked: list[str] = []
    versions = [reader.version]
    deadline = time.monotonic() + 60.0
    while len(acked) < acks_before_kill and time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line, f"writer exited early with {proc.poll()}"
        acked.append(line.decode().strip())
        reader.refresh()  # follows the writer while it writes
        versions.append(reader.version)
    if batch == 1:
        # Kill at a moment unrelated to the writer's progress through its current record.
        time.sleep(float(np.random.default_rng(seed).uniform(0.0, 0.02)))
    else:
        # Kill as soon as the next batch starts reaching the file: inside its write, most likely.
        journal = os.path.join(path, JOURNAL)
        size = os.path.getsize(journal)
        while os.path.getsize(journal) == size and time.monotonic() < deadline:
            pass
    os.kill(proc.pid, signal.SIGKILL)
    rest = proc.stdout.read()  # acknowledgements printed before the kill but not read yet
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    acked += [line.decode() for line in rest.split(b"\n")[:-1]]  # only complete lines
    assert all(a <= b for a, b in zip(versions, versions[1:]))  # a reader's version never goes back
    return acked


def test_sigkill_mid_append_loses_no_acknowledged_item(tmp_path) -> None:
    path = str(tmp_path / "bank")
    MemoryBank.create(path, SceneVectorEmbedder(DIM)).close()
    reader = MemoryBank.open(path, SceneVectorEmbedder(DIM))
    all_acked: list[str] = []
    torn_recoveries = 0
    for round_no, (batch, max_answer, acks) in enumerate(ROUNDS):
        all_acked += _run_and_kill(path, f"r{round_no}", round_no, batch, max_answer, acks, reader)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            bank = MemoryBank.open(path, SceneVectorEmbedder(DIM), writable=True)  # opens cleanly
        torn_recoveries += any(issubclass(w.category, JournalWarning) for w in caught)
        ids = {item.id for item in bank}
        missing = [i for i in all_acked if i not in ids]
        assert not missing, f"round {round_no}: acknowledged items lost: {missing}"
        unacknowledged = sum(b for b, _, _ in ROUNDS[:round_no + 1])  # at most one append per kill
        assert len(ids) - len(all_acked) <= unacknowledged
        assert scan(os.path.join(path, JOURNAL)).torn_tail == 0  # recovery left a clean file
        assert bank.version >= len(all_acked)
        bank.close()
    # The reader catches up with everything, and retrieval works on the recovered bank.
    reader.refresh()
    assert {i for i in all_acked} <= {item.id for item in reader}
    probe = reader.get(all_acked[-1])
    assert reader.retrieve(probe.scene_vector, k=1)[0][0].id == probe.id
    # The batch rounds kill inside a write, so the torn-tail recovery must have run at least once.
    assert torn_recoveries >= 1, "no kill tore a record: the recovery path was not exercised"
