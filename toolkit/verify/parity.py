"""Integration parity: a tiny, randomly initialised Llama run through transformers' attention backends.

No weights are downloaded: the model is built from a config with a fixed seed. Every implementation
(flash_attention_2, or flash_attention_3 / flash_attention_4 for those suites, sdpa, eager) runs the same
weights at low precision; the reference is eager
attention in fp32. An implementation passes when its logits (at real, non-padding tokens) are at most
2x as far from the reference as eager's own low-precision logits, plus 1% of the logits' scale.
Batches run without padding and with right and left padding, which sends flash-attn through its
varlen path inside transformers.
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if (
    TYPE_CHECKING
):  # transformers is imported inside run_parity, which reports its absence as an error
    from transformers import LlamaConfig, PreTrainedModel

IMPLEMENTATIONS = ("flash_attention_2", "sdpa", "eager")
FACTOR = 2.0
SCALE_FRACTION = 0.01


@dataclass(frozen=True)
class ParityModel:
    """transformers' tiny Llama of the parity check (build_model below builds it)."""

    hidden_size: int = 256
    intermediate_size: int = 512
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    vocab_size: int = 1000
    seqlen: int = 32

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


PARITY = ParityModel()
BATCH, SEQLEN = 3, PARITY.seqlen


@dataclass
class ParityResult:
    name: str  # "<scenario>/<implementation>"
    status: str  # "passed" | "failed" | "error"
    error: float | None
    bound: float | None
    duration_s: float
    message: str = ""
    traceback: str = ""

    @classmethod
    def broken(cls, name: str, start: float, exc: Exception) -> ParityResult:
        """The error row of a scenario (or of the setup) that raised, with its first 500 characters."""
        return cls(
            name,
            "error",
            None,
            None,
            time.perf_counter() - start,
            f"{type(exc).__name__}: {exc}"[:500],
            traceback.format_exc()[-4000:],
        )


def tiny_llama_config() -> LlamaConfig:
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=PARITY.hidden_size,
        intermediate_size=PARITY.intermediate_size,
        num_hidden_layers=PARITY.num_hidden_layers,
        num_attention_heads=PARITY.num_attention_heads,
        num_key_value_heads=PARITY.num_key_value_heads,
        vocab_size=PARITY.vocab_size,
        max_position_embeddings=4 * SEQLEN,
    )


def scenarios(device: torch.device) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """name -> (input_ids, attention_mask); 'padding' has a right-padded and a left-padded row."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, PARITY.vocab_size, (BATCH, SEQLEN), generator=generator)
    full = torch.ones(BATCH, SEQLEN, dtype=torch.long)
    padded = full.clone()
    padded[1, SEQLEN - 10 :] = 0  # right padding
    padded[2, :7] = 0  # left padding
    return {
        "no-padding": (ids.to(device), full.to(device)),
        "padding": (ids.to(device), padded.to(device)),
    }


def _build(
    config: LlamaConfig,
    implementation: str,
    state: dict | None,
    device: torch.device,
    dtype: torch.dtype,
) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config, attn_implementation=implementation)
    if state is not None:
        model.load_state_dict(state)
    used = model.config._attn_implementation
    if used != implementation:
        raise RuntimeError(
            f"transformers picked attn_implementation {used!r} instead of {implementation!r}"
        )
    return model.to(device=device, dtype=dtype).eval()


def _logits(model: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits.float()


def run_parity(
    device: torch.device | str,
    implementations: tuple[str, ...] = IMPLEMENTATIONS,
    dtype: torch.dtype = torch.bfloat16,
) -> list[ParityResult]:
    """One result per (scenario, implementation); a failure to build or run one is its own error."""
    device = torch.device(device)
    start = time.perf_counter()
    try:
        os.environ.setdefault(
            "HF_HUB_OFFLINE", "1"
        )  # nothing here may reach for the hub (GPU hosts are offline)
        import transformers

        transformers.logging.set_verbosity_error()
        torch.set_float32_matmul_precision("highest")
        torch.manual_seed(0)
        config = tiny_llama_config()
        reference_model = _build(config, "eager", None, device, torch.float32)
        state = {name: tensor.to("cpu") for name, tensor in reference_model.state_dict().items()}
        eager_low = _build(config, "eager", state, device, dtype)
        inputs = scenarios(device)
        references = {name: _logits(reference_model, *batch) for name, batch in inputs.items()}
        floors = {
            name: _max_error(_logits(eager_low, *batch), references[name], batch[1])
            for name, batch in inputs.items()
        }
    except Exception as exc:  # no transformers, or the reference itself broke: one error, reported
        return [ParityResult.broken("setup", start, exc)]
    results = []
    for implementation in implementations:
        model_start = time.perf_counter()
        try:
            model = _build(config, implementation, state, device, dtype)
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}"[:500]
            results += [
                ParityResult(
                    f"{name}/{implementation}",
                    "error",
                    None,
                    None,
                    time.perf_counter() - model_start,
                    message,
                    traceback.format_exc()[-4000:],
                )
                for name in inputs
            ]
            continue
        for name, (ids, mask) in inputs.items():
            results.append(
                _compare(
                    f"{name}/{implementation}", model, ids, mask, references[name], floors[name]
                )
            )
    return results


def _max_error(logits: torch.Tensor, reference: torch.Tensor, mask: torch.Tensor) -> float:
    real = mask.bool()
    return float((logits[real] - reference[real]).abs().max())


def _compare(
    name: str,
    model: PreTrainedModel,
    ids: torch.Tensor,
    mask: torch.Tensor,
    reference: torch.Tensor,
    floor: float,
) -> ParityResult:
    start = time.perf_counter()
    try:
        error = _max_error(_logits(model, ids, mask), reference, mask)
    except Exception as exc:
        return ParityResult.broken(name, start, exc)
    scale = float(reference[mask.bool()].abs().max())
    bound = FACTOR * floor + SCALE_FRACTION * scale
    passed = error <= bound  # NaN fails
    message = (
        ""
        if passed
        else f"logits differ by {error:.3g} > {bound:.3g} (eager low-precision: {floor:.3g})"
    )
    return ParityResult(
        name, "passed" if passed else "failed", error, bound, time.perf_counter() - start, message
    )


def transformers_names(implementation: str) -> str:
    """ "" when the installed transformers registers attn_implementation `implementation` (flash_attention_3,
    flash_attention_4), else why not: an older transformers is a finding of the report, not an error of the
    kernels."""
    try:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    except Exception as exc:  # no transformers, or one too old to have the attention registry
        return f"transformers has no attention registry here ({type(exc).__name__}: {exc})"[:300]
    if implementation not in ALL_ATTENTION_FUNCTIONS:
        return f"this transformers does not register attn_implementation {implementation!r}"
    return ""


def run_implementation_parity(
    device: torch.device | str, implementation: str
) -> list[ParityResult]:
    """The tiny-Llama parity with `implementation` beside sdpa and eager (the parity level of every suite but FA2's);
    its rows are "unsupported", with why, where this transformers has no such attn_implementation."""
    why = transformers_names(implementation)
    rows = run_parity(device, ("sdpa", "eager") if why else (implementation, "sdpa", "eager"))
    if why:
        rows += [
            ParityResult(f"{name}/{implementation}", "unsupported", None, None, 0.0, why)
            for name in scenarios(torch.device("cpu"))
        ]
    return rows
