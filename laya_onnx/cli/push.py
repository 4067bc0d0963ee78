"""`laya-onnx push BUNDLE REPO_ID`: publish a bundle to the Hugging Face Hub with a model card."""

from __future__ import annotations

import argparse

from laya_onnx.cli.common import EXIT_OK

NAME = "push"
HELP = "publish a bundle to the Hugging Face Hub (one commit: its files, manifest and a model card)"


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        NAME,
        help=HELP,
        description="Verify the bundle's files against its manifest, write a model card from it "
        "(precision and gate, parity, file digests, timings at export, how to load it) and commit "
        "both to REPO_ID with huggingface_hub. The Hub is $HF_ENDPOINT's, else huggingface.co; "
        "the token $HF_TOKEN's or `hf auth login`'s.",
    )
    p.add_argument("bundle", help="the bundle directory (laya-onnx export's output)")
    p.add_argument("repo_id", help="org/name, or org/name/subfolder to publish into a subfolder")
    p.add_argument("--private", action="store_true", help="create the repo private (when it is created)")
    p.add_argument("--revision", help="the branch to commit to (created when missing; default: main)")
    p.add_argument("--commit-message", help="the commit's message (default: names the precision)")
    p.add_argument("--license", help="the card's license (a Hub license id, e.g. apache-2.0)")
    p.add_argument(
        "--allow-random-weights",
        action="store_true",
        help="publish a bundle of a test checkpoint (laya-onnx make-checkpoint); refused otherwise",
    )
    return p


def run(args: argparse.Namespace) -> int:
    from laya_onnx.core.publish import push_bundle

    url = push_bundle(
        args.bundle,
        args.repo_id,
        private=args.private,
        revision=args.revision,
        commit_message=args.commit_message,
        allow_random_weights=args.allow_random_weights,
        license=args.license,
    )
    print(f"pushed: {url}")
    return EXIT_OK
