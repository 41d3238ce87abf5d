"""The `bench` command's flags and which mode runs: the only module of specdec.bench that knows every mode.

Flags left out take the mode's own defaults, from the one table in specdec.bench.defaults."""

from __future__ import annotations

import argparse

from specdec.bench.defaults import BENCH_KINDS, BENCH_MODES, BENCH_OUT


def add_bench_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quick", action="store_true", help="one prompt per kind, the mode's short token budget, 1 repeat (< 3 min "
                    "on 2 cores)")
    ap.add_argument("--gamma", default="4", help="draft length, or 'auto' to compare adaptive policies")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="tokens per run (default: the mode's own)")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per prompt (default: the mode's own)")
    ap.add_argument("--modes", default=None, help=f"comma list of greedy,sampled (temperature 0.7); default "
                    f"{BENCH_MODES}, greedy for --drafter, --suite, --engines and --quant-draft")
    ap.add_argument("--kinds", default=None, help=f"comma list of prompt kinds; default {BENCH_KINDS}, or the mode's "
                    "own (specdec/bench/defaults.py)")
    ap.add_argument("--sweep-gamma", default=None, help="e.g. 1..12: measured vs predicted speedup per gamma")
    ap.add_argument("--policy", default="fixed", choices=["fixed", "expected", "heuristic", "confidence"],
                    help="gamma policy of our loop (d) in the side-by-side table; (b) always uses a constant gamma")
    ap.add_argument("--draft-vocab", type=int, default=None,
                    help="our loop's draft head: ids below N plus EOS and the text's own tokens; 0 = full "
                         "vocabulary; default: 65536 for large vocabularies")
    ap.add_argument("--out", default=None, help=f"the JSON result (default: {BENCH_OUT}, or the mode's own file)")
    ap.add_argument("--drafter", choices=["model", "ngram", "early-exit", "cross"], default=None,
                    help="one drafter against transformers' own equivalent, plain generate() and our plain decoding, "
                         "on the input-grounded prompts (specdec/bench/drafters.py)")
    ap.add_argument("--equiv-gamma", type=int, default=None,
                    help="with --drafter: run transformers' equivalent at this gamma instead of --gamma (e.g. its own "
                         "best setting, to compare best against best in one run)")
    ap.add_argument("--overhead", action="store_true", help="per-round time outside the model forward passes, "
                    "by category (JSON to bench-results/overhead.json unless --out)")
    ap.add_argument("--predicted", action="store_true", help="light edits, the original text as the prediction: "
                    "predicted drafter vs plain and ngram (JSON to bench-results/predicted.json unless --out)")
    ap.add_argument("--per-kind", type=int, default=None, help="with --suite: prompts per task kind (default: all)")
    ap.add_argument("--split", choices=["test", "tune"], default="test",
                    help="with --suite: the prompt half to run; defaults are tuned on 'tune' and reported on 'test' "
                         "(specdec.prompts.SUITE_SPLITS)")
    ap.add_argument("--contenders", default=None, help="with --suite: comma-separated contenders to run (e.g. "
                    "model,auto,hf_assisted; default: all); plain generate() always runs, every speedup is over it")
    ap.add_argument("--tree", action="store_true", help="chains against token trees: the draft model's chain and "
                    "top-k trees, prompt lookup's chain and copy tree, our plain decoding and transformers' assisted "
                    "generation, on code, prose, chat and grounded prompts (JSON to bench-results/trees.json)")
    ap.add_argument("--suite", action="store_true", help="the Spec-Bench-shaped suite: six task kinds, greedy, ours "
                    "(model, ngram, suffix, auto) against transformers (assisted at its defaults and at γ 4, prompt "
                    "lookup at 5, 10 and 20 tokens) "
                    "and plain generate(); --kinds picks kinds, --quick one prompt each (JSON to "
                    "bench-results/suite.json unless --out)")
    ap.add_argument("--quant-draft", action="store_true",
                    help="bf16 draft vs weight-only int8 (reduced head 65,536 and 32,768 ids) and int4 copies of it vs "
                         "plain target decoding, greedy, on code, prose, chat and grounded prompts (bf16 on the CPU; "
                         "JSON to bench-results/quant-draft.json unless --out)")
    ap.add_argument("--verify-modes", action="store_true", help="pq, strict and block verification on the same "
                    "drafts at temperatures 0, 0.3, 0.7 and 1 (JSON to assets/verify_modes.json unless --out)")
    ap.add_argument("--engines", action="store_true", help="eager, static-cache and compiled engines side by side: "
                    "plain decoding and the draft-model loop on each, compilation timed apart (JSON to "
                    "bench-results/engines.json unless --out)")
    ap.add_argument("--batch", default=None, help="e.g. 1,2,4,8,16: batched speculative vs plain batched decoding "
                    "per batch size (latency vs throughput; JSON to bench-results/batch.json unless --out)")
    ap.add_argument("--loops", default=None, help="with --batch: comma list of lockstep,ragged,scheduled,tree, the "
                    "speculative loops measured beside plain batched decoding (default: all four)")
    ap.add_argument("--gamma-max", type=int, default=None, help="with --batch: the longest draft the scheduled "
                    "loop's γ-by-B table may choose (default 8)")


def cmd_bench(args, load) -> int:
    """Run the mode the flags ask for; `load()` returns the pair the command line asked for."""
    if args.drafter:  # one drafter against its transformers equivalent
        from specdec.bench.drafters import cmd_drafter_bench as cmd
    elif args.batch:  # batched decoding
        from specdec.bench.batch import cmd_batch_bench as cmd
    elif args.tree:  # chains against token trees
        from specdec.bench.trees import cmd_tree_bench as cmd
    elif args.suite:  # the Spec-Bench-shaped suite
        from specdec.bench.suite import cmd_suite as cmd
    elif args.engines:  # eager vs static vs compiled
        from specdec.bench.engines import cmd_engines_bench as cmd
    elif args.quant_draft:  # the int8 and int4 drafts against the bf16 one
        from specdec.bench.quant_draft import cmd_quant_draft_bench as cmd
    elif args.verify_modes:  # the three verification rules on the same drafts
        from specdec.bench.verify_modes import cmd_verify_modes as cmd
    elif args.predicted:  # predicted output on its own edit tasks
        from specdec.bench.predicted import cmd_predicted_bench as cmd
    elif args.overhead:  # per-round time outside the forward passes
        from specdec.bench.overhead import cmd_overhead as cmd
    else:  # side by side with transformers (or --sweep-gamma, --gamma auto)
        from specdec.bench.speed import cmd_speed as cmd
    return cmd(args, load)
