"""`fastmode distill` end to end: data, training under a time budget, checkpoints, export.

Files in the output folder:

    answers.jsonl      the teacher's answers to prompts.txt (generated once, reused)
    checkpoint.pt      student + AdamW + RNG + stream position (every --checkpoint-every steps)
    train_log.jsonl    one line per step: losses, learning rate, elapsed seconds (a run started
                       with `init_from` begins with the lines of the student it started from)
    spark.safetensors  the exported student (layers + final norm) with its JSON record
    spark.json         a readable copy of that record
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from fastmode.config import ModelConfig
from fastmode.distill.answers import load_prompts, teacher_answers
from fastmode.distill.corpus import Document, keep_clean, shakespeare_documents, stdlib_documents, text_pieces
from fastmode.distill.defaults import DEFAULT_MIX
from fastmode.distill.export import (
    MAX_BYTES,
    choose_format,
    decode,
    read_spark,
    save_spark,
    spark_file,
    teacher_identity,
)
from fastmode.distill.forward import check_supported
from fastmode.distill.importance import select_by_importance
from fastmode.distill.stream import SourceCursor, WindowStream
from fastmode.distill.student import choose_layers, own_state
from fastmode.distill.train import TrainConfig, Trainer, load_checkpoint, resume_mismatch, save_checkpoint
from fastmode.loader import LoadedModel
from fastmode.loader.tokenizer import Tokenizer

log = logging.getLogger(__name__)

PIECE_CHARS = 6000  # ~1,500 tokens: several windows per piece, many pieces per source
PROBE_SEED_OFFSET = 1_000_003  # the probe batch comes from its own stream, not from the training order
IMPORTANCE_SEED_OFFSET = 2_000_003  # so do the windows that layer importance is measured on
IMPORTANCE_SEQ_LEN = 64  # tokens per importance window: short windows, so that several sources are sampled


@dataclass(frozen=True)
class DistillOptions:
    """Everything about a run that is not the maths (that is `TrainConfig`)."""

    out_dir: Path
    model: str | None = None  # teacher; None = the embedded default model
    resume: bool = False
    max_steps: int | None = None  # stop at this step (None: at the time budget); resuming may raise it
    max_minutes: float = 60.0  # training wall time, summed over resumed sessions
    checkpoint_every: int = 25  # steps
    mix: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    answer_max_tokens: int = 128
    export_format: str = "auto"
    max_bytes: int = MAX_BYTES
    importance_windows: int = 8  # windows of IMPORTANCE_SEQ_LEN tokens that layer importance is measured on
    # A new run that starts from an exported student (its layers and weights) instead of the teacher's
    # layers: the way to go on training a student whose checkpoint is gone. The optimizer starts afresh.
    init_from: Path | None = None
    progress: bool = True


def teacher_config(model: str | None) -> ModelConfig:
    """The teacher's config, read from the GGUF header or config.json without loading any weights."""
    from fastmode.loader.gguf_file import config_from_metadata, read_metadata
    from fastmode.loader.hf_dir import config_from_hf
    from fastmode.loader.load import resolve_model_path

    path, _ = resolve_model_path(model)
    if path.is_file():
        from gguf import GGUFReader

        reader = GGUFReader(str(path))  # memory-mapped: only the header is read here
        return config_from_metadata(read_metadata(reader), {t.name for t in reader.tensors}, str(path))
    return config_from_hf(json.loads((path / "config.json").read_text()), str(path))


def load_sources(mix: Mapping[str, float], answer_docs: list[Document]) -> dict[str, list[Document]]:
    """Clean, split documents of every source with weight > 0 (a source may come back empty)."""
    loaders = {"stdlib": stdlib_documents, "shakespeare": shakespeare_documents, "answers": lambda: answer_docs}
    sources = {}
    for name, weight in mix.items():
        if name not in loaders:
            raise ValueError(f"unknown data source {name!r}; sources: {', '.join(loaders)}")
        if weight > 0:
            sources[name] = text_pieces(keep_clean(loaders[name]()), PIECE_CHARS)
    return sources


