"""``python -m eloquent_vllm ...`` is ``python -m eloquent_vllm.serve ...``."""

from eloquent_vllm.serve import main

if __name__ == "__main__":  # vLLM spawns processes that re-import the main module: run only once
    raise SystemExit(main())
