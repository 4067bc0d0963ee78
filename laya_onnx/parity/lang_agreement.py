"""Agreement of our language routing with the reference's, over the corpus in `parity/lang/`.

    python -m laya_onnx.parity.lang_agreement [--min 0.995] [--report-dir parity/lang]

For every state of the corpus (`lang_corpus.load_corpus`) it asks the reference `laya.Router`
(built with `default="multilingual"`, the reference default, and with `default="english"`) for
its route, and reads our `laya_onnx.core.lang.analyse` through `route_detection` the same two ways.
A state agrees when both checkpoints agree under both defaults: then the Router picks the same
checkpoint whatever its default. The report also counts the states whose reason text is
identical and those whose whole detection dict is.

It writes `report.json` (every figure, and every disagreement) and `report.md` (the figures and
a table of the disagreements) to the report directory. Each disagreement is explained from the
evidence: the two sides' diagnostic stage and reason, and the words of the state that our
function-word lists and the reference's count differently (read from the installed reference at
run time, for the explanation only). Exit status 1 when agreement is below `--min`.

Needs the reference (`laya==0.4.15`, the dev extra); no torch.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from laya_onnx.core import lang
from laya_onnx.core.lang_words import FUNCTION_WORDS
from laya_onnx.parity.lang_corpus import CORPUS_DIR, load_corpus

DEFAULTS = ("multilingual", "english")
TARGET = 0.995
_WORD = re.compile(r"[^\W\d_]+")


@dataclass
class Side:
    """One side's answer for one state: the checkpoint and reason per default, and the detection."""

    routes: dict[str, tuple[str, str]]
    detection: dict[str, Any]


@dataclass
class Comparison:
    record: dict[str, Any]
    ours: Side
    reference: Side

    @property
    def checkpoint_agrees(self) -> bool:
        return all(self.ours.routes[d][0] == self.reference.routes[d][0] for d in DEFAULTS)

    @property
    def reason_agrees(self) -> bool:
        return all(self.ours.routes[d] == self.reference.routes[d] for d in DEFAULTS)

    @property
    def detection_agrees(self) -> bool:
        return _plain(self.ours.detection) == _plain(self.reference.detection)


def _plain(detection: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in detection.items() if k != "diagnostic"}


def _ours(state: Any) -> Side:
    detection = lang.analyse(state, explain=True)
    return Side({d: lang.route_detection(detection, d) for d in DEFAULTS}, detection)


class _Reference:
    def __init__(self) -> None:
        from laya import Router
        from laya import lang as reference_lang

        self.lang = reference_lang
        self.routers = {d: Router(default=d) for d in DEFAULTS}

    def side(self, state: Any) -> Side:
        routes = {}
        for default, router in self.routers.items():
            decision = router.route(state)
            routes[default] = (decision["model"], decision["reason"])
        return Side(routes, self.lang.analyse(state, explain=True))

    def stopwords(self) -> dict[str, set[str]]:
        return {lg: set(words) for lg, words in getattr(self.lang, "_STOP", {}).items()}


def compare(records: list[dict[str, Any]]) -> list[Comparison]:
    """Both sides' answers for every record, in corpus order."""
    reference = _Reference()
    return [Comparison(r, _ours(r["state"]), reference.side(r["state"])) for r in records]


def _word_differences(state: Any, reference_words: dict[str, set[str]]) -> list[str]:
    """The words of the state that one side's list of a language counts and the other's does not."""
    words = Counter(_WORD.findall(lang.state_text(state).lower()))
    notes = []
    for code, ours in FUNCTION_WORDS.items():
        theirs = reference_words.get(code, set())
        only_ours = sorted(w for w in words if w in ours and w not in theirs)
        only_theirs = sorted(w for w in words if w in theirs and w not in ours)
        if only_ours or only_theirs:
            part = "%s: " % code
            if only_ours:
                part += "only our list counts %s" % ", ".join(only_ours)
            if only_theirs:
                part += ("; " if only_ours else "") + "only the reference's counts %s" % ", ".join(
                    only_theirs
                )
            notes.append(part)
    return notes


