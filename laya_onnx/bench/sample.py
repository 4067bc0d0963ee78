"""The README's example request: what `laya-onnx demo` answers and every measurement sends."""

from __future__ import annotations

from typing import Any

README_REQUEST: dict[str, Any] = {
    "state": "I was charged twice this month, I want my money back",
    "questions": {
        "queue": {
            "type": "choice",
            "instructions": "Which team?",
            "criteria": {
                "billing": "billing and refunds",
                "tech": "login and app issues",
                "other": "everything else",
            },
        },
        "urgency": {
            "type": "score",
            "instructions": "How urgent is this?",
            "criteria": ["not urgent", "soon", "blocking"],
        },
        "refund": {"type": "noul", "instructions": "Does the user ask for a refund?"},
    },
}
