"""`account_records`, the accounting by offset that the run report and the fault tests end with: each bin, what
counts as lost and what as pending, and that it stays linear in the records."""

from __future__ import annotations

import time

import numpy as np
import pytest

from streamtrain.report.accounting import SeqLedger, account_records

pytestmark = pytest.mark.faults


def test_every_record_lands_in_exactly_one_bin() -> None:
    # 0-2 trained (1 twice: a step retrained after a crash), 3 dead-lettered, 4-5 dropped, 6 trained out of
    # order above the committed offset 6, 7-9 never processed.
    fates = account_records(range(10), trained=[0, 1, 1, 2, 6], truncated=[4, 5], dead_lettered=[3], committed=6)
    assert (fates.trained, fates.dead_lettered, fates.truncated, fates.pending) == (4, 1, 2, 3)
    assert fates.retrained == 1 and fates.unaccounted == 0 and fates.settled and not fates.complete
    assert fates.trained + fates.dead_lettered + fates.truncated + fates.pending == fates.records == 10


def test_processed_past_with_no_fate_is_lost_and_at_or_above_the_commit_is_pending() -> None:
    fates = account_records(range(6), trained=[0, 1, 5], truncated=[3], committed=4)
    assert fates.lost.tolist() == [2] and fates.pending == 1 and fates.unaccounted == 1 and not fates.settled
    nothing_committed = account_records(range(3), trained=[1])
    assert nothing_committed.pending == 2 and nothing_committed.settled  # a run that never committed lost nothing


def test_claims_about_records_the_topic_never_held_are_unaccounted() -> None:
    fates = account_records([10, 11, 12], trained=[10, 11, 12, 13], dead_lettered=[99], committed=13, log_start=10)
    assert fates.unknown.tolist() == [13, 99] and fates.unaccounted == 2
    # Below the log start they are records deleted after being processed: accounted from what the run says.
    deleted = account_records([10, 11], trained=[3, 4, 10, 11], truncated=[5], committed=12, log_start=10)
    assert (deleted.records, deleted.trained, deleted.truncated, deleted.unaccounted) == (5, 4, 1, 0)


def test_written_twice_is_counted_from_identities_whatever_the_numbering() -> None:
    seqs = np.array([2_000_000_000, 2_000_000_013, 2_000_000_013, 7, 7], dtype=np.int64)  # a second producer: 7
    payloads = np.array([1, 2, 2, 3, 4], dtype=np.int64)  # offset 2 repeats offset 1; the two 7s differ
    fates = account_records(range(5), trained=range(5), committed=5, identities=seqs * 31 + payloads)
    assert fates.written_twice == 1 and fates.complete


def test_an_empty_stream_is_fully_accounted() -> None:
    assert account_records([]).complete and account_records([]).records == 0


def test_a_million_records_are_accounted_in_about_a_second() -> None:
    rng = np.random.default_rng(0)
    n = 1_000_000
    offsets = np.arange(n, dtype=np.int64)
    fate = rng.integers(0, 4, size=n)  # 0 trained, 1 dropped, 2 dead-lettered, 3 untouched
    began = time.perf_counter()
    fates = account_records(offsets, trained=offsets[fate == 0], truncated=offsets[fate == 1],
                            dead_lettered=offsets[fate == 2], committed=n // 2, identities=offsets * 3)
    took = time.perf_counter() - began
    untouched = int((fate == 3).sum())
    assert fates.trained + fates.truncated + fates.dead_lettered + fates.pending + len(fates.lost) == n
    assert len(fates.lost) + fates.pending == untouched and took < 5.0, took


def test_seq_ledger_checks_a_densely_numbered_stream_without_walking_its_range() -> None:
    ledger = SeqLedger()
    for seq in [0, 1, 1, 3, 10**12]:
        ledger.add("d", seq)
    account = ledger.account("d", 5)
    assert account.missing == (2, 4) and account.duplicates == 1 and account.unexpected == (10**12,)
    assert not account.exact and account.seen == 5
