"""A character-level LSTM language model on CPython's own documentation: ``python -m arrayrnn.demo``.

The text is ``pydoc_data.topics`` (about half a million characters of English help text that ships with
every CPython). The model is ``Embedding -> LSTM -> Dense`` built from ``ar.nn``, trained with
``ar.value_and_grad`` and ``ar.optim.Adam`` on random windows of the first 90% of the text; the last 10%
is held out. It prints the unigram entropy of the text (the bits per character of a model that knows only
character frequencies), the validation bits per character before and after training, and a sample.
The same seed gives the same numbers.

``--recurrent-dropout p`` / ``--weight-dropout p`` train the LSTM with variational dropout on ``h_{t-1}``
or DropConnect on ``W_hh`` (see ``arrayrnn.RNNSpec``); the demo then trains the same model without them
first and reports the validation bits per character of both.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import threadpoolctl

from . import engines, ops
from .autodiff import value_and_grad
from .core import npzfile
from .core.errors import EngineUnavailableError
from .core.spec import SEED_LIMIT, RNNSpec, check_seed
from .engines.thread_count import get_num_threads
from .training import distributed, nn, optim

MODEL_KIND = "arrayrnn-demo"  # the kind of file save_model writes (see arrayrnn.core.npzfile)

LN2 = math.log(2.0)
TRAIN_FRACTION = 0.9   # the first 90% of the text trains, the rest is held out
EVAL_ROWS = 32   # bits_per_char cuts the held-out text into this many parallel streams


@dataclass(frozen=True)
class Config:
    steps: int = 800
    hidden: int = 256
    layers: int = 1
    embed: int = 48
    batch: int = 32
    seq_len: int = 64
    lr: float = 4e-3
    clip: float = 1.0
    engine: str = "auto"
    seed: int = 0
    eval_chars: int = 16384
    sample_chars: int = 300
    recurrent_dropout: float = 0.0
    weight_dropout: float = 0.0
    layer_norm: bool = False

    def __post_init__(self) -> None:
        for field, minimum in (("steps", 1), ("hidden", 1), ("layers", 1), ("embed", 1), ("batch", 1),
                               ("seq_len", 1), ("eval_chars", EVAL_ROWS + 1), ("sample_chars", 0)):
            if not (_is_int(getattr(self, field)) and getattr(self, field) >= minimum):
                raise BadOption(field, getattr(self, field), f"an integer >= {minimum}")
        for field in ("lr", "clip"):
            if not _is_positive_number(getattr(self, field)):
                raise BadOption(field, getattr(self, field), "a finite number > 0")
        for field in ("recurrent_dropout", "weight_dropout"):
            if not _is_probability(getattr(self, field)):
                raise BadOption(field, getattr(self, field), "a number in [0, 1)")
        if not isinstance(self.layer_norm, (bool, np.bool_)):
            raise BadOption("layer_norm", self.layer_norm, "True or False")
        if not isinstance(self.engine, str) or self.engine not in engines.engine_names():
            raise BadOption("engine", self.engine, f"one of {', '.join(engines.engine_names())}")
        try:
            check_seed(self.seed)
        except (TypeError, ValueError):
            raise BadOption("seed", self.seed, "an integer in [0, 2**64)") from None
        if self.seed is None:
            raise BadOption("seed", None, "an integer in [0, 2**64) (the demo is reproducible)")


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_positive_number(value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        return False
    return math.isfinite(value) and value > 0


def _is_probability(value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        return False
    return 0.0 <= value < 1.0


VARIANTS = ("recurrent_dropout", "weight_dropout", "layer_norm")  # the LSTM's options the demo compares


def variants_text(cfg: Config) -> str:
    """``"recurrent_dropout=0.25, layer_norm=True"``: the cell variants ``cfg`` turns on ("" if none)."""
    return ", ".join(f"{name}={getattr(cfg, name)}" for name in VARIANTS if getattr(cfg, name))


class BadOption(ValueError):
    """A :class:`Config` field (a command-line option) with a value outside its range."""

    def __init__(self, field: str, value: Any, expected: str):
        super().__init__(f"{field} = {value!r}; expected {expected}")
        self.field, self.value, self.expected = field, value, expected

    def as_option(self) -> str:
        """The message in command-line terms: ``--seq-len = 0; expected ...``."""
        return f"--{self.field.replace('_', '-')} = {self.value}; expected {self.expected}"


def load_text() -> str:
    """CPython's ``pydoc_data.topics`` help texts, joined in key order."""
    from pydoc_data.topics import topics

    return "".join(topics[key] for key in sorted(topics))


