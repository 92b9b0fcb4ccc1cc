"""The `--help` bench: fresh processes, the slowest command named (bench/help_times.py)."""

from __future__ import annotations

from bench.help_times import HelpTime, format_table, time_help


def test_help_time_is_measured_in_a_fresh_process() -> None:
    measured = time_help("card-update", repeat=1)
    assert measured.answer == "help" and 0.0 < measured.seconds < 60.0


def test_help_table_names_the_slowest_command_against_the_limit() -> None:
    times = [HelpTime("serve", 0.4, "help"), HelpTime("export", 2.1, "help")]
    table = format_table(times, "AMD EPYC")
    assert "| export | 2.10 | help |" in table
    assert table.endswith("slowest: export, 2.10 s (OVER the 1 s limit)")
    assert format_table(times[:1], "AMD EPYC").endswith("(within the 1 s limit)")
