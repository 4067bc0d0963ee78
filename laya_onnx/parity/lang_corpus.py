"""The language-routing corpus: states in many scripts and languages, as the Router sees them.

`parity/lang/` holds it (see its README):

- `sentences/<code>.txt`: hand-written sentences, one a line, of the language the file names
  (`bn-latn`, `hi-latn`: romanized Bangla and Hindi);
- `handwritten.json`: hand-written states, each `{"id", "kind", "state", "note"}`: edge cases
  (numbers and emoji only, acronyms, code, English with loanwords and foreign names, mixed
  scripts, nested JSON and conversations);
- `generated.jsonl`: what `python -m laya_onnx.parity.lang_corpus` makes from the sentences, one
  state a line, deterministically (a fixed seed, sorted inputs): each sentence as a plain
  string and in one or more of the shapes below, chosen by the seeded generator.

`load_corpus()` returns both, hand-written first. Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import random
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

CORPUS_DIR = Path(__file__).resolve().parents[2] / "parity" / "lang"
SEED = 6
# The sentence banks, in generation order, and the id prefix of their states. `heldout/` was
# written after the function-word lists were aligned with the reference on `sentences/`, and the
# lists were not changed for it: its figure is the agreement on text they were not tuned on.
BANKS = (("sentences", "gen"), ("heldout", "held"))

# English material the shapes wrap foreign sentences in.
_ENGLISH_SUBJECTS = (
    "Support request",
    "Re: your order",
    "Billing question",
    "Ticket escalated by the first-line team",
    "Customer feedback form",
)
_ENGLISH_NOTES = (
    "Customer has been with us since 2019 and is on the business plan. Please reply within one day.",
    "Auto-tagged by the triage bot. Priority is normal and there is no open incident for this region.",
    "The previous agent asked for the order number and the customer sent it in the next message.",
)
_ASSISTANT_REPLIES = (
    "Thanks for reaching out! Could you share your order number so I can look into this?",
    "I am sorry to hear that. Let me check what happened with your account.",
    "I have forwarded this to our billing team, they will get back to you shortly.",
)
_CODE_LINES = (
    'Traceback (most recent call last):\n  File "app.py", line 12, in main\n    resp = client.get(url)',
    "ERROR 2024-05-01T10:22:03Z payment_service.charge() failed: card_declined",
    "curl -X POST https://api.example.com/v1/refunds -d order_id=4471",
)
_LINKS = (
    "see https://help.example.com/articles/refunds.html",
    "contact billing@acme-corp.com",
    "ref v2.4.1 build 7781",
)


def _sentences(bank: str) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for path in sorted((CORPUS_DIR / bank).glob("*.txt")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                pairs.append((path.stem, line.strip()))
    return pairs


def _ascii(text: str) -> str:
    stripped = "".join(ch for ch in unicodedata.normalize("NFKD", text) if not unicodedata.combining(ch))
    return (
        stripped.replace("ß", "ss").replace("ø", "o").replace("æ", "ae").replace("ł", "l").replace("đ", "d")
    )


def _is_latin(text: str) -> bool:
    letters = [ch for ch in text if ch.isalpha()]
    return bool(letters) and sum(ord(ch) < 0x0250 for ch in letters) * 2 > len(letters)


_Shape = Callable[[random.Random, str], Any]


def _shapes() -> dict[str, _Shape]:
    return {
        "message": lambda r, s: {"message": s},
        "ticket": lambda r, s: {"subject": r.choice(_ENGLISH_SUBJECTS), "body": s},
        "ticket+notes": lambda r, s: {
            "subject": r.choice(_ENGLISH_SUBJECTS),
            "body": s,
            "internal_notes": r.choice(_ENGLISH_NOTES),
        },
        "conversation": lambda r, s: [
            {"role": "user", "content": s},
            {"role": "assistant", "content": r.choice(_ASSISTANT_REPLIES)},
            {"role": "user", "content": s.split(" ")[0] + " ?"},
        ],
        "agent-first": lambda r, s: [
            {"role": "assistant", "content": r.choice(_ASSISTANT_REPLIES)},
            {"role": "user", "content": s},
        ],
        "english-line+foreign-line": lambda r, s: r.choice(_ENGLISH_NOTES) + "\n" + s,
        "foreign+stacktrace": lambda r, s: s + "\n" + r.choice(_CODE_LINES),
        "foreign+link": lambda r, s: s + " " + r.choice(_LINKS),
        "nested": lambda r, s: {
            "ticket": {
                "id": r.randrange(1000, 9999),
                "fields": {"description": s, "tags": ["web", "billing"]},
            },
            "customer": {"name": "Alex Morgan", "plan": "pro"},
        },
        "shouted": lambda r, s: s.upper(),
        "short": lambda r, s: " ".join(s.split()[: r.choice((1, 2, 3))]),
        "ascii": lambda r, s: _ascii(s),
        "code-switched": lambda r, s: (
            "Hi team, quick question: " + " ".join(s.split()[: max(2, len(s.split()) // 2)]) + " ... thanks!"
        ),
        "brand-prefix": lambda r, s: "iPhone 15 Pro / order #A-4471: " + s,
    }


def generate(seed: int = SEED) -> Iterator[dict[str, Any]]:
    """Every generated state, in a fixed order: each sentence of `sentences/`, then of `heldout/`,
    plain and in 4-6 seeded shapes."""
    rng = random.Random(seed)
    shapes = _shapes()
    common = [name for name in shapes if name not in ("ascii", "shouted")]
    for bank, prefix in BANKS:
        n = 0
        for code, sentence in _sentences(bank):
            for kind, state in _variants(rng, shapes, common, sentence):
                n += 1
                yield {
                    "id": "%s-%05d" % (prefix, n),
                    "bank": bank,
                    "kind": kind,
                    "lang": code,
                    "state": state,
                }


def _variants(
    rng: random.Random, shapes: dict[str, _Shape], common: list[str], sentence: str
) -> Iterator[tuple[str, Any]]:
    picks = ["plain"] + rng.sample(common, 3)
    if _is_latin(sentence):
        if _ascii(sentence) != sentence:
            picks.append("ascii")
        if rng.random() < 0.5:
            picks.append("shouted")
    else:
        picks.append(rng.choice(("english-line+foreign-line", "brand-prefix", "ticket+notes")))
    for kind in picks:
        yield kind, (sentence if kind == "plain" else shapes[kind](rng, sentence))


def load_corpus(directory: Path = CORPUS_DIR) -> list[dict[str, Any]]:
    """The hand-written states, then the generated ones, as written in `directory`."""
    records = json.loads((directory / "handwritten.json").read_text(encoding="utf-8"))
    with open(directory / "generated.jsonl", encoding="utf-8") as handle:
        records.extend(json.loads(line) for line in handle if line.strip())
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="write parity/lang/generated.jsonl from the sentence bank")
    parser.add_argument("--out", type=Path, default=CORPUS_DIR / "generated.jsonl")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    count = 0
    with open(args.out, "w", encoding="utf-8") as handle:
        for record in generate(args.seed):
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    print("wrote %d states to %s" % (count, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