def _diagnosis(side: Side) -> str:
    diag = side.detection.get("diagnostic") or {}
    return "%s/%s, language %r" % (diag.get("stage"), diag.get("reason"), side.detection.get("language"))


def explain(item: Comparison, reference_words: dict[str, set[str]]) -> str:
    """Why the two sides differ, from the evidence the state gives each."""
    text = "ours: %s; reference: %s" % (_diagnosis(item.ours), _diagnosis(item.reference))
    words = _word_differences(item.record["state"], reference_words)
    if words:
        text += ". Word lists differ on this state: " + " | ".join(words)
    elif item.ours.detection.get("diacritic_rate") != item.reference.detection.get("diacritic_rate"):
        text += ". The non-English letter sets differ: diacritic rate %s (ours) vs %s" % (
            item.ours.detection.get("diacritic_rate"),
            item.reference.detection.get("diacritic_rate"),
        )
    return text


@dataclass
class Report:
    states: int
    checkpoint_agreement: float
    reason_agreement: float
    detection_agreement: float
    seconds: float
    disagreements: list[dict[str, Any]] = field(default_factory=list)
    by_kind: dict[str, dict[str, int]] = field(default_factory=dict)
    by_bank: dict[str, dict[str, Any]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "states": self.states,
            "checkpoint_agreement": self.checkpoint_agreement,
            "reason_agreement": self.reason_agreement,
            "detection_agreement": self.detection_agreement,
            "target": TARGET,
            "defaults_compared": list(DEFAULTS),
            "by_bank": self.by_bank,
            "by_kind": self.by_kind,
            "disagreements": self.disagreements,
        }


