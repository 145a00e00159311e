"""The functions synthetic repositories are made of (:mod:`reinforge.envs.swe_data`).

Each :class:`Template` is one small function's source and a generator of the arguments its test
calls it with. A repository takes a handful of the functions of one theme (:data:`THEMES`: numbers,
text, lists) into one module; the expected values of its tests are what the original function
returns. Only terminating code without f-strings (whose inner positions older Pythons misreport);
a mutation that makes a function loop is rejected by the generator's time limit.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Args = tuple[Any, ...]


@dataclass(frozen=True)
class Template:
    """A function's ``source`` (named ``name``) and ``cases(rng)``: the argument tuples of its test."""

    name: str
    source: str
    cases: Callable[[random.Random], list[Args]]


def _ints(rng: random.Random, n: int, lo: int = -20, hi: int = 20) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


WORDS = (
    "apple banana cherry delta echo forest garden harbor island jungle kettle lemon mango noodle orange "
    "pepper quartz river stone tiger umbrella violet walnut yellow zebra level radar noon kayak civic"
).split()


def _text(rng: random.Random, lo: int = 2, hi: int = 5) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


NUMBERS = [
    Template(
        "clamp",
        "def clamp(x, lo, hi):\n    if x < lo:\n        return lo\n    if x > hi:\n        return hi\n    return x\n",
        lambda r: [(r.randint(-10, 20), 0, 10) for _ in range(4)] + [(0, 0, 10), (10, 0, 10), (-3, 0, 10), (15, 0, 10)],
    ),
    Template(
        "mean",
        "def mean(xs):\n    return sum(xs) / len(xs)\n",
        lambda r: [(_ints(r, r.randint(1, 6)),) for _ in range(4)] + [([4, 8],)],
    ),
    Template(
        "factorial",
        "def factorial(n):\n    result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result\n",
        lambda r: [(0,), (1,), (r.randint(2, 4),), (r.randint(5, 8),)],
    ),
    Template(
        "is_prime",
        "def is_prime(n):\n    if n < 2:\n        return False\n    for d in range(2, int(n ** 0.5) + 1):\n"
        "        if n % d == 0:\n            return False\n    return True\n",
        lambda r: [(n,) for n in (1, 2, 3, 4, 9, 25, 49, 121)] + [(r.randint(10, 99),) for _ in range(3)],
    ),
    Template(
        "digit_sum",
        "def digit_sum(n):\n    total = 0\n    n = abs(n)\n    while n > 0:\n        total += n % 10\n"
        "        n //= 10\n    return total\n",
        lambda r: [(0,), (7,), (r.randint(10, 99),), (r.randint(100, 99999),), (-r.randint(10, 999),)],
    ),
    Template(
        "fib",
        "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
        lambda r: [(0,), (1,), (2,), (r.randint(3, 6),), (r.randint(7, 15),)],
    ),
    Template(
        "celsius_to_fahrenheit",
        "def celsius_to_fahrenheit(c):\n    return c * 9 / 5 + 32\n",
        lambda r: [(0,), (100,), (-40,), (r.randint(-30, 45),)],
    ),
    Template(
        "sign",
        "def sign(x):\n    if x > 0:\n        return 1\n    if x < 0:\n        return -1\n    return 0\n",
        lambda r: [(0,), (r.randint(1, 50),), (-r.randint(1, 50),), (1,), (-1,)],
    ),
    Template(
        "is_leap",
        "def is_leap(year):\n    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)\n",
        lambda r: [(y,) for y in (1900, 2000, 2004, 2023, 2100, 2400)] + [(r.randint(1800, 2200),)],
    ),
    Template(
        "count_divisors",
        "def count_divisors(n):\n    count = 0\n    for d in range(1, n + 1):\n        if n % d == 0:\n"
        "            count += 1\n    return count\n",
        lambda r: [(1,), (6,), (12,), (r.randint(2, 60),), (r.randint(61, 100),)],
    ),
    Template(
        "median",
        "def median(xs):\n    s = sorted(xs)\n    mid = len(s) // 2\n    if len(s) % 2 == 1:\n        return s[mid]\n"
        "    return (s[mid - 1] + s[mid]) / 2\n",
        lambda r: [(_ints(r, n),) for n in (1, 2, 3, 4, 5, 6)],
    ),
    Template(
        "gcd",
        "def gcd(a, b):\n    while b != 0:\n        a, b = b, a % b\n    return a\n",
        lambda r: [(12, 18), (7, 5), (r.randint(1, 60) * 6, r.randint(1, 60) * 4), (9, 0), (r.randint(2, 99), 1)],
    ),
]

