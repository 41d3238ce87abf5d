"""Short words about rounds and runs: status lines, dropdown labels, the replay summary. Pure functions of a Round
or a RunRecord; the playground and the Learn tab both label rounds with these."""

from __future__ import annotations

from specdec.core import events
from specdec.core.events import Round
from specdec.core.record import RunRecord
from specdec.core.stop import stop_label

from .tokens import quoted


def default_selection(rnd: Round) -> tuple[int, int]:
    """Chart the most telling position of a round: its rejection, else the bonus position."""
    return rnd.index, rnd.rejected_at if rnd.rejected_at is not None else rnd.gamma


def describe_round(rnd: Round) -> str:
    if rnd.gamma == 0:
        return f"nothing drafted, plain target step {quoted(rnd.emitted_piece)}"
    kept = f"{rnd.kept}/{rnd.gamma} guesses kept"
    if rnd.is_bonus:
        return f"{kept}, bonus {quoted(rnd.emitted_piece)}"
    return f"{kept}, {quoted(rnd.draft_pieces[rnd.rejected_at])} rejected → {quoted(rnd.emitted_piece)}"


def round_label(rnd: Round) -> str:
    """One line per round for a selector: 'Round 3: 2/4 kept, repaired'."""
    if rnd.gamma == 0:
        return f"Round {rnd.index + 1}: nothing drafted (plain step)"
    tail = " + bonus" if rnd.is_bonus else ", repaired"
    return f"Round {rnd.index + 1}: {rnd.kept}/{rnd.gamma} kept{tail}"


def round_choices(rounds: list[Round]) -> list[tuple[str, int]]:
    return [(round_label(r), r.index) for r in rounds]


FATE_WORDS = {events.KEPT: "kept", events.DISCARDED: "discarded", events.CUT: "not committed"}


def position_choices(rnd: Round) -> list[tuple[str, int]]:
    out = []
    for i, fate in enumerate(rnd.fates):
        word = f"rejected → {quoted(rnd.emitted_piece)}" if fate == events.REJECTED else FATE_WORDS[fate]
        out.append((f"{i}: {quoted(rnd.draft_pieces[i])} {word}", i))
    if rnd.gamma == 0:
        last = f"plain target step {quoted(rnd.emitted_piece)}"
    else:
        last = f"after the last guess ({f'bonus {quoted(rnd.emitted_piece)}' if rnd.is_bonus else 'not reached'})"
    out.append((f"{rnd.gamma}: {last}", rnd.gamma))
    return out


def progress_message(record: RunRecord, rnd: Round) -> str:
    return (f"Generating… round {rnd.index + 1} · {len(record.generated_ids)}/{record.settings.max_new_tokens} "
            f"tokens · last round: {describe_round(rnd)}")


def finished_message(record: RunRecord) -> str:
    why = stop_label(record.stop_reason) or "finished"
    return f"Done: {len(record.generated_ids)} tokens in {len(record.rounds)} rounds ({why})."


def stopped_message(record: RunRecord, can_continue: bool) -> str:
    head = f"Stopped after {len(record.rounds)} rounds ({len(record.generated_ids)} tokens)."
    if can_continue:
        return head + " Step or Run to end continues; Generate starts over."
    return head + " Generate starts a new run."


def prompt_text(prompt: str | list) -> str:
    """What the token view shows as the prompt: the text, or the chat messages' contents."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(m.get("content", "") for m in prompt if isinstance(m, dict))


def describe_replay(record: RunRecord) -> str:
    """The status line after a trace loads: what it is, which models made it, and what the buttons now do."""
    m = record.pair
    models = f"target {m.target or '?'} + draft {m.draft or '?'}"
    where = ", ".join(x for x in (m.device, m.dtype) if x)
    when = f", recorded {record.created}" if record.created else ""
    drafter = "" if record.settings.drafter == "model" else f" with the {record.settings.drafter} drafter"
    state = f"stopped: {stop_label(record.stop_reason)}" if record.stop_reason else "was stopped before the end"
    return (f"Replaying a trace: {len(record.generated_ids)} tokens in {len(record.rounds)} rounds, made by {models}"
            f"{f' ({where})' if where else ''}{drafter}{when}; the run {state}. No model was loaded. "
            "Click tokens or pick a round to inspect it; Generate or Step starts a new run on this app's models.")
