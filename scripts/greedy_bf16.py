"""How often bf16 greedy speculative decoding writes the same text as bf16 plain greedy decoding, on a real pair.

Exact arithmetic would make the two identical (greedy is the one-hot case of the rule). In bf16 the verify pass
scores gamma+1 tokens in one matrix product while plain decoding scores one token at a time, and the two round
exact ties (and near-ties) differently, so the argmax can flip. This script counts the runs that differ, and where
they first do, for the model drafter and the ngram drafter over the shared prompt sets (specdec.prompts); fp32 is
run on the same prompts as the control (bit-exact on a CPU).

    python scripts/greedy_bf16.py [--pair default] [--tokens 48] [--gamma 4] [--out bench-results/greedy_bf16.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from specdec.core.settings import DecodeSettings  # noqa: E402
from specdec.loop.decoder import SpeculativeDecoder  # noqa: E402
from specdec.loop.plain import plain_decode  # noqa: E402
from specdec.models.pair import load_pair  # noqa: E402
from specdec.prompts import PROMPTS  # noqa: E402


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="default")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--drafters", default="model,ngram")
    ap.add_argument("--out", default="bench-results/greedy_bf16.json")
    args = ap.parse_args(argv)
    prompts = [(kind, p) for kind, ps in PROMPTS.items() for p in ps]
    result = {"pair": args.pair, "tokens": args.tokens, "gamma": args.gamma, "runs": []}
    for dtype in args.dtypes.split(","):
        pair = load_pair(args.pair, dtype=dtype, device="cpu")
        for kind, prompt in prompts:
            s = DecodeSettings(gamma=args.gamma, max_new_tokens=args.tokens)
            plain = plain_decode(pair, prompt, s).ids
            for drafter in args.drafters.split(","):
                dec = SpeculativeDecoder(pair, prompt, DecodeSettings(gamma=args.gamma, max_new_tokens=args.tokens,
                                                                      drafter=drafter), top_k=0)
                list(dec)
                at = first_difference(dec.generated_ids, plain)
                result["runs"].append({"dtype": dtype, "drafter": drafter, "kind": kind, "prompt": prompt[:40],
                                       "same": at is None, "first_difference": at})
                print(f"{dtype:9s} {drafter:6s} {kind:6s} {'same' if at is None else f'differs at token {at}'}",
                      flush=True)
    for dtype in args.dtypes.split(","):
        for drafter in args.drafters.split(","):
            rows = [r for r in result["runs"] if r["dtype"] == dtype and r["drafter"] == drafter]
            diff = [r["first_difference"] for r in rows if not r["same"]]
            print(f"{dtype} {drafter}: {len(diff)} of {len(rows)} runs differ from plain greedy"
                  + (f" (first difference at tokens {sorted(diff)})" if diff else ""))
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