TEXT = [
    Template(
        "count_vowels",
        'def count_vowels(s):\n    count = 0\n    for ch in s.lower():\n        if ch in "aeiou":\n'
        "            count += 1\n    return count\n",
        lambda r: [(_text(r),) for _ in range(3)] + [("",), ("AEIOU xyz",)],
    ),
    Template(
        "is_palindrome",
        "def is_palindrome(s):\n    t = [c.lower() for c in s if c.isalnum()]\n    return t == t[::-1]\n",
        lambda r: [("Racecar",), ("a",), ("",), ("never odd or even",), (r.choice(WORDS),), (_text(r, 2, 3),)],
    ),
    Template(
        "truncate",
        'def truncate(s, n):\n    if len(s) <= n:\n        return s\n    return s[: n - 3] + "..."\n',
        lambda r: [("hello", 5), ("hello world", 8), ("abc", 10), (_text(r, 3, 5), r.randint(6, 12))],
    ),
    Template(
        "caesar",
        "def caesar(s, shift):\n    out = []\n    for ch in s:\n        if ch.isalpha():\n"
        '            base = ord("a") if ch.islower() else ord("A")\n'
        "            out.append(chr((ord(ch) - base + shift) % 26 + base))\n        else:\n"
        '            out.append(ch)\n    return "".join(out)\n',
        lambda r: [("abc", 1), ("xyz", 3), ("Hello, World", 13), (_text(r), r.randint(1, 25))],
    ),
    Template(
        "word_count",
        "def word_count(s):\n    counts = {}\n    for w in s.lower().split():\n"
        "        counts[w] = counts.get(w, 0) + 1\n    return counts\n",
        lambda r: [(_text(r, 3, 7),) for _ in range(2)] + [("a b a",), ("",)],
    ),
    Template(
        "longest_word",
        'def longest_word(s):\n    best = ""\n    for w in s.split():\n        if len(w) > len(best):\n'
        "            best = w\n    return best\n",
        lambda r: [(_text(r, 3, 6),) for _ in range(3)] + [("aa bb c",), ("",)],
    ),
    Template(
        "run_length",
        "def run_length(s):\n    out = []\n    i = 0\n    while i < len(s):\n        j = i\n"
        "        while j < len(s) and s[j] == s[i]:\n            j += 1\n        out.append(str(j - i) + s[i])\n"
        '        i = j\n    return "".join(out)\n',
        lambda r: [("aaabcc",), ("",), ("abc",), ("".join(r.choice("ab") * r.randint(1, 3) for _ in range(4)),)],
    ),
    Template(
        "pad_left",
        "def pad_left(s, width, fill):\n    return fill * max(0, width - len(s)) + s\n",
        lambda r: [("7", 3, "0"), ("abc", 2, "."), ("x", 5, "-"), (str(r.randint(1, 999)), 6, "0")],
    ),
    Template(
        "acronym",
        'def acronym(s):\n    return "".join(w[0].upper() for w in s.split() if len(w) > 0)\n',
        lambda r: [(_text(r, 2, 5),) for _ in range(3)] + [("portable network graphics",)],
    ),
    Template(
        "count_substring",
        "def count_substring(s, sub):\n    count = 0\n    for i in range(len(s) - len(sub) + 1):\n"
        "        if s[i : i + len(sub)] == sub:\n            count += 1\n    return count\n",
        lambda r: [("banana", "an"), ("aaaa", "aa"), ("abc", "d"), ("abcabc", "abc"), (_text(r), "e")],
    ),
    Template(
        "title_case",
        'def title_case(s):\n    return " ".join(w[:1].upper() + w[1:] for w in s.split(" "))\n',
        lambda r: [(_text(r),) for _ in range(3)] + [("x",)],
    ),
]

