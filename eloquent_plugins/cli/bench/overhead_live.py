"""``eloquent bench overhead --target URL | --vllm MODEL``: streamed vs non-streamed tokens/s on a live server.

The figure is tokens/s of streamed chat completions divided by tokens/s of the same requests non-streamed, per
concurrency level. On a shared machine single runs vary far more than the effect measured, so:

* **paired, interleaved rounds.** Each round runs every mode once, one after the other, in an order rotated from
  round to round (ABC, BCA, CAB, ...); the ratio is taken *within* the round (its streamed tokens/s over its own
  non-streamed tokens/s) and the table gives the median of the per-round ratios with their min-max. A slow spell
  on the machine then lowers both sides of one ratio instead of one side of the comparison.
* **three modes on one server.** Against a server that runs our middleware (found from its response headers) a
  round measures non-streamed, streamed through the middleware, and streamed *around* it (header
  ``eloquent-transport: datagram``, which the middleware passes through untouched: the app's own streaming, in
  the same process, with the same engine). Every run checks the path it took: through the middleware means the
  middleware's headers (``x-accel-buffering``, ``x-eloquent-stream``), and the bypass must have none of them and
  no SSE ``id:`` line.
* **a light client.** Requests go over :mod:`.lighthttp` (one :class:`asyncio.Protocol` per keep-alive
  connection, hand-written HTTP/1.1, the body decoded in ``data_received``), one connection per concurrent worker,
  opened by the worker's first request (inside the timed run, alike for every mode) and kept for the run. A
  stream is not parsed event by event: the client times the first non-empty ``"content"`` (time to first token)
  and keeps the last 4 KiB, where it finds ``data: [DONE]`` and the usage chunk's ``completion_tokens``
  (``stream_options.include_usage``); a non-streamed response is one ``json.loads``. A response that is not a
  200, a stream without ``[DONE]`` or a token count other than ``max_tokens`` (``ignore_eos``) is an error and
  its tokens are not counted. The client's own CPU time per 1000 tokens is reported for every mode. httpx is
  used only for ``/v1/models`` and ``/health``.

``--vllm MODEL`` measures CPU per token in vLLM's own processes instead (servers side by side, more paths):
see :mod:`.overhead_vllm`. The client, the modes and one run are in :mod:`.overhead_request`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
from collections.abc import Callable
from typing import Any

from eloquent_plugins.cli.bench.overhead_request import (
    BYPASS,
    NON_STREAMED,
    STREAMED,
    Mode,
    PathError,
    check_path,
    run_level,
)


# -- a target: rounds x levels x modes -------------------------------------------------------------------------


def _spread(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def summarise_level(level: int, requests: int, modes: list[Mode], rounds: list[dict[str, dict[str, Any]]]
                    ) -> dict[str, Any]:
    """Per mode: median/min/max tokens/s, median TTFT; per streamed mode: per-round ratios to non-streamed."""
    out: dict[str, Any] = {"concurrency": level, "requests": requests, "modes": {}, "ratios": {}}
    for mode in modes:
        runs = [r[mode.name] for r in rounds]
        entry: dict[str, Any] = {"tokens_per_s": _spread([r["tokens_per_s"] for r in runs]),
                                 "errors": sum(r["errors"] for r in runs),
                                 "client_cpu_ms_per_1k_tokens": 1e6 * sum(r["client_cpu_s"] for r in runs)
                                 / max(1, sum(r["tokens"] for r in runs))}
        ttfts = [r["ttft_p50_s"] for r in runs if "ttft_p50_s" in r]
        if ttfts:
            entry["ttft_p50_s_median"] = statistics.median(ttfts)
        samples = [r["error_sample"] for r in runs if "error_sample" in r]
        if samples:
            entry["error_sample"] = samples[0]
        out["modes"][mode.name] = entry

    def ratios(num: str, den: str) -> dict[str, Any]:
        values = [r[num]["tokens_per_s"] / r[den]["tokens_per_s"] if r[den]["tokens_per_s"] else float("nan")
                  for r in rounds]
        return _spread(values)

    for mode in modes:
        if mode.stream:
            out["ratios"][mode.name] = ratios(mode.name, NON_STREAMED.name)
    if any(m.name == BYPASS.name for m in modes):
        out["ratios"]["streamed/bypass"] = ratios(STREAMED.name, BYPASS.name)
    return out


def measure_target(label: str, url: str, model: str | None, max_tokens: int, levels: list[int],
                   requests: int | None, rounds: int, *, expect_middleware: bool | None = None,
                   progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """All levels, ``rounds`` interleaved rounds each (see the module docstring). The bypass mode is added when
    the server's streams go through our middleware; ``expect_middleware`` (True/False) makes that a requirement."""
    import httpx

    if model is None:
        model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
    # Warm-up (the first requests pay one-off costs) and the path check: does this server run our middleware?
    probe = asyncio.run(run_level(url, model, STREAMED, 8, 1, 2))
    if probe["errors"]:
        raise RuntimeError(f"{label}: warm-up request failed: {probe.get('error_sample')}")
    has_middleware = probe["via_middleware"] > 0
    if expect_middleware is not None and has_middleware != expect_middleware:
        raise PathError(f"{label}: streams {'do not ' if expect_middleware else ''}carry the middleware's headers")
    modes = [NON_STREAMED, STREAMED] + ([BYPASS] if has_middleware else [])
    load_before = os.getloadavg()[0]
    rows = []
    for level in levels:
        n = requests or max(4, 2 * level)
        for mode in modes:  # warm-up at this level, and each mode's path checked before it counts
            run = asyncio.run(run_level(url, model, mode, 8, level, level))
            if mode.stream:
                check_path(run, mode is STREAMED and has_middleware)
        per_round: list[dict[str, dict[str, Any]]] = []
        for i in range(rounds):
            order = modes[i % len(modes):] + modes[:i % len(modes)]
            runs = {}
            for position, mode in enumerate(order):
                run = asyncio.run(run_level(url, model, mode, max_tokens, level, n))
                if mode.stream:
                    check_path(run, mode is STREAMED and has_middleware)
                run["round"], run["position"] = i, position
                runs[mode.name] = run
            per_round.append(runs)
            if progress:
                cells = "  ".join(f"{m.name} {runs[m.name]['tokens_per_s']:.1f}" for m in order)
                progress(f"{label} c={level} round {i + 1}/{rounds}: {cells} tok/s")
        summary = summarise_level(level, n, modes, per_round)
        summary["runs"] = [run for r in per_round for run in r.values()]
        rows.append(summary)
    return {"label": label, "target": url, "model": model, "max_tokens": max_tokens, "rounds": rounds,
            "modes": [m.name for m in modes], "middleware": has_middleware, "loadavg_before": load_before,
            "loadavg_after": os.getloadavg()[0], "levels": rows}


