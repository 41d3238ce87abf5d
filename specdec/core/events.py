"""Plain dataclasses that carry one round of speculative decoding from the engine to whoever renders it.

Everything here is JSON-ready (ints, floats, strings, lists), so rounds stream to the UI, export to traces and
replay without any model loaded.

Glossary -- the words mean this everywhere in the project:
- guessed (drafted): a token the drafter proposed this round; `Round.gamma` of them (`Round.asked` is how many the
  gamma policy asked for: a drafter may propose fewer).
- tested: a guess the rule decided on: the guesses up to and including the first refused one. Guesses after a
  refusal are never tested (DISCARDED).
- accepted: the rule's verdict that a tested guess stays (`Round.n_accepted` counts them, `Verdict.n_accepted` too).
- committed: a token added to the text this round (`Round.committed_ids`): accepted guesses, then the repair or
  bonus token, all cut by the stop rule.
- cut: tested, but past a committed EOS or the token budget, so not in the text (CUT).
- kept: accepted AND committed (`Round.kept`, `Totals.kept`): what every acceptance statistic counts.
- repaired: the token drawn from normalize(max(0, p - q)) at the first refused position.
- bonus: the token drawn from p after the last guess when every guess was accepted (the residual against q = 0).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from specdec.core.tree_events import TreeRoundEvent
from specdec.core.verify import ModeVerdict

# What became of one draft position, decided once here and read by every renderer and statistic:
KEPT = "kept"  # accepted by the rule and committed to the text (the glossary's "kept")
REJECTED = "rejected"  # the first guess the rule refused; the repair token took its place in the text
DISCARDED = "discarded"  # after a rejection: never tested
CUT = "cut"  # tested (kept or refused) but past a committed EOS or the token budget, so not in the text



def draft_fates(gamma: int, n_accepted: int, rejected_at: int | None, n_committed: int) -> list[str]:
    """One of KEPT / REJECTED / DISCARDED / CUT per guess of a round that drafted `gamma` guesses, of which the
    rule accepted `n_accepted` (refusing the one at `rejected_at`, None: none refused) and `n_committed` tokens
    reached the text. The one definition of what a round's guesses count for (`Round.fates`, the batched loop)."""
    out = []
    for i in range(gamma):
        if rejected_at is not None and i > rejected_at:
            out.append(DISCARDED)
        elif i >= n_committed:
            out.append(CUT)
        else:
            out.append(KEPT if i < n_accepted else REJECTED)
    return out


COPY_SOURCES = ("prompt", "output", "earlier run")  # DraftNote.source: this run's prompt, its output, a past run


@dataclass
class TokenProb:
    id: int
    piece: str
    prob: float


@dataclass
class DraftNote:
    """Where a drafter's guesses came from, for display. Plain JSON-ready fields; absent ones stay None."""

    drafter: str  # "model", "ngram", "early-exit", "cross", "predicted", "suffix", "auto"
    one_hot: bool = False  # q is 1 on each guess: a deterministic proposal (copied or re-tokenized text)
    # ngram: index in prompt + generated ids where the copied tokens start; predicted: index in the PREDICTION's
    # tokens (settings.prediction, target tokenizer) of the first proposed token
    source_start: int | None = None
    # ngram: length of the suffix that matched there; predicted: 0 if the round carried straight on from the last
    # one, else the length of the output suffix that re-aligned to the prediction after the output departed
    match_len: int | None = None
    layers: int | None = None  # early-exit: how many of the target's layers drafted
    total_layers: int | None = None  # early-exit: the target's layer count
    draft_pieces: list[str] | None = None  # cross: the draft model's own tokens (its own vocabulary)
    # suffix: where the first copied token came from, one of COPY_SOURCES; source_start is then its index in the
    # prompt + generated ids ("prompt", "output") or in that earlier run's tokens ("earlier run")
    source: str | None = None


@dataclass
class Totals:
    """Running totals after this round."""

    rounds: int = 0
    generated: int = 0  # tokens committed so far
    drafted: int = 0
    kept: int = 0  # guesses accepted AND committed (a guess accepted past a committed EOS is not counted)
    tested: int = 0  # guesses the rule decided on within the committed text: kept + a committed refusal
    target_passes: int = 0  # forward passes of the target: one per round (round one also runs the prompt)
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    elapsed_ms: float = 0.0  # wall time since the first round started (it includes running the prompt)

    @property
    def kept_rate(self) -> float:
        """Kept / drafted guesses (vLLM's "draft acceptance rate")."""
        return self.kept / self.drafted if self.drafted else 0.0

    def count(self, fates: list[str], n_committed: int) -> None:
        """Add one round (or one batch row's round) by its guesses' fates: the only place totals are counted."""
        self.rounds += 1
        self.target_passes += 1
        self.generated += n_committed
        self.drafted += len(fates)
        self.kept += fates.count(KEPT)
        self.tested += fates.count(KEPT) + fates.count(REJECTED)

    def observe(self, rnd: "Round") -> None:
        """Add a round: its counts (by `Round.fates`) and its draft and verify time."""
        self.count(rnd.fates, len(rnd.committed_ids))
        self.draft_ms += rnd.draft_ms
        self.verify_ms += rnd.verify_ms

    @classmethod
    def from_dict(cls, d: dict) -> "Totals":
        """Totals from a trace's dict; traces before the glossary call `kept` "accepted"."""
        d = dict(d)
        if "accepted" in d:
            d.setdefault("kept", d.pop("accepted"))
        return cls(**d)


