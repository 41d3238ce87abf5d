"""A run's acceptance metrics in the shape vLLM (v1) reports speculative decoding metrics.

vLLM counts, per engine step, with `SpecDecodingStats` (vllm/v1/spec_decode/metrics.py):
num_drafts, num_draft_tokens, num_accepted_tokens and num_accepted_tokens_per_pos, exported as the Prometheus
counters vllm:spec_decode_num_drafts, vllm:spec_decode_num_draft_tokens, vllm:spec_decode_num_accepted_tokens and
vllm:spec_decode_num_accepted_tokens_per_pos{position="i"}; its log line (`SpecDecodingLogging`) derives the mean
acceptance length 1 + accepted / drafts (counting the bonus token), the per-position acceptance rate
accepted_per_pos[i] / drafts and the draft acceptance rate accepted / draft tokens. The scheduler records a draft
only for a request that had draft tokens, so our rounds with gamma 0 (e.g. the ngram drafter found nothing) are
not drafts. docs/metrics.md ("Server metrics") documents the mapping; `export` is the one place it is computed.

Counts come from the rounds' fates, the same convention as RunRecord.metrics (specdec/core/metrics.py): a guess kept
past a committed EOS or the token budget is not counted as accepted (vLLM's scheduler counts it; the numbers differ
only in a run's last round).
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Any

from specdec.core.errors import InvalidInputError, short_repr
from specdec.core.events import KEPT
from specdec.core.record import RunRecord

FORMAT = "specdec.vllm-spec-decode-metrics/1"
PROM_PREFIX = "vllm:spec_decode_"
# key -> (type, meaning); the documented shape, checked by tests/test_server_metrics.py against docs/metrics.md
FIELDS: dict[str, tuple[type, str]] = {
    "num_spec_tokens": (int, "largest gamma of the run (vLLM: num_speculative_tokens, the per-position vector length)"),
    "num_drafts": (int, "rounds that drafted at least one token"),
    "num_draft_tokens": (int, "tokens drafted, over all rounds"),
    "num_accepted_tokens": (int, "draft tokens accepted (kept and committed)"),
    "num_accepted_tokens_per_pos": (list, "drafts whose guess at position i was accepted, i = 0..num_spec_tokens-1"),
    "mean_acceptance_length": (float, "1 + num_accepted_tokens / num_drafts (counts the bonus or repaired token)"),
    "draft_acceptance_rate": (float, "num_accepted_tokens / num_draft_tokens (a fraction; vLLM logs it in %)"),
    "per_position_acceptance_rate": (list, "num_accepted_tokens_per_pos[i] / num_drafts"),
}


def counts(record: RunRecord) -> dict[str, Any]:
    """The four vLLM counters (and the vector length) from the record's rounds."""
    drafted_rounds = [r for r in record.rounds if r.gamma > 0]
    n_spec = max((r.gamma for r in record.rounds), default=0)
    per_pos = [0] * n_spec
    for r in drafted_rounds:
        for i, fate in enumerate(r.fates):
            if fate == KEPT:  # kept guesses form a prefix, as vLLM's per-position loop assumes
                per_pos[i] += 1
    return {
        "num_spec_tokens": n_spec,
        "num_drafts": len(drafted_rounds),
        "num_draft_tokens": sum(r.gamma for r in drafted_rounds),
        "num_accepted_tokens": sum(r.kept for r in drafted_rounds),  # vLLM's name for the kept count
        "num_accepted_tokens_per_pos": per_pos,
    }