def _shown(state: Any, limit: int = 160) -> str:
    text = state if isinstance(state, str) else json.dumps(state, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def build_report(records: list[dict[str, Any]]) -> Report:
    start = time.perf_counter()
    items = compare(records)
    seconds = time.perf_counter() - start
    reference_words = _Reference().stopwords()
    by_kind: dict[str, dict[str, int]] = {}
    by_bank: dict[str, dict[str, Any]] = {}
    disagreements = []
    for item in items:
        counts = [
            by_kind.setdefault(item.record.get("kind", "?"), {"states": 0, "checkpoint_disagreements": 0}),
            by_bank.setdefault(
                item.record.get("bank", "handwritten"), {"states": 0, "checkpoint_disagreements": 0}
            ),
        ]
        for count in counts:
            count["states"] += 1
        if item.checkpoint_agrees:
            continue
        for count in counts:
            count["checkpoint_disagreements"] += 1
        disagreements.append(
            {
                "id": item.record["id"],
                "kind": item.record.get("kind"),
                "lang": item.record.get("lang"),
                "state": _shown(item.record["state"]),
                "ours": {d: list(item.ours.routes[d]) for d in DEFAULTS},
                "reference": {d: list(item.reference.routes[d]) for d in DEFAULTS},
                "explanation": explain(item, reference_words),
            }
        )
    for count in by_bank.values():
        count["checkpoint_agreement"] = 1 - count["checkpoint_disagreements"] / count["states"]
    n = len(items)
    return Report(
        states=n,
        checkpoint_agreement=sum(i.checkpoint_agrees for i in items) / n,
        reason_agreement=sum(i.reason_agrees for i in items) / n,
        detection_agreement=sum(i.detection_agrees for i in items) / n,
        seconds=seconds,
        disagreements=disagreements,
        by_kind=dict(sorted(by_kind.items())),
        by_bank=by_bank,
    )


def markdown(report: Report) -> str:
    lines = [
        "# Language routing: agreement with laya 0.4.15",
        "",
        "Made by `python -m laya_onnx.parity.lang_agreement` over the corpus in this folder.",
        "",
        "| figure | value |",
        "|---|---|",
        "| states | %d |" % report.states,
        "| same checkpoint, under both defaults (target %.1f%%) | %.2f%% |"
        % (100 * TARGET, 100 * report.checkpoint_agreement),
        "| same checkpoint and reason text | %.2f%% |" % (100 * report.reason_agreement),
        "| identical detection dict | %.2f%% |" % (100 * report.detection_agreement),
        "| disagreements (checkpoint) | %d |" % len(report.disagreements),
    ]
    lines += [
        "| same checkpoint, `%s` states only (%d) | %.2f%% |"
        % (bank, c["states"], 100 * c["checkpoint_agreement"])
        for bank, c in report.by_bank.items()
    ]
    lines += [
        "",
        "`handwritten`: handwritten.json; `sentences`: states generated from sentences/, the bank the",
        "function-word lists were aligned on; `heldout`: states generated from heldout/, written after",
        "that alignment and not used to change the lists.",
        "",
    ]
    if report.disagreements:
        lines += [
            "## Every disagreement",
            "",
            "| id | kind | lang | state | ours | reference | why |",
            "|---|---|---|---|---|---|---|",
        ]
        for d in report.disagreements:
            ours = "%s / %s" % (d["ours"]["multilingual"][0], d["ours"]["english"][0])
            ref = "%s / %s" % (d["reference"]["multilingual"][0], d["reference"]["english"][0])
            cells = [d["id"], str(d["kind"]), str(d["lang"]), d["state"], ours, ref, d["explanation"]]
            lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", "\\n") for c in cells) + " |")
        lines += [
            "",
            'ours / reference: the checkpoint with `default="multilingual"` / with `default="english"`.',
        ]
    return "\n".join(lines) + "\n"


def bench(records: list[dict[str, Any]], rounds: int = 5) -> list[float]:
    """Seconds per pass of `analyse` over every state, ours / the reference's, interleaved round by
    round in one process (a ratio per round: shared machines make absolute times noise)."""
    from laya import lang as reference_lang

    states = [r["state"] for r in records]
    ratios = []
    for _ in range(rounds):
        start = time.perf_counter()
        for state in states:
            lang.analyse(state)
        ours = time.perf_counter() - start
        start = time.perf_counter()
        for state in states:
            reference_lang.analyse(state)
        ratios.append(ours / (time.perf_counter() - start))
    return ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="language routing agreement with the reference laya")
    parser.add_argument("--min", type=float, default=TARGET, help="fail below this agreement (default 0.995)")
    parser.add_argument("--report-dir", type=Path, default=CORPUS_DIR)
    parser.add_argument(
        "--bench", type=int, metavar="ROUNDS", help="instead, time analyse against the reference's"
    )
    args = parser.parse_args(argv)
    if args.bench:
        import resource

        ratios = bench(load_corpus(), args.bench)
        print(
            "analyse over the corpus, ours / reference: %.2f-%.2f (%d rounds); peak RSS %.0f MiB"
            % (
                min(ratios),
                max(ratios),
                len(ratios),
                resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            )
        )
        return 0
    report = build_report(load_corpus())
    args.report_dir.mkdir(parents=True, exist_ok=True)
    (args.report_dir / "report.json").write_text(
        json.dumps(report.as_json(), ensure_ascii=False, indent=1) + "\n", encoding="utf-8"
    )
    (args.report_dir / "report.md").write_text(markdown(report), encoding="utf-8")
    print(
        "%d states: checkpoint agreement %.2f%%, reason %.2f%%, detection %.2f%%, %d disagreements (%.1f s)"
        % (
            report.states,
            100 * report.checkpoint_agreement,
            100 * report.reason_agreement,
            100 * report.detection_agreement,
            len(report.disagreements),
            report.seconds,
        )
    )
    return 0 if report.checkpoint_agreement >= args.min else 1


if __name__ == "__main__":
    raise SystemExit(main())
