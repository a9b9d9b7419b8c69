"""Cold start, phase by phase: build an engine and say where the seconds went.

    engine, report = build_engine("reference_engine/checkpoints/target")
    print(report.format())

Phases (seconds of wall time, measured in this process with time.perf_counter):
  imports        importing torch and the engine modules (near 0 when something imported them already)
  config         parsing config.json on its own
  tokenizer      parsing tokenizer.json on its own
  weights        the rest of load_model: building the modules and copying the safetensors weights in
  kv_allocation  allocating (and zeroing) the paged KV cache
  warm_up        one short generation, which pays for first-call costs (kernel selection, allocator growth)
  graph_capture  None: the engine runs eagerly and captures no CUDA graphs ("n/a on CPU" on a CPU)
  tp_workers     with tensor_parallel_size > 1: starting the worker interpreters, each importing torch,
                 loading its shard and allocating its KV cache, all ranks at once (weights and
                 kv_allocation above are then this process's share: near 0). None at size 1.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, fields
from pathlib import Path

from ..shipped import TARGET


@dataclass
class StartupReport:
    """Seconds per phase (None: the phase does not happen here) and the device the engine runs on."""
    device: str
    imports: float
    config: float
    tokenizer: float
    weights: float
    kv_allocation: float
    warm_up: float
    graph_capture: float | None = None
    tp_workers: float | None = None

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) or 0.0 for f in fields(self) if f.name != "device")

    def format(self) -> str:
        """One line per phase, aligned, for `course serve` to print."""
        rows = []
        for f in fields(self):
            if f.name == "device":
                continue
            v = getattr(self, f.name)
            if v is None and f.name == "tp_workers":
                continue  # one process: nothing to report
            if v is None:
                note = "n/a on CPU" if self.device == "cpu" else "n/a (the engine runs eagerly, no CUDA graphs)"
                rows.append(f"  {f.name:<14} {note}")
            else:
                rows.append(f"  {f.name:<14} {v * 1e3:9.1f} ms")
        rows.append(f"  {'total':<14} {self.total * 1e3:9.1f} ms")
        return f"startup on {self.device}:\n" + "\n".join(rows)


def build_engine(model=TARGET, warm_up: bool = True, **engine_kwargs):
    """Build an LLMEngine on `model` (a local model directory), timing each phase.

    Returns (engine, StartupReport). engine_kwargs go to LLMEngine unchanged. warm_up=False skips the
    warm-up generation (its time is then 0.0).
    """
    t = time.perf_counter()
    import torch  # noqa: F401  (timed: the first import of torch is most of a cold start on CPU)

    from ..config import ModelConfig
    from ..engine import LLMEngine
    from ..loader import Tokenizer
    from ..sampling import SamplingParams
    imports = time.perf_counter() - t

    path = Path(model)
    t = time.perf_counter()
    ModelConfig.from_file(path / "config.json")
    config = time.perf_counter() - t
    t = time.perf_counter()
    if (path / "tokenizer.json").is_file():
        Tokenizer(path / "tokenizer.json")
    tokenizer = time.perf_counter() - t

    engine = LLMEngine(path, **engine_kwargs)
    # load_model parsed config and tokenizer again; what is left of it is the weights.
    weights = max(0.0, engine.init_times["load_model"] - config - tokenizer)

    t = time.perf_counter()
    if warm_up:
        rid = engine.add_request([engine.config.eos_token_ids[0] if engine.config.eos_token_ids else 0],
                                 SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), request_id="__warm_up__")
        while engine.has_unfinished():
            engine.step()
        engine.requests.pop(rid, None)
    warm = time.perf_counter() - t
    report = StartupReport(device=engine.device.type, imports=imports, config=config, tokenizer=tokenizer,
                           weights=weights, kv_allocation=engine.init_times["kv_allocation"], warm_up=warm,
                           tp_workers=engine.init_times.get("tp_workers"))
    return engine, report
