"""The run ledger (training/ledger.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.ledger import (
    LedgerEntry,
    cpu_kind,
    device_details,
    format_ledger,
    ledger_path,
    read_ledger,
    record,
)


def test_ledger_appends_one_line_per_run_and_reads_them_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("CDT_LEDGER", str(path))
    record(LedgerEntry("train", "runs/a", "done", task="SafetyCarRun-v0", seed=0, steps=10))
    record(LedgerEntry("select", "runs/a", "not admissible: kappa 10 | idle", split="selection"))
    entries = read_ledger(path)
    assert [entry.command for entry in entries] == ["train", "select"]
    assert entries[0].cpu and entries[0].time
    table = format_ledger(entries)
    assert table.count("\n") == 3  # header, rule, two rows
    assert "not admissible: kappa 10 / idle" in table  # a pipe would break the row


def test_ledger_off_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDT_LEDGER", "off")
    assert ledger_path() is None
    record(LedgerEntry("train", "runs/a", "done"))
    assert read_ledger(tmp_path / "ledger.jsonl") == []


@pytest.mark.parametrize(
    ("flags", "kind"),
    [
        (["avx2", "amx_bf16", "amx_tile", "avx512_bf16"], "AMX"),
        (["avx2", "avx512f", "avx512_bf16"], "AVX-512 BF16"),
        (["avx2", "avx512f", "avx512_vnni"], "AVX-512, no BF16"),
        (["sse4_2", "avx", "avx2"], "AVX2 only"),
        (["sse4_2"], "no AVX2"),
    ],
)
def test_the_cpu_kind_tells_cpus_of_one_model_name_apart(flags: list[str], kind: str) -> None:
    assert cpu_kind(flags) == kind


def test_device_details_are_empty_for_a_cpu_run() -> None:
    assert device_details("cpu") == {}  # the entry's `cpu` already names the machine
