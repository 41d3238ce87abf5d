"""Built-in rounds for the Learn tab's walkthrough: hand-made distributions over a few words, decided by the
engine's own `verify`, so the story it tells is what the rule does."""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass

import torch

from specdec.core.events import Round, TokenProb
from specdec.core.sampling import OneHot
from specdec.core.tree import TokenTree, verify_tree
from specdec.core.verify import verify
from specdec.loop.tree_display import tree_chain_round, tree_round_event


@dataclass
class ExampleRound:
    context: str  # the text the round continues
    round: Round


def _row(weights: dict[str, float], idx: dict[str, int]) -> torch.Tensor:
    """A distribution over the example's word list (`idx`: word -> id) from made-up weights, normalized."""
    t = torch.zeros(len(idx))
    for w, v in weights.items():
        t[idx[w]] = v
    return t / t.sum()


def _example_round(context: str, steps: list[tuple[str, dict[str, float], dict[str, float]]],
                   bonus_p: dict[str, float], uniforms: list[float], emit: str) -> ExampleRound:
    """A Round for a hand-made example, with its verdict produced by specdec.verify.verify.

    steps holds (drafted piece, q row, p row) per position over a small made-up vocabulary; the recorded
    uniforms are replayed, so verify decides what is kept. The repair or bonus token is verify's own draw;
    seeds are tried in order until that draw is `emit`, the token the story tells (it must be possible).
    """
    vocab: list[str] = []
    for piece, q, p in steps:
        for w in [piece, *q, *p]:
            if w not in vocab:
                vocab.append(w)
    for w in bonus_p:
        if w not in vocab:
            vocab.append(w)
    idx = {w: i for i, w in enumerate(vocab)}
    q = torch.stack([_row(s[1], idx) for s in steps])
    p = torch.stack([_row(s[2], idx) for s in steps] + [_row(bonus_p, idx)])
    draft = torch.tensor([idx[s[0]] for s in steps])
    for seed in range(1000):
        gen = torch.Generator().manual_seed(seed)
        verdict = verify(draft, q, p, gen, uniforms=torch.tensor(uniforms))
        if verdict.tokens[-1] == idx[emit]:
            break
    else:
        raise ValueError(f"verify never emitted {emit!r} for this example")

    def top(r: torch.Tensor) -> list[dict]:
        order = torch.argsort(r, descending=True)
        return [TokenProb(int(i), vocab[int(i)], float(r[i])) for i in order if r[i] > 0]

    g = len(steps)
    emitted = verdict.tokens[-1]
    n = verdict.n_accepted
    rnd = Round(
        index=0, position=0, gamma=g,
        draft_ids=draft.tolist(), draft_pieces=[s[0] for s in steps],
        q_draft=[float(q[i, draft[i]]) for i in range(g)],
        p_draft=[float(p[i, draft[i]]) for i in range(g)],
        accept_probs=verdict.accept_probs.tolist(), uniforms=verdict.uniforms.tolist(),
        n_accepted=n, rejected_at=verdict.rejected_at,
        emitted_id=emitted, emitted_piece=vocab[emitted], is_bonus=verdict.bonus,
        emitted_p=float(p[n, emitted]),
        q_top=[top(q[i]) for i in range(g)], p_top=[top(p[i]) for i in range(g + 1)],
        residual_top=top(verdict.residual) if verdict.residual is not None else None,
        committed_ids=verdict.tokens, committed_pieces=[vocab[t] for t in verdict.tokens],
        draft_ms=0.0, verify_ms=0.0, top_k=len(vocab),
    )
    return ExampleRound(context, rnd)


class WordTokenizer:
    """Decodes the ids of a hand-made word list (what the tree display asks a tokenizer for)."""

    def __init__(self, vocab: list[str]):
        self.vocab = vocab

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(self.vocab[int(i)] for i in ids)

    def batch_decode(self, rows, skip_special_tokens: bool = False) -> list[str]:
        return [self.decode(r) for r in rows]