# -- printing --------------------------------------------------------------------------------------------------


def _fmt_ratio(spread: dict[str, Any]) -> str:
    return f"{spread['median']:.3f} [{spread['min']:.3f}-{spread['max']:.3f}]"


def _level(result: dict[str, Any], level: int) -> dict[str, Any]:
    return next(r for r in result["levels"] if r["concurrency"] == level)


def side_by_side(results: list[dict[str, Any]], levels: list[int]) -> list[dict[str, Any]]:
    """One row per level: every target's streamed modes as ratios to the same target's non-streamed."""
    rows = []
    for level in levels:
        row: dict[str, Any] = {"concurrency": level}
        for result in results:
            for name, spread in _level(result, level)["ratios"].items():
                row[f"{result['label']} {name}"] = {k: spread[k] for k in ("median", "min", "max")}
        rows.append(row)
    return rows


_COLUMN_TITLES = {"streamed": "streamed / non-streamed", "bypass": "bypass (app's own streaming) / non-streamed",
                  "streamed/bypass": "streamed / bypass"}


def print_targets(results: list[dict[str, Any]], levels: list[int], *, client_cpus: str | None = None,
                  titles: dict[str, str] | None = None) -> None:
    """The per-mode figures, then one side-by-side table of the ratios (``titles``: column key -> heading)."""
    for result in results:
        print(f"{result['label']}: {result['target']}  model {result['model']}  max_tokens {result['max_tokens']}  "
              f"{result['rounds']} rounds, order rotated  modes {', '.join(result['modes'])}  load "
              f"{result['loadavg_before']:.1f} -> {result['loadavg_after']:.1f} on {os.cpu_count()} CPUs"
              + (f"  client on CPUs {client_cpus}" if client_cpus else ""))
    print(f"\n{'target':<10} {'conc':>4} {'mode':<13} {'tok/s median [min-max]':<26} {'TTFT p50':>9} "
          f"{'client CPU ms/1k tok':>21} {'errors':>6}")
    for result in results:
        for level in levels:
            for name, entry in _level(result, level)["modes"].items():
                spread = entry["tokens_per_s"]
                cell = f"{spread['median']:.1f} [{spread['min']:.1f}-{spread['max']:.1f}]"
                ttft = f"{entry['ttft_p50_s_median'] * 1000:.0f} ms" if "ttft_p50_s_median" in entry else "-"
                print(f"{result['label']:<10} {level:>4} {name:<13} {cell:<26} {ttft:>9} "
                      f"{entry['client_cpu_ms_per_1k_tokens']:>21.1f} {entry['errors']:>6}")
    keys = list(side_by_side(results, levels[:1])[0]) if levels else []
    keys = [k for k in keys if k != "concurrency"]
    keys = [k for k in keys if "/" not in k] + [k for k in keys if "/" in k]  # paired streamed/bypass last
    headings = []
    for key in keys:
        label, _, name = key.partition(" ")
        headings.append((titles or {}).get(key) or f"{label}: {_COLUMN_TITLES.get(name, name)}")
    width = [max(len(h), 23) for h in headings]
    print("\nmedian of per-round ratios of tokens/s [min-max]")
    print((f"{'concurrency':>11} | " + " | ".join(h.ljust(w) for h, w in zip(headings, width, strict=True))).rstrip())
    for row in side_by_side(results, levels):
        cells = [_fmt_ratio(row[key]).ljust(w) for key, w in zip(keys, width, strict=True)]
        print(f"{row['concurrency']:>11} | " + " | ".join(cells).rstrip())
    for result in results:
        for level in levels:
            for name, entry in _level(result, level)["modes"].items():
                if "error_sample" in entry:
                    print(f"{result['label']} c={level} {name}: {entry['errors']} errors, e.g. {entry['error_sample']}")


