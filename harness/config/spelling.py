""" "Did you mean": the closest of the names a misspelt one could have meant."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest choice, every one of them when several are as close
    (' (did you mean 'a' or 'b'?)'), or '' when none is close."""
    matcher = difflib.SequenceMatcher(b=word)  # as difflib.get_close_matches scores them
    scored = []
    for choice in dict.fromkeys(choices):
        matcher.set_seq1(choice)
        if (score := matcher.ratio()) >= 0.6:
            scored.append((score, choice))
    if not scored:
        return ""
    best = max(score for score, _ in scored)
    # Equally near: picking one would send the user to a name they may not have meant.
    nearest = [repr(c) for score, c in scored if score == best]
    said = nearest[0] if len(nearest) == 1 else f"{', '.join(nearest[:-1])} or {nearest[-1]}"
    return f" (did you mean {said}?)"
