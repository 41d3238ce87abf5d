"""The three verification rules on the same drafts, across temperatures: how many guesses each keeps.

For each temperature and prompt one run decodes with the draft model under the pq rule; every round also records
what strict and block verification would have kept from the same guesses with the same uniforms
(`Round.same_draft`, from `core.verify.same_draft_verdicts`). Pooled per temperature and rule: the share of
guesses kept and the tokens one target pass produces (kept + 1 per round), both as each rule's expectation given
the draft (`core.verify.expected_kept`): the same drafts for every rule and no draw noise, so the difference
between rules is the rules', not the runs'. (Kept counts under the run's own uniforms are recorded too; block
uses its uniforms differently from pq, so those are not paired draw by draw.)

`python -m specdec bench --verify-modes` measures it on the loaded pair and writes the JSON the Learn tab charts.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from specdec.bench.defaults import VERIFY_MODES_ASSET, resolve
from specdec.core.sampling import SamplingConfig
from specdec.core.settings import VERIFY_MODES, DecodeSettings
from specdec.loop.decoder import SpeculativeDecoder

TEMPERATURES = (0.0, 0.3, 0.7, 1.0)
PROMPTS = ("def fibonacci(n):\n    ", "The history of the printing press begins",
           "Q: What is the capital of France?\nA:")
DEFAULT_OUT = VERIFY_MODES_ASSET  # what the Learn tab reads


@dataclass
class ModePoint:
    temperature: float
    mode: str
    rounds: int
    drafted: int
    kept: int  # kept with the run's own uniforms
    expected: float  # sum over rounds of the guesses the rule keeps on average from that draft (fresh uniforms)

    @property
    def kept_share(self) -> float:
        """Expected share of drafted guesses kept (the conditional expectation per draft: no draw noise)."""
        return self.expected / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_pass(self) -> float:
        return (self.expected + self.rounds) / self.rounds if self.rounds else 0.0


def measure(pair, temperatures=TEMPERATURES, prompts=PROMPTS, gamma: int = 4, max_new_tokens: int = 32,
            seed: int = 0) -> list[ModePoint]:
    """One pq run per (temperature, prompt); each round's three same-draft verdicts pooled per rule."""
    points = []
    for t in temperatures:
        pooled = {m: ModePoint(float(t), m, 0, 0, 0, 0.0) for m in VERIFY_MODES}
        for prompt in prompts:
            s = DecodeSettings(gamma=gamma, max_new_tokens=max_new_tokens, seed=seed,
                               sampling=SamplingConfig(temperature=float(t)))
            for rnd in SpeculativeDecoder(pair, prompt, s, top_k=1):
                for v in rnd.same_draft:
                    pt = pooled[v.mode]
                    pt.rounds, pt.drafted, pt.kept = pt.rounds + 1, pt.drafted + rnd.gamma, pt.kept + v.n_accepted
                    pt.expected += v.expected
        points += list(pooled.values())
    return points


def to_json(points: list[ModePoint], pair_label: str) -> str:
    rows = [{**asdict(p), "kept_share": p.kept_share, "tokens_per_pass": p.tokens_per_pass} for p in points]
    return json.dumps({"pair": pair_label, "points": rows}, indent=1)


def load(path: str | Path = DEFAULT_OUT) -> tuple[str, list[ModePoint]] | None:
    """The measured points shipped with the app (None when the file is missing or unreadable)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
        return doc["pair"], [ModePoint(r["temperature"], r["mode"], r["rounds"], r["drafted"], r["kept"], r["expected"])
                             for r in doc["points"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def cmd_verify_modes(args, load_pair) -> int:
    run = resolve(args, "verify-modes")
    pair = load_pair()
    points = measure(pair, max_new_tokens=run.max_new_tokens)
    out = run.out
    info = pair.describe()
    Path(out).write_text(to_json(points, f"{info['target']} + {info['draft']} ({info['dtype']})"), encoding="utf-8")
    print(f"{'T':>4} {'rule':>7} {'kept/drafted':>13} {'tokens/pass':>12} {'rounds':>7}")
    for p in points:
        print(f"{p.temperature:>4.1f} {p.mode:>7} {p.kept_share:>13.3f} {p.tokens_per_pass:>12.2f} {p.rounds:>7}")
    print(f"wrote {out}")
    return 0
