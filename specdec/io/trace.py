"""Write a RunRecord as a JSON trace, and read one back for replay without any model.

The format is documented in docs/trace-schema.md. In short::

    {"schema": "specdec.trace", "version": 3, "created": "2025-01-01T12:00:00+00:00",
     "settings": {...DecodeSettings, with "sampling": {...}}, "models": {...PairInfo},
     "prompt": "text" | [{"role": ..., "content": ...}], "prompt_ids": [...], "text": "...",
     "rounds": [Round.to_dict(), ...], "costs": {"target_ms", "draft_ms"} | null, "metrics": {...}}

This module is the JSON boundary: `record_to_dict` / `dumps_trace` turn a RunRecord into JSON, `load_trace`
turns JSON into a RunRecord. Traces come from strangers (uploads in a public app), so `load_trace` trusts nothing:
every malformed input, from binary garbage to a round whose accepted prefix contradicts its own uniforms, raises
`TraceError` with a message that names the offending field. Nothing else escapes it. The `metrics` object is
written for readers of the file; on import it is checked and then recomputed from the rounds.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, fields
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from specdec.core.errors import InvalidInputError, TraceError, whole_number
from specdec.core.events import COPY_SOURCES, DraftNote, Round
from specdec.core.metrics import StepCosts
from specdec.core.record import PairInfo, RunRecord
from specdec.core.sampling import SamplingConfig
from specdec.core.stop import StopReason
from specdec.core.verify import kept_count
from specdec.core.settings import (DRAFTERS, GAMMA_POLICIES, MAX_GAMMA, MAX_TREE_NODES, VERIFY_MODES,
                                   DecodeSettings)
from specdec.core.tree_events import (BONUS, Q_KINDS, REPAIR, TREE_ACCEPTED, TREE_FATES, TREE_UNTRIED, TreeNodeView,
                                      TreeRoundEvent)

SCHEMA = "specdec.trace"
# 2: rounds may draft nothing (gamma 0), carry top_k and a draft note; totals count committed guesses.
# 3: rounds carry `asked` (the gamma the policy asked for); totals call kept guesses "kept" (v1/v2: "accepted").
VERSION = 3
MAX_TRACE_BYTES = 20 * 1024 * 1024  # a 4096-token run at gamma 4 is ~5 MB; anything far larger is not ours
STOP_REASONS = tuple(r.value for r in StopReason)
PROB_SLACK = 1e-5  # float32 probabilities may overshoot 1 by rounding

REQUIRED_KEYS = ("schema", "version", "created", "settings", "models", "prompt", "prompt_ids", "text", "rounds")


# --------------------------------------------------------------------------------------------------- export


def record_to_dict(record: RunRecord) -> dict:
    """The JSON-ready trace of a run. Values that are not finite numbers are written as null (JSON has no NaN)."""
    metrics = record.metrics.to_dict()
    metrics["stop_reason"] = record.stop_reason
    return {
        "schema": SCHEMA,
        "version": VERSION,
        "created": record.created,
        "label": record.label,
        "settings": asdict(record.settings),
        "models": asdict(record.pair),
        "prompt": record.prompt,
        "prompt_ids": list(record.prompt_ids),
        "text": record.text,
        "rounds": [r.to_dict() for r in record.rounds],
        "costs": asdict(record.costs) if record.costs else None,
        "baseline_ms_per_token": record.baseline_ms_per_token,
        "baseline_steps": record.baseline_steps,
        "baseline_prompt_ms": record.baseline_prompt_ms,
        "metrics": _finite_or_null(metrics),
    }


def _finite_or_null(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_null(v) for v in value]
    return value


def dumps_trace(record: RunRecord | dict) -> str:
    """Compact JSON text of a run's trace (a RunRecord, or its `record_to_dict` form); refuses one that
    `load_trace` would refuse for its size."""
    data = record_to_dict(record) if isinstance(record, RunRecord) else record
    try:
        text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise TraceError(f"this trace cannot be written as JSON: {exc}") from exc
    size = len(text.encode("utf-8"))
    if size > MAX_TRACE_BYTES:
        raise TraceError(
            f"this run's trace would be {size / 2**20:.1f} MB, over the {MAX_TRACE_BYTES // 2**20} MB limit for "
            "trace files; export a shorter run (fewer tokens or a smaller gamma)"
        )
    return text


# --------------------------------------------------------------------------------------------------- import


def load_trace_file(path: str | Path) -> RunRecord:
    """Load a trace from a file, checking its size before reading it (uploads can be anything)."""
    p = Path(path)
    try:
        size = p.stat().st_size
        _check_size(size)
        data = p.read_bytes()
    except OSError as exc:
        raise TraceError(f"the trace file could not be read: {exc.strerror or exc}") from exc
    return load_trace(data)


def load_trace(text_or_bytes: str | bytes | bytearray) -> RunRecord:
    """Parse and validate a trace; raises TraceError, naming the bad field, for anything that is not one."""
    doc = _parse_json(text_or_bytes)
    _check_header(doc)
    settings = settings_from_dict(doc["settings"])
    pair = _check_models(doc["models"])
    vocab = pair.vocab_size or None  # 0 means "unknown", as for a pair described before loading
    prompt = _check_prompt(doc["prompt"])
    prompt_ids = _token_ids(doc["prompt_ids"], "prompt_ids", vocab, allow_empty=False)
    text = _string(doc["text"], "text")
    metrics = doc.get("metrics")
    if metrics is not None and not isinstance(metrics, dict):
        raise TraceError(f"'metrics' must be a JSON object, got {_kind(metrics)}")
    rounds = _check_rounds(doc["rounds"], vocab, settings.max_new_tokens)
    label = doc.get("label") or ""
    baseline = doc.get("baseline_ms_per_token")
    if baseline is not None:
        _duration(baseline, "baseline_ms_per_token")
    prompt_ms = doc.get("baseline_prompt_ms")
    if prompt_ms is not None:
        _duration(prompt_ms, "baseline_prompt_ms")
    steps = doc.get("baseline_steps", 0)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise TraceError(f"'baseline_steps' must be a whole number >= 0, got {_short(steps)}")
    return RunRecord(
        prompt=prompt,
        prompt_ids=prompt_ids,
        settings=settings,
        pair=pair,
        rounds=rounds,
        text=text,
        stop_reason=rounds[-1].stop_reason if rounds else None,
        costs=_check_costs(doc.get("costs")),
        baseline_ms_per_token=float(baseline) if baseline else None,
        baseline_steps=steps if baseline else 0,
        baseline_prompt_ms=float(prompt_ms) if baseline and prompt_ms else None,
        label=_string(label, "label"),
        created=doc["created"],
    )


def _check_costs(d) -> StepCosts | None:
    if d is None:
        return None
    if not isinstance(d, dict):
        raise TraceError(f"'costs' must be a JSON object or null, got {_kind(d)}")
    for key in ("target_ms", "draft_ms"):
        if key not in d:
            raise TraceError(f"'costs' is missing '{key}'")
        _duration(d[key], f"costs.{key}")
    return StepCosts(float(d["target_ms"]), float(d["draft_ms"]))


def settings_from_dict(d: dict) -> DecodeSettings:
    """Rebuild DecodeSettings from a trace's settings object (unknown keys are ignored, missing optional ones
    take their defaults); raises TraceError when the values would not be accepted by the decoder."""
    if not isinstance(d, dict):
        raise TraceError(f"'settings' must be a JSON object, got {_kind(d)}")
    for key in ("gamma", "max_new_tokens", "seed", "sampling"):
        if key not in d:
            raise TraceError(f"'settings' is missing '{key}'")
    s = d["sampling"]
    if not isinstance(s, dict):
        raise TraceError(f"'settings.sampling' must be a JSON object, got {_kind(s)}")
    for key in ("temperature", "top_k", "top_p"):
        if key not in s:
            raise TraceError(f"'settings.sampling' is missing '{key}'")
    known = {f.name for f in fields(DecodeSettings)} - {"sampling"}
    sampling = SamplingConfig(temperature=s["temperature"], top_k=s["top_k"], top_p=s["top_p"])
    settings = DecodeSettings(sampling=sampling, **{k: v for k, v in d.items() if k in known})
    _check_setting_types(settings)
    try:
        return settings.validate()
    except InvalidInputError as exc:
        raise TraceError(f"'settings' are not valid decoder settings: {exc}") from exc


def _check_setting_types(s: DecodeSettings) -> None:
    # DecodeSettings.validate checks ranges of values a person typed; a trace can put any JSON value anywhere,
    # and a string where a number belongs would make validate() itself fail with a TypeError.
    if not isinstance(s.chat, bool):
        raise TraceError(f"'settings.chat' must be true or false, got {_kind(s.chat)}")
    if not isinstance(s.gamma_policy, str) or s.gamma_policy not in GAMMA_POLICIES:
        choices = ", ".join(GAMMA_POLICIES)
        raise TraceError(f"'settings.gamma_policy' must be one of {choices}, got {_short(s.gamma_policy)}")
    if not isinstance(s.drafter, str) or s.drafter not in DRAFTERS:
        raise TraceError(f"'settings.drafter' must be one of {', '.join(DRAFTERS)}, got {_short(s.drafter)}")
    if not isinstance(s.verify, str) or s.verify not in VERIFY_MODES:
        raise TraceError(f"'settings.verify' must be one of {', '.join(VERIFY_MODES)}, got {_short(s.verify)}")
    numbers = {"confidence_threshold": s.confidence_threshold, "sampling.temperature": s.sampling.temperature,
               "sampling.top_p": s.sampling.top_p}
    for name, value in numbers.items():
        if not _is_number(value):
            raise TraceError(f"'settings.{name}' must be a finite number, got {_short(value)}")


# ------------------------------------------------------------------------------------------- document level


def _check_size(n_bytes: int) -> None:
    if n_bytes > MAX_TRACE_BYTES:
        raise TraceError(
            f"the trace file is {n_bytes / 2**20:.1f} MB; the limit is {MAX_TRACE_BYTES // 2**20} MB"
        )


def _reject_constant(name: str):
    raise TraceError(f"the trace contains {name}, which is not valid JSON; probabilities and times must be finite")


def _finite_float(literal: str) -> float:
    # A literal such as 1e400 parses to inf: refused here, so no field (checked or not) can hold a value that
    # could not be written back out.
    x = float(literal)
    if not math.isfinite(x):
        raise TraceError(f"the trace contains the number {_short(literal, 30)}, which overflows; every number must "
                         "be finite")
    return x


def _parse_json(text_or_bytes) -> dict:
    if isinstance(text_or_bytes, (bytes, bytearray, memoryview)):
        _check_size(len(text_or_bytes))
        try:
            text = bytes(text_or_bytes).decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise TraceError("the trace is not UTF-8 text; is this the JSON file specdec exported?") from exc
    elif isinstance(text_or_bytes, str):
        # A str is at most 4 bytes per character; encode only when that bound does not already settle it.
        if len(text_or_bytes) * 4 > MAX_TRACE_BYTES:
            _check_size(len(text_or_bytes.encode("utf-8", "surrogatepass")))
        text = text_or_bytes
    else:
        raise TraceError(f"a trace must be JSON text or bytes, got {_kind(text_or_bytes)}")
    try:
        doc = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError as exc:
        raise TraceError("the trace is nested too deeply to be a specdec trace") from exc
    except ValueError as exc:  # JSONDecodeError, and lone surrogates that Python rejects
        if isinstance(exc, TraceError):
            raise
        raise TraceError(f"the trace is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise TraceError(f"a trace must be a JSON object, got {_kind(doc)}")
    return doc


def _check_header(doc: dict) -> None:
    if "schema" not in doc:
        raise TraceError("this JSON is not a specdec trace: it has no 'schema' field")
    if doc["schema"] != SCHEMA:
        raise TraceError(f"this JSON is not a specdec trace: schema is {_short(doc['schema'])}, expected '{SCHEMA}'")
    v = doc.get("version")
    if not _is_int(v):
        raise TraceError(f"the trace 'version' must be a whole number, got {_short(v)}")
    if v > VERSION:
        raise TraceError(
            f"this trace has version {v}, written by a newer specdec; this one reads version {VERSION}. "
            "Update specdec to open it"
        )
    if v < 1:
        raise TraceError(f"unknown trace version {v}; this specdec reads version {VERSION}")
    missing = [k for k in REQUIRED_KEYS if k not in doc]
    if missing:
        raise TraceError(f"the trace is missing {', '.join(repr(k) for k in missing)}")
    created = doc["created"]
    if not isinstance(created, str):
        raise TraceError(f"'created' must be an ISO 8601 time string, got {_kind(created)}")
    try:
        datetime.fromisoformat(created)
    except ValueError as exc:
        raise TraceError(f"'created' is not an ISO 8601 time: {_short(created)}") from exc


MODEL_STRINGS = ("name", "target", "draft")


def _check_models(d) -> PairInfo:
    if not isinstance(d, dict):
        raise TraceError(f"'models' must be a JSON object, got {_kind(d)}")
    for key in MODEL_STRINGS:
        if key not in d:
            raise TraceError(f"'models' is missing '{key}'")
    for key in MODEL_STRINGS + ("device", "dtype"):
        if key in d and not isinstance(d[key], str):
            raise TraceError(f"'models.{key}' must be a string, got {_kind(d[key])}")
    if "vocab_size" in d and not (_is_int(d["vocab_size"]) and d["vocab_size"] >= 0):
        raise TraceError(f"'models.vocab_size' must be a whole number >= 0, got {_short(d['vocab_size'])}")
    known = {f.name for f in fields(PairInfo)}
    return PairInfo(**{k: v for k, v in d.items() if k in known})


def _check_prompt(p):
    if isinstance(p, str):
        return p
    if isinstance(p, list):
        for i, m in enumerate(p):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise TraceError(f"'prompt[{i}]' must be a chat message {{'role': str, 'content': str}}")
        return p
    raise TraceError(f"'prompt' must be a string or a list of chat messages, got {_kind(p)}")


# --------------------------------------------------------------------------------------------- round level


ROUND_KEYS = tuple(f.name for f in fields(Round))
OPTIONAL_ROUND_KEYS = {"round_ms": 0.0, "totals": None, "stop_reason": None, "top_k": 8, "note": None,
                       "asked": None, "tree": None, "verify": "pq", "same_draft": [],
                       "rule_ms": 0.0, "cache_ms": 0.0, "display_ms": 0.0}  # added later
TOTALS_INTS = ("rounds", "generated", "drafted", "kept", "accepted", "tested", "target_passes")  # accepted: v1/v2
NOTE_INTS = ("source_start", "match_len", "layers", "total_layers")
TOTALS_FLOATS = ("draft_ms", "verify_ms", "elapsed_ms")


def _check_rounds(rows, vocab: int | None, max_new_tokens: int) -> list[Round]:
    if not isinstance(rows, list):
        raise TraceError(f"'rounds' must be a list, got {_kind(rows)}")
    rounds, position = [], 0
    for i, row in enumerate(rows):
        rnd = _check_round(row, f"rounds[{i}]", vocab)
        if rnd.index != i:
            raise TraceError(f"rounds[{i}].index is {rnd.index}; rounds must be numbered 0, 1, 2, ... in order")
        if rnd.position != position:
            raise TraceError(
                f"rounds[{i}].position is {rnd.position}, but the rounds before it committed {position} tokens"
            )
        if rnd.stop_reason is not None and i != len(rows) - 1:
            raise TraceError(f"rounds[{i}] stops the run ({rnd.stop_reason}) but more rounds follow it")
        position += len(rnd.committed_ids)
        rounds.append(rnd)
    if position > max_new_tokens:
        raise TraceError(f"the rounds commit {position} tokens, more than settings.max_new_tokens = {max_new_tokens}")
    return rounds


def _check_round(d, where: str, vocab: int | None) -> Round:
    if not isinstance(d, dict):
        raise TraceError(f"{where} must be a JSON object, got {_kind(d)}")
    missing = [k for k in ROUND_KEYS if k not in d and k not in OPTIONAL_ROUND_KEYS]
    if missing:
        raise TraceError(f"{where} is missing {', '.join(repr(k) for k in missing)}")
    _whole(d["index"], f"{where}.index", 0)
    _whole(d["position"], f"{where}.position", 0)
    # 0: the drafter had nothing to propose; a tree round's chain (its accepted path) may be deeper than MAX_GAMMA
    g = _whole(d["gamma"], f"{where}.gamma", 0, MAX_GAMMA if d.get("tree") is None else MAX_TREE_NODES)
    _token_ids(d["draft_ids"], f"{where}.draft_ids", vocab, length=g)
    _strings(d["draft_pieces"], f"{where}.draft_pieces", g)
    for key in ("q_draft", "p_draft", "accept_probs", "uniforms"):
        _probs(d[key], f"{where}.{key}", g)
    n = _whole(d["n_accepted"], f"{where}.n_accepted", 0)
    if n > g:
        raise TraceError(f"{where}.n_accepted is {n}, more than the {g} tokens drafted (gamma)")
    _check_verdict(d, where, n, g)
    _token_id(d["emitted_id"], f"{where}.emitted_id", vocab)
    _string(d["emitted_piece"], f"{where}.emitted_piece")
    _prob(d["emitted_p"], f"{where}.emitted_p")
    _top_rows(d["q_top"], f"{where}.q_top", g, vocab)
    _top_rows(d["p_top"], f"{where}.p_top", g + 1, vocab)
    if d["residual_top"] is not None:
        _top_list(d["residual_top"], f"{where}.residual_top", vocab)
    _check_committed(d, where, n, vocab)
    for key in ("draft_ms", "verify_ms", "round_ms", "rule_ms", "cache_ms", "display_ms"):
        if key in d:
            _duration(d[key], f"{where}.{key}")
    if d.get("totals") is not None:
        _check_totals(d["totals"], f"{where}.totals")
    if "top_k" in d:
        _whole(d["top_k"], f"{where}.top_k", 0, 1000)  # 0: the run carried no candidate lists
    if d.get("note") is not None:
        _check_note(d["note"], f"{where}.note")
    # asked 0: no guesses were asked for (round one of a run that times plain decoding beside it is a plain step)
    if d.get("asked") is not None and _whole(d["asked"], f"{where}.asked", 0 if g == 0 else 1, MAX_GAMMA) < g:
        raise TraceError(f"{where}.asked is {d['asked']}, fewer than the {g} tokens drafted (gamma)")
    if d.get("tree") is not None:
        _check_tree(d["tree"], f"{where}.tree", vocab, d)
    _check_same_draft(d.get("same_draft"), f"{where}.same_draft", g)
    stop = d.get("stop_reason")
    if stop is not None and stop not in STOP_REASONS:
        raise TraceError(f"{where}.stop_reason must be null, 'eos' or 'max_new_tokens', got {_short(stop)}")
    data = {k: d[k] for k in ROUND_KEYS if k in d}
    if data.get("totals") is None:
        data["totals"] = {}
    try:
        return Round.from_dict(data)
    except (TypeError, ValueError, KeyError) as exc:  # validation above should make this unreachable
        raise TraceError(f"{where} could not be read: {exc}") from exc


def _check_same_draft(rows, where: str, g: int) -> None:
    """What each rule would have kept from the same draft: a list of {mode, tests [g], n_accepted}."""
    if rows is None:
        return
    if not isinstance(rows, list) or len(rows) > len(VERIFY_MODES):
        raise TraceError(f"{where} must be a list of at most {len(VERIFY_MODES)} verdicts, got {_short(rows)}")
    for i, v in enumerate(rows):
        at = f"{where}[{i}]"
        if not isinstance(v, dict) or not {"mode", "tests", "n_accepted"} <= set(v) <= {"mode", "tests",
                                                                                      "n_accepted", "expected"}:
            raise TraceError(f"{at} must be an object with mode, tests, n_accepted and (optionally) expected")
        if "expected" in v and not (_is_number(v["expected"]) and 0 <= v["expected"] <= g):
            raise TraceError(f"{at}.expected must be a number from 0 to {g}, got {_short(v['expected'])}")
        if v["mode"] not in VERIFY_MODES:
            raise TraceError(f"{at}.mode must be one of {', '.join(VERIFY_MODES)}, got {_short(v['mode'])}")
        _probs(v["tests"], f"{at}.tests", g)
        _whole(v["n_accepted"], f"{at}.n_accepted", 0, g)


def _check_verdict(d: dict, where: str, n: int, g: int) -> None:
    """The recorded outcome must follow from the recorded draws under the round's rule (core.verify.kept_count):
    a test passes iff u < accept prob; pq and strict keep the leading run of passes, block the longest prefix
    whose last test passed."""
    mode = d.get("verify", "pq")
    if not isinstance(mode, str) or mode not in VERIFY_MODES:
        raise TraceError(f"{where}.verify must be one of {', '.join(VERIFY_MODES)}, got {_short(mode)}")
    passed = torch.tensor([u < a for u, a in zip(d["uniforms"], d["accept_probs"])], dtype=torch.bool)
    kept = int(kept_count(passed[None], mode)[0])
    if kept != n:
        rule = "the last passing test" if mode == "block" else "a token is kept iff u < accept prob"
        raise TraceError(
            f"{where}.n_accepted is {n}, but its uniforms and accept_probs keep the first {kept} "
            f"draft tokens under {mode} verification ({rule})"
        )
    rejected = d["rejected_at"]
    if rejected is not None and (not _is_int(rejected) or rejected != n or n == g):
        raise TraceError(f"{where}.rejected_at is {_short(rejected)}; with {n} of {g} kept it must be "
                         f"{n if n < g else 'null'}")
    if rejected is None and n < g:
        raise TraceError(f"{where}.rejected_at is null, but only {n} of {g} draft tokens were kept")
    if not isinstance(d["is_bonus"], bool):
        raise TraceError(f"{where}.is_bonus must be true or false, got {_kind(d['is_bonus'])}")
    if d["is_bonus"] != (n == g):
        raise TraceError(f"{where}.is_bonus is {str(d['is_bonus']).lower()}, but {n} of {g} draft tokens were kept")
    if d["is_bonus"] and d["residual_top"] is not None:
        raise TraceError(f"{where}.residual_top must be null for a bonus round (there was no rejection)")
    if not d["is_bonus"] and d["residual_top"] is None:
        raise TraceError(f"{where}.residual_top is null, but the round has a rejection to repair from")


def _check_committed(d: dict, where: str, n: int, vocab: int | None) -> None:
    ids = _token_ids(d["committed_ids"], f"{where}.committed_ids", vocab, allow_empty=False)
    _strings(d["committed_pieces"], f"{where}.committed_pieces", len(ids))
    # EOS or the token budget may cut the round short, but what it commits is always a prefix of
    # (accepted draft tokens + the repaired/bonus token).
    full = list(d["draft_ids"][:n]) + [d["emitted_id"]]
    if ids != full[: len(ids)] or len(ids) > len(full):
        raise TraceError(
            f"{where}.committed_ids {_short(ids)} is not a prefix of the accepted draft tokens plus the emitted "
            f"token {_short(full)}"
        )


def _check_totals(t, where: str) -> None:
    if not isinstance(t, dict):
        raise TraceError(f"{where} must be a JSON object, got {_kind(t)}")
    unknown = set(t) - set(TOTALS_INTS) - set(TOTALS_FLOATS)
    if "kept" in t and "accepted" in t:
        unknown.add("accepted")  # one name per count: "accepted" is the name older traces gave "kept"
    if unknown:
        raise TraceError(f"{where} has unknown fields: {', '.join(sorted(map(repr, unknown)))}")
    for key in TOTALS_INTS:
        if key in t:
            _whole(t[key], f"{where}.{key}", 0)
    for key in TOTALS_FLOATS:
        if key in t:
            _duration(t[key], f"{where}.{key}")


def _check_note(n, where: str) -> None:
    if not isinstance(n, dict):
        raise TraceError(f"{where} must be a JSON object or null, got {_kind(n)}")
    unknown = set(n) - {f.name for f in fields(DraftNote)}
    if unknown:
        raise TraceError(f"{where} has unknown fields: {', '.join(sorted(map(repr, unknown)))}")
    if n.get("drafter") not in DRAFTERS:
        raise TraceError(f"{where}.drafter must be one of {', '.join(DRAFTERS)}, got {_short(n.get('drafter'))}")
    if not isinstance(n.get("one_hot", False), bool):
        raise TraceError(f"{where}.one_hot must be true or false")
    for key in NOTE_INTS:
        if n.get(key) is not None:
            _whole(n[key], f"{where}.{key}", 0)
    if n.get("source") is not None and n["source"] not in COPY_SOURCES:
        raise TraceError(f"{where}.source must be one of {', '.join(COPY_SOURCES)} or null, got {_short(n['source'])}")
    if n.get("draft_pieces") is not None:
        pieces = n["draft_pieces"]
        _strings(pieces, f"{where}.draft_pieces", len(pieces) if isinstance(pieces, list) else -1)


TREE_KEYS = tuple(f.name for f in fields(TreeRoundEvent))
TREE_NODE_KEYS = tuple(f.name for f in fields(TreeNodeView))
TREE_TRIED_KEYS = ("r", "accept_prob", "uniform")
ACCEPT_SLACK = 1e-3  # recorded keep chances vs min(1, r / q) recomputed from the recorded (rounded) r and q


def _check_tree(t, where: str, vocab: int | None, rnd: dict) -> None:
    """A tree round's `tree` object: well-formed nodes, a walk that follows from its own draws, and the same
    accepted path and emitted token as the round's chain fields."""
    if not isinstance(t, dict):
        raise TraceError(f"{where} must be a JSON object or null, got {_kind(t)}")
    missing = [k for k in TREE_KEYS if k not in t and k != "n_committed"]
    if missing:
        raise TraceError(f"{where} is missing {', '.join(repr(k) for k in missing)}")
    _string(t["mode"], f"{where}.mode")
    if not isinstance(t["widths"], list):
        raise TraceError(f"{where}.widths must be a list of whole numbers >= 1, got {_kind(t['widths'])}")
    for i, w in enumerate(t["widths"]):
        _whole(w, f"{where}.widths[{i}]", 1, MAX_TREE_NODES)
    if t["q_kind"] not in Q_KINDS:
        raise TraceError(f"{where}.q_kind must be one of {', '.join(Q_KINDS)}, got {_short(t['q_kind'])}")
    nodes = t["nodes"]
    if not isinstance(nodes, list) or len(nodes) > MAX_TREE_NODES:
        raise TraceError(f"{where}.nodes must be a list of at most {MAX_TREE_NODES} nodes, got {_describe_list(nodes)}")
    for i, n in enumerate(nodes):
        _check_tree_node(n, f"{where}.nodes[{i}]", i, nodes, vocab)
    fates = [n["fate"] for n in nodes]
    path = _tree_node_list(t["path"], f"{where}.path", len(nodes))
    steps = _tree_node_list(t["steps"], f"{where}.steps", len(nodes))
    if len(set(steps)) != len(steps):
        raise TraceError(f"{where}.steps tries a node twice: {_short(steps)}")
    tried = {i for i, f in enumerate(fates) if f != TREE_UNTRIED}
    if set(steps) != tried:
        raise TraceError(f"{where}.steps {_short(steps)} must list exactly the nodes whose fate is not 'untried'")
    # The walk from the root: children in order until one is accepted, then that child's children, ...
    walk, node = [], -1
    while True:
        kids = [i for i, n in enumerate(nodes) if n["parent"] == node]
        nxt = None
        for k in kids:
            walk.append(k)
            if fates[k] == TREE_ACCEPTED:
                nxt = k
                break
        if nxt is None:
            break
        node = nxt
    if walk != steps:
        raise TraceError(f"{where}.steps is {_short(steps)}, but walking the tree by its fates tries {_short(walk)}")
    accepted = [i for i in walk if fates[i] == TREE_ACCEPTED]
    if path != accepted:
        raise TraceError(f"{where}.path is {_short(path)}, but the accepted nodes of the walk are {_short(accepted)}")
    kind = t["emitted_kind"]
    if kind not in (REPAIR, BONUS):
        raise TraceError(f"{where}.emitted_kind must be '{REPAIR}' or '{BONUS}', got {_short(kind)}")
    leaf = not any(n["parent"] == node for n in nodes)
    if (kind == BONUS) != leaf:
        raise TraceError(f"{where}.emitted_kind is '{kind}', but the walk ends at a node "
                         f"{'without' if leaf else 'with'} children (a bonus follows a leaf, a repair refused "
                         "children)")
    _token_id(t["emitted_id"], f"{where}.emitted_id", vocab)
    _string(t["emitted_piece"], f"{where}.emitted_piece")
    _prob(t["emitted_p"], f"{where}.emitted_p")
    _prob(t["emitted_r"], f"{where}.emitted_r")
    # The round's chain fields are this walk seen as a chain: the path, then the last refused child.
    tokens = [nodes[i]["token_id"] for i in path]
    if rnd["n_accepted"] != len(path) or rnd["draft_ids"][: len(path)] != tokens:
        raise TraceError(f"{where}.path's tokens {_short(tokens)} are not the round's accepted draft_ids")
    if rnd["emitted_id"] != t["emitted_id"] or rnd["is_bonus"] != (kind == BONUS):
        raise TraceError(f"{where}'s emitted token differs from the round's emitted_id / is_bonus")
    if rnd["gamma"] != len(path) + (kind == REPAIR):
        raise TraceError(f"{where}: a tree round's gamma is its path length plus 1 before a repair "
                         f"({len(path) + (kind == REPAIR)}), got {rnd['gamma']}")
    if "n_committed" in t and _whole(t["n_committed"], f"{where}.n_committed", 0) != len(rnd["committed_ids"]):
        raise TraceError(f"{where}.n_committed is {t['n_committed']}, but the round commits "
                         f"{len(rnd['committed_ids'])} tokens")


