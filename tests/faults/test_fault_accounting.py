"""`account_device`, the per-seq accounting the fault tests end with: each bin, and what counts as lost."""

from __future__ import annotations

import pytest

from streamtrain.accounting import SeqLedger, account_device

pytestmark = pytest.mark.faults


def _ledger(device: str, seqs: list[int]) -> SeqLedger:
    ledger = SeqLedger()
    for seq in seqs:
        ledger.add(device, seq)
    return ledger


def test_every_record_lands_in_exactly_one_bin() -> None:
    # offsets 0..9 hold seqs 0..9, except offset 4 (an undecodable record, dead-lettered) pushes seqs 4.. up one.
    records = [(0, 0), (1, 1), (2, 2), (3, 3), (4, None), (5, 4), (6, 5), (7, 6), (8, 7), (9, 8), (10, 9)]
    trained = _ledger("d", [0, 1, 2, 3, 3, 6, 7])  # seq 3 twice (a retrained step)
    fate = account_device("d", records, trained, dead_offsets={4}, truncated=2, committed=9, expected=10)
    assert (fate.trained, fate.duplicates, fate.dead_lettered, fate.truncated) == (6, 1, 1, 2)
    assert fate.pending == (8, 9) and fate.lost == () and fate.missing == ()
    assert not fate.complete  # seqs 8 and 9 were never processed
    assert fate.trained + fate.truncated + fate.dead_lettered + len(fate.pending) == fate.records


def test_processed_but_untrained_beyond_the_reported_truncation_is_lost() -> None:
    records = [(o, o) for o in range(6)]
    fate = account_device("d", records, _ledger("d", [0, 1, 5]), truncated=1, committed=6)
    assert fate.lost == (2, 3, 4) and not fate.complete  # three skipped, one reported: which one is unknowable
    exact = account_device("d", records, _ledger("d", [0, 1, 5]), truncated=3, committed=6)
    assert exact.lost == () and exact.truncated == 3 and exact.complete and exact.exact


def test_missing_foreign_and_written_twice() -> None:
    records = [(0, 0), (1, 1), (2, 1), (3, 3)]  # seq 2 never delivered; seq 1 written twice
    fate = account_device("d", records, _ledger("d", [0, 1, 3, 7]), committed=4, expected=4)
    assert fate.missing == (2,) and fate.topic_duplicates == 1 and fate.foreign == (7,)
    assert not fate.complete and not fate.exact
    assert account_device("d", [], SeqLedger(), expected=0).exact  # an empty stream is fully accounted
    undecodable = account_device("d", [(0, None)], SeqLedger(), committed=1)
    assert undecodable.undecodable == 1 and not undecodable.complete  # bad but never dead-lettered
