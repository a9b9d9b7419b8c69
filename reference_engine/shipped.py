"""The models this repository ships (reference_engine/checkpoints/), found from the package, never from the
working directory: `from reference_engine.shipped import TARGET`.

    TARGET  the ~3.3M-parameter Llama-architecture model every lesson runs (Hugging Face layout: config.json,
            model.safetensors, tokenizer.json)
    DRAFT   its small draft model, for speculative decoding (lesson 14)
    METRICS metrics.json: how both were trained and what they score (reference_engine/tools/train.py writes it)
"""
from pathlib import Path

CHECKPOINTS = Path(__file__).resolve().parent / "checkpoints"
TARGET = CHECKPOINTS / "target"
DRAFT = CHECKPOINTS / "draft"
METRICS = CHECKPOINTS / "metrics.json"