def _tree_example(context: str, nodes: list[tuple[str, int]], p_rows: dict[int, dict[str, float]],
                  uniforms: list[float], emit: str, widths: list[int]) -> ExampleRound:
    """A tree round over a small word list: `nodes` are (piece, parent) in topological order, chosen
    deterministically (one-hot q, as the draft model's top-k trees); p_rows[i] is the target's row after node i
    (-1: after the context). verify_tree decides with the given uniforms; seeds are tried until its repair or bonus
    draw is `emit`. The round is shown as the tree loop shows it (tree_round_event, tree_chain_round)."""
    vocab = list(dict.fromkeys([w for w, _ in nodes] + [w for r in p_rows.values() for w in r]))
    idx = {w: i for i, w in enumerate(vocab)}
    tokens = torch.tensor([idx[w] for w, _ in nodes])
    tree = TokenTree(tokens, [parent for _, parent in nodes], OneHot(tokens, len(vocab)))
    p = torch.stack([_row(p_rows[i], idx) for i in range(-1, len(nodes))])
    tok = WordTokenizer(vocab)
    for seed in range(1000):
        verdict = verify_tree(tree, p, torch.Generator().manual_seed(seed), uniforms=list(uniforms))
        if verdict.tokens[-1] == idx[emit]:
            break
    else:
        raise ValueError(f"verify_tree never emitted {emit!r} for this example")
    event = tree_round_event(tree, p, verdict, tok, "top-k", widths)
    rnd = tree_chain_round(0, 0, tree, p, verdict, event, list(verdict.tokens), None, 0.0, 0.0, tok, len(vocab))
    return ExampleRound(context, rnd)


@functools.lru_cache(maxsize=1)
def _example_rounds() -> dict[str, ExampleRound]:
    ctx = "Tell me where the cat is."
    reject = _example_round(
        ctx,
        [
            ("The", {"The": 62, "A": 20, "My": 10, "One": 8}, {"The": 71, "A": 15, "My": 8, "One": 6}),
            (" cat", {" cat": 48, " dog": 30, " owl": 22}, {" cat": 40, " dog": 38, " owl": 22}),
            (" sat", {" sat": 55, " ran": 25, " slept": 20}, {" sat": 61, " ran": 19, " slept": 20}),
            (" down", {" down": 50, " nearby": 20, " still": 25, " quietly": 5},
             {" down": 10, " nearby": 55, " still": 25, " quietly": 10}),
        ],
        {".": 50, " on": 30, ",": 20},
        [0.41, 0.27, 0.66, 0.58],
        emit=" nearby",
    )
    bonus = _example_round(
        ctx,
        [
            ("The", {"The": 62, "A": 20, "My": 10, "One": 8}, {"The": 71, "A": 15, "My": 8, "One": 6}),
            (" cat", {" cat": 48, " dog": 30, " owl": 22}, {" cat": 40, " dog": 38, " owl": 22}),
            (" sat", {" sat": 55, " ran": 25, " slept": 20}, {" sat": 61, " ran": 19, " slept": 20}),
            (" nearby", {" nearby": 45, " down": 35, " still": 20}, {" nearby": 55, " down": 10, " still": 35}),
        ],
        {".": 70, " on": 20, ",": 10},
        [0.41, 0.27, 0.66, 0.12],
        emit=".",
    )
    # The draft's two likeliest first words, each with its likeliest next word: widths 2,1. The target refuses
    # " cat" (u 0.62 against p 0.30), so r loses " cat"; then " dog" passes against r, and so does " ran" after it;
    # " ran" has no children, so the bonus is drawn from p after it.
    tree = _tree_example(
        "Tell me where the cat is. The",
        [(" cat", -1), (" dog", -1), (" sat", 0), (" ran", 1)],
        {-1: {" cat": 30, " dog": 50, " owl": 20}, 0: {" sat": 60, " ran": 40}, 1: {" ran": 70, " sat": 30},
         2: {" down": 100}, 3: {" away": 60, " off": 40}},
        [0.62, 0.35, 0.48],
        emit=" away", widths=[2, 1],
    )
    return {"builtin:reject": reject, "builtin:bonus": bonus, "builtin:tree": tree}


def example_rounds() -> dict[str, ExampleRound]:
    """The built-in rounds of the walkthrough: the story's rejected "down", a round where all guesses pass, and a
    token-tree round (builtin:tree, its Round.tree set)."""
    return copy.deepcopy(_example_rounds())  # built once; callers get their own copy to read or modify