# What a guess's test probability is called under each rule (Round.accept_probs; core.verify's glossary).
TEST_NAMES = {"pq": "min(1, p/q)", "strict": "p(x)", "block": "h"}
RULE_HINTS = {
    "pq": "keep it iff u < min(1, p/q), left to right",
    "strict": "the target draws its own token; a guess is kept iff it is that token (u < p(x))",
    "block": "test h per prefix; keep the longest prefix whose test passed (u < h)",
}


@dataclass
class Round:
    index: int  # 0-based round number
    position: int  # tokens generated before this round
    gamma: int  # guesses drafted this round
    draft_ids: list[int]
    draft_pieces: list[str]
    q_draft: list[float]  # q(x_i) of each draft token
    p_draft: list[float]  # p(x_i) of each draft token
    accept_probs: list[float]  # each draft token's test: min(1, p/q) ("pq"), p(x) ("strict"), h_i ("block")
    uniforms: list[float]  # u per draft token; its test passes iff u < accept prob (which guesses are kept: fates)
    n_accepted: int  # guesses the rule accepted (some may be cut: see fates / kept)
    rejected_at: int | None
    emitted_id: int  # the repaired token (after a rejection) or the bonus token (all kept)
    emitted_piece: str
    is_bonus: bool
    emitted_p: float  # p of the emitted token at its position
    q_top: list[list[TokenProb]]  # per draft position, top-k of q
    p_top: list[list[TokenProb]]  # per position 0..gamma, top-k of p
    residual_top: list[TokenProb] | None  # top-k of normalize(max(0, p-q)) at the rejected position
    committed_ids: list[int]  # what this round added to the text (may be cut short by EOS / max_new_tokens)
    committed_pieces: list[str]
    draft_ms: float
    verify_ms: float
    round_ms: float = 0.0  # whole round wall time: draft + verify + bookkeeping and building this event
    # Where the rest of the round went (0 in older traces): the rule itself, rolling both caches back (and the
    # drafter's feedback), and building this event (top-k candidates, decoded pieces).
    rule_ms: float = 0.0
    cache_ms: float = 0.0
    display_ms: float = 0.0
    totals: Totals = field(default_factory=Totals)
    stop_reason: str | None = None  # a core.stop.StopReason ("eos" / "max_new_tokens") on the final round
    top_k: int = 8  # candidates q_top / p_top / residual_top carry per position (fewer: the rest is 0; 0: none kept)
    note: DraftNote | None = None  # where the guesses came from (None: the draft model, for older traces)
    asked: int | None = None  # guesses the gamma policy asked for (None in older traces: read as gamma)
    verify: str = "pq"  # the rule that judged the guesses (core.verify.VERIFY_MODES; older traces: "pq")
    # What each rule would have kept from the same guesses and the same uniforms (empty when not computed).
    same_draft: list[ModeVerdict] = field(default_factory=list)
    # A tree round: the whole token tree with what the rule read at every node. The chain fields above then hold
    # its accepted path (plus the last refused child before a repair) as the guesses.
    tree: TreeRoundEvent | None = None

    @property
    def fates(self) -> list[str]:
        """One of KEPT / REJECTED / DISCARDED / CUT per draft position."""
        return draft_fates(self.gamma, self.n_accepted, self.rejected_at, len(self.committed_ids))

    @property
    def kept(self) -> int:
        """Guesses kept and committed: what acceptance statistics count."""
        return self.fates.count(KEPT)

    @property
    def tested(self) -> int:
        """Guesses the rule decided on within the committed text (kept ones plus a committed rejection)."""
        f = self.fates
        return f.count(KEPT) + f.count(REJECTED)

    @property
    def test_name(self) -> str:
        """What accept_probs holds under this round's rule: min(1, p/q), p(x) or h."""
        return TEST_NAMES.get(self.verify, "accept prob")

    def passed(self, i: int) -> bool:
        """Whether guess i's own test passed (u < its accept prob). Under block verification a guess whose test
        failed is still kept when a later test passed; which guesses are kept is `fates`."""
        return self.uniforms[i] < self.accept_probs[i]

    @property
    def drafter(self) -> str:
        return self.note.drafter if self.note else "model"

    @property
    def one_hot(self) -> bool:
        return bool(self.note and self.note.one_hot)

    @property
    def asked_nothing(self) -> bool:
        """No guesses were asked for: the round is plain decoding's first step (the playground's round one, where
        the prompt pass alone is timed for the measured speedup), not a drafter that found nothing to propose."""
        return self.asked == 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Round":
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in d.items() if k in known}
        tp = lambda rows: [TokenProb(**t) for t in rows]  # noqa: E731
        data["q_top"] = [tp(r) for r in d["q_top"]]
        data["p_top"] = [tp(r) for r in d["p_top"]]
        data["residual_top"] = tp(d["residual_top"]) if d.get("residual_top") is not None else None
        data["totals"] = Totals.from_dict(d.get("totals") or {})
        data["note"] = DraftNote(**d["note"]) if d.get("note") else None
        data["tree"] = TreeRoundEvent.from_dict(d["tree"]) if d.get("tree") else None
        data["same_draft"] = [ModeVerdict(**v) for v in d.get("same_draft") or []]
        return cls(**data)
