"""Greedy generation with Hugging Face ``generate``: tokens/s of eager torch, torch.compile
(inductor) and torch.compile(backend="dpl") (issue 31: the goal is dpl >= inductor).

    python bench/bench_generate.py [--rounds 5] [--cache dynamic|static] [--threads 1 2] [--fresh]

A Llama-style decoder (LlamaForCausalLM from a config, random weights: 4 layers, hidden 512,
8 query heads and 4 key/value heads of 64, MLP 1408, vocabulary 4096, about 16M parameters),
batch 1, a prompt of 128 tokens, 32 new tokens, greedy. Each compiled variant is
``model.forward = torch.compile(model.forward, ...)`` on a copy of its own per thread count
(inductor fixes its OpenMP thread count when it compiles; dpl's ``threads`` is a build
option), warmed up by one ``generate`` (which compiles the prefill and decode graphs). Then
interleaved rounds, in one process: per round and thread count (``torch.set_num_threads``),
one ``generate`` of each variant. tokens/s is 32 / the whole ``generate`` (prefill included);
the table gives the medians over the rounds and the ratios to eager and to inductor. Each
variant's tokens are checked equal to eager's.

Stop 41, the 2-core Xeon with AVX-512 (480 MiB L3), quiet host, tokens/s of wall time, medians
of 9 rounds, the last run of the day; in brackets dpl / inductor in that day's other runs since
the static cache's grouped heads (7 or 9 rounds), between which eager moved by up to 20%:

    cache, prompt            threads   eager  inductor    dpl   dpl/inductor (other runs)  stop 40
    dynamic, 128 each round     1      172.5     215.6   238.0      1.10  (1.18, 1.12)    0.98-1.14
                                2      250.4     333.3   345.7      1.04  (1.08, 1.05)    0.91-1.00
    static, 128 each round      1      167.4     212.8   224.9      1.06  (1.16, 1.14, 1.13) 0.97-1.04
                                2      246.2     331.7   348.4      1.05  (1.13, 1.17, 1.13) 0.98-1.04
    dynamic, --fresh (5 rounds, 1      129.8     180.2   119.9      0.67                  0.68
      an earlier run)           2      213.5     295.8   163.8      0.55                  0.57

Every variant generated eager's tokens. Since stop 40: attention over key/value heads repeated for
the query heads (transformers' repeat_kv, the static cache's path) is grouped-query attention over
the unrepeated heads (two copies of each layer's cache a token fewer); the prefill (whose graph
takes f32[0] placeholders for the caches) runs prepared; a decode call's consecutive prepared runs
are one program from its second call; the output pool and the weight check cost 65 us less a call.
What is left (``exe.profile`` of a decode step): each layer's key cache is transposed for the
attention (a copy, 15-60 us); a decode plan on two threads retries one thread about once a
generate (``timed_choice.PROBE_SHARE``: 1-3 ms); ``--fresh`` pays about 2 ms a decode step at each
new length (rebinding the plan and preparing the steps the length moves) and 6 ms a prefill.

Dynamo's automatic-dynamic state is per code object, so the variants compiled after the first
see a symbolic prompt length from their first call.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

PROMPT, NEW_TOKENS, VOCAB = 128, 32, 4096
CONFIG = dict(vocab_size=VOCAB, hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
              num_key_value_heads=4, max_position_embeddings=512)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cache", choices=("dynamic", "static"), default="dynamic")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--fresh", action="store_true",
                        help="each round a prompt length no round ran before (a server's case): dpl plans each new "
                             "length anew, which the default, one prompt in every round, does not show")
    args = parser.parse_args(argv)

    import torch
    import transformers

    import dpl

    torch._dynamo.config.cache_size_limit = 64  # a compiled copy per variant and thread count, each a few graphs
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**CONFIG)
    config._attn_implementation = "sdpa"
    base = transformers.LlamaForCausalLM(config).eval()
    def prompt(length: int):
        return torch.randint(0, VOCAB, (1, length), generator=torch.Generator().manual_seed(1))

    ids = prompt(PROMPT)
    settings = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    if args.cache == "static":
        settings["cache_implementation"] = "static"

    def generate(model, ids=ids):
        with torch.no_grad():
            return model.generate(ids, **settings)

    want = generate(base)
    variants: dict[tuple[str, int], object] = {}
    failed: dict[str, str] = {}
    for threads in args.threads:
        torch.set_num_threads(threads)
        variants["eager", threads] = base
        for name, compile_forward in (("inductor", lambda f: torch.compile(f)),
                                      ("dpl", lambda f, t=threads: dpl.compile(f, threads=t))):
            if name in failed:
                continue
            model = copy.deepcopy(base)
            model.forward = compile_forward(model.forward)
            start = time.perf_counter()
            try:
                got = generate(model)
            except Exception as err:  # inductor needs a C++ compiler; keep the column with the reason
                failed[name] = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
                continue
            if args.fresh:  # a second length, so that dynamo's graphs are dynamic before the timed rounds
                generate(model, prompt(PROMPT + 1))
            print(f"{name}, {threads} thread(s): compiled and warmed up in {time.perf_counter() - start:.1f} s", flush=True)
            if not torch.equal(got, want):
                raise SystemExit(f"{name} at {threads} thread(s) generated other tokens than eager: "
                                 f"{got[0, PROMPT:].tolist()} vs {want[0, PROMPT:].tolist()}")
            variants[name, threads] = model
            if name == "dpl":
                print(_summary(model.forward.dpl_report), flush=True)

    walls: dict[tuple[str, int], list[float]] = {key: [] for key in variants}
    cpus: dict[tuple[str, int], list[float]] = {key: [] for key in variants}
    for r in range(args.rounds):
        ids_r = prompt(PROMPT + (r + 1) * (NEW_TOKENS + 8)) if args.fresh else ids  # decode lengths no round met
        for threads in args.threads:
            torch.set_num_threads(threads)
            for key, model in variants.items():
                if key[1] != threads:
                    continue
                wall, cpu = time.perf_counter(), time.process_time()
                generate(model, ids_r)
                walls[key].append(NEW_TOKENS / (time.perf_counter() - wall))
                cpus[key].append(NEW_TOKENS / (time.process_time() - cpu))

    first = PROMPT + NEW_TOKENS + 8
    prompts = f"a new prompt length each round ({first}, +{NEW_TOKENS + 8}, ...)" if args.fresh else f"prompt {PROMPT}"
    setting = (f"batch 1, {prompts}, {NEW_TOKENS} new tokens, {args.cache} cache, median of {args.rounds} "
               "interleaved rounds; generate's whole time, prefill included")
    _table(f"\ntokens/s of wall time ({setting})", walls, args.threads)
    _table("tokens/s of this process's CPU time (what other jobs on the host disturb less; at 2 threads both "
           "threads' time, so no speed-up shows)", cpus, args.threads)
    for name, why in failed.items():
        print(f"{name}: failed to compile or run, so its column is empty: {why}")
    return 0


def _table(title: str, samples: dict, thread_counts) -> None:
    print(title)
    print(f"{'threads':>7} {'eager':>8} {'inductor':>9} {'dpl':>8} {'dpl/eager':>10} {'dpl/inductor':>13}")
    for threads in thread_counts:
        med = {name: statistics.median(samples[name, threads]) if (name, threads) in samples else None
               for name in ("eager", "inductor", "dpl")}
        cells = [f"{v:8.1f}" if v is not None else f"{'-':>8}" for v in med.values()]
        ratio_eager = f"{med['dpl'] / med['eager']:10.2f}" if med["dpl"] else f"{'-':>10}"
        ratio_inductor = f"{med['dpl'] / med['inductor']:13.2f}" if med["dpl"] and med["inductor"] else f"{'-':>13}"
        print(f"{threads:>7} {cells[0]} {cells[1]:>9} {cells[2]} {ratio_eager} {ratio_inductor}")


def _summary(report) -> str:
    """One line per graph: its inputs, ops in dpl and in torch, and the dpl calls made so far."""
    lines = []
    for graph in report.graphs:
        calls = sum(p.calls for p in graph.parts if p.runs == "dpl")
        lines.append(f"  {graph.headline()}; {calls} dpl calls")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
