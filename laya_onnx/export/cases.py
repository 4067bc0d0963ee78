"""Built-in requests the exporter traces with and validates on, encoded by the runtime core.

The feeds are built exactly as the runtime builds them (`laya_onnx.core.sequences`), so validation
compares torch and ONNX Runtime on the inputs the graph will really see. Together they cover:
padding (rows of different lengths in one batch), states longer than the sliding window and
long enough to hit `max_len`, conversation (list) and dict states, 1 to 20 options, all three
question types, option_order, and batches of 1 to 12 rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

_TEAMS = {
    "billing": "payments, invoices and refunds",
    "technical": "bugs, crashes and outages",
    "sales": "pricing, plans and quotes",
    "legal": "contracts and privacy",
    "shipping": "deliveries and returns",
}
_INTENTS = [
    "refund",
    "cancel subscription",
    "change address",
    "report bug",
    "ask price",
    "complaint",
    "account locked",
    "invoice question",
    "delivery late",
    "feature request",
    "spam",
    "password reset",
    "upgrade plan",
    "data deletion",
    "speak to manager",
    "warranty claim",
    "order status",
    "duplicate charge",
    "gift card",
    "other",
]

QUESTIONS: dict[str, dict[str, Any]] = {
    "team": {"type": "choice", "instructions": "Which team should handle this message?", "criteria": _TEAMS},
    "urgency": {
        "type": "score",
        "instructions": "How urgent is this request?",
        "criteria": ["not urgent", "low", "medium", "high", "critical"],
    },
    "refund": {"type": "noul", "instructions": "The customer asks for money back."},
    "only": {"type": "choice", "instructions": "Is there anything to do?", "criteria": ["escalate"]},
    "pair": {
        "type": "choice",
        "instructions": "Reply or close?",
        "criteria": ["reply", "close"],
        "option_order": [1, 0],
    },
    "intent": {"type": "choice", "instructions": "What does the customer want?", "criteria": _INTENTS},
    "eleven": {
        "type": "choice",
        "instructions": "Pick the product line.",
        "criteria": {f"line {i}": f"products of family {i}" for i in range(11)},
    },
    "polite": {
        "type": "noul",
        "instructions": "The message is polite.",
        "criteria": {"true": "courteous wording", "false": "rude or curt"},
        "labels": {"false": "rude", "true": "polite"},
    },
    "stars": {
        "type": "score",
        "instructions": "Rate the satisfaction from 0 to 9.",
        "criteria": [f"{i} stars" for i in range(10)],
    },
}

_SHORT = [
    "I was charged twice for the same order, please refund the second payment.",
    "The app crashes whenever I upload a photo.",
    "Hi",
    "Can I get a quote for 300 units delivered to Berlin?",
]
_PARAGRAPH = (
    "The delivery was late again and the box was damaged. I have written to support three times "
    "and nobody answered; I want a refund or a replacement before the end of the week. "
)


def _long_text(words: int) -> str:
    reps = words // len(_PARAGRAPH.split()) + 1
    return (_PARAGRAPH * reps).strip()


@dataclass(frozen=True)
class Call:
    """One predict_batch-shaped call: several states sharing one set of questions."""

    name: str
    states: Sequence[Any]
    question_ids: Sequence[str]
    #: The questions' definitions when they are not the built-in `QUESTIONS` (a parity suite's).
    definitions: Mapping[str, Any] | None = None

    def questions(self) -> dict[str, dict[str, Any]]:
        source = QUESTIONS if self.definitions is None else self.definitions
        return {q: source[q] for q in self.question_ids}


#: Few rows, every shape: validation runs each of them through torch and ONNX Runtime, so its
#: cost is the padded tokens (2.8k here, 8.8k before on the full-size model at max_len 512).
#: `shape_coverage` states what they cover and tests/export/test_export.py pins it.
CALLS: list[Call] = [
    Call("single row, one 3-level question", [_SHORT[0]], ["refund"]),
    Call("one state, three question types", [_SHORT[1]], ["team", "urgency", "refund"]),
    Call("twelve rows: one- and two-option choices padded together", _SHORT, ["only", "pair", "refund"]),
    Call("20 and 11 options, 10 levels, past the sliding window", [_SHORT[0]], ["intent", "eleven", "stars"]),
    Call("truncated to max_len, with a short row", [_long_text(2000), _SHORT[2]], ["polite"]),
    Call(
        "conversation and dict states",
        [
            [{"role": "user", "content": _long_text(40)}, {"role": "assistant", "content": "Let me check."}],
            {"ticket": 1042, "channel": "email", "text": _SHORT[0], "priority": "high"},
        ],
        ["pair"],
    ),
]


def encode_calls(
    tokenizer_dir: Path, max_len: int, head_max_len: int, calls: Sequence[Call] = CALLS
) -> list[dict[str, Any]]:
    """[{"name", "rows", "feeds"}] for each call, built by the runtime core."""
    from laya_onnx.core.questions import normalize_questions
    from laya_onnx.core.sequences import collate, encode_state
    from laya_onnx.core.tokenizer import LayaTokenizer

    tok = LayaTokenizer.from_dir(tokenizer_dir)
    out = []
    for call in calls:
        questions = normalize_questions(call.questions())
        rows = [
            row for state in call.states for row in encode_state(tok, state, questions, max_len, head_max_len)
        ]
        out.append({"name": call.name, "rows": len(rows), "feeds": collate(rows, tok.pad_token_id)})
    return out


def trace_feeds(
    tokenizer_dir: Path, max_len: int, head_max_len: int, min_length: int
) -> dict[str, np.ndarray]:
    """A small batch for tracing: >= 2 rows, >= 2 markers, padding, longer than `min_length`.
    One state asked two questions of different lengths: the trace runs the model once, on these
    rows, so they are as few as those conditions allow (a full-size trace pays for every token)."""
    words = 40
    while True:
        call = Call("trace", [_long_text(words)], ["team", "refund"])
        feeds = encode_calls(tokenizer_dir, max_len, head_max_len, [call])[0]["feeds"]
        mask = feeds["attention_mask"]
        if mask.shape[1] > min_length or mask.shape[1] >= max_len:
            break
        words *= 2
    assert mask.shape[0] >= 2 and feeds["marker_pos"].shape[1] >= 2 and (mask == 0).any()
    return feeds