def export(record: RunRecord) -> dict[str, Any]:
    """The run's metrics as vLLM reports them: counters, the derived rates, Prometheus samples and the log line."""
    c = counts(record)
    drafts, drafted, accepted = c["num_drafts"], c["num_draft_tokens"], c["num_accepted_tokens"]
    mean_len = 1.0 + accepted / drafts if drafts else 1.0  # vLLM's compute_acceptance_len returns 1 with no drafts
    rate = accepted / drafted if drafted else float("nan")
    per_pos_rate = [n / drafts for n in c["num_accepted_tokens_per_pos"]] if drafts else [0.0] * c["num_spec_tokens"]
    out = {
        **c,
        "mean_acceptance_length": mean_len,
        "draft_acceptance_rate": rate,
        "per_position_acceptance_rate": per_pos_rate,
    }
    return {
        "format": FORMAT,
        "per_request": per_request(record),
        "source": {"run": record.display_label, "pair": record.pair.label, "drafter": record.settings.drafter,
                   "gamma_policy": record.settings.gamma_policy, "rounds": len(record.rounds),
                   "rounds_without_draft": len(record.rounds) - drafts, "created": record.created},
        "vllm": out,
        "prometheus": prometheus_samples(c),
        "log_line": log_line(out),
    }


def per_request(record: RunRecord, detailed: bool = True) -> dict[str, Any]:
    """The run as one request's acceptance record, the shape per-request reporting uses (vLLM's
    `--per-request-spec-decode-metrics summary|detailed`, normalized by AIPerf's SpecDecodeAcceptanceRecord):
    the acceptance-length histogram {kept guesses: steps} (sparse, without the bonus token), the same split by
    draft length, and with `detailed` the ordered per-step arrays."""
    steps = [r for r in record.rounds if r.gamma > 0]
    hist: dict[int, int] = {}
    by_len: dict[int, dict[int, int]] = {}
    for r in steps:
        hist[r.kept] = hist.get(r.kept, 0) + 1
        row = by_len.setdefault(r.gamma, {})
        row[r.kept] = row.get(r.kept, 0) + 1
    drafted, kept = sum(r.gamma for r in steps), sum(r.kept for r in steps)
    out: dict[str, Any] = {
        "num_spec_steps": len(steps),
        "num_draft_tokens": drafted,
        "num_accepted_draft_tokens": kept,
        "mean_acceptance_length": 1.0 + kept / len(steps) if steps else 1.0,
        "draft_acceptance_rate": kept / drafted if drafted else None,
        "acceptance_histogram": {str(k): hist[k] for k in sorted(hist)},
        "acceptance_histogram_by_draft_length": {str(g): {str(k): v[k] for k in sorted(v)}
                                                 for g, v in sorted(by_len.items())},
    }
    if detailed:
        out["per_step"] = {"num_draft_tokens": [r.gamma for r in steps],
                           "num_accepted_tokens": [r.kept for r in steps]}
    return out


@dataclass
class ServerAcceptance:
    """A vLLM server's spec-decode counters read from a /metrics scrape, summed over its label sets."""

    num_drafts: float
    num_draft_tokens: float
    num_accepted_tokens: float
    accepted_per_pos: list[float]  # position 0, 1, ...
    label_sets: int  # how many (model, engine) series were summed

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def per_position_rate(self) -> list[float]:
        return [n / self.num_drafts for n in self.accepted_per_pos] if self.num_drafts else []

    @property
    def draft_acceptance_rate(self) -> float | None:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None


MAX_SCRAPE_CHARS = 2_000_000


