"""The MoE models that ragdot's benchmarks, tuner and tests use, defined once.

Each `MoEModel` holds a model's MoE layer (embedding width ``dim``, expert MLP width ``moe_hidden``, routed
``experts``, ``top_k``, ``shared`` experts) and what the benchmarks derive from it:

- ``gemm_tokens``: the routed-row counts M of the expert-GEMM micro-benchmark; each gives one shape
  (M, K=dim, N=moe_hidden, E=experts) of `ragdot.shapes.SHAPES`, named ``shape_name`` (default: the model's
  name; with several counts, ``<name>-m<M>``);
- ``train``: the reduced depth, sequence and batch of the train-step benchmark (`ragdot.moe.model.MODEL_CONFIGS`);
- ``mxfp8``: the grouped weight-gradient problems of ``ragdot bench-mxfp8``, given whole (their expert count is
  a per-device slice, their N may be a fused projection).

Tags pick the tables a model appears in:

- ``seed``, ``anchor``, ``tiny``: the tags of its GEMM shapes (``ragdot bench`` / ``tune`` / tests; see
  `ragdot.shapes`); ``tiny`` also keeps a model's MXFP8 problems out of that bench's default set;
- ``moe``: in the train-step set (``ragdot moe-bench`` runs every one by default); needs ``train``;
- ``layer``: a layer config only (``moe-bench --layer``, or ``--configs NAME``), outside the default train set;
- ``quick``: the one CPU smoke config (`ragdot.moe.model.QUICK_CONFIG`); needs ``train``;
- ``mxfp8``: has ``mxfp8`` problems.

Add a model by adding one `MoEModel` to `MODELS`; the derived tables keep catalog order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

__all__ = [
    "TAGS", "MODELS", "MoEModel", "TrainStep", "WgradProblem", "check_catalog", "get_model", "mxfp8_problems",
    "with_tag",
]  # fmt: skip

TAGS: tuple[str, ...] = ("seed", "anchor", "tiny", "moe", "layer", "quick", "mxfp8")


def _check_positive(owner: str, **values: int | None) -> None:
    for field, value in values.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{owner}: {field} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class TrainStep:
    """The reduced decoder of the train-step benchmark: tokens per step = batch x seq_len."""

    layers: int
    seq_len: int
    batch: int
    vocab: int = 4096
    head_dim: int = 128

    def __post_init__(self) -> None:
        _check_positive("train step", **vars(self))


@dataclass(frozen=True)
class WgradProblem:
    """One MXFP8 grouped weight-gradient problem: dW [experts, K, N] from `tokens` routed rows."""

    name: str
    N: int
    K: int
    experts: int
    tokens: int

    def __post_init__(self) -> None:
        _check_positive(f"mxfp8 problem {self.name!r}", N=self.N, K=self.K, experts=self.experts, tokens=self.tokens)

    @property
    def dims(self) -> tuple[int, int, int, int]:
        """(N, K, experts, tokens), the MXFP8 bench's order."""
        return (self.N, self.K, self.experts, self.tokens)


@dataclass(frozen=True)
class MoEModel:
    """One MoE model of the catalog (``top_k`` / ``shared`` None: not used by any table, left unstated)."""

    name: str
    dim: int
    moe_hidden: int
    experts: int
    top_k: int | None = None
    shared: int | None = None
    gemm_tokens: tuple[int, ...] = ()
    shape_name: str | None = None
    train: TrainStep | None = None
    mxfp8: tuple[WgradProblem, ...] = ()
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        owner = f"model {self.name!r}"
        _check_positive(owner, dim=self.dim, moe_hidden=self.moe_hidden, experts=self.experts, top_k=self.top_k)
        _check_positive(owner, **{f"gemm_tokens[{i}]": m for i, m in enumerate(self.gemm_tokens)})
        if self.shared is not None and (isinstance(self.shared, bool) or not isinstance(self.shared, int)
                                        or self.shared < 0):  # fmt: skip
            raise ValueError(f"{owner}: shared must be a non-negative int, got {self.shared!r}")
        unknown = [t for t in self.tags if t not in TAGS]
        if unknown:
            raise ValueError(f"{owner}: tags {unknown} are unknown; expected some of {', '.join(TAGS)}")
        self._check_tags(owner)

    def _check_tags(self, owner: str) -> None:
        tags = set(self.tags)
        if tags & {"moe", "layer", "quick"} and (self.top_k is None or self.shared is None):
            raise ValueError(f"{owner}: a moe, layer or quick config needs top_k and shared")
        if tags & {"moe", "quick"} and self.train is None:
            raise ValueError(f"{owner}: a moe or quick config needs train=TrainStep(...)")
        if tags & {"seed", "anchor"} and not self.gemm_tokens:
            raise ValueError(f"{owner}: a seed or anchor model needs gemm_tokens")
        if ("mxfp8" in tags) != bool(self.mxfp8):
            raise ValueError(f"{owner}: the mxfp8 tag and mxfp8 problems go together")

    def shapes(self) -> Iterator[tuple[str, int, int, int, int]]:
        """(shape name, M, K, N, E) for each of gemm_tokens."""
        base = self.shape_name or self.name
        for m in self.gemm_tokens:
            name = base if len(self.gemm_tokens) == 1 else f"{base}-m{m}"
            yield (name, m, self.dim, self.moe_hidden, self.experts)


def _duplicates(names: Iterable[str]) -> list[str]:
    return sorted(n for n, count in Counter(names).items() if count > 1)


