"""Predicted output: the user says what they expect the output to be, and that text is the draft.

When most of an answer is known in advance (a function being lightly edited, a document being rewritten, a form
filled in again) the expected text itself is a near-free draft. The prediction is tokenized once with the TARGET's
tokenizer; a pointer into those tokens says where the output currently is in the prediction.

Each round:
- if everything committed since the last round continues the prediction at the pointer, the next up-to-gamma
  prediction tokens after it are proposed (long runs of kept guesses where the prediction holds);
- otherwise the output has departed (an edit). The drafter then looks the last n committed tokens (n from `n_max`
  down to `n_min`, longest first, as the ngram drafter does) up in the prediction, and among the matches of the
  longest length takes the one nearest AFTER the departure point (an edit rejoins the original further on; a
  repeated line such as `return x` earlier in the prediction is a worse guess), else the nearest before it;
- no match: nothing is proposed and the round is a plain target step (the suffix grows, so a later round may match).

The proposal is a deterministic function of the committed text and the prediction, so q is one-hot on it:
verification keeps a guess x with probability p(x) and repairs from p with x removed -- exact at every temperature.

Each round's DraftNote ("predicted") says where in the prediction the guesses came from:
`source_start` is the index in the prediction's tokens of the first proposed token, and `match_len` is 0 when the
round carried straight on from the previous one, or the length of the output suffix that re-aligned the pointer
after a departure. A round that found no place to rejoin carries neither; one at the end of the prediction proposes
nothing and has source_start = the prediction's length.

`propose_tree` drafts a token tree for tree rounds (`loop.tree`): its first branch is the chain's proposal (the
prediction from the pointer on), then come the prediction after every other place where the output's last
tokens occur in it (`realign_all`: longer matches first, then the nearest at or after the pointer, then the
nearest before it), merged where they agree; one-hot on every node.
"""

from __future__ import annotations

import numpy as np

from specdec.core.errors import InvalidInputError
from specdec.core.events import DraftNote
from specdec.core.tree import TokenTree
from specdec.drafters.base import Draft, no_draft, one_hot_draft
from specdec.drafters.ngram import suffix_matches
from specdec.drafters.tree import branch_tree


def tokenize_prediction(tokenizer, text: str) -> list[int]:
    """The prediction as the target tokenizes plain text (no BOS/EOS added: it is the middle of a sequence).

    Any non-empty text is a prediction, whitespace alone included (an indentation-only edit)."""
    if not isinstance(text, str) or not text:
        raise InvalidInputError("the 'predicted' drafter needs a prediction: the text you expect the output to be")
    ids = [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]
    if not ids:
        raise InvalidInputError("the prediction produced no tokens")
    return ids


def realign(pred: np.ndarray, suffix: np.ndarray, n_max: int, n_min: int, anchor: int) -> tuple[int, int] | None:
    """Where the output rejoins the prediction: (next index in `pred`, match length) or None.

    Finds every place where the last n tokens of `suffix` occur in `pred` with at least one prediction token after
    them, n as long as possible up to n_max (and at least n_min). Among the matches of that length, the one whose
    next index is nearest at or after `anchor` wins; failing that, the nearest before it.
    """
    n_cap = min(n_max, len(suffix))
    if n_cap < n_min or len(pred) < 2:
        return None
    # Candidate match ends: prediction positions holding the last output token, excluding the final one (nothing
    # would follow it), each extended backwards while it keeps agreeing with the suffix.
    ends, match = suffix_matches(pred, suffix, n_cap)
    if ends.size == 0:
        return None
    n = min(int(match.max()), n_cap)
    if n < n_min:
        return None
    nxt = ends[match >= n] + 1  # ascending
    after = nxt[nxt >= anchor]
    return (int(after[0]) if after.size else int(nxt[-1])), n


