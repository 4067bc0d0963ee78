"""`ONNXAgent`: laya 0.4.15's answers from an exported bundle, on onnxruntime + tokenizers + numpy.

The pipeline per call: validate and normalise the questions once, build each question's head
once, tokenize each state once, run one session per chunk of states, decode each state's rows.
Nothing here imports torch, transformers or aiohttp.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Sequence
from typing import Any

from laya_onnx.core import structured, tracing
from laya_onnx.core.bundle import (
    GRAPH_DATA_FILE,
    Bundle,
    RandomWeightsWarning,
    ReducedPrecisionWarning,
    weights_verified,
)
from laya_onnx.core.calibration import Calibration, CallLogits, act_probabilities, empty_result
from laya_onnx.core.calibration_file import apply_calibration, bundle_calibration, warn_if_other_checkpoint
from laya_onnx.core.calibration_file import load_calibration as load_calibration_file
from laya_onnx.core.hooks import HookRegistry, PredictContext
from laya_onnx.core.hub import fetch_bundle
from laya_onnx.core.int8_kernel import choose_kernel, requested_kernel, resolve_graph
from laya_onnx.core.manifest import PrecisionRecord
from laya_onnx.core.memory import (
    ARENA_RELEASE_BYTES,
    PassMemoryModel,
    device_pass_budget,
    probe_feeds,
    resolve_max_pass_memory,
)
from laya_onnx.core.names import random_weights_preset
from laya_onnx.core.openvino_session import open_session
from laya_onnx.core.options import CallOptions
from laya_onnx.core.passes import DEFAULT_BUCKET_ROWS, plan_passes
from laya_onnx.core.prepared import session_graph
from laya_onnx.core.publish import push_bundle
from laya_onnx.core.question_cache import QuestionCache
from laya_onnx.core.questions import require_questions_dict
from laya_onnx.core.sequences import (
    check_option_layout,
    checked_states,
    collate,
    encode_state,
    require_state_sequence,
)
from laya_onnx.core.session import FallbackEntry, ProviderSpec, RunTerminated, resolve_threads
from laya_onnx.core.tokenizer import LayaTokenizer
from laya_onnx.core.tournament import questions_group_size, requested_group, run_tournament
from laya_onnx.core.windows import predict_long as scan_long
from laya_onnx.core.windows import warn_if_truncated
from laya_onnx.core.work import CallStopped, PassClock, PassWork, current_limits, timed_pass, warm_up

State = str | dict | list | Any
DEFAULT_MAX_LEN = 512
DEFAULT_HEAD_MAX_LEN = 192


class ONNXAgent(HookRegistry):
    """Answer typed questions about a state with an exported Laya bundle.

    >>> agent = ONNXAgent("bundle/")                       # doctest: +SKIP
    >>> agent.predict("I was charged twice", {"refund": {"type": "noul",
    ...               "instructions": "Does the user want a refund?"}})   # doctest: +SKIP
    """

    def __init__(
        self,
        bundle: str | os.PathLike,
        providers: Sequence[ProviderSpec] | ProviderSpec | None = None,
        *,
        verify: bool = True,
        threads: int | None = None,
        lang_temperatures: dict[str, Any] | None = None,
        name: str | None = None,
        hooks: Any = None,
        on_predict_start: Any = None,
        on_predict_end: Any = None,
        hooks_raise: bool = True,
        hooks_concurrent: bool = True,
        hooks_timeout: float | None = None,
        revision: str | None = None,
        token: str | None = None,
        max_pass_memory: int | str | None = None,
        calibration: str | os.PathLike | None = None,
        strict_providers: bool = False,
        io_binding: bool | None = None,
        bucket_rows: int | None = DEFAULT_BUCKET_ROWS,
        int8_kernel: str | None = None,
    ):
        """`max_pass_memory`: bytes one forward pass may use above idle (int, or text such as
        "2G"); default $LAYA_MAX_PASS_MEMORY, else 2 GiB. Passes are split to stay inside it and a
        row that cannot fit alone is refused with `PassTooLarge` before anything runs. The budget
        is per pass: callers running predictions concurrently on one agent add up.

        `calibration`: a calibration file (`laya.Agent.save_calibration`'s JSON) applied after the
        checkpoint's temperatures and after a calibration file the bundle carries.

        `providers`: names or `(name, options)` pairs as onnxruntime takes them (options such as
        `device_id`, `gpu_mem_limit`, `arena_extend_strategy`, CoreML `MLComputeUnits` are passed
        through); `strict_providers=True` raises `ProviderUnavailable` instead of falling back to
        CPU when a requested accelerator does not attach (or a pass on it fails). `io_binding`
        feeds and fetches through an onnxruntime IOBinding (default: on CUDA only).

        `bucket_rows`: a `predict_batch` without `batch_size` whose rows outnumber it runs in
        passes of this many rows of similar length (see `plan_passes`); None or 0 runs them in
        one pass, as laya does (`laya_onnx.core.passes`).

        `int8_kernel` (int8 bundles): "auto" (default: $LAYA_INT8_KERNEL, else auto), "u8s8" or
        "u8u8", the integer GEMM the bundle runs (`laya_onnx.core.int8_kernel`); the answers are
        the same, the speed is not. A kernel that would answer wrongly on this CPU is refused."""
        if bucket_rows is not None and (
            isinstance(bucket_rows, bool) or not isinstance(bucket_rows, int) or bucket_rows < 0
        ):
            raise ValueError("bucket_rows must be a positive integer, 0 or None, got %r" % (bucket_rows,))
        self.bucket_rows = bucket_rows or 0
        self.max_pass_memory = resolve_max_pass_memory(max_pass_memory)
        self._install_hooks(
            hooks, on_predict_start, on_predict_end, hooks_raise, hooks_concurrent, hooks_timeout
        )
        # A local directory, or a bundle published on the Hub (`org/name[/subfolder]`, pinned with
        # `revision` or $LAYA_REVISION; HF_HUB_OFFLINE=1 reads the local cache only), pulled by
        # its manifest and hashed as it arrives, so Bundle.open need not hash it again. Every file
        # a load parses is hashed first; the graph's external weights while the session opens.
        located = fetch_bundle(bundle, revision=revision, token=token, verify=verify)
        verifying = verify and not located.verified
        self.bundle = Bundle.open(located.path, verify=verifying, defer_weights=verifying)
        #: The bundle's one name: /health, /v1/models, `routing.model` and every warning use it
        #: (the results' `model` names the runtime, `laya-rl-agent-onnx`, as laya's ONNX agent does).
        self.name: str = name or self.bundle.source.name or self.bundle.root.resolve().name
        self.cfg: dict[str, Any] = self.bundle.config
        check_option_layout(self.cfg, f"bundle {str(self.bundle.root)!r}")
        self.tok = LayaTokenizer.from_dir(self.bundle.tokenizer_dir)
        #: Validated questions and their heads, reused by calls that ask the same questions.
        self.question_cache = QuestionCache(self.tok)
        self.calibration = Calibration.from_config(self.cfg, lang_temperatures=lang_temperatures)
        source = self.bundle.source
        #: The checkpoint a calibration file's recorded identity is compared with.
        self.model_id_or_path = source.repo or source.path or str(bundle)
        self.subfolder = source.subfolder
        for path in (bundle_calibration(self.bundle.root, self.bundle.manifest), calibration):
            if path is not None:
                self.load_calibration(path)
        #: Intra-op threads: the `threads` argument, else $LAYA_THREADS, else None (onnxruntime's
        #: default). Read once, here.
        self.threads = resolve_threads(threads)
        with weights_verified(self.bundle if verifying else None) as verified:
            self._open_graph_session(providers, int8_kernel, strict_providers, io_binding, verified)
        #: Peak bytes of one pass as a function of (rows, padded length): measured at export.
        self.memory_model = PassMemoryModel.for_bundle(self.bundle.manifest)
        #: Seconds of one pass as a function of (rows, padded length): the architecture's
        #: operations at the speed this process measures (`laya_onnx.core.work`).
        self.pass_clock = PassClock(
            PassWork.for_bundle(self.bundle.manifest), probe=lambda *shape: timed_pass(self.session, *shape)
        )
        self.revision: str | None = located.revision or source.revision
        #: The test preset this bundle's random weights come from (`tiny-english`, ...), None for a
        #: real checkpoint; shown by /health, /v1/models and the CLI.
        self.random_weights: str | None = random_weights_preset(self.cfg)
        #: Whether a cut state was already reported (`windows.warn_if_truncated`: once per agent).
        self._truncation_reported = False
        if self.random_weights:
            warnings.warn(
                f"laya-onnx: bundle {self.name!r} holds random test weights (preset "
                f"{self.random_weights!r}, laya-onnx make-checkpoint): its answers carry no meaning",
                RandomWeightsWarning,
                stacklevel=2,
            )
        self.model_id = str(bundle)

    def _open_graph_session(
        self,
        providers: Sequence[ProviderSpec] | ProviderSpec | None,
        int8_kernel: str | None,
        strict_providers: bool,
        io_binding: bool | None,
        verified: Any,
    ) -> None:
        """Open the session on the graph this bundle runs here: its precision, an int8 bundle's
        kernel for this CPU, the providers, and the pass budget the device's memory leaves; a
        graph below fp32 is announced with its measured agreement. `verified()` returns once the
        bundle's weights are checked (`prepared.session_graph`)."""
        #: "fp32", "fp16", "int8" or "bf16" (`laya-onnx export --precision`); `precision_record`
        #: holds its gate and the agreement with fp32 torch measured at export.
        self.precision_record: PrecisionRecord = self.bundle.precision
        self.precision: str = self.precision_record.precision
        #: The integer GEMM an int8 bundle runs here, its graph file and why (`int8_kernel`: None
        #: for other precisions).
        self.int8_kernel_choice = choose_kernel(
            self.precision_record, requested_kernel(int8_kernel), default_graph=self.bundle.graph_path.name
        )
        #: The graph file the session runs (an int8 bundle's form for this CPU, else laya.onnx).
        self.session_graph = resolve_graph(self.bundle.root, self.int8_kernel_choice)
        self.session = open_session(
            # the shipped graph, or its form prepared for this CPU when $LAYA_SESSION_CACHE is set
            str(
                session_graph(
                    self.session_graph,
                    self.bundle.manifest,
                    self.precision,
                    providers,
                    self.threads,
                    verified,
                )
            ),
            self.precision,
            providers=providers,
            threads=self.threads,
            strict=strict_providers,
            io_binding=io_binding,
            label=repr(self.name),
        )
        graph_files = (self.session_graph, self.bundle.root / GRAPH_DATA_FILE)
        weights = sum(p.stat().st_size for p in graph_files if p.exists())
        self.max_pass_memory = device_pass_budget(
            self.max_pass_memory, self.session.device_memory_limit, weights
        )
        if self.precision != "fp32":
            warnings.warn(
                f"laya-onnx: bundle {self.name!r} runs in {self.precision_record.describe()}"
                + (f"; {self.int8_kernel} kernel" if self.int8_kernel else ""),
                ReducedPrecisionWarning,
                stacklevel=3,  # the caller of ONNXAgent(...)
            )

    def load_calibration(self, path: str | os.PathLike) -> None:
        """Apply a calibration file (laya's `load_calibration`): its temperatures replace the
        current ones and its binning map (or none) replaces the current map; a version-2 file
        fitted for another checkpoint warns and still loads. A bad file raises
        `CalibrationFileError` naming the file and the fault."""
        payload = load_calibration_file(path)
        warn_if_other_checkpoint(payload, self.model_id_or_path, self.subfolder, self.cfg)
        self.calibration = apply_calibration(self.calibration, payload)

    def push_to_hub(
        self,
        repo_id: str,
        *,
        private: bool = False,
        revision: str | None = None,
        commit_message: str | None = None,
        allow_random_weights: bool = False,
        license: str | None = None,
        token: str | None = None,
    ) -> str:
        """Publish this agent's bundle as `repo_id` (`org/name`, or `org/name/subfolder`) in one
        commit with a model card, as `laya-onnx push` does (`laya_onnx.core.publish.push_bundle`):
        its files are hashed against the manifest first (a bundle altered since it was opened is
        refused), random test weights are refused unless `allow_random_weights`, `private` applies
        when the repo is created and `revision` names the branch (created when missing). Returns
        the commit's URL; raises `PushError` when the Hub refuses or cannot be reached."""
        return push_bundle(
            self.bundle.root,
            repo_id,
            private=private,
            revision=revision,
            commit_message=commit_message,
            allow_random_weights=allow_random_weights,
            license=license,
            token=token,
        )

    # -- introspection ------------------------------------------------------------------------
    @property
    def providers(self) -> list[str]:
        """The execution providers the session actually runs on."""
        return self.session.providers

    @property
    def requested_providers(self) -> list[str]:
        return list(self.session.info.requested)

    @property
    def fallbacks(self) -> dict[str, FallbackEntry]:
        """{provider: {"count", "last_reason"}} for every provider that fell back (a copy, safe to
        read from another thread while a pass runs)."""
        return self.session.fallback_snapshot()

    @property
    def healthy(self) -> bool:
        """False once the device has failed `DEVICE_FAILURE_LIMIT` passes in a row: the process
        should be restarted (the server's /health answers 503 then)."""
        return self.session.healthy

    @property
    def int8_kernel(self) -> str | None:
        """ "u8s8" or "u8u8": the integer GEMM an int8 bundle runs here; None for other precisions."""
        return self.int8_kernel_choice.kernel

    @property
    def max_len(self) -> int:
        return self.cfg.get("max_len", DEFAULT_MAX_LEN)

    @property
    def head_max_len(self) -> int:
        return self.cfg.get("head_max_len", DEFAULT_HEAD_MAX_LEN)

    # -- prediction ---------------------------------------------------------------------------
    def warm_up(self) -> None:
        """The speed probe and a pass at each common length up to `max_len`, so that the first
        calls after it run at full speed (`laya_onnx.core.work.warm_up`)."""
        warm_up(self.session, self.pass_clock, self.max_len)

    def predict(
        self,
        state: State,
        questions: dict[Any, dict[str, Any]],
        lang: str | None = None,
        hooks: Any = None,
        on_predict_start: Any = None,
        on_predict_end: Any = None,
        hooks_raise: bool | None = None,
        hooks_timeout: float | None = None,
        max_len: int | None = None,
        head_max_len: int | None = None,
        min_confidence: Any = None,
        tournament: bool | int | None = None,
    ) -> dict[str, Any]:
        """Answer `questions` about one state (text, JSON value, or a conversation list).

        `tournament` (off by default, as in laya) answers large choices by elimination
        (`laya_onnx.core.tournament`): an int is the group size; True takes the largest group whose
        options keep all their tokens in `head_max_len` and runs no round when every choice
        already does. Each round is one more `predict` call, hooks included.
        """
        call = CallOptions.resolve(
            self,
            hooks=hooks,
            on_predict_start=on_predict_start,
            on_predict_end=on_predict_end,
            hooks_raise=hooks_raise,
            hooks_timeout=hooks_timeout,
            min_confidence=min_confidence,
        )
        budgets: dict[str, Any] = dict(lang=lang, max_len=max_len, head_max_len=head_max_len)
        return self.run_call([state], questions, call, tournament=tournament, **budgets)[0]

    system_one = predict

    def tournament_group_size(self, questions: Any, head_max_len: int | None = None) -> int | None:
        """The group size `predict(..., tournament=True)` uses, or None when one pass reads every
        choice without shrinking an option (`tournament.questions_group_size`)."""
        return questions_group_size(
            self.tok, questions, self.head_max_len if head_max_len is None else head_max_len
        )

    def predict_batch(
        self,
        states: Sequence[State],
        questions: dict[Any, dict[str, Any]],
        batch_size: int | None = None,
        lang: str | None = None,
        hooks: Any = None,
        on_predict_start: Any = None,
        on_predict_end: Any = None,
        hooks_raise: bool | None = None,
        hooks_timeout: float | None = None,
        max_len: int | None = None,
        head_max_len: int | None = None,
        sort_by_length: bool = False,
        min_confidence: Any = None,
        tournament: bool | int | None = None,
    ) -> list[dict[str, Any]]:
        """The same questions over many states; one session run per `batch_size` states.

        Hooks see one `PredictContext` for the call: start hooks may rewrite `ctx.states`,
        `ctx.questions`, `ctx.max_len`/`ctx.head_max_len` or answer with `ctx.skip(results)`;
        end hooks run after the gate, also when the call failed (after `on_error`).

        `tournament` as in `predict`: when it narrows, each state runs its own rounds (a
        tournament's passes depend on that state's finalists; each round is a plain `predict`),
        so `batch_size` and `sort_by_length` have nothing to apply to.
        """
        call = CallOptions.resolve(
            self,
            hooks=hooks,
            on_predict_start=on_predict_start,
            on_predict_end=on_predict_end,
            hooks_raise=hooks_raise,
            hooks_timeout=hooks_timeout,
            min_confidence=min_confidence,
        )
        budgets: dict[str, Any] = dict(lang=lang, max_len=max_len, head_max_len=head_max_len)
        sizing: dict[str, Any] = dict(batch_size=batch_size, sort_by_length=sort_by_length)
        return self.run_call(states, questions, call, tournament=tournament, **budgets, **sizing)

    def run_call(
        self,
        states: Sequence[State],
        questions: Any,
        call: CallOptions,
        *,
        tournament: Any = None,
        lang: str | None = None,
        max_len: int | None = None,
        head_max_len: int | None = None,
        batch_size: int | None = None,
        sort_by_length: bool = False,
    ) -> list[dict[str, Any]]:
        """One call whose options are resolved (`laya_onnx.core.options`): its hook lifecycle
        around the inference, one `PredictContext` for all its states. A `tournament` that
        narrows runs per state instead, each round one such call."""
        group = requested_group(self, tournament, questions, head_max_len)
        if group is not None:
            require_state_sequence(states)

            def one_round(state: State, round_questions: Any) -> dict[str, Any]:
                budgets: dict[str, Any] = dict(lang=lang, max_len=max_len, head_max_len=head_max_len)
                return self.run_call([state], round_questions, call, **budgets)[0]

            return [run_tournament(one_round, s, questions, group) for s in states]
        ctx = PredictContext(
            states=states,
            questions=questions,
            model=self.model_id,
            agent=self,
            max_len=max_len,
            head_max_len=head_max_len,
        )
        with tracing.span("laya.call", tracing.call_attributes(self.name, states, questions)):
            with call.lifecycle([ctx]):
                call.fire("on_predict_start", ctx)
                if ctx.results is None:
                    ctx.results = self._checked_infer(
                        ctx, lang=lang, batch_size=batch_size, sort_by_length=sort_by_length
                    )
        return ctx.results

    predict_many = predict_batch

    def decide(self, state: State, schema: Any = None, **kwargs: Any) -> Any:
        """Typed values for one state from a JSON schema or pydantic model (`laya_onnx.core.structured`:
        `questions=`, `return_details=`, `min_confidence=`; other keywords go to `predict`)."""
        return structured.decide(self, state, schema, **kwargs)

    def decide_batch(self, states: Sequence[State], schema: Any = None, **kwargs: Any) -> list[Any]:
        """`decide` over many states in one `predict_batch` call (`laya_onnx.core.structured`)."""
        return structured.decide_batch(self, states, schema, **kwargs)

    def predict_long(
        self,
        state: State,
        questions: dict[Any, dict[str, Any]],
        window: int | None = None,
        stride: int | None = None,
        aggregate: str = "auto",
        batch_size: int | None = None,
        lang: str | None = None,
        hooks: Any = None,
        on_predict_start: Any = None,
        on_predict_end: Any = None,
        hooks_raise: bool | None = None,
        hooks_timeout: float | None = None,
    ) -> dict[str, Any]:
        """Answer `questions` about a state longer than one sequence (laya's `predict_long`).

        The state is tokenized once and scanned in overlapping windows of `window` tokens
        (default: the config's state budget, capped at the room the questions leave), `stride`
        apart (default half the window); all windows go through one `predict_batch` call
        (`batch_size` caps windows per pass). Per question the deciding window is the one with
        the highest P(true) (noul) or `answer_confidence` (choice, score); its answer carries
        `answer["window"]` (`index`, `token_start`, `token_end`, `count`) and `usage["windows"]`
        counts the windows scored. A state that fits is answered by `predict` as is. The
        probabilities are the deciding window's, not a calibrated number for the whole document.
        Rules, warnings and refusals: `laya_onnx.core.windows`.
        """
        call = CallOptions.resolve(
            self,
            hooks=hooks,
            on_predict_start=on_predict_start,
            on_predict_end=on_predict_end,
            hooks_raise=hooks_raise,
            hooks_timeout=hooks_timeout,
        )
        return scan_long(
            self,
            state,
            questions,
            call,
            window=window,
            stride=stride,
            aggregate_mode=aggregate,
            batch_size=batch_size,
            lang=lang,
        )

    def _checked_infer(
        self, ctx: PredictContext, *, lang, batch_size, sort_by_length
    ) -> list[dict[str, Any]]:
        """Type checks on what survived the start hooks, then inference."""
        questions, max_len, head_max_len = ctx.questions, ctx.max_len, ctx.head_max_len
        require_state_sequence(ctx.states)
        require_questions_dict(questions)
        states = checked_states(
            ctx.states, dict(max_len=max_len, head_max_len=head_max_len, batch_size=batch_size)
        )
        results = self._infer(
            states,
            questions,
            lang=lang,
            batch_size=batch_size,
            sort_by_length=sort_by_length,
            max_len=self.max_len if max_len is None else max_len,
            head_max_len=self.head_max_len if head_max_len is None else head_max_len,
        )
        if not self._truncation_reported:  # once per agent
            self._truncation_reported = warn_if_truncated(self.name, results, stacklevel=4)
        return results

    def _infer(
        self,
        states: list[State],
        questions: dict[Any, dict[str, Any]],
        *,
        lang,
        batch_size,
        sort_by_length: bool,
        max_len: int,
        head_max_len: int,
    ) -> list[dict[str, Any]]:
        if not states:
            return []
        if not questions:
            return [empty_result() for _ in states]
        prepared = self.question_cache.get(questions, head_max_len)
        qs, heads = prepared.questions, prepared.heads
        limits = current_limits()
        # Every state is encoded before any pass runs, so a row too large for the memory budget
        # (or a call too large for its caller's limits) is refused before work is spent on the
        # others. Encoding a large batch takes seconds: a stopped call stops between states.
        encoded = []
        with tracing.span("laya.tokenize") as traced:
            for i, s in enumerate(states):
                if limits is not None:
                    limits.check()
                subject = "state" if len(states) == 1 else "states[%d]" % i
                encoded.append(encode_state(self.tok, s, qs, max_len, head_max_len, heads, subject=subject))
            tracing.set_attributes(traced, tracing.tokenized_attributes, encoded)
        longest = max((len(r.ids) for rows in encoded for r in rows), default=0)
        self.memory_model.check_row(longest, self.max_pass_memory)
        passes = plan_passes(
            encoded,
            batch_size,
            sort_by_length,
            bucket_rows=self.bucket_rows,
            memory_model=self.memory_model,
            max_pass_memory=self.max_pass_memory,
        )
        shapes = [(len(refs), max(len(encoded[i][j].ids) for i, j in refs)) for refs in passes]
        if limits is not None:
            limits.charge(
                sum(self.pass_clock.seconds(rows, width) for rows, width in shapes),
                "%d rows of up to %d tokens in %d passes" % (sum(r for r, _ in shapes), longest, len(shapes)),
                passes=len(shapes),
            )
        largest = max(self.memory_model.estimate(rows, width) for rows, width in shapes)
        gathered = CallLogits(qs, len(encoded))
        for n, refs in enumerate(passes):
            rows = [encoded[i][j] for i, j in refs]
            # After a large call, its last pass hands the arena's free memory back to the OS.
            release = largest >= ARENA_RELEASE_BYTES and n == len(passes) - 1
            running = False
            try:
                if limits is not None:
                    limits.check()
                running, started = True, time.perf_counter()
                with tracing.span("laya.pass", tracing.pass_attributes(self, n, rows, shapes[n][1])):
                    logits, act_logits = self.session.run(
                        collate(rows, self.tok.pad_token_id),
                        release_memory=release,
                        stop_on=None if limits is None else limits.stopping,
                    )
            except (CallStopped, RunTerminated) as exc:
                # stopped before its last pass (or during a pass: a cancel cuts it short), which
                # would have released the arena: a short pass hands the memory of the large
                # ones back instead
                if largest >= ARENA_RELEASE_BYTES and (n or running):
                    self.session.run(probe_feeds(1, 8), release_memory=True)
                if isinstance(exc, RunTerminated) and limits is not None:
                    limits.check()  # CallStopped, with the reason of the cancel that stopped it
                raise
            self.pass_clock.observe(*shapes[n], time.perf_counter() - started)
            gathered.add(refs, logits, act_probabilities(act_logits))
        with tracing.span("laya.decode"):
            return gathered.decode(encoded, self.calibration, lang)

    def __repr__(self) -> str:
        extra = "" if self.precision == "fp32" else f", precision={self.precision!r}"
        if self.int8_kernel is not None:
            extra += f", int8_kernel={self.int8_kernel!r}"
        return f"ONNXAgent({str(self.bundle.root)!r}, providers={self.providers}{extra})"