def check_catalog(models: Iterable[MoEModel]) -> tuple[MoEModel, ...]:
    """`models` as a tuple, after checking that model, shape and MXFP8 names are unique and one model is quick."""
    models = tuple(models)
    tables = {
        "model": [m.name for m in models],
        "shape": [s[0] for m in models for s in m.shapes()],
        "mxfp8 problem": [p.name for m in models for p in m.mxfp8],
    }
    for kind, names in tables.items():
        if dup := _duplicates(names):
            raise ValueError(f"catalog: {kind} names {dup} appear more than once")
    quick = [m.name for m in models if "quick" in m.tags]
    if len(quick) != 1:
        raise ValueError(f"catalog: exactly one model must be tagged quick, got {quick}")
    return models


def _train(layers: int, seq_len: int, batch: int) -> TrainStep:
    return TrainStep(layers, seq_len, batch)


_ANCHOR = ("seed", "anchor", "moe")

# name, dim, moe_hidden, experts, top_k, shared; then the GEMM token count M, the train step (layers, seq_len,
# batch: 4096 tokens per step, 2048 for the widest, so that one step of every path fits an H200 in seconds;
# mixtral-8x7b-large's expert weights alone exceed one GPU and the bench reports it skipped).
MODELS: tuple[MoEModel, ...] = check_catalog((
    MoEModel("deepseek2-16b", 2048, 1408, 64, 6, 2, (3840,), train=_train(4, 512, 8), tags=(*_ANCHOR, "mxfp8"),
             mxfp8=(WgradProblem("16B", 1408, 2048, 8, 195_840),)),
    MoEModel("deepseek3-test", 512, 512, 256, 8, 1, (5120,), train=_train(4, 512, 8), tags=_ANCHOR),
    MoEModel("deepseek3-671b-reduced", 7168, 2048, 32, 8, 1, train=_train(2, 512, 4), tags=("moe", "mxfp8"),
             mxfp8=(WgradProblem("671B-4096", 4096, 7168, 32, 258_304),
                    WgradProblem("671B-7168", 7168, 7168, 32, 126_976))),
    MoEModel("gemma4-26b", 2816, 704, 128, 8, 1, (10240,), train=_train(2, 1024, 4), tags=_ANCHOR),
    MoEModel("qwen3-30b-a3b", 2048, 768, 128, 8, 0, (10240,), train=_train(2, 1024, 4), tags=_ANCHOR),
    MoEModel("qwen3-235b-a22b", 4096, 1536, 128, 8, 0, (20480,), train=_train(2, 2048, 1), tags=_ANCHOR),
    MoEModel("llama4-17b-16e", 5120, 8192, 16, 1, 1, (1280,), train=_train(2, 1024, 4), tags=_ANCHOR),
    MoEModel("mixtral-8x7b", 6144, 20480, 32, 4, 0, (15360,), train=_train(1, 1024, 2), tags=_ANCHOR),
    # A layer config for `moe-bench --layer`; its GEMM shape keeps the name of the recorded results.
    MoEModel("gpt-oss-like", 2880, 2880, 128, 4, 0, (10240,), shape_name="gpt-oss-120b-like",
             tags=("seed", "anchor", "layer")),
    MoEModel("mixtral-8x7b-large", 8192, 28672, 64, 8, 0, (40960,), train=_train(1, 1024, 2), tags=("seed", "moe")),
    MoEModel("deepseek-v2-like", 5120, 1536, 160, gemm_tokens=(1920,), tags=("seed",)),
    MoEModel("qwen3-next-like", 2048, 512, 512, gemm_tokens=(6400,), tags=("seed",)),
    # Small problems that keep the structure (many experts, uneven sizes, odd widths) for CPU runs.
    MoEModel("tiny-8e", 64, 96, 8, gemm_tokens=(192,), tags=("tiny",)),
    MoEModel("tiny-odd", 48, 72, 10, gemm_tokens=(200,), tags=("tiny",)),
    MoEModel("tiny", 64, 32, 8, 2, 1, train=TrainStep(2, 32, 2, vocab=128, head_dim=16), tags=("quick",)),
    MoEModel("tiny-mxfp8", 192, 128, 4, tags=("tiny", "mxfp8"), mxfp8=(WgradProblem("tiny", 128, 192, 4, 2_048),)),
))  # fmt: skip

_BY_NAME: dict[str, MoEModel] = {m.name: m for m in MODELS}


def with_tag(tag: str, models: Iterable[MoEModel] = MODELS) -> list[MoEModel]:
    """The models carrying `tag` (one of TAGS), in catalog order."""
    if tag not in TAGS:
        raise ValueError(f"tag={tag!r} is unknown; expected one of {', '.join(TAGS)}")
    return [m for m in models if tag in m.tags]


def mxfp8_problems(models: Iterable[MoEModel] = MODELS, *, tiny: bool = True) -> list[WgradProblem]:
    """The MXFP8 problems of `models` in catalog order; with tiny=False, those of tiny-tagged models left out."""
    return [p for m in with_tag("mxfp8", models) if tiny or "tiny" not in m.tags for p in m.mxfp8]


def get_model(name: str) -> MoEModel:
    """A catalog model by name."""
    if name not in _BY_NAME:
        raise ValueError(f"model {name!r} is unknown; expected one of {', '.join(_BY_NAME)}")
    return _BY_NAME[name]
