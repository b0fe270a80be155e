"""The files a text-workflow run reads: the model checkpoint and the prompt files.

When the ``text`` section names none, a run is self-contained: rank 0 builds a tiny Qwen2 model
with an in-process trained tokenizer (:mod:`policies.causal_lm.tiny`) and a procedurally generated
arithmetic dataset (:mod:`vla_rl.data.arithmetic`) inside the run directory, before any worker
loads them. Existing files are reused (a resumed run finds them in place).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vla_rl.config import RunConfig

TINY_MODEL_DIR = "tiny_model"
ARITHMETIC_DIR = "arithmetic"
#: Rows per parquet row group of the generated prompts: the unit a worker reads, small enough
#: that a few hundred rows still split over several workers.
GENERATED_ROW_GROUP_SIZE = 16


@dataclass(frozen=True)
class TextAssets:
    """Resolved paths of a text run.

    Attributes:
        model_path: the HF directory or ``.gguf`` file of the policy.
        train_file, test_file: the training and held-out prompt files.
    """

    model_path: Path
    train_file: Path
    test_file: Path

    @classmethod
    def resolve(cls, config: RunConfig, run_dir: Path) -> TextAssets:
        """The configured paths, or the generated ones under ``run_dir`` for those left null."""
        text = config.text
        generated = run_dir / ARITHMETIC_DIR
        return cls(
            model_path=Path(text.model_path) if text.model_path else run_dir / TINY_MODEL_DIR,
            train_file=Path(text.train_file) if text.train_file else generated / "train.parquet",
            test_file=Path(text.test_file) if text.test_file else generated / "test.parquet",
        )


def write_generated_prompts(config: RunConfig, out_dir: Path) -> dict[str, Path]:
    """Write the arithmetic splits of a run whose ``text.train_file`` or ``text.test_file`` is
    null (``text.num_generated_train`` / ``num_generated_test`` rows of ``text.arithmetic_levels``,
    drawn from ``run.seed``: the same rows wherever it runs). Returns ``{"train": path, "test": path}``."""
    from vla_rl.data.arithmetic import write_arithmetic_dataset
    from vla_rl_core.arithmetic import LEVELS

    text = config.text
    names = text.arithmetic_levels
    levels = LEVELS if names is None else tuple(level for level in LEVELS if level.name in names)
    return write_arithmetic_dataset(out_dir, text.num_generated_train, text.num_generated_test, seed=config.run.seed,
                                    row_group_size=GENERATED_ROW_GROUP_SIZE, levels=levels)


def tiny_model_spec(config: RunConfig):
    """The size of the tiny Qwen2 a run with ``text.model_path: null`` generates
    (:class:`policies.causal_lm.tiny.TinyQwen2Spec` of ``text.tiny_hidden_size`` and
    ``text.tiny_num_layers``)."""
    from policies.causal_lm.tiny import TinyQwen2Spec

    text = config.text
    return TinyQwen2Spec(hidden_size=text.tiny_hidden_size, intermediate_size=2 * text.tiny_hidden_size,
                         num_hidden_layers=text.tiny_num_layers)


def ensure_text_assets(config: RunConfig, run_dir: Path) -> TextAssets:
    """Build what the run generates itself and check that every configured file exists.

    Call on one rank only, then barrier.

    Raises:
        FileNotFoundError: a configured model or prompt file is missing (names the field).
    """
    from policies.causal_lm.tiny import write_tiny_checkpoint

    text = config.text
    assets = TextAssets.resolve(config, run_dir)
    if text.model_path is None and not (assets.model_path / "config.json").exists():
        write_tiny_checkpoint(assets.model_path, tiny_model_spec(config), seed=config.run.seed)
    if (text.train_file is None or text.test_file is None) and not (
        assets.train_file.exists() and assets.test_file.exists()
    ):
        write_generated_prompts(config, run_dir / ARITHMETIC_DIR)
    for field, path in (("text.model_path", assets.model_path), ("text.train_file", assets.train_file),
                        ("text.test_file", assets.test_file)):
        if not path.exists():
            raise FileNotFoundError(f"{field}: {path} does not exist")
    return assets