def realign_all(pred: np.ndarray, suffix: np.ndarray, n_max: int, n_min: int, anchor: int) -> list[tuple[int, int]]:
    """Every place the output could rejoin the prediction, as realign's (next index, match length), best first:
    longer matches (up to n_max, at least n_min) first; among equally long ones those at or after `anchor` in
    ascending order, then those before it, nearest first. realign's answer is the first entry."""
    n_cap = min(n_max, len(suffix))
    if n_cap < n_min or len(pred) < 2:
        return []
    ends, match = suffix_matches(pred, suffix, n_cap)
    if ends.size == 0:
        return []
    out = []
    for n in range(min(int(match.max()), n_cap), n_min - 1, -1):
        nxt = ends[match == n] + 1  # ascending
        out += [(int(i), n) for i in nxt[nxt >= anchor]] + [(int(i), n) for i in nxt[nxt < anchor][::-1]]
    return out


class PredictedDrafter:
    """Proposes the next tokens of a user-supplied prediction, re-aligning after the output departs from it."""

    def __init__(self, prediction_ids: list[int], vocab_size: int, device, n_max: int = 4, n_min: int = 1,
                 eos_token_ids: tuple[int, ...] = ()):
        if not prediction_ids:
            raise InvalidInputError("the prediction produced no tokens")
        self.pred = np.asarray(prediction_ids, dtype=np.int64)
        self.vocab_size = vocab_size
        self.device = device
        self.n_max, self.n_min = n_max, n_min
        self.eos = set(eos_token_ids)
        self._seen: int | None = None  # length of the committed text at the previous proposal (None: none yet)
        self._ptr: int | None = 0  # prediction index the output is at; None after a departure not yet rejoined
        self._anchor = 0  # where the output last left the prediction: re-alignment prefers matches after it

    def _follow(self, committed: list[int]) -> bool:
        """Move the pointer over what was committed since the last proposal; False if the output departed.

        True means the pointer is valid and the round carries straight on from it."""
        if self._seen is None or len(committed) < self._seen:  # first call (the prompt), or a different text
            self._seen, self._ptr, self._anchor = len(committed), 0, 0
            return True
        new = committed[self._seen :]
        self._seen = len(committed)
        if self._ptr is None:
            return False
        ahead = self.pred[self._ptr : self._ptr + len(new)].tolist()
        same = 0
        while same < len(ahead) and ahead[same] == new[same]:
            same += 1
        if same == len(new):
            self._ptr += same
            return True
        self._anchor, self._ptr = self._ptr + same, None  # departed right after the last agreeing token
        return False

    def propose(self, committed, gamma, cfg, gen) -> Draft:
        matched = 0
        if not self._follow(committed):
            tail = np.asarray(committed[-self.n_max :], dtype=np.int64)
            found = realign(self.pred, tail, self.n_max, self.n_min, self._anchor)
            if found is None:
                return no_draft(self.vocab_size, self.device, DraftNote("predicted", one_hot=True))
            self._ptr, matched = found
        start = self._ptr
        tokens = self.pred[start : start + gamma].tolist()
        if not tokens:  # the output has reached the end of the prediction: the note says where it is
            return no_draft(self.vocab_size, self.device,
                            DraftNote("predicted", one_hot=True, source_start=start, match_len=matched))
        return one_hot_draft(tokens, self.vocab_size, self.device,
                             DraftNote("predicted", one_hot=True, source_start=start, match_len=matched), self.eos)

    def propose_tree(self, committed, depth, budget, cfg, gen) -> TokenTree:
        """The chain's proposal as the first branch, then the prediction after every other match of the output's
        last tokens (see the module docstring); at most `budget` nodes, empty when nothing matches."""
        starts: list[int] = []
        following = self._follow(committed)
        anchor = self._ptr if following else self._anchor
        if following:
            starts.append(self._ptr)
        tail = np.asarray(committed[-self.n_max :], dtype=np.int64)
        found = realign_all(self.pred, tail, self.n_max, self.n_min, anchor)
        if self._ptr is None and found:
            self._ptr = found[0][0]  # rejoined, as propose does
        starts += [i for i, _ in found]
        branches = [self.pred[i : i + depth].tolist() for i in dict.fromkeys(starts)]
        return branch_tree(branches, budget, self.vocab_size, self.device, self.eos)

    def feedback(self, committed, n_accepted, n_drafted) -> None:
        pass  # the pointer is moved in propose, from the committed text itself