def make_stream(
    sources: Mapping[str, list[Document]], tokenizer: Tokenizer, cfg: TrainConfig, mix: Mapping[str, float], seed: int
) -> WindowStream:
    """A window stream over the non-empty sources; text is separated by <|endoftext|> (or EOS)."""
    separator = tokenizer.backend.token_to_id("<|endoftext|>")
    separator = tokenizer.eos_token_id if separator is None else separator

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    cursors = [SourceCursor(name, docs, encode, separator, seed) for name, docs in sources.items() if docs]
    return WindowStream(cursors, mix, seed, cfg.batch_size, cfg.seq_len)


def stored_format(teacher: LoadedModel, cfg: TrainConfig, opts: DistillOptions) -> str:
    """The format the student will be exported in (ValueError, before any training, if none fits)."""
    layer = {k: tuple(v.shape) for k, v in teacher.model.layers[0].state_dict().items()}
    shapes = {f"layers.{j}.{k}": shape for j in range(cfg.num_layers) for k, shape in layer.items()}
    shapes["norm.weight"] = (teacher.config.hidden_size,)
    return choose_format(shapes, opts.export_format, opts.max_bytes)


def choose_student_layers(
    teacher: LoadedModel, cfg: TrainConfig, sources: Mapping[str, list[Document]], opts: DistillOptions
) -> tuple[list[int], dict[str, Any]]:
    """The teacher layers the student starts from, and a record of how they were chosen."""
    n = teacher.config.num_layers
    if cfg.layer_selection == "even":
        layers = choose_layers(n, cfg.num_layers)
        return layers, {"method": "even", "layers": layers}
    windows = make_stream(
        sources,
        teacher.tokenizer,
        replace(cfg, batch_size=opts.importance_windows, seq_len=IMPORTANCE_SEQ_LEN),
        opts.mix,
        cfg.seed + IMPORTANCE_SEED_OFFSET,
    ).next_batch()[:, :-1]
    t0 = time.perf_counter()
    selection = select_by_importance(teacher.model, [windows], cfg.num_layers)
    log.info("layers by importance (%.0f s): %s", time.perf_counter() - t0, selection.layers)
    return selection.layers, selection.record()


@dataclass(frozen=True)
class StartingPoint:
    """What a run started from an exported student (`init_from`) takes from it."""

    layers: list[int]
    layer_selection: dict[str, Any]
    weights: dict[str, Any]  # the student's own tensors, fp32
    record: dict[str, Any]  # the earlier run, kept under summary.init_from
    log_rows: list[dict[str, Any]]  # its train_log.jsonl lines


def start_from_file(path: Path, identity: dict[str, str], cfg: TrainConfig) -> StartingPoint:
    """Read the exported student at `path` as the start of a new run.

    ValueError if it is not a student of this teacher, or has another number of layers than `cfg`.
    """
    file = spark_file(path)
    tensors, info = read_spark(file)
    if info["teacher"]["sha256"] != identity["sha256"]:
        raise ValueError(
            f"{file} was distilled from {info['teacher']['name']}, not from this teacher ({identity['name']})"
        )
    layers = list(info["layer_indices"])
    if len(layers) != cfg.num_layers:
        raise ValueError(f"{file} has {len(layers)} layers; pass --num-layers {len(layers)} to train it on")
    prior = info.get("summary", {})
    record = {
        "file": file.name,
        "format": info.get("format"),
        "steps": prior.get("steps", 0),
        "tokens": prior.get("tokens", 0),
        "train_minutes": prior.get("train_minutes", 0.0),
        "config": prior.get("config"),
        "init_from": prior.get("init_from"),  # the student that one started from, and so on
    }
    log_path = file.with_name("train_log.jsonl")
    rows = [json.loads(ln) for ln in log_path.read_text().splitlines() if ln] if log_path.exists() else []
    return StartingPoint(
        layers=layers,
        layer_selection=info.get("layer_selection") or {"method": "file", "layers": layers},
        weights=decode(tensors, torch.float32),  # the trainer keeps fp32 weights
        record=record,
        log_rows=rows,
    )


