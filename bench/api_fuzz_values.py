"""Odd JSON values and mutations for `bench/fuzz_api.py`, drawn from a seeded `random.Random`.

`encode` writes JSON the way a careless or hostile client might: NaN and Infinity as bare
literals (Python's `json` does), and `Raw` pieces verbatim (`1e400`, `-0`, a 40-digit integer).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Raw:
    """A JSON token written as it is (`1e400`, `NaN`, `-0`)."""

    text: str


def encode(value: Any) -> bytes:
    """`value` as JSON text, `Raw` tokens verbatim, NaN and infinities as bare literals."""
    raws: list[str] = []

    def hold(item: Any) -> Any:
        if isinstance(item, Raw):
            raws.append(item.text)
            return f"\x00raw{len(raws) - 1}\x00"
        raise TypeError(type(item).__name__)

    text = json.dumps(value, default=hold, allow_nan=True)
    for index, raw in enumerate(raws):
        text = text.replace(json.dumps(f"\x00raw{index}\x00"), raw)
    return text.encode("utf-8", errors="surrogatepass")


ODD_NUMBERS: tuple[Any, ...] = (
    float("nan"), float("inf"), float("-inf"), 1e308, -1e308, -0.0, 0, -1, 1e-320, 2.5,
    2**31, 2**53 + 1, 2**63, 2**64, 10**40, -(2**63) - 1, 1e9 + 1, -1e9 - 1,
    Raw("1e400"), Raw("-1e400"), Raw("-0"), Raw("1E+2"), Raw("0.0000000000000000000000001"),
    Raw("NaN"), Raw("Infinity"), Raw("-Infinity"), Raw("1" * 5000),
)  # fmt: skip
ODD_STRINGS: tuple[str, ...] = (
    "", " ", "null", "NaN", "1.5", "true", "\x00", "\n\r\t", "é", "日本語", "🚀" * 10,
    "\u202e\u200b", "\ud800", "\udfff x", "' OR 1=1 --", "../../etc/passwd", "%00", "%2e%2e",
    "<script>", "${jndi:x}", "{{7*7}}", "a" * 129, "b" * 10_000, "\\u0000",
)  # fmt: skip


def odd_number(rng: random.Random) -> Any:
    return rng.choice(ODD_NUMBERS)


def odd_string(rng: random.Random) -> str:
    if rng.random() < 0.2:
        return "".join(chr(rng.randrange(1, 0x3000)) for _ in range(rng.randrange(1, 40)))
    return rng.choice(ODD_STRINGS)


def junk_value(rng: random.Random, depth: int) -> Any:
    """Any JSON value, nested up to `depth`."""
    pick = rng.randrange(8 if depth > 0 else 5)
    if pick == 0:
        return odd_number(rng)
    if pick == 1:
        return odd_string(rng)
    if pick == 2:
        return rng.choice([None, True, False])
    if pick == 3:
        return rng.uniform(-10, 10)
    if pick == 4:
        return rng.randrange(-5, 5)
    if pick == 5:
        return [junk_value(rng, depth - 1) for _ in range(rng.randrange(4))]
    if pick == 6:
        return {odd_string(rng): junk_value(rng, depth - 1) for _ in range(rng.randrange(4))}
    return [[[[junk_value(rng, 0)]]]]


def odd_episode_id(rng: random.Random) -> str:
    return rng.choice(
        [
            "0" * 32, "f" * 64, "g" * 65, "-", "_", "a.b", "..", "%2F", "a%20b", "%00",
            "x" * 2000, "日本", "🚀", "null", "0x10", "-1", "a:b", "~", "%ff%fe",
        ]
    )  # fmt: skip


def odd_step_index(rng: random.Random, step: int) -> Any:
    return rng.choice(
        [step + 2, step - 1, step + 100, 0, -1, 2**31, 2**31 - 1, 2**64, 1.5, float(step + 1),
         "1", None, True, Raw("1e400"), Raw(f"{step + 1}.0000000000000001")]
    )  # fmt: skip


def odd_header_value(rng: random.Random, *, numeric: bool = False) -> str:
    if numeric:
        return rng.choice(
            ["0", "-1", "nan", "inf", "1e400", "1e10", "10000000001", "abc", "",
             "1767225600.25", "4102444800", "1.0e9", "0x10", "12e", "1 2"]
        )  # fmt: skip
    return rng.choice(
        ['"7"', "7", "*", 'W/"1"', '"1", "2"', '"-1"', '"99999999999999999999"', '"abc"', "",
         '"', "x y", '"' + "9" * 19 + '"', "*, *"]
    )  # fmt: skip


def mutate_object(rng: random.Random, body: dict[str, Any]) -> tuple[Any, str]:
    """`body` broken in one or a few ways; returns it and a note saying how."""
    mutated: Any = dict(body)
    notes = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        if not isinstance(mutated, dict):
            break
        key = rng.choice(sorted(mutated)) if mutated else "model"
        pick = rng.randrange(11)
        if pick == 0:
            mutated.pop(key, None)
            notes.append(f"without {key}")
        elif pick == 1:
            extra = odd_string(rng)[:20] or "extra"
            mutated[extra] = junk_value(rng, 2)
            notes.append(f"extra field {extra!r}")
        elif pick == 2:
            mutated[key] = odd_number(rng)
            notes.append(f"{key} = odd number")
        elif pick == 3:
            mutated[key] = odd_string(rng)
            notes.append(f"{key} = odd string")
        elif pick == 4:
            mutated[key] = junk_value(rng, 3)
            notes.append(f"{key} = junk")
        elif pick == 5 and isinstance(mutated.get(key), list):
            length = rng.choice([0, 1, len(mutated[key]) - 1, len(mutated[key]) + 1, 4097, 5000])
            mutated[key] = [rng.uniform(-1, 1) for _ in range(length)]
            notes.append(f"{key} of {length} values")
        elif pick == 6 and isinstance(mutated.get(key), list) and mutated[key]:
            values = list(mutated[key])
            values[rng.randrange(len(values))] = odd_number(rng)
            mutated[key] = values
            notes.append(f"{key} holding an odd number")
        elif pick == 7:
            mutated[key] = None
            notes.append(f"{key} = null")
        elif pick == 8:
            mutated = rng.choice([[mutated], list(mutated.values()), None, "x", 1])
            notes.append("not an object")
        elif pick == 9:
            mutated[key] = {"value": mutated.get(key)}
            notes.append(f"{key} wrapped in an object")
        else:
            mutated[key] = str(mutated.get(key))
            notes.append(f"{key} as a string")
    return mutated, "; ".join(notes) or "unchanged"