def _check_tree_node(n, where: str, i: int, nodes: list, vocab: int | None) -> None:
    if not isinstance(n, dict):
        raise TraceError(f"{where} must be a JSON object, got {_kind(n)}")
    missing = [k for k in TREE_NODE_KEYS if k not in n and k not in TREE_TRIED_KEYS]
    if missing:
        raise TraceError(f"{where} is missing {', '.join(repr(k) for k in missing)}")
    if n["node"] != i or not _is_int(n["node"]):
        raise TraceError(f"{where}.node is {_short(n['node'])}; nodes must be numbered 0, 1, 2, ... in order")
    _token_id(n["token_id"], f"{where}.token_id", vocab)
    _string(n["piece"], f"{where}.piece")
    parent = n["parent"]
    if not _is_int(parent) or not -1 <= parent < i:
        raise TraceError(f"{where}.parent must be -1 (the root) or an earlier node, got {_short(parent)}")
    depth = 1 if parent == -1 else nodes[parent]["depth"] + 1
    if n["depth"] != depth or not _is_int(n["depth"]):
        raise TraceError(f"{where}.depth is {_short(n['depth'])}; under its parent it is {depth}")
    _prob(n["p"], f"{where}.p")
    _prob(n["q"], f"{where}.q")
    fate = n["fate"]
    if fate not in TREE_FATES:
        raise TraceError(f"{where}.fate must be one of {', '.join(TREE_FATES)}, got {_short(fate)}")
    values = {k: n.get(k) for k in TREE_TRIED_KEYS}
    if fate == TREE_UNTRIED:
        if any(v is not None for v in values.values()):
            raise TraceError(f"{where} was never tried, so its r, accept_prob and uniform must be null")
        return
    for k, v in values.items():
        _prob(v, f"{where}.{k}")
    r, q, a, u = values["r"], n["q"], values["accept_prob"], values["uniform"]
    expected = (r > 0) * 1.0 if q <= 0 else min(1.0, r / q)
    if abs(a - expected) > ACCEPT_SLACK * max(1.0, expected):
        raise TraceError(f"{where}.accept_prob is {a:.6g}, but min(1, r / q) is {expected:.6g}")
    if (u < a) != (fate == TREE_ACCEPTED):
        raise TraceError(f"{where} is {fate} with u = {u:.6g} and accept_prob = {a:.6g} (a node is accepted iff "
                         "u < accept_prob)")