# -- --target --------------------------------------------------------------------------------------------------


def base_url(url: str) -> str:
    return url.rstrip("/").removesuffix("/v1")


def parse_targets(values: list[str]) -> list[tuple[str, str]]:
    """``URL`` or ``LABEL=URL`` each; unlabelled ones are called ``target``, ``target2``, ..."""
    out = []
    for i, value in enumerate(values):
        label, sep, url = value.partition("=")
        if not sep or "://" in label:
            label, url = ("target" if i == 0 else f"target{i + 1}"), value
        out.append((label, base_url(url)))
    return out


def parse_levels(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_cpus(text: str) -> set[int]:
    """``0``, ``1,3``, ``0-2,5`` -> a set of CPU numbers (``os.sched_setaffinity``'s form)."""
    cpus: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    if not cpus:
        raise ValueError(f"no CPUs in {text!r}")
    return cpus


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_target(args: argparse.Namespace) -> dict[str, Any]:
    levels = parse_levels(args.concurrency)
    results = [measure_target(label, url, args.model, args.max_tokens, levels, args.requests, args.rounds or 9,
                              progress=_progress)
               for label, url in parse_targets(args.target)]
    print_targets(results, levels, client_cpus=args.client_cpus)
    summary = side_by_side(results, levels)
    if len(results) == 1:  # the single-target JSON keeps its original shape
        return {**results[0], "targets": results, "summary": summary, "client_cpus": args.client_cpus}
    return {"targets": results, "concurrency": levels, "summary": summary, "client_cpus": args.client_cpus}