def parse_scrape(text: str) -> ServerAcceptance:
    """Read vLLM's spec-decode counters from Prometheus text (a `curl .../metrics` scrape) with prometheus_client's
    parser; a clear InvalidInputError when the text is not Prometheus text or has no spec-decode counters."""
    from prometheus_client.parser import text_string_to_metric_families

    if not isinstance(text, str) or not text.strip():
        raise InvalidInputError("paste a vLLM server's /metrics text (Prometheus format) first")
    if len(text) > MAX_SCRAPE_CHARS:
        raise InvalidInputError(f"the scrape is {len(text):,} characters; the limit is {MAX_SCRAPE_CHARS:,}")
    totals = {"num_drafts": 0.0, "num_draft_tokens": 0.0, "num_accepted_tokens": 0.0}
    per_pos: dict[int, float] = {}
    labels: set = set()
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = sample.name.removesuffix("_total")
                if not name.startswith(PROM_PREFIX) or sample.name.endswith("_created"):
                    continue
                key = name[len(PROM_PREFIX):]
                rest = {k: v for k, v in sample.labels.items() if k != "position"}
                labels.add(tuple(sorted(rest.items())))
                if key == "num_accepted_tokens_per_pos" and "position" in sample.labels:
                    pos = int(sample.labels["position"])
                    per_pos[pos] = per_pos.get(pos, 0.0) + sample.value
                elif key in totals:
                    totals[key] += sample.value
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise InvalidInputError(f"this is not Prometheus text that can be read: {short_repr(str(exc))}") from None
    if not labels:
        raise InvalidInputError("no vllm:spec_decode_* counters in this scrape: was speculative decoding on?")
    n_pos = max(per_pos) + 1 if per_pos else 0
    return ServerAcceptance(totals["num_drafts"], totals["num_draft_tokens"], totals["num_accepted_tokens"],
                            [per_pos.get(i, 0.0) for i in range(n_pos)], len(labels))


def prometheus_samples(c: dict[str, Any]) -> dict[str, float]:
    """Counter samples as a vLLM /metrics endpoint exposes them (prometheus_client adds _total to counters)."""
    samples = {
        f"{PROM_PREFIX}num_drafts_total": c["num_drafts"],
        f"{PROM_PREFIX}num_draft_tokens_total": c["num_draft_tokens"],
        f"{PROM_PREFIX}num_accepted_tokens_total": c["num_accepted_tokens"],
    }
    for i, n in enumerate(c["num_accepted_tokens_per_pos"]):
        samples[f'{PROM_PREFIX}num_accepted_tokens_per_pos_total{{position="{i}"}}'] = n
    return samples


def prometheus_text(exported: dict[str, Any]) -> str:
    """The samples in Prometheus text exposition format (without vLLM's engine/model labels)."""
    lines, typed = [], set()
    for name, value in exported["prometheus"].items():
        family = name.split("{", 1)[0].removesuffix("_total")
        if family not in typed:
            typed.add(family)
            lines.append(f"# TYPE {family} counter")
        lines.append(f"{name} {float(value)}")
    return "\n".join(lines) + "\n"


def log_line(m: dict[str, Any]) -> str:
    """vLLM's SpecDecodingLogging line, without the throughput fields (a single run has no logging interval)."""
    rates = ", ".join(f"{p:.3f}" for p in m["per_position_acceptance_rate"])
    pct = 100 * m["draft_acceptance_rate"] if m["num_draft_tokens"] else float("nan")
    return (f"SpecDecoding metrics: Mean acceptance length: {m['mean_acceptance_length']:.2f}, "
            f"Accepted: {m['num_accepted_tokens']} tokens, Drafted: {m['num_draft_tokens']} tokens, "
            f"Per-position acceptance rate: {rates}, Avg Draft acceptance rate: {pct:.1f}%")


def dumps(record: RunRecord) -> str:
    """JSON text of export(record); NaN (a run with no drafts) is written as null."""
    data = export(record)
    if data["vllm"]["draft_acceptance_rate"] != data["vllm"]["draft_acceptance_rate"]:
        data["vllm"]["draft_acceptance_rate"] = None
    return json.dumps(data, indent=2, ensure_ascii=False)


def write_file(record: RunRecord, folder: str | Path) -> Path:
    """Write dumps(record) to a new file in folder (for a download button); returns its path."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", record.pair.name or "run").strip("-")[:40] or "run"
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=Path(folder), suffix=".json", delete=False,
                                     prefix=f"specdec-server-metrics-{slug}-{time.strftime('%Y%m%d-%H%M%S')}-") as fh:
        fh.write(dumps(record))
    return Path(fh.name)