def _tree_node_list(xs, where: str, n: int) -> list[int]:
    if not isinstance(xs, list) or any(not _is_int(x) or not 0 <= x < n for x in xs):
        raise TraceError(f"{where} must be a list of node numbers (0..{n - 1}), got {_short(xs)}")
    return xs


def _top_rows(rows, where: str, length: int, vocab: int | None) -> None:
    if not isinstance(rows, list) or len(rows) != length:
        raise TraceError(f"{where} must be a list of {length} candidate lists, got {_describe_list(rows)}")
    for i, row in enumerate(rows):
        _top_list(row, f"{where}[{i}]", vocab)


def _top_list(row, where: str, vocab: int | None) -> None:
    if not isinstance(row, list):
        raise TraceError(f"{where} must be a list of {{id, piece, prob}} candidates, got {_kind(row)}")
    for i, tp in enumerate(row):
        w = f"{where}[{i}]"
        if not isinstance(tp, dict) or set(tp) != {"id", "piece", "prob"}:
            raise TraceError(f"{w} must be an object with exactly 'id', 'piece' and 'prob'")
        _token_id(tp["id"], f"{w}.id", vocab)
        _string(tp["piece"], f"{w}.piece")
        _prob(tp["prob"], f"{w}.prob")


# ------------------------------------------------------------------------------------------- scalar checks


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    return isinstance(x, int) or math.isfinite(x)  # huge JSON ints are fine; float() of them would overflow


