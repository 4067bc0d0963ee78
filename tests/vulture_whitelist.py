"""Names `vulture` (tests/run's dead-code check) cannot see being used: each is called or read by
a framework, by Python itself, or by the package's users. Everything else the package defines must
be used by the package; a name only tests use belongs in tests/.

vulture matches names, not places: an entry here keeps that name alive everywhere, so list only
names whose use is outside the code, and say whose.
"""

from vulture.whitelist_utils import Whitelist

_ = Whitelist()

# -- Python ---------------------------------------------------------------------------------
_.__getattr__  # module-level lazy imports (PEP 562): laya_onnx, laya_onnx.parity, laya_onnx.serve
_.__context__  # exception chaining: a hook's failure set as the context of the pass's own
_.showwarning  # warnings: how a warning is shown (core/notices.py)
_.eof_received  # asyncio: a client half-closed its connection (serve/connection.py)

# -- the public API, as laya 0.4.15 names it (README "Python"; users call these) -------------
_.system_one  # ONNXAgent / Router alias of predict
_.predict_many  # Router alias of predict_batch
_.loaded_revisions  # Router: which revision each loaded checkpoint runs
_.set_default_hooks  # laya_onnx.hooks: the process-wide default hooks
_.add_default_hook
_.clear_default_hooks
_.push_to_hub  # ONNXAgent: publish its bundle to the Hub (docs/hub.md)
_.remove_hook  # HookRegistry
_.HookArg  # laya_onnx.hooks' type aliases for the hooks= / on_predict_*= arguments
_.PredictHookArg
_.run_id  # PredictContext fields a hook reads
_.elapsed_ms
_.answer_confidence  # DecisionResult field (decide / decide_batch)
_.misses  # QuestionCache.info(): the cache's hits / misses / maxsize / currsize, read by its users
_.currsize
# the hook events, called by name (laya_onnx.core.hooks.HOOK_EVENTS) on users' hooks and ours
_.on_route
_.on_load
_.on_evict
_.on_error

# -- framework entry points and settings read by the libraries -------------------------------
_.handle_error  # aiohttp: RequestHandler's error response (serve/connection.py)
_.eof_received  # asyncio: a protocol's end-of-input callback (serve/connection.py)
_.handlers  # logging: the access logger's handlers
_.check_health  # Ray Serve: a replica's health check
_.preserve_order  # Ray Data: DataContext settings
_.enable_progress_bars
_.graph_optimization_level  # onnxruntime: SessionOptions
_.intra_op_num_threads
_.enable_cpu_mem_arena
_.enable_mem_pattern
_.optimized_model_filepath  # onnxruntime: SessionOptions (core/prepared.py)
_.log_severity_level
_.enable_attention  # onnxruntime.transformers: FusionOptions
_.writeable  # numpy: an array's flags
_.post_processor  # tokenizers: a Tokenizer's post-processing template
_.symbolic  # torch.autograd.Function: its ONNX export
_._attn_implementation  # transformers: a model config's attention kernel
_.reference_compile  # transformers: ModernBERT's torch.compile switch

# -- pydantic: model configuration and fields, read by pydantic (serve/schema.py, serve/openapi.py)
_.model_config
# the contract's models (serve/schema.py): bodies are checked and /openapi.json is generated from them
_.noul
_.output_tokens
_.loc
_.msg
_.x_model_fallback
_.false
_.diagnostics
_.act_probability
_.finalists
_.abstention
_.abstention_threshold
_.low_confidence
_.action
_.x_jev_confidence
_.x_tournament
_.tokens_per_option
_.state_tokens
_.state_tokens_dropped
_.truncated
_.truncated_questions
_.total_usage
_.device_is_preference
_.checkpoint_devices
_.provider_fallbacks
_.release_date
_.openapi
_.x_aliases
_.x_revision
_.x_repo
_.x_int8_kernel
_.x_graph_sha256
_.x_manifest_sha256
_.x_precision
_.x_providers

# -- manifest.json's keys: fields of the typed records (core/manifest.py), read and written
# through dataclasses.fields when a manifest is parsed and written; bundle users read them
_.weights_sha256
_.total_seconds
_.rule
_.tool
_.nodes_before
_.nodes_after
_.fusions
_.optimizer_statistics
_.op_types_before
_.op_types_after
_.kernels_identical
_.measured_on
_.cpu_ep
_.format_version

# -- parity reports: CaseResult fields written to the JSON report (asdict) and read by --plot ----
_.abs_dps
