"""Why profwatch's verdict and msprof-analyze's slow_rank votes differ, in words for the report (pure).

msprof-analyze ``slow_rank`` votes per collective instance: a Dixon Q-test (3 sigma above 100 ranks) on the
instance's durations across ranks gives one vote to the rank with the shortest collective, the one the others
waited for (recipe ``slow_rank`` in Ascend/msprof-analyze; docs/msprof-analyze.md). profwatch pools each rank's own
work over the captured steps and tests it against the other ranks' spread (``daemon/profwatch/core/verdict/ranking.py``).
The two disagree when a slowdown is small against the noise of single collectives (no instance passes the Q-test,
pooling still sees it), when it is spread over many collectives (each shortened a little), or when one collective's
outlier is not a consistent excess. A reader who sees a red badge beside "no slow rank found (0 votes)" gets this
explanation instead of a contradiction (docs/verdicts.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from profwatch.core.verdict.evidence import Suspect


def vote_notes(votes: Mapping[int, int], suspects: Sequence[Suspect], slow_rank_status: str | None,
               z: Mapping[int, float], pooled: Mapping[int, float], *, z_needed: float,
               min_effect_frac: float) -> list[str]:
    """Notes for each disagreement between the named suspects and the slow_rank votes.

    Args:
        votes: rank -> slow_rank votes (> 0 only); suspects: the verdict's suspects.
        slow_rank_status: the slow_rank recipe's status (``None``: not run; nothing is said then).
        z, pooled: every rank's robust z and pooled excess (fraction of step) of own work.
        z_needed, min_effect_frac: the thresholds a rank had to pass.

    Returns:
        Zero or more sentences; none when the two agree (the top suspect holds the most votes, or no rank is named
        and none was voted for).
    """
    if slow_rank_status is None:
        return []
    total = sum(votes.values())
    named = {s.rank for s in suspects}
    out: list[str] = []
    timed = [s for s in suspects if s.evidence.get("signal")]
    if timed and slow_rank_status == "ok" and not any(votes.get(s.rank, 0) for s in timed):
        who = ", ".join(f"rank {s.rank}" for s in timed[:3])
        out.append(f"slow_rank gave {who} no vote ({total} vote(s) in all): it votes per collective instance "
                   "(Dixon's Q-test on one instance's durations across ranks), so an excess that is small against "
                   "the noise of single collectives, or spread over many of them, wins no instance; profwatch "
                   "pools each rank's own work over the captured steps, which is why it names the rank anyway")
    elif slow_rank_status != "ok" and timed:
        out.append(f"slow_rank did not vote (status {slow_rank_status}): the suspects rest on the time breakdown "
                   "alone")
    for rank, n in sorted(votes.items(), key=lambda kv: (-kv[1], kv[0]))[:3]:
        if rank in named:
            continue
        why = []
        if rank in z:
            why.append(f"its pooled own-work excess is {100 * pooled.get(rank, 0.0):.2f}% of the step "
                       f"(needs {100 * min_effect_frac:.1f}%) at z {z[rank]:.1f} (needs {z_needed:.1f})")
        else:
            why.append("it has no time breakdown")
        out.append(f"slow_rank voted for rank {rank} ({n} of {total} votes) but profwatch does not name it: "
                   + "; ".join(why) + ": a few collectives where it arrived last, not a consistent excess")
    return out