def _whole(x, where: str, lo: int, hi: int | None = None) -> int:
    return whole_number(x, where, lo, hi, TraceError, got=_short(x))


def _prob(x, where: str) -> None:
    if not _is_number(x) or not 0 <= x <= 1 + PROB_SLACK:
        raise TraceError(f"{where} must be a finite probability in [0, 1], got {_short(x)}")


def _probs(xs, where: str, length: int) -> None:
    if not isinstance(xs, list) or len(xs) != length:
        raise TraceError(
            f"{where} must be a list of {length} probabilities (one per draft token), got {_describe_list(xs)}"
        )
    for i, x in enumerate(xs):
        _prob(x, f"{where}[{i}]")


def _duration(x, where: str) -> None:
    if not _is_number(x) or x < 0:
        raise TraceError(f"{where} must be a finite number of milliseconds >= 0, got {_short(x)}")


def _string(x, where: str) -> str:
    if not isinstance(x, str):
        raise TraceError(f"{where} must be a string, got {_kind(x)}")
    return x


def _strings(xs, where: str, length: int) -> None:
    if not isinstance(xs, list) or len(xs) != length:
        raise TraceError(f"{where} must be a list of {length} strings, got {_describe_list(xs)}")
    for i, x in enumerate(xs):
        _string(x, f"{where}[{i}]")