def _truncate_log(path: Path, last_step: int) -> None:
    # Steps after the checkpoint are redone on resume; drop their old lines so each step appears once.
    if path.exists():
        lines = [ln for ln in path.read_text().splitlines() if ln and json.loads(ln)["step"] <= last_step]
        path.write_text("".join(ln + "\n" for ln in lines))


@contextmanager
def _stop_on_first_ctrl_c() -> Iterator[Callable[[], bool]]:
    """Yield a "was Ctrl-C pressed?" check; the first Ctrl-C only sets it, a second one interrupts.

    Stopping between steps keeps the checkpoint consistent: a step cut in the
    middle has consumed its batch without updating the weights.
    """
    pressed = []

    def handler(signum, frame):
        if pressed:
            raise KeyboardInterrupt
        pressed.append(True)
        log.warning("Ctrl-C: stopping after this step (checkpoint + export); press again to abort")

    if threading.current_thread() is not threading.main_thread():
        yield lambda: False  # signal handlers can only be set from the main thread
        return
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield lambda: bool(pressed)
    finally:
        signal.signal(signal.SIGINT, previous)


def run_distill(teacher: LoadedModel, cfg: TrainConfig, opts: DistillOptions) -> dict[str, Any]:
    """Train (or resume) and export; returns the JSON record written beside the weights."""
    out = Path(opts.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    check_supported(teacher.config)
    ckpt_path, log_path = out / "checkpoint.pt", out / "train_log.jsonl"
    if ckpt_path.exists() and not opts.resume:
        raise FileExistsError(f"{ckpt_path} exists: pass --resume to continue it, or choose another --out")
    if opts.resume and not ckpt_path.exists():
        raise FileNotFoundError(f"--resume: no checkpoint at {ckpt_path}")
    if opts.resume and opts.init_from is not None:
        raise ValueError("--init-from starts a new run and --resume continues one: pass only one of them")
    identity = teacher_identity(teacher.path)
    fmt = stored_format(teacher, cfg, opts)
    state = load_checkpoint(ckpt_path) if opts.resume else None
    if cfg.quantize_aware_from is None:  # unset: as the checkpoint says, or from the start for a Q4_1 student
        start = state["config"].get("quantize_aware_from") if state else (0 if fmt == "q4_1" else None)
        cfg = replace(cfg, quantize_aware_from=start)

    answers = []
    if opts.mix.get("answers", 0) > 0:
        answers = teacher_answers(load_prompts(), out / "answers.jsonl", identity, opts.model, opts.answer_max_tokens)
    answer_docs = [a.document(teacher.tokenizer.eos_token_id) for a in answers]
    sources = load_sources(opts.mix, answer_docs)
    stream = make_stream(sources, teacher.tokenizer, cfg, opts.mix, cfg.seed)
    probe_batch = make_stream(sources, teacher.tokenizer, cfg, opts.mix, cfg.seed + PROBE_SEED_OFFSET).next_batch()

    # What decides the data (TrainConfig decides the rest): a resume must see the same stream.
    data_key = {
        "teacher": identity,
        "mix": dict(opts.mix),
        "answer_max_tokens": opts.answer_max_tokens,
        "piece_chars": PIECE_CHARS,
    }
    extra: dict[str, Any] = {"elapsed_s": 0.0, "data": data_key}
    if state is not None:
        if state["extra"]["data"] != data_key:
            raise ValueError(f"checkpoint was made with other data settings: {state['extra']['data']}, now {data_key}")
        diff = resume_mismatch(state["config"], cfg, state["step"])
        if diff:
            raise ValueError(f"checkpoint was made with other training settings (checkpoint, now): {diff}")
        trainer = Trainer(teacher.model, stream, cfg, state["layer_indices"])  # the layers chosen at the start
        trainer.load_state_dict(state)
        extra = state["extra"]
        _truncate_log(log_path, extra.get("step_offset", 0) + trainer.step)
        log.info("resumed at step %d", trainer.step)
    elif opts.init_from is not None:
        start = start_from_file(opts.init_from, identity, cfg)
        trainer = Trainer(teacher.model, stream, cfg, start.layers)
        trainer.load_student(start.weights, str(opts.init_from))
        extra["layer_selection"], extra["init_from"] = start.layer_selection, start.record
        # Log lines continue the earlier student's: steps and elapsed time count from where it stopped.
        last = start.log_rows[-1] if start.log_rows else {"step": start.record["steps"], "elapsed_s": 0.0}
        extra["step_offset"], extra["elapsed_offset_s"] = last["step"], last["elapsed_s"]
        log_path.write_text("".join(json.dumps(r) + "\n" for r in start.log_rows))
        extra["probe_kl_start"] = trainer.evaluate(probe_batch).kl
        log.info("started from %s (%d steps before)", opts.init_from, extra["step_offset"])
    else:
        layers, extra["layer_selection"] = choose_student_layers(teacher, cfg, sources, opts)
        trainer = Trainer(teacher.model, stream, cfg, layers)
        log_path.unlink(missing_ok=True)
        extra["probe_kl_start"] = trainer.evaluate(probe_batch).kl

    def checkpoint() -> None:
        save_checkpoint(ckpt_path, {**trainer.state_dict(), "extra": extra})

    budget_s = opts.max_minutes * 60
    last_step_s = 0.0
    bar = None
    if opts.progress:
        from tqdm import tqdm

        bar = tqdm(total=opts.max_steps, initial=trainer.step, unit="step", desc="distill")
    with _stop_on_first_ctrl_c() as stop_requested, log_path.open("a") as log_file:
        while opts.max_steps is None or trainer.step < opts.max_steps:
            if extra["elapsed_s"] + last_step_s > budget_s or stop_requested():
                break  # out of budget (the next step would end past it), or Ctrl-C
            t0 = time.perf_counter()
            parts = trainer.train_step()
            last_step_s = time.perf_counter() - t0
            extra["elapsed_s"] += last_step_s
            row = {
                "step": extra.get("step_offset", 0) + trainer.step,
                "kl": parts.kl,
                "ce": parts.ce,
                "loss": parts.total,
                "lr": cfg.lr_at(trainer.step - 1),
                "elapsed_s": round(extra.get("elapsed_offset_s", 0.0) + extra["elapsed_s"], 2),
            }
            log_file.write(json.dumps(row) + "\n")
            log_file.flush()
            if bar is not None:
                bar.set_postfix(
                    kl=f"{parts.kl:.3f}", ce=f"{parts.ce:.3f}", tok_s=f"{cfg.tokens_per_step / last_step_s:.0f}"
                )
                bar.update(1)
            if trainer.step % opts.checkpoint_every == 0:
                checkpoint()
    if bar is not None:
        bar.close()
    checkpoint()

    rows = [json.loads(ln) for ln in log_path.read_text().splitlines() if ln]
    tail = rows[-20:]
    info = {
        "teacher": identity,
        "teacher_num_layers": teacher.config.num_layers,
        "layer_indices": trainer.layer_indices,
        "layer_selection": extra.get("layer_selection"),
        "summary": {
            "config": asdict(cfg),
            "steps": trainer.step,
            "tokens": trainer.tokens_seen,
            "train_minutes": round(extra["elapsed_s"] / 60, 2),
            "quantize_aware_from": cfg.quantize_aware_from,
            "init_from": extra.get("init_from"),
            "data_mix": stream.fractions,
            "data_pieces": {name: len(docs) for name, docs in sources.items()},
            "probe_kl_start": extra.get("probe_kl_start"),
            "probe_kl_end": trainer.evaluate(probe_batch).kl,
            "last20_mean_kl": sum(r["kl"] for r in tail) / len(tail) if tail else None,
        },
    }
    if fmt == "q4_1" and not cfg.quantize_aware_at(trainer.step - 1):
        log.warning(
            "exporting as Q4_1 a student whose last steps did not train through Q4_1 rounding: the rounding "
            "undoes much of its training (pass --quantize-aware-from STEP, or a more precise --format)"
        )
    path = save_spark(out, own_state(trainer.student), info, fmt, opts.max_bytes)
    info = json.loads((out / "spark.json").read_text())
    info["path"] = str(path)
    return info