class Vocabulary:
    """The sorted set of characters of a text, with encode/decode to integer ids."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        return np.array([self.index[c] for c in text], dtype=np.int64)

    def decode(self, ids: Any) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def unigram_entropy(ids: np.ndarray, vocab_size: int) -> float:
    """Bits per character of the character-frequency model of ``ids``."""
    p = np.bincount(ids, minlength=vocab_size) / len(ids)
    p = p[p > 0]
    return float(-(p * np.log2(p)).sum())


def derived_seed(seed: int, offset: int) -> int:
    """``seed + offset``, wrapped into the 64-bit seed range (so ``--seed 2**64 - 1`` is valid too)."""
    return (seed + offset) % SEED_LIMIT


def batch_engine(name: str) -> str:
    """The engine the demo runs for ``--engine name``: ``"auto"`` takes numba's loops from the first call
    where numba runs here, waiting for their compile, rather than the reference engine meanwhile: a batch
    job wants its total time and the same numbers every run (the switch from the reference engine moves the
    last digits); ``"auto"`` stays where numba cannot run."""
    if name == "auto" and engines.engine_unavailable_reason("numba", engines.probe_call(
            RNNSpec("lstm", 1, 1), training=True)) is None:
        return "numba"
    return name


def blas_beside(engine: str) -> contextlib.AbstractContextManager:
    """NumPy's BLAS held to one thread while the LSTM runs on the numba engine's threads (a context).

    After each product OpenBLAS's threads spin for about 0.1 s (``OPENBLAS_THREAD_TIMEOUT``, 2**28 cycles)
    on the cores the engine's time loops and split products need; the head's products between the LSTM's
    forward and backward kept them spinning through every engine call (2 cores: 121 -> 86 ms per training
    step with one BLAS thread, bench/bench_demo_step.py). The head's own products are small. The engine
    holds BLAS to one thread inside its own calls; what runs between them is the program's to hold."""
    if engine != "numba" or get_num_threads() == 1:
        return contextlib.nullcontext()
    return threadpoolctl.threadpool_limits(1, user_api="blas")


class CharModel:
    """``Embedding -> LSTM -> Dense``; ``params`` is the list of the three layers' buffers."""

    def __init__(self, vocab_size: int, cfg: Config):
        self.embedding = nn.Embedding(vocab_size, cfg.embed, seed=derived_seed(cfg.seed, 0))
        self.lstm = nn.LSTM(cfg.embed, cfg.hidden, cfg.layers, seed=derived_seed(cfg.seed, 1),
                            engine=batch_engine(cfg.engine), recurrent_dropout=cfg.recurrent_dropout,
                            weight_dropout=cfg.weight_dropout, layer_norm=cfg.layer_norm)
        self.head = nn.Dense(cfg.hidden, vocab_size, seed=derived_seed(cfg.seed, 2))

    @property
    def params(self) -> list:
        return [self.embedding.params, self.lstm.params, self.head.params]

    def logits(self, params: list, ids: Any, h0: Any = None, c0: Any = None,
               seed: int | None = None) -> tuple[Any, Any, Any]:
        """Time-major ``ids`` ``(T, B)`` -> logits ``(T, B, V)`` and the final ``(h, c)``. ``seed`` draws the
        dropout masks of a differentiated call (training); evaluation uses none."""
        emb, lstm, head = params
        y, h_n, c_n = self.lstm.apply(lstm, self.embedding.apply(emb, ids), h0=h0, c0=c0, seed=seed)
        return self.head.apply(head, y), h_n, c_n

    def loss(self, params: list, inputs: Any, targets: Any, seed: int | None = None) -> Any:
        logits, _, _ = self.logits(params, inputs, seed=seed)
        return ops.softmax_cross_entropy(logits, targets)


def random_windows(ids: np.ndarray, batch: int, seq_len: int, rng: np.random.Generator) -> np.ndarray:
    """``(seq_len + 1, batch)`` windows starting at random offsets (time-major)."""
    starts = rng.integers(0, len(ids) - seq_len - 1, size=batch)
    return np.stack([ids[s:s + seq_len + 1] for s in starts], axis=1)


def bits_per_char(model: CharModel, ids: np.ndarray, rows: int = EVAL_ROWS) -> float:
    """Mean next-character cross-entropy in bits over ``ids`` cut into ``rows`` parallel streams."""
    length = (len(ids) - 1) // rows
    windows = np.stack([ids[r * length:(r + 1) * length + 1] for r in range(rows)], axis=1)
    loss = model.loss(model.params, windows[:-1], windows[1:])
    return float(loss) / LN2


