"""What the gamma policies read: an empty proposal (no n-gram match, no draft) says nothing about acceptance, so the
heuristic policy neither grows nor shrinks gamma on it."""

from __future__ import annotations

from specdec.core.events import Round
from specdec.core.settings import DecodeSettings
from specdec.loop.decoder import SpeculativeDecoder
from specdec.loop.gamma import HeuristicGamma


def _round(gamma: int, n_accepted: int) -> Round:
    return Round(index=1, position=0, gamma=gamma, draft_ids=[1] * gamma, draft_pieces=["a"] * gamma,
                 q_draft=[1.0] * gamma, p_draft=[0.5] * gamma, accept_probs=[0.5] * gamma, uniforms=[0.1] * gamma,
                 n_accepted=n_accepted, rejected_at=None if n_accepted == gamma else n_accepted, emitted_id=2,
                 emitted_piece="b", is_bonus=n_accepted == gamma, emitted_p=0.5, q_top=[], p_top=[],
                 residual_top=None, committed_ids=[1] * n_accepted + [2], committed_pieces=[], draft_ms=1.0,
                 verify_ms=1.0)


def test_heuristic_gamma_ignores_rounds_without_a_proposal():
    policy = HeuristicGamma(4)
    for _ in range(5):
        policy.observe(_round(0, 0))
    assert policy.gamma == 4
    policy.observe(_round(4, 4))
    assert policy.gamma == 6
    policy.observe(_round(6, 2))
    assert policy.gamma == 5


class AskedRecorder:
    """Wraps a drafter and records the gamma each round asked it for."""

    def __init__(self, inner):
        self.inner, self.asked = inner, []

    def propose(self, committed, gamma, cfg, gen):
        self.asked.append(gamma)
        return self.inner.propose(committed, gamma, cfg, gen)

    def feedback(self, committed, n_accepted, n_drafted):
        self.inner.feedback(committed, n_accepted, n_drafted)


def test_ngram_rounds_without_a_match_do_not_inflate_gamma(tiny_pair):
    from specdec.drafters import make_drafter

    s = DecodeSettings(gamma=4, max_new_tokens=24, drafter="ngram", gamma_policy="heuristic", seed=0)
    dec = SpeculativeDecoder(tiny_pair, "qwertyuiop", s)
    rec = AskedRecorder(make_drafter(tiny_pair, s, dec.prompt_ids))
    dec.drafter = rec
    list(dec)
    empty = [i for i, r in enumerate(dec.rounds) if r.gamma == 0]
    assert empty, "the test needs rounds where ngram found no match"
    for i in empty:
        if i + 1 < len(dec.rounds):
            assert rec.asked[i + 1] <= rec.asked[i], f"gamma grew after the empty round {i}: {rec.asked}"
