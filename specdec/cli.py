"""Command line: `python -m specdec generate ...` and `python -m specdec bench ...`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from specdec.core.errors import SpecDecError
from specdec.core.settings import DRAFTERS, ENGINES, TREE_MODES, VERIFY_MODES
from specdec.models.quant import QUANT_MODES


def _add_model_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--pair", default="default", help="preset pair name (default: the embedded Qwen2.5-Coder pair)")
    ap.add_argument("--target", help="target model: hub id or local folder (overrides the pair's target)")
    ap.add_argument("--draft", help="draft model: hub id or local folder (overrides the pair's draft)")
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                    help="model dtype; auto is bfloat16 on CUDA and on CPUs with native bf16, else float32")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto picks CUDA when present")
    ap.add_argument("--device-map", choices=["auto", "balanced", "balanced_low_0", "sequential", "none"],
                    help="shard the target across devices with accelerate (default: $SPECDEC_DEVICE_MAP, else none)")
    ap.add_argument("--draft-quant", choices=["none", *QUANT_MODES], default=None,
                    help="quantize the draft's weights: int8 (weight-only, per-row scales) or int4 (groups of 32 "
                         "weights); CPU with bfloat16 or float16 activations, 'auto' dtype picks bfloat16; default: "
                         "the pair's own (none, or the preset's: default-int8, default-int4)")
    ap.add_argument("--compile", dest="engine", action="store_const", const="compiled", default=None,
                    help="static KV cache with the decode and verify passes under torch.compile (CUDA graphs on a "
                         "GPU); same as --engine compiled or SPECDEC_COMPILE=1")
    ap.add_argument("--engine", dest="engine", choices=list(ENGINES),
                    help="how chain passes run: eager (dynamic cache), static (preallocated cache, eager passes) or "
                         "compiled (default: $SPECDEC_COMPILE, else eager)")


def _add_sampling_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--top-k", type=int, default=0, help="0 = off")
    ap.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    ap.add_argument("--seed", type=int, default=0,
                    help="random seed: the same seed, settings, pair, dtype and device give the same text")


def _gamma(text: str):
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"gamma must be a whole number or 'auto', got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m specdec", description="Exact speculative decoding, visible.")
    sub = ap.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text with speculative decoding")
    g.add_argument("--prompt", required=True, help="the prompt text")
    g.add_argument("--chat", action="store_true", help="wrap the prompt as a user message (chat template)")
    g.add_argument("--gamma", type=_gamma, default=4, help="draft tokens per round, or 'auto' (adaptive)")
    g.add_argument("--adaptive", choices=["expected", "heuristic", "confidence"], default="expected",
                   help="with --gamma auto: the gamma with the best predicted speedup from running alpha and c "
                        "estimates, the +2/-1 schedule, or stop drafting below --confidence-threshold")
    g.add_argument("--confidence-threshold", type=float, default=0.4,
                   help="with --adaptive confidence: end a draft after a token whose draft probability is below this")
    g.add_argument("--draft-vocab", type=int, default=None,
                   help="draft head: ids below N plus EOS and the text's own tokens; 0 = full vocabulary; "
                        "default: 65536 for large vocabularies")
    g.add_argument("--drafter", default="model", choices=list(DRAFTERS),
                   help="who proposes the guesses: the draft model, n-gram prompt lookup, the target's first "
                        "layers (early exit), a draft with another tokenizer (cross), --prediction (predicted), "
                        "auto (a copy after a strong n-gram match, else the draft model), or suffix (the most "
                        "frequent continuation in an index over the prompt and the output)")
    g.add_argument("--ngram-max", type=int, default=4, help="ngram: longest suffix matched (tried first)")
    g.add_argument("--ngram-min", type=int, default=1, help="ngram: shortest suffix matched")
    g.add_argument("--exit-layer", type=int, default=0, help="early-exit: layers that draft (0 = a quarter)")
    pg = g.add_mutually_exclusive_group()
    pg.add_argument("--prediction", metavar="TEXT", default="", help="predicted: the text you expect the output to be")
    pg.add_argument("--prediction-file", metavar="F", help="predicted: read the expected output from file F (UTF-8)")
    g.add_argument("--verify", default="pq", choices=list(VERIFY_MODES),
                   help="how the target checks the guesses: pq keeps x with probability min(1, p/q); strict keeps it "
                        "only if the target's own draw is x; block judges the guesses jointly (keeps at least as "
                        "many as pq in expectation); all three are exact")
    g.add_argument("--max-new-tokens", type=int, default=64, help="token budget of the run")
    g.add_argument("--trace", metavar="FILE", help="write the run as a specdec trace (JSON) to FILE")
    _add_sampling_args(g)
    _add_model_args(g)
    g.add_argument("--tree", metavar="WIDTHS", help="draft a token tree with the draft model: children per node at "
                   "each depth, e.g. 3,2,1 (one target pass scores every node); with --drafter ngram or predicted "
                   "the tree is copied, a branch per distinct continuation, within the shape's depth (its length) "
                   "and node count, e.g. 4,1,1,1,1,1 for up to four branches of six tokens")
    g.add_argument("--tree-mode", default="top-k", choices=list(TREE_MODES),
                   help="how a node's children are chosen: the draft's likeliest ids (one-hot q), i.i.d. samples, "
                        "samples without replacement, or dynamic: the tree shaped by the draft's confidence (at each "
                        "depth the w likeliest paths get w children each; a round keeps as many nodes, and drafts as "
                        "many depths, as this run's measured costs say pay; one-hot q)")
    g.add_argument("--compare", action="store_true",
                   help="also run plain target decoding (before and after the speculative run; the faster counts) "
                        "and report the speedup")
    g.add_argument("--json", action="store_true", help="one JSON object per round, then a summary object")

    b = sub.add_parser("bench", help="benchmark against plain decoding and transformers assisted generation")
    from specdec.bench.cli import add_bench_args

    add_bench_args(b)
    _add_model_args(b)
    return ap


def decode_settings(args):
    from specdec.core.settings import DecodeSettings
    from specdec.core.sampling import SamplingConfig

    auto = args.gamma == "auto"
    return DecodeSettings(
        gamma=4 if auto else args.gamma,
        max_new_tokens=args.max_new_tokens,
        sampling=SamplingConfig(args.temperature, args.top_k, args.top_p),
        seed=args.seed,
        chat=args.chat,
        gamma_policy=args.adaptive if auto else "fixed",
        confidence_threshold=args.confidence_threshold,
        draft_vocab=args.draft_vocab,
        drafter=args.drafter,
        ngram_max=args.ngram_max,
        ngram_min=args.ngram_min,
        exit_layer=args.exit_layer,
        prediction=_prediction(args),
        verify=args.verify,
    ).validate()


def _prediction(args) -> str:
    """--prediction TEXT or the contents of --prediction-file F (an unreadable file is refused clearly)."""
    path = getattr(args, "prediction_file", None)
    if not path:
        return getattr(args, "prediction", "") or ""
    from specdec.core.errors import InvalidInputError

    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"cannot read the prediction file {path!r}: {exc}") from None


def load_from_args(args):
    from specdec.models.pair import load_pair

    return load_pair(args.pair, target=args.target, draft=args.draft, dtype=args.dtype, device=args.device,
                     device_map=getattr(args, "device_map", None), draft_quant=getattr(args, "draft_quant", None),
                     progress=lambda m: print(m, file=sys.stderr, flush=True), engine=getattr(args, "engine", None))


def cmd_generate(args) -> int:
    from specdec.loop.decoder import SpeculativeDecoder
    from specdec.loop.plain import plain_decode
    from specdec.core.metrics import StepCosts, time_breakdown

    settings = decode_settings(args)
    if args.tree:
        return cmd_generate_tree(args, settings)
    pair = load_from_args(args)
    dec = SpeculativeDecoder(pair, args.prompt, settings)  # validates the prompt before any timing
    baseline = draft_only = None
    if args.compare:
        warm = type(settings)(max_new_tokens=2, chat=settings.chat)
        plain_decode(pair, args.prompt, warm)  # first calls pay one-time allocation costs; keep them out
        plain_decode(pair, args.prompt, warm, model="draft")
        baseline = plain_decode(pair, args.prompt, settings)
        draft_only = plain_decode(pair, args.prompt, type(settings)(max_new_tokens=min(16, settings.max_new_tokens),
                                                                     chat=settings.chat), model="draft")
    for rnd in dec:
        if args.json:
            print(json.dumps(rnd.to_dict()), flush=True)
    if baseline:
        # Plain decoding again, after the speculative run, and the faster of the two kept (other load only adds
        # time): a fresh process's first full decode pays for memory it has not touched yet, which would credit
        # the speculative run with a speedup a warm process does not see.
        again = plain_decode(pair, args.prompt, settings)
        baseline = min(baseline, again, key=lambda b: sum(b.token_ms))
    costs = StepCosts(baseline.ms_per_token, draft_only.ms_per_token) if baseline and draft_only else None
    record = dec.record(costs)
    m = record.metrics
    if args.trace:
        from specdec.io.trace import dumps_trace

        Path(args.trace).write_text(dumps_trace(record), encoding="utf-8")
    spec_tok_s = 1e3 * len(dec.generated_ids) / dec.totals.elapsed_ms if dec.totals.elapsed_ms else 0.0
    summary = {
        "text": dec.text,
        "tokens": len(dec.generated_ids),
        "rounds": len(dec.rounds),
        "acceptance_rate": m.kept_rate,  # the JSON names of the kept counts (RunMetrics.JSON_NAMES)
        "alpha": m.alpha,
        "tokens_per_round": m.tokens_per_round,
        "per_position_acceptance": m.kept_per_position,
        "accepted_histogram": m.kept_histogram,
        "stop_reason": dec.stop_reason,
        "models": pair.describe(),
        "verify": settings.verify,
        "time_ms": time_breakdown(dec.rounds, costs).to_dict()["total"],
        "time_reading": time_breakdown(dec.rounds, costs).reading,
    }
    if baseline:
        summary.update(
            baseline_text=baseline.text,
            baseline_tok_s=baseline.tok_s,
            speculative_tok_s=spec_tok_s,
            speedup=spec_tok_s / baseline.tok_s if baseline.tok_s else None,
            c_plain=m.c_plain,
            c_loop=m.c_loop,
            predicted_speedup=m.predicted_speedup,
            same_text=baseline.ids == dec.generated_ids,
        )
    if args.json:
        print(json.dumps(summary), flush=True)
        return 0
    print(dec.text)
    line = (f"-- {summary['tokens']} tokens in {summary['rounds']} rounds | kept {m.kept_rate:.1%} of guesses | "
            f"{m.tokens_per_round:.2f} tokens/round (incl. repaired/bonus) | {spec_tok_s:.2f} tok/s")
    if baseline:
        line += f" | plain {baseline.tok_s:.2f} tok/s | speedup {summary['speedup']:.2f}x"
        line += (f" (predicted {m.predicted_speedup:.2f}x at c_loop={m.c_loop:.2f}, mean gamma {m.mean_gamma:.1f})"
                 if m.predicted_speedup and m.c_loop is not None else "")
    print(line, file=sys.stderr)
    return 0


def cmd_generate_tree(args, settings) -> int:
    """generate --tree: tree rounds (loop.tree); prints the text and tokens per target pass."""
    from specdec.core.errors import InvalidInputError
    from specdec.drafters.tree import check_widths
    from specdec.loop.tree import TreeDecoder

    try:
        widths = check_widths([int(w) for w in args.tree.split(",")], args.tree_mode)
    except ValueError as exc:
        if isinstance(exc, InvalidInputError):
            raise
        raise InvalidInputError(f"--tree takes comma-separated widths, e.g. 3,2,1; got {args.tree!r}") from None
    dec = TreeDecoder(load_from_args(args), args.prompt, settings, widths, args.tree_mode)
    for _ in dec:
        pass
    if args.trace:  # every round with its whole tree (docs/trace-schema.md, "Tree rounds")
        from specdec.io.trace import dumps_trace
        from specdec.loop.tree_display import TreeRun

        Path(args.trace).write_text(dumps_trace(TreeRun(dec).record()), encoding="utf-8")
    text = dec.pair.tokenizer.decode(dec.generated_ids, skip_special_tokens=True)
    summary = {"text": text, "tokens": len(dec.generated_ids), "target_passes": len(dec.rounds),
               "tokens_per_pass": len(dec.generated_ids) / len(dec.rounds), "tree": widths, "tree_mode": args.tree_mode,
               "drafter": settings.drafter,
               "nodes_per_tree": sum(r.tree.size for r in dec.rounds) / len(dec.rounds),
               "stop_reason": dec.stop_reason, "models": dec.pair.describe()}
    if args.json:
        print(json.dumps(summary), flush=True)
        return 0
    print(text)
    print(f"-- {summary['tokens']} tokens in {summary['target_passes']} target passes "
          f"({summary['tokens_per_pass']:.2f} per pass) with {settings.drafter} {args.tree_mode} trees {args.tree} "
          f"({summary['nodes_per_tree']:.1f} nodes each)", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    try:
        if args.command == "generate":
            return cmd_generate(args)
        from specdec.bench.cli import cmd_bench

        return cmd_bench(args, lambda: load_from_args(args))
    except SpecDecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