def learning_rate(cfg: Config, step: int) -> float:
    """Linear warm-up over the first 5% of steps, then cosine decay to 10% of ``cfg.lr``."""
    warmup = max(1, cfg.steps // 20)
    if step <= warmup:
        return cfg.lr * step / warmup
    progress = (step - warmup) / max(1, cfg.steps - warmup)
    return cfg.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def train(cfg: Config, train_ids: np.ndarray, model: CharModel, progress: bool = True,
          comm: Any = None) -> list[float]:
    """Run ``cfg.steps`` Adam steps; returns the training loss (nats) of every step.

    With an MPI ``comm`` (data-parallel), each rank trains on its own shard of ``train_ids`` and the
    gradients are averaged across ranks every step; the returned losses are this rank's.

    A non-finite loss stops training with a ``FloatingPointError`` naming the step.
    """
    from tqdm import tqdm

    rank, size = (comm.Get_rank(), comm.Get_size()) if comm is not None else (0, 1)
    if cfg.seq_len > max_seq_len(len(train_ids), size):
        raise BadOption("seq_len", cfg.seq_len, f"an integer <= {max_seq_len(len(train_ids), size)} (each "
                        "rank's share of the training text must hold a sequence and its next character)")
    train_ids = train_ids[rank * len(train_ids) // size:(rank + 1) * len(train_ids) // size]
    rng = np.random.default_rng(derived_seed(cfg.seed, rank))
    opt = optim.Adam(model.params, lr=cfg.lr)
    if comm is not None:
        distributed.broadcast_from_root([model.params, opt], comm)
    loss_and_grads = value_and_grad(model.loss)
    losses: list[float] = []
    chars_per_step = cfg.batch * cfg.seq_len
    start = time.perf_counter()
    with tqdm(range(1, cfg.steps + 1), desc="training", unit="step", disable=not progress,
              file=sys.stderr, dynamic_ncols=True) as bar:
        for step in bar:
            window = random_windows(train_ids, cfg.batch, cfg.seq_len, rng)
            masks_seed = derived_seed(cfg.seed, 3 + step * size + rank)  # new masks every step and rank
            loss, grads = loss_and_grads(model.params, window[:-1], window[1:], seed=masks_seed)
            loss = float(loss)
            if not math.isfinite(loss):
                raise FloatingPointError(f"step {step}: the training loss is {loss}; training diverged "
                                         f"(try a smaller --lr than {cfg.lr} or a smaller clip)")
            if comm is not None:
                distributed.allreduce_mean(grads, comm)
            optim.clip_grad_norm(grads, cfg.clip)
            opt.lr = learning_rate(cfg, step)
            opt.step(grads)
            losses.append(loss)
            elapsed = time.perf_counter() - start
            speed = step * chars_per_step / elapsed
            bar.set_postfix(loss=f"{loss:.3f}", bpc=f"{loss / LN2:.2f}", chars_s=f"{speed:,.0f}")
    return losses


def sample(model: CharModel, vocab: Vocabulary, prompt: str, n: int, seed: int,
           temperature: float = 0.8) -> str:
    """Continue ``prompt`` by ``n`` characters, one LSTM step at a time, carrying ``(h, c)``."""
    rng = np.random.default_rng(seed)
    logits, h, c = model.logits(model.params, vocab.encode(prompt)[:, None])
    out = []
    for _ in range(n):
        z = logits[-1, 0].astype(np.float64) / temperature
        p = np.exp(z - z.max())
        next_id = int(rng.choice(len(p), p=p / p.sum()))
        out.append(next_id)
        logits, h, c = model.logits(model.params, np.array([[next_id]]), h, c)
    return prompt + vocab.decode(out)


def save_model(path: str, model: CharModel, vocab: Vocabulary, cfg: Config) -> None:
    """An ``.npz`` with a JSON header (config, vocabulary) and the three parameter buffers; no pickle."""
    header = {"config": asdict(cfg), "chars": vocab.chars}
    npzfile.write(path, MODEL_KIND, 1, header, _buffers(model))


def load_model(path: str) -> tuple[CharModel, Vocabulary, Config]:
    built: dict[str, Any] = {}

    def expect(header: dict[str, Any]) -> dict[str, tuple[Any, tuple[int, ...]]]:
        """Build the model the header describes; its buffers are what the members must be."""
        try:
            cfg = Config(**header["config"])
            vocab = Vocabulary("".join(header["chars"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: damaged demo model header ({type(e).__name__}: {e})") from None
        built.update(model=CharModel(len(vocab), cfg), vocab=vocab, cfg=cfg)
        return {name: (a.dtype, a.shape) for name, a in _buffers(built["model"]).items()}

    _, arrays = npzfile.read(path, MODEL_KIND, range(1, 2), expect=expect)  # version 1, the only one
    for name, target in _buffers(built["model"]).items():
        target[...] = arrays[name]
    return built["model"], built["vocab"], built["cfg"]


def _buffers(model: CharModel) -> dict[str, np.ndarray]:
    """The model's parameter buffers by their member names in a saved model."""
    return {"embedding": model.embedding.params, "lstm": model.lstm.params.data, "head": model.head.params}


def run(cfg: Config, save: str | None = None, progress: bool = True, out: Any = sys.stdout,
        comm: Any = None) -> dict[str, Any]:
    """The whole demo; returns the numbers it prints."""
    started = time.perf_counter()
    text = load_text()
    vocab = Vocabulary(text)
    ids = vocab.encode(text)
    split = int(TRAIN_FRACTION * len(ids))
    train_ids, valid_ids = ids[:split], ids[split:split + cfg.eval_chars + 1]
    model = CharModel(len(vocab), cfg)
    entropy = unigram_entropy(train_ids, len(vocab))
    variants = f" {variants_text(cfg)}" if variants_text(cfg) else ""
    print(f"text: pydoc_data.topics, {len(text):,} characters, {len(vocab)} distinct; model: LSTM "
          f"hidden={cfg.hidden} layers={cfg.layers}{variants} engine={model.lstm.engine}", file=out)
    print(f"unigram entropy of the text:        {entropy:.3f} bits/char", file=out)
    with blas_beside(model.lstm.engine):
        before = bits_per_char(model, valid_ids)
        print(f"validation bits/char before:        {before:.3f}", file=out)
        train_start = time.perf_counter()
        losses = train(cfg, train_ids, model, progress=progress, comm=comm)
        train_seconds = time.perf_counter() - train_start
        after = bits_per_char(model, valid_ids)
    chars_per_second = cfg.steps * cfg.batch * cfg.seq_len / train_seconds
    print(f"validation bits/char after {cfg.steps} steps: {after:.3f}  "
          f"({train_seconds:.1f} s of training, {chars_per_second:,.0f} chars/s)", file=out)
    text_sample = sample(model, vocab, "The ", cfg.sample_chars, cfg.seed)
    print("sample:\n" + text_sample, file=out)
    if save:
        save_model(save, model, vocab, cfg)
        print(f"saved the model to {save}", file=out)
    total = time.perf_counter() - started
    print(f"total time: {total:.1f} s", file=out)
    return {"unigram_entropy": entropy, "bpc_before": before, "bpc_after": after, "losses": losses,
            "sample": text_sample, "train_seconds": train_seconds, "total_seconds": total}


def run_with_and_without(cfg: Config, save: str | None = None, progress: bool = True, out: Any = sys.stdout,
                         comm: Any = None) -> dict[str, Any]:
    """``run`` the model without its cell variants, then with them (``save`` keeps the latter), and print
    both validation bits per character; returns ``{"without": ..., "with": ...}``."""
    plain = replace(cfg, recurrent_dropout=0.0, weight_dropout=0.0, layer_norm=False)
    print(f"== without {', '.join(name for name in VARIANTS if getattr(cfg, name))}", file=out)
    without = run(plain, progress=progress, out=out, comm=comm)
    print(f"== with {variants_text(cfg)}", file=out)
    with_variants = run(cfg, save=save, progress=progress, out=out, comm=comm)
    print(f"validation bits/char after {cfg.steps} steps: {without['bpc_after']:.3f} without, "
          f"{with_variants['bpc_after']:.3f} with {variants_text(cfg)}", file=out)
    return {"without": without, "with": with_variants}


def main(argv: list[str] | None = None) -> None:
    defaults = Config()
    parser = argparse.ArgumentParser(prog="python -m arrayrnn.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=defaults.steps, help="training steps (%(default)s)")
    parser.add_argument("--hidden", type=int, default=defaults.hidden, help="LSTM hidden size (%(default)s)")
    parser.add_argument("--layers", type=int, default=defaults.layers, help="LSTM layers (%(default)s)")
    parser.add_argument("--engine", default=defaults.engine,
                        help=f"{' | '.join(engines.engine_names())} (%(default)s)")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="random seed, 0 <= seed < 2**64 "
                        "(%(default)s)")
    parser.add_argument("--batch", type=int, default=defaults.batch, help="sequences per step (%(default)s)")
    parser.add_argument("--seq-len", type=int, default=defaults.seq_len, help="characters per sequence "
                        "(%(default)s)")
    parser.add_argument("--lr", type=float, default=defaults.lr, help="peak Adam learning rate (%(default)s)")
    parser.add_argument("--recurrent-dropout", type=float, default=defaults.recurrent_dropout,
                        help="variational dropout on h_{t-1} in the LSTM's recurrent product, 0 <= p < 1; "
                        "also trains without it and reports both (%(default)s)")
    parser.add_argument("--weight-dropout", type=float, default=defaults.weight_dropout,
                        help="DropConnect on W_hh, 0 <= p < 1; also trains without it and reports both "
                        "(%(default)s)")
    parser.add_argument("--layer-norm", action="store_true",
                        help="layer normalisation inside the LSTM's recurrence (both products and the cell); "
                        "also trains without it and reports both")
    parser.add_argument("--distributed", action="store_true", help="data-parallel under MPI: "
                        "mpiexec -n 2 python -m arrayrnn.demo --distributed (needs the mpi extra)")
    parser.add_argument("--save", metavar="PATH", help="write the trained model to PATH (.npz)")
    args = parser.parse_args(argv)
    cfg = _config_from(parser, args)
    comm = _communicator(parser, args.distributed)
    _check_fits(parser, cfg, comm)
    if args.save and os.path.isdir(args.save):
        parser.error(f"--save {args.save}: is a directory; expected a file path (e.g. {args.save}/model.npz)")
    if args.save and not os.path.isdir(os.path.dirname(os.path.abspath(args.save))):
        parser.error(f"--save {args.save}: the directory does not exist")
    run_demo = run_with_and_without if variants_text(cfg) else run
    if comm is None:
        run_demo(cfg, save=args.save)
        return
    with distributed.abort_on_error(comm), open(os.devnull, "w") as devnull:
        lead = comm.Get_rank() == 0     # rank 0 prints, shows the progress bar and saves
        run_demo(cfg, save=args.save if lead else None, progress=lead, out=sys.stdout if lead else devnull,
                 comm=comm)


def _config_from(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Config:
    """The options as a :class:`Config`; a value out of range is argparse's usage error."""
    try:
        return Config(steps=args.steps, hidden=args.hidden, layers=args.layers, engine=args.engine,
                      seed=args.seed, batch=args.batch, seq_len=args.seq_len, lr=args.lr,
                      recurrent_dropout=args.recurrent_dropout, weight_dropout=args.weight_dropout,
                      layer_norm=args.layer_norm)
    except BadOption as err:
        parser.error(err.as_option())


def _communicator(parser: argparse.ArgumentParser, distributed_run: bool) -> Any:
    if not distributed_run:
        return None
    try:
        from mpi4py import MPI
    except ImportError as err:
        parser.error(f"--distributed needs mpi4py ({err}); install it with pip install 'arrayrnn[mpi]'")
    return MPI.COMM_WORLD


def _check_fits(parser: argparse.ArgumentParser, cfg: Config, comm: Any) -> None:
    """The sizes make an LSTM, the engine can train it here, and a sequence fits in each rank's text."""
    try:
        spec = RNNSpec("lstm", cfg.embed, cfg.hidden, cfg.layers, recurrent_dropout=cfg.recurrent_dropout,
                       weight_dropout=cfg.weight_dropout, layer_norm=cfg.layer_norm)
    except ValueError as err:
        parser.error(f"--hidden = {cfg.hidden}, --layers = {cfg.layers}: {err}")
    if cfg.engine != "auto":
        try:
            engines.select_engine(cfg.engine, engines.probe_call(spec, training=True))
        except EngineUnavailableError as err:
            parser.error(f"--engine = {cfg.engine}: {err}")
    longest = max_seq_len(int(TRAIN_FRACTION * len(load_text())), comm.Get_size() if comm else 1)
    if cfg.seq_len > longest:
        parser.error(f"--seq-len = {cfg.seq_len}; expected at most {longest} (each rank's share of the "
                     "training text must hold a sequence and its next character)")


def max_seq_len(train_chars: int, ranks: int) -> int:
    """The longest ``seq_len`` whose windows (``seq_len + 1`` characters) fit in each rank's share."""
    return train_chars // ranks - 2


if __name__ == "__main__":
    main()