LISTS = [
    Template(
        "running_sum",
        "def running_sum(xs):\n    out = []\n    total = 0\n    for x in xs:\n        total += x\n"
        "        out.append(total)\n    return out\n",
        lambda r: [(_ints(r, n),) for n in (0, 1, 3, 5)],
    ),
    Template(
        "chunk",
        "def chunk(xs, size):\n    return [xs[i : i + size] for i in range(0, len(xs), size)]\n",
        lambda r: [(list(range(n)), s) for n, s in ((5, 2), (6, 3), (0, 2), (r.randint(3, 9), r.randint(1, 4)))],
    ),
    Template(
        "argmax",
        "def argmax(xs):\n    best = 0\n    for i in range(1, len(xs)):\n        if xs[i] > xs[best]:\n"
        "            best = i\n    return best\n",
        lambda r: [(_ints(r, n),) for n in (1, 3, 5, 7)] + [([3, 1, 3],), ([1, 2, 9],)],
    ),
    Template(
        "rotate",
        "def rotate(xs, k):\n    if len(xs) == 0:\n        return []\n    k = k % len(xs)\n"
        "    return xs[k:] + xs[:k]\n",
        lambda r: [([1, 2, 3, 4], 1), ([1, 2, 3], 0), ([], 2), (_ints(r, 5), r.randint(1, 7))],
    ),
    Template(
        "second_largest",
        "def second_largest(xs):\n    uniq = sorted(set(xs))\n    if len(uniq) < 2:\n        return None\n"
        "    return uniq[-2]\n",
        lambda r: [([1, 2, 3],), ([5, 5],), ([4, 9, 9, 1],), (_ints(r, 6),)],
    ),
    Template(
        "pairwise_diff",
        "def pairwise_diff(xs):\n    return [xs[i + 1] - xs[i] for i in range(len(xs) - 1)]\n",
        lambda r: [([1, 4, 9, 16],), ([5],), (_ints(r, 5),)],
    ),
    Template(
        "count_greater",
        "def count_greater(xs, t):\n    count = 0\n    for x in xs:\n        if x > t:\n            count += 1\n"
        "    return count\n",
        lambda r: [([1, 5, 3, 7], 3), ([2, 2, 2], 2), ([], 0), (_ints(r, 6), r.randint(-5, 5))],
    ),
    Template(
        "merge_sorted",
        "def merge_sorted(a, b):\n    i = j = 0\n    out = []\n    while i < len(a) and j < len(b):\n"
        "        if a[i] <= b[j]:\n            out.append(a[i])\n            i += 1\n        else:\n"
        "            out.append(b[j])\n            j += 1\n    return out + a[i:] + b[j:]\n",
        lambda r: [([1, 4, 6], [2, 3, 7]), ([], [1]), ([1, 1], [1]), (sorted(_ints(r, 4)), sorted(_ints(r, 3)))],
    ),
    Template(
        "window_max",
        "def window_max(xs, k):\n    return [max(xs[i : i + k]) for i in range(len(xs) - k + 1)]\n",
        lambda r: [([1, 3, 2, 5, 4], 2), ([4, 1], 1), (_ints(r, 6), 3)],
    ),
    Template(
        "binary_search",
        "def binary_search(xs, target):\n    lo, hi = 0, len(xs) - 1\n    while lo <= hi:\n"
        "        mid = (lo + hi) // 2\n        if xs[mid] == target:\n            return mid\n"
        "        if xs[mid] < target:\n            lo = mid + 1\n        else:\n            hi = mid - 1\n"
        "    return -1\n",
        lambda r: [([1, 3, 5, 7, 9], t) for t in (1, 9, 5, 4)] + [([], 3), ([2, 4], 4)],
    ),
    Template(
        "take_while_positive",
        "def take_while_positive(xs):\n    out = []\n    for x in xs:\n        if x <= 0:\n            break\n"
        "        out.append(x)\n    return out\n",
        lambda r: [([3, 1, 0, 2],), ([],), ([-1, 2],), (_ints(r, 5, 0, 9),)],
    ),
]

THEMES: dict[str, tuple[list[Template], list[str], str]] = {
    "numbers": (NUMBERS, ["numkit", "mathbits", "calcs", "arith_tools"], "Small number utilities."),
    "text": (TEXT, ["textkit", "strbits", "wordplay", "string_tools"], "Small string utilities."),
    "lists": (LISTS, ["listkit", "seqbits", "arrays_util", "sequence_tools"], "Small list utilities."),
}
