"""A week of a course as the hub service's history would record it, for sizing the cards before
the course starts (docs/sizing-a-course.md).

60 students, two 2-hour labs a week (Tuesday and Thursday, 14:00 UTC). Each student starts a
server in the lab's first quarter of an hour, takes the smallest slice of the spawn page that
holds their notebook (40 take 3 GiB, 15 take 5 GiB, 5 take 7 GiB), and stops it between 20
minutes before and 30 minutes after the lab's end. On the evening after each lab a third of the
class comes back for an hour of homework. Seeded: the same file every time.

Usage: ``python examples/course-history.py FILE`` writes ``api/v1/history``'s CSV columns;
``gpushare-replay --history FILE`` replays it against the cards you consider.
"""

from __future__ import annotations

import csv
import random
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

STUDENTS = 60
SIZES = [3] * 40 + [5] * 15 + [7] * 5  # GiB of a Tesla T4, as the students choose them
LABS = [datetime(2026, 11, 24, 14, tzinfo=UTC), datetime(2026, 11, 26, 14, tzinfo=UTC)]
LAB = timedelta(hours=2)
COLUMNS = ("user", "groups", "server", "slice", "gib", "model", "created", "start", "end")


def iso(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def sessions(seed: int = 2026) -> list[dict[str, str]]:
    rng = random.Random(seed)
    rows = []
    for lab in LABS:
        sizes = SIZES[:]
        rng.shuffle(sizes)
        homework = set(rng.sample(range(STUDENTS), STUDENTS // 3))
        for student, gib in enumerate(sizes):
            user = f"student-{student:02d}"
            start = lab + timedelta(seconds=rng.randint(0, 15 * 60))
            end = lab + LAB + timedelta(seconds=rng.randint(-20 * 60, 30 * 60))
            rows.append(row(user, gib, start, end))
            if student in homework:
                evening = lab.replace(hour=19) + timedelta(seconds=rng.randint(0, 3 * 3600))
                rows.append(row(user, gib, evening, evening + timedelta(hours=1)))
    return sorted(rows, key=lambda r: (r["created"], r["user"]))


def row(user: str, gib: int, start: datetime, end: datetime) -> dict[str, str]:
    return {
        "user": user,
        "groups": "course",
        "server": "",
        "slice": f"t4-{gib}g",
        "gib": str(gib),
        "model": "Tesla-T4",
        "created": iso(start),
        "start": iso(start),
        "end": iso(end),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python examples/course-history.py FILE", file=sys.stderr)
        return 2
    path = Path(argv[0])
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(sessions())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