def _token_id(x, where: str, vocab: int | None) -> int:
    if not _is_int(x) or x < 0 or (vocab is not None and x >= vocab):
        limit = f" below the vocabulary size {vocab}" if vocab is not None else ""
        raise TraceError(f"{where} must be a token id (a whole number >= 0{limit}), got {_short(x)}")
    return x


def _token_ids(xs, where: str, vocab: int | None, length: int | None = None, allow_empty: bool = True) -> list[int]:
    if not isinstance(xs, list) or (length is not None and len(xs) != length) or (not allow_empty and not xs):
        if length is not None:
            want = f"a list of {length} token ids"
        else:
            want = "a list of token ids" if allow_empty else "a non-empty list of token ids"
        raise TraceError(f"{where} must be {want}, got {_describe_list(xs)}")
    for i, t in enumerate(xs):
        _token_id(t, f"{where}[{i}]", vocab)
    return xs


# ------------------------------------------------------------------------------------------- wording helpers


def _kind(x) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null",
            int: "a whole number", float: "a number", bytes: "bytes"}.get(type(x), type(x).__name__)


def _describe_list(x) -> str:
    return f"a list of {len(x)}" if isinstance(x, list) else _kind(x)


def _short(x, limit: int = 60) -> str:
    try:
        text = json.dumps(x, ensure_ascii=True)
    except (TypeError, ValueError):
        text = repr(x)
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = [
    "MAX_TRACE_BYTES", "SCHEMA", "VERSION", "dumps_trace", "load_trace", "load_trace_file", "record_to_dict",
    "settings_from_dict",
]
